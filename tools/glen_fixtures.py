"""Writes a GLEN parity fixture (tests/fixtures/glen_parity/<shape>/) from GLEN's own code; every size is a flag.

    git clone https://github.com/skleee/GLEN GLEN && \\
        python tools/glen_fixtures.py --glen_repo GLEN --out tests/fixtures/glen_parity/v96_d32_relu
    python tools/glen_fixtures.py --glen_repo GLEN --out tests/fixtures/glen_parity/v128_d48_gated --vocab 128 \\
        --d_model 48 --d_kv 8 --heads 6 --d_ff 96 --feed_forward gated-gelu --encoder_layers 3 --decoder_layers 3 \\
        --docid_length 4 --docs 40 --queries 6 --max_len 40 --short_queries 3 --seed 1

It imports their phase-2 model (`tevatron.modeling.GLENP2Model`, src/tevatron/modeling/glen_phase2.py) from that
working tree and runs, on a tiny random HF T5 (eval mode), their `make_doc_id` (the makeid docids and logits, in
batches of 16 documents as scripts/eval_make_docid_glen_nq.sh) and their `evaluation_step(batch,
predefined_id=False)` (constrained top-K search, K = 2N, and the collision-free cosine ranking), with the trie and
lookup tables built from the docid file as examples/glen_phase2/evaluate_glen.py:194-246 builds them. The step
logits, decoder states and encoder output are read by a forward hook on the HF model; the per-document scores of
ranking.json come from a replay of their search on those logits, and the tool fails unless the replay gives their
ranked lists exactly. The layout is that of the shared peer fixture (README.md of tests/fixtures/glen_parity/).

Harness shims, because transformers 5 moved names (nothing of theirs is edited): `AutoModelWithLMHead`,
`prune_linear_layer` and `find_pruneable_heads_and_indices` aliased (not on this path); a pandas stand-in when
pandas is absent (only their tree builder from a file uses it; the tables are built here as theirs are);
`torch.device("cuda")` inside glen_phase2 and `Tensor.cuda()` during their calls go to the CPU. A stub tokenizer:
id i ↔ `tok{i}`, pad 0, eos 1, unk 2, the last `--sentinels` ids sentinels. Weights: HF's init after
`torch.manual_seed(seed)`, every attention and feed-forward output matrix × `--output_scale` (with the plain init
almost every docid starts with pad), the layer norms 1 ± `--norm_spread` (at HF's ones a swap of two entries,
`check_parity --mutate`, changes nothing). Seeds whose docids contain pad (their trie stops there), whose N
exceeds the finite beams, or whose smallest decision gap is below float noise are refused: pick another seed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.machinery
import json
import sys
import types
from collections import defaultdict
from pathlib import Path

import numpy as np

from gr_jax.runtime import cli
from gr_jax.runtime.io_utils import atomic_dir
from gr_jax.runtime.provenance import git_commit

DEFAULTS = dict(vocab=96, sentinels=8, d_model=32, d_kv=8, d_ff=64, heads=4, encoder_layers=2, decoder_layers=2,
                docid_length=3, docs=30, queries=5, max_len=24, short_queries=1, batch_docs=16)
MIN_GAP = 2e-5  # decisions closer than this could flip under another summation order


def _import_glen(repo: Path):
    if importlib.util.find_spec("pandas") is None and "pandas" not in sys.modules:
        stand_in = types.ModuleType("pandas")
        stand_in.__spec__ = importlib.machinery.ModuleSpec("pandas", None)
        sys.modules["pandas"] = stand_in
    import transformers
    import transformers.modeling_utils as mu
    import transformers.pytorch_utils as pu

    transformers.AutoModelWithLMHead = getattr(transformers, "AutoModelWithLMHead",
                                               transformers.AutoModelForSeq2SeqLM)
    mu.prune_linear_layer = getattr(mu, "prune_linear_layer", pu.prune_linear_layer)

    def not_on_this_path(*a, **k):
        raise NotImplementedError("find_pruneable_heads_and_indices is not on GLEN's inference path")

    mu.find_pruneable_heads_and_indices = getattr(mu, "find_pruneable_heads_and_indices", not_on_this_path)
    sys.path.insert(0, str(repo / "src"))
    try:
        phase2 = importlib.import_module("tevatron.modeling.glen_phase2")
        tree = importlib.import_module("tevatron.tree")
    finally:
        sys.path.remove(str(repo / "src"))
    import torch

    class CpuTorch(types.ModuleType):  # their torch.device("cuda") (glen_phase2.py:146,155,245,254)
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def device(*a, **k):
            return torch.device("cpu")

    phase2.torch = CpuTorch("torch")
    return phase2.GLENP2Model, tree.TreeBuilder, transformers.__version__


@contextlib.contextmanager
def _cuda_is_cpu():  # their .cuda() (glen_phase2.py:161,162,262,263)
    import torch

    orig = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.Tensor.cuda = orig


class StubTokenizer:
    def __init__(self, vocab: int, sentinels: int):
        self.pad_token_id, self.eos_token_id, self.unk_token_id, self.bos_token_id = 0, 1, 2, None
        self.all_special_ids = [1, 2, 0] + list(range(vocab - 1, vocab - sentinels - 1, -1))

    def convert_ids_to_tokens(self, ids, skip_special_tokens=False):
        return [f"tok{int(i)}" for i in ids if not (skip_special_tokens and int(i) in self.all_special_ids)]

    def convert_tokens_to_ids(self, tokens):
        return [int(t[3:]) for t in tokens]

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(self.convert_ids_to_tokens(ids, skip_special_tokens))


def _padded(rows, max_len):
    ids = np.zeros((len(rows), max_len), np.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)], ids[i, len(r)] = r, 1
    return ids, (ids != 0).astype(np.int64)


def replay(step_logits, masked, docid_rows, N):
    """Their search on one query's [M, V] step logits (the fixture README's rules 6-7): K = 2N beams over the
    trie of `docid_rows`; returns (final beams [(tokens, logprob)], first N (tokens, logprob) in beam order)."""
    import torch

    M, V = step_logits.shape
    K = 2 * N
    logits = torch.tensor(step_logits).clone()
    logits[:, masked] = -float("inf")
    scores = torch.log_softmax(logits, dim=-1)
    children = defaultdict(set)
    for row in docid_rows:
        for t in range(M):
            children[tuple(row[:t])].add(int(row[t]))
    cum, seqs = None, None
    for t in range(M):
        allowed = torch.full((1 if t == 0 else K, V), -float("inf"))
        for k in range(allowed.shape[0]):
            prefix = () if t == 0 else tuple(seqs[k])
            nxt = children.get(prefix) if (t == 0 or torch.isfinite(cum[k])) else None
            allowed[k, sorted(nxt) if nxt else [1]] = 0.0
        cand = scores[t][None] + allowed + (0 if t == 0 else cum[:, None])
        top = torch.topk(cand.reshape(-1), K)
        parent, token = top.indices // V, top.indices % V
        seqs = [([] if t == 0 else seqs[int(p)]) + [int(v)] for p, v in zip(parent, token)]
        cum = top.values
    beams = [(s, float(c)) for s, c in zip(seqs, cum)]
    return beams, beams[:N]


def write_fixture(repo: Path, out: Path, seed: int = 0, sizes=None, feed_forward: str = "relu",
                  output_scale: float = 8.0, norm_spread: float = 0.1, settings=(10, 5), commit=None) -> dict:
    import torch
    import transformers
    from torch.utils.data import default_collate

    z = sizes if sizes is not None else argparse.Namespace(**DEFAULTS)
    GLENP2Model, TreeBuilder, tf_version = _import_glen(repo)
    M, V = z.docid_length, z.vocab
    torch.manual_seed(seed)
    config = transformers.T5Config(vocab_size=V, d_model=z.d_model, d_kv=z.d_kv, d_ff=z.d_ff,
                                   num_layers=z.encoder_layers, num_decoder_layers=z.decoder_layers,
                                   num_heads=z.heads, dropout_rate=0.0, feed_forward_proj=feed_forward,
                                   decoder_start_token_id=0, tie_word_embeddings=True)
    hf = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith((".o.weight", ".wo.weight")):
                p.mul_(output_scale)
            if "layer_norm" in name and norm_spread:
                p.copy_(1.0 + norm_spread * torch.randn_like(p))
    hf.set_attn_implementation("eager")
    tok = StubTokenizer(V, z.sentinels)
    masked = [i for i in tok.all_special_ids if i not in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)]
    rng = np.random.default_rng(seed + 100)
    regular = (3, V - z.sentinels)
    docs = [rng.integers(*regular, int(rng.integers(z.max_len // 3, z.max_len - 1))) for _ in range(z.docs)]
    gold = rng.integers(0, z.docs, z.queries)
    queries = []
    for q, d in enumerate(gold):  # a span of the gold document, one token replaced; the first short ones short
        n = 2 if q < z.short_queries else int(rng.integers(3, min(len(docs[d]), z.max_len - 1)))
        start = int(rng.integers(0, len(docs[d]) - n + 1))
        span = docs[d][start:start + n].copy()
        span[int(rng.integers(0, n))] = rng.integers(*regular)
        queries.append(span)
    doc_ids, doc_mask = _padded(docs, z.max_len)
    q_ids, q_mask = _padded(queries, z.max_len)

    captured = []  # every forward of theirs: (logits [B, V], last decoder state [B, D], encoder output)
    hook = hf.register_forward_hook(lambda m, a, o: captured.append(
        (o.logits[:, -1].detach().numpy().copy(), o.decoder_hidden_states[-1][:, -1].detach().numpy().copy(),
         o.encoder_last_hidden_state.detach().numpy().copy() if o.encoder_last_hidden_state is not None
         else None)))
    model = GLENP2Model(lm_q=hf, lm_p=hf, untie_encoder=False, negatives_x_device=False, tokenizer=tok)
    model.model_args = types.SimpleNamespace(max_output_length=M + 1, mask_special_tokens_for_decoding=True,
                                             special_token_ids=masked, num_return_sequences=None, tree=1,
                                             reranking="cosine")
    model.eval()
    rows, d_logits, d_hidden = [], [], []
    with _cuda_is_cpu(), torch.no_grad():
        for s in range(0, z.docs, z.batch_docs):
            captured.clear()
            batch = {"source_ids": torch.tensor(doc_ids[s:s + z.batch_docs]),
                     "source_mask": torch.tensor(doc_mask[s:s + z.batch_docs]),
                     "oldids": [str(i) for i in range(s, min(s + z.batch_docs, z.docs))]}
            oldids, texts, preds, logits = model.make_doc_id(batch)
            rows += list(zip(oldids, preds, logits.tolist(), texts))
            d_logits.append(np.stack([c[0] for c in captured[:M]], 1))
            d_hidden.append(np.stack([c[1] for c in captured[:M]], 1))
    d_logits, d_hidden = np.concatenate(d_logits), np.concatenate(d_hidden)
    tsv = "".join(f"{o}\t{p}\t{'<->'.join(str(x) for x in lg)}\t{t}\n" for o, p, lg, t in rows)
    docid_tokens = np.array([tok.convert_tokens_to_ids(p.split("<->")) for _, p, _, _ in rows], np.int64)
    if (docid_tokens == 0).any():
        raise ValueError(f"seed {seed}: a docid holds pad 0, where their trie stops; pick another seed")
    raw = np.take_along_axis(d_logits, docid_tokens[..., None], -1)[..., 0]

    # the tables of evaluate_glen.py:194-246, from the docid file's rows
    docid2num_docs, docid2oldids, oldid2logit = defaultdict(int), defaultdict(list), {}
    for o, p, lg, _ in rows:
        docid2num_docs[p] += 1
        docid2oldids[p].append(o)
        oldid2logit[o] = torch.tensor([float(x) for x in lg])
    builder = TreeBuilder()
    for p in dict((o, p) for o, p, _, _ in rows).values():
        builder.add(tok.convert_tokens_to_ids(p.split("<->"))[:M])
    model.root, model.docid2num_docs = builder.build(), dict(docid2num_docs)
    model.docid2oldids, model.oldid2docid_logit = docid2oldids, oldid2logit
    model.oldid2docid = {o: p for o, p, _, _ in rows}

    ranking = {"reranking": "cosine", "settings": []}
    q_logits = q_hidden = q_encoded = None
    stored = np.array([[float(x) for x in lg] for _, _, lg, _ in rows])
    for N in settings:
        model.model_args.num_return_sequences = N
        captured.clear()
        batch = default_collate([{"source_ids": torch.tensor(q_ids[q]), "source_mask": torch.tensor(q_mask[q]),
                                  "oldid": str(int(gold[q])), "rank": [(model.oldid2docid[str(int(gold[q]))], 1)]}
                                 for q in range(z.queries)])
        with _cuda_is_cpu(), torch.no_grad():
            _, preds, _, _ = model.evaluation_step(batch, predefined_id=False)
        logits = np.stack([c[0] for c in captured[:M]], 1)
        if q_logits is None:
            q_logits, q_hidden = logits, np.stack([c[1] for c in captured[:M]], 1)
            q_encoded = captured[0][2]
        per_query = []
        for q in range(z.queries):
            beams, first = replay(logits[q], masked, docid_tokens.tolist(), N)
            finite = [b for b in beams if np.isfinite(b[1])]
            if len(finite) < N:
                raise ValueError(f"seed {seed}: query {q} has {len(finite)} finite beams < N = {N}; pick another")
            ranked, cos_gaps = [], []
            for beam_rank, (tokens, logprob) in enumerate(first):
                key = "<->".join(f"tok{t}" for t in tokens)
                owners = docid2oldids[key]
                cos = [float(torch.cosine_similarity(oldid2logit[o], torch.tensor(logits[q][np.arange(M), tokens]),
                                                     dim=0)) for o in owners]
                order = np.argsort(-np.array(cos)) if len(owners) > 1 else [0]
                if len(owners) > 1:
                    cos_gaps += list(np.abs(np.diff(np.sort(cos))))
                ranked += [{"doc": owners[i], "docid_tokens": tokens, "beam_rank": beam_rank, "seq_logprob": logprob,
                            "cosine": cos[i] if len(owners) > 1 else None, "collision_size": len(owners)}
                           for i in order]
            ranked = [{**e, "rank": r + 1} for r, e in enumerate(ranked[:N])]
            mine = [f"{e['doc']}<->" + "<->".join(f"tok{t}" for t in e["docid_tokens"]) for e in ranked]
            if mine != list(preds[q]):
                raise RuntimeError(f"query {q}, N {N}: the replay gives {mine}, their evaluation_step {preds[q]}")
            values = sorted(v for _, v in finite)
            beam_gap = float(np.min(np.diff(values))) if len(values) > 1 else float("inf")
            cos_gap = float(min(cos_gaps)) if cos_gaps else None
            if beam_gap < MIN_GAP or (cos_gap is not None and cos_gap < MIN_GAP):
                raise ValueError(f"seed {seed}: query {q} has a decision gap below {MIN_GAP}; pick another seed")
            per_query.append({"query": q, "their_pred_strings": list(preds[q]), "ranked": ranked,
                              "final_beams": [{"tokens": b[0], "logprob": b[1] if np.isfinite(b[1]) else None}
                                              for b in beams],
                              "n_finite_final_beams": len(finite), "min_beam_score_margin": beam_gap,
                              "min_cosine_margin": cos_gap})
        ranking["settings"].append({"num_return_sequences": N, "K": 2 * N, "per_query": per_query})
    hook.remove()

    margins = [(pq["min_beam_score_margin"], pq["min_cosine_margin"]) for s in ranking["settings"]
               for pq in s["per_query"]]
    meta = {"method": "GLEN phase 2 (GLENP2Model): makeid + constrained top-K + collision-free (cosine) ranking",
            "repo": "skleee/GLEN", "commit": commit or git_commit(repo),
            "versions": {"torch": torch.__version__, "transformers": tf_version, "numpy": np.__version__},
            "model_seed": seed, "data_seed": seed + 100, "feed_forward": feed_forward,
            "weight_init": f"HF init after torch.manual_seed({seed}); *.o.weight and *.wo.weight × {output_scale}; "
                           f"layer norms 1 + {norm_spread}·N(0, 1)",
            "sizes": vars(z), "token_layout": {"pad": 0, "eos": 1, "unk": 2, "token_string": "tok{id}",
                                               "masked_token_ids": masked},
            "M": M, "max_output_length": M + 1, "max_len": z.max_len, "n_queries": z.queries, "n_docs": z.docs,
            "query_lengths": [len(q) + 1 for q in queries],
            "docid_stats": {"unique_docids": len(docid2num_docs),
                            "collided_docs": z.docs - len(docid2num_docs),
                            "distinct_first_tokens": len(set(docid_tokens[:, 0].tolist()))},
            "checks": {"min_beam_score_margin": min(m[0] for m in margins),
                       "min_cosine_margin": min((m[1] for m in margins if m[1] is not None), default=None),
                       "replay_reproduces_their_rankings": True},
            "command": " ".join(["python tools/glen_fixtures.py --glen_repo GLEN", f"--out {out}"]
                                + [f"--{k} {v}" for k, v in sorted(vars(z).items()) if DEFAULTS.get(k) != v]
                                + ([f"--feed_forward {feed_forward}"] if feed_forward != "relu" else [])
                                + ([f"--output_scale {output_scale}"] if output_scale != 8.0 else [])
                                + ([f"--norm_spread {norm_spread}"] if norm_spread != 0.1 else [])
                                + ([f"--settings {' '.join(map(str, settings))}"] if list(settings) != [10, 5]
                                   else [])
                                + ([f"--commit {commit}"] if commit else [])
                                + ([f"--seed {seed}"] if seed else []))}
    with atomic_dir(out) as tmp:
        hf.save_pretrained(str(tmp / "model"))
        np.savez(tmp / "inputs.npz", query_input_ids=q_ids, query_attention_mask=q_mask, query_gold_doc=gold,
                 doc_input_ids=doc_ids, doc_attention_mask=doc_mask, masked_token_ids=np.array(masked, np.int64))
        np.savez(tmp / "outputs.npz", doc_docid_tokens=docid_tokens, doc_docid_logit_raw=raw.astype(np.float32),
                 doc_docid_logit_rounded=stored, doc_step_logits=d_logits, doc_step_hidden=d_hidden,
                 query_step_logits=q_logits, query_step_hidden=q_hidden, query_encoder_output=q_encoded)
        (tmp / "glen_docid.tsv").write_text(tsv)
        (tmp / "ranking.json").write_text(json.dumps(ranking, indent=1) + "\n")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--glen_repo", required=True, help="a working tree of skleee/GLEN (its src/tevatron)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=cli.natural, default=0)
    parser.add_argument("--commit", help="the commit of --glen_repo when it is not a git working tree")
    parser.add_argument("--feed_forward", choices=("relu", "gated-gelu"), default="relu")
    parser.add_argument("--output_scale", type=cli.positive, default=8.0)
    parser.add_argument("--norm_spread", type=cli.nonnegative, default=0.1)
    parser.add_argument("--settings", type=cli.count, nargs="+", default=[10, 5], help="N returned (K = 2N beams)")
    for name, default in DEFAULTS.items():
        kind = cli.natural if name == "short_queries" else cli.count
        parser.add_argument(f"--{name}", type=kind, default=default)
    args = parser.parse_args(argv)
    cli.setup_logging()
    sizes = argparse.Namespace(**{k: getattr(args, k) for k in DEFAULTS})
    problems = [msg for bad, msg in (
        (args.max_len < 8, "--max_len ≥ 8"), (args.sentinels >= args.vocab - 8, "--sentinels < --vocab − 8"),
        (args.short_queries > args.queries, "--short_queries ≤ --queries"),
        (2 * max(args.settings) > args.docs, "every 2 × --settings ≤ --docs")) if bad]
    if problems:
        parser.error("; ".join(problems))
    repo = Path(args.glen_repo)
    if not (repo / "src" / "tevatron" / "modeling" / "glen_phase2.py").is_file():
        sys.stderr.write(f"{repo}: not a GLEN checkout (no src/tevatron/modeling/glen_phase2.py; git clone "
                         "https://github.com/skleee/GLEN)\n")
        return 2
    try:
        meta = write_fixture(repo, Path(args.out), args.seed, sizes, args.feed_forward, args.output_scale,
                             args.norm_spread, tuple(args.settings), args.commit)
    except (ValueError, OSError, RuntimeError) as e:
        sys.stderr.write(f"{e}\n")
        return 2
    sys.stdout.write(json.dumps({"out": args.out, **meta["docid_stats"], **meta["checks"]}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
