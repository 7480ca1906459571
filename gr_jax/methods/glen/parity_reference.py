"""GLEN's inference as GLEN's own PyTorch code runs it, on a transformers T5 (needs the torch extra): the
contender of `tools/bench_decoding.py`'s GLEN row and a second reference for the parity tests."""

from __future__ import annotations

import numpy as np


def glen_rank_torch(hf_model, query_ids: np.ndarray, query_mask: np.ndarray, docids: np.ndarray,
                    doc_weights: np.ndarray, num_return: int, masked_ids, beam_factor: int = 2) -> list[list[int]]:
    """GLEN's inference written the way GLEN's PyTorch code runs it, for comparison with `methods.glen.model`: the
    decoder fed its own hidden state step by step (KV cache), the tied head's logits `(h·d^-0.5)Eᵀ` with the
    special ids masked, log-softmax, a top-K over K × V per step with the prefix tree's children looked up in
    a nested dict for every beam (−inf elsewhere), K = beam_factor · N; then the first N beams expanded into
    documents, colliding documents by descending cosine between the stored docid weights and the query's
    logits at the docid's tokens, cut to N. Returns the ranked document rows per query."""
    import torch

    docids = np.asarray(docids)
    M = docids.shape[1]
    root: dict = {}
    owners: dict = {}
    for row, seq in enumerate(docids.tolist()):
        node = root
        for tok in seq:
            node = node.setdefault(tok, {})
        owners.setdefault(tuple(seq), []).append(row)
    K, N = beam_factor * num_return, num_return
    d_model = hf_model.config.d_model
    emb = hf_model.shared.weight
    masked = torch.tensor(list(masked_ids), dtype=torch.long)
    q = torch.tensor(np.asarray(query_ids), dtype=torch.long)
    m = torch.tensor(np.asarray(query_mask), dtype=torch.long)
    B, V = q.shape[0], emb.shape[0]
    with torch.no_grad():
        enc = hf_model.encoder(input_ids=q, attention_mask=m).last_hidden_state
        x = emb[0].expand(B, 1, -1)
        past, step_logits = None, []
        prefixes = [[()] for _ in range(B)]
        cum = torch.zeros(B, 1)
        for t in range(M):
            out = hf_model.decoder(inputs_embeds=x, encoder_hidden_states=enc, encoder_attention_mask=m,
                                   past_key_values=past, use_cache=True)
            past, h = out.past_key_values, out.last_hidden_state[:, -1]
            logits = (h * d_model ** -0.5) @ emb.T
            step_logits.append(logits)
            scores = torch.log_softmax(logits.index_fill(1, masked, float("-inf")), dim=-1)
            allow = torch.full((B, len(prefixes[0]), V), float("-inf"))
            for b in range(B):
                for k, prefix in enumerate(prefixes[b]):
                    node = root
                    for tok in prefix:
                        node = node.get(tok)
                        if node is None:
                            break
                    if node:
                        allow[b, k, list(node)] = 0.0
            cand = (cum[:, :, None] + scores[:, None, :] + allow).reshape(B, -1)
            top, idx = torch.topk(cand, min(K, cand.shape[1]), dim=-1)
            parent, token = idx // V, idx % V
            prefixes = [[prefixes[b][int(p)] + (int(tk),) for p, tk in zip(parent[b], token[b])] for b in range(B)]
            cum = top
            x = h[:, None]
        table = torch.stack(step_logits, dim=1)  # [B, M, V] raw logits
    ranked = []
    w_d = np.asarray(doc_weights, np.float64)
    for b in range(B):
        out_rows: list[int] = []
        for k in range(N):
            if not torch.isfinite(cum[b, k]):
                break
            z = prefixes[b][k]
            rows = owners.get(z, [])
            if len(rows) > 1:
                w_q = table[b, torch.arange(M), torch.tensor(z)].double().numpy()
                cos = [float(np.dot(w_d[r], w_q) / (max(np.linalg.norm(w_d[r]), 1e-8) * max(np.linalg.norm(w_q), 1e-8)))
                       for r in rows]
                rows = [rows[i] for i in np.argsort(-np.asarray(cos), kind="stable")]
            out_rows += [r for r in rows if r not in out_rows]
        ranked.append(out_rows[:N])
    return ranked
