"""Writes a PAG parity fixture (tests/fixtures/pag_parity/<shape>/) from PAG's own model code; every size is a flag.

    git clone https://github.com/HansiZeng/PAG PAG && \\
        python tools/pag_fixtures.py --pag_repo PAG --out tests/fixtures/pag_parity/l4_k12_relu
    python tools/pag_fixtures.py --pag_repo PAG --out tests/fixtures/pag_parity/l3_k16_gated --levels 3 --codes 16 \\
        --d_model 48 --d_kv 8 --heads 6 --d_ff 96 --feed_forward gated-gelu --encoder_layers 3 --decoder_layers 3 \\
        --queries 5 --docs 36 --short_queries 2 --seed 1

Their classes compute every model output: `LexicalRipor.from_pretrained(model/)`
(t5_pretrainer/modeling/t5_generative_retriever.py) → `encode` in mode `lex_retrieval` (the planner's lexical
representations), and the `T5ForLexicalSemanticGeneration` forward in mode `smt_retrieval` (the raw step logits
after every prefix of every docid, decoder input = [padded query, 0, prefix]). The set docids, s_lex and the planning
set follow their formulas (evaluate.py:546-556, tasks/evaluator.py:39-59 and :95). The decoding is a replay, as in
the shared peer fixture (its README, rules 5-8, `tests/fixtures/pag_parity/peer_v320_d64/README.md`): their beam
search imports transformers 4.x modules that transformers 5 no longer has, so the tool replays
beam_search_lex_tmp_rescore (guided) and beam_search with lexical_condition (unguided) on their step logits, in
float32, with HF 4.17's beam bookkeeping (2B candidates, the first B kept, finalize by the decoder length). Harness
shims (nothing of theirs is edited): `ujson` is json; `T5ForLexicalSemanticGeneration.model_parallel = False` (an
attribute transformers 5 dropped); eager attention. Weights: HF's init after `torch.manual_seed(seed)`, the docid
tokens' embedding rows × `--docid_scale` (so raw docid logits sit on the scale of the planner bonus), the layer
norms 1 ± `--norm_spread` (at HF's ones a swap of two entries, `check_parity --mutate`, changes nothing). Seeds
whose decisions are closer than float noise are refused: pick another seed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import numpy as np

from gr_jax.runtime import cli
from gr_jax.runtime.io_utils import atomic_dir
from gr_jax.runtime.provenance import git_commit

DEFAULTS = dict(base_vocab=128, sentinels=8, levels=4, codes=12, d_model=32, d_kv=8, d_ff=64, heads=4,
                encoder_layers=2, decoder_layers=2, queries=4, docs=30, doc_max=20, m=8, planning=20,
                short_queries=1, collisions=2)
MIN_GAP = 1e-4  # decisions closer than this could flip under another summation order (logits reach tens)


def _import_pag(repo: Path):
    import json as _json

    sys.modules.setdefault("ujson", _json)  # not installed here; the same load/dump API
    sys.path.insert(0, str(repo))
    try:
        module = importlib.import_module("t5_pretrainer.modeling.t5_generative_retriever")
    finally:
        sys.path.remove(str(repo))
    module.T5ForLexicalSemanticGeneration.model_parallel = False  # read by their forward; gone in transformers 5
    return module.LexicalRipor


def _batch(rows):
    width = max(len(r) for r in rows) + 1  # padding='longest', eos after the tokens
    ids = np.zeros((len(rows), width), np.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)], ids[i, len(r)] = r, 1
    return ids, (ids != 0).astype(np.int64)


def replay(logits_of, planned, s_lex, B: int, L: int, decoder_length: int, guided: bool):
    """One query's decoding (the peer fixture README's rules 5-8) → (steps, final [(tokens, raw_sum, rel_score,
    normalised)] in output order, minimum selection margin). `logits_of(prefix)` → float32 [V] raw logits;
    `planned`: {docid tokens: [planned docs]}; `s_lex`: doc → score."""
    import torch

    children, bonus = {}, {}
    for tokens, docs in planned.items():
        best = max(s_lex[d] for d in docs)
        for t in range(L):
            key = (tuple(tokens[:t]), tokens[t])
            children.setdefault(tuple(tokens[:t]), set()).add(tokens[t])
            bonus[key] = max(bonus.get(key, -np.inf), best)
    beams = [()] * B
    kept = torch.tensor([0.0] + [-1e9] * (B - 1), dtype=torch.float32)
    steps, margin = [], np.inf
    for _ in range(L):
        rows_kept, rows_select = [], []
        for k, prefix in enumerate(beams):
            raw = torch.tensor(logits_of(prefix), dtype=torch.float32)
            mask = torch.full_like(raw, -float("inf"))
            allowed = sorted(children.get(prefix, ()))
            mask[allowed] = 0.0
            score = raw + mask + kept[k]
            extra = torch.zeros_like(raw)
            if guided:
                extra[allowed] = torch.tensor([bonus[(prefix, a)] for a in allowed], dtype=torch.float32)
            rows_kept.append(score)
            rows_select.append(score + extra)
        sel = torch.stack(rows_select).reshape(-1)
        V = rows_kept[0].shape[0]
        top = torch.topk(sel, 2 * B)
        genuine = [float(v) for v in top.values if v > -1e8]
        if len(genuine) > B:
            margin = min(margin, genuine[B - 1] - genuine[B])
        picks = top.indices[:B]
        flat_kept = torch.stack(rows_kept).reshape(-1)
        beams = [beams[int(i) // V] + (int(i) % V,) for i in picks]
        kept = flat_kept[picks].clone()
        steps.append([{"tokens": list(b), "raw_cum": float(c), "select_score": float(s), "parent_beam": int(i) // V}
                      for b, c, s, i in zip(beams, kept, top.values[:B], picks)]
                     + [{"n_copy_beams": int((kept < -1e8).sum())}])
    if (kept < -1e8).any():
        raise ValueError("fewer than B complete docids in a planning set: copies would reach the output")
    hyps = [(float(c) / decoder_length, b, float(c)) for b, c in zip(beams, kept)]
    order = sorted(range(B), key=lambda j: hyps[j][0])  # their sorted(...) then pop() from the end
    final = []
    for j in reversed(order):
        normalised = np.float32(hyps[j][0])
        final.append((list(hyps[j][1]), hyps[j][2], float(np.float32(normalised * np.float32(decoder_length))),
                      float(normalised)))
    return steps, final, margin


def write_fixture(repo: Path, out: Path, seed: int = 0, sizes=None, feed_forward: str = "relu",
                  docid_scale: float = 0.25, norm_spread: float = 0.1, beams=(4, 16), commit=None) -> dict:
    import torch
    import transformers

    z = sizes if sizes is not None else argparse.Namespace(**DEFAULTS)
    LexicalRipor = _import_pag(repo)
    base, L, K = z.base_vocab, z.levels, z.codes
    V = base + L * K
    torch.manual_seed(seed)
    config = transformers.T5Config(vocab_size=V, d_model=z.d_model, d_kv=z.d_kv, d_ff=z.d_ff,
                                   num_layers=z.encoder_layers, num_decoder_layers=z.decoder_layers,
                                   num_heads=z.heads, dropout_rate=0.0, feed_forward_proj=feed_forward,
                                   decoder_start_token_id=0, tie_word_embeddings=True)
    hf = transformers.T5ForConditionalGeneration(config)
    with torch.no_grad():
        hf.shared.weight[base:].mul_(docid_scale)
        for name, p in hf.named_parameters():
            if "layer_norm" in name and norm_spread:
                p.copy_(1.0 + norm_spread * torch.randn_like(p))
    rng = np.random.default_rng(seed + 200)
    regular = (3, base - z.sentinels)
    docs = [rng.integers(*regular, int(rng.integers(z.doc_max // 2, z.doc_max))) for _ in range(z.docs)]
    gold = rng.integers(0, z.docs, z.queries)
    queries = []
    for q, d in enumerate(gold):
        n = 2 if q < z.short_queries else int(rng.integers(3, min(len(docs[d]), 9)))
        start = int(rng.integers(0, len(docs[d]) - n + 1))
        queries.append(docs[d][start:start + n].copy())
    codes = rng.integers(0, K, (z.docs, L))
    pairs = rng.choice(z.docs, (z.collisions, 2), replace=False) if z.collisions else np.zeros((0, 2), np.int64)
    for a, b in pairs:
        codes[b] = codes[a]
    docid_tokens = base + np.arange(L) * K + codes
    q_ids, q_mask = _batch(queries)
    d_ids, d_mask = _batch(docs)

    with atomic_dir(out) as tmp:
        hf.save_pretrained(str(tmp / "model"))
        model = LexicalRipor.from_pretrained(str(tmp / "model"))
        model.eval()
        net = model.base_model
        net.set_attn_implementation("eager")
        with torch.no_grad():
            net.mode = "lex_retrieval"
            rep_q = model.encode(input_ids=torch.tensor(q_ids), attention_mask=torch.tensor(q_mask),
                                 decoder_input_ids=torch.tensor(q_ids))[0]
            rep_d = model.encode(input_ids=torch.tensor(d_ids), attention_mask=torch.tensor(d_mask),
                                 decoder_input_ids=torch.tensor(d_ids))[0]
            sorted_d = torch.sort(rep_d[:, :base], dim=-1, descending=True)
            set_ids = sorted_d.indices[:, :z.m]
            s_lex = rep_q[:, set_ids].sum(-1)  # [Q, D]
            planning = torch.topk(s_lex, z.planning)
            prefixes = sorted({tuple(r[:t]) for r in docid_tokens.tolist() for t in range(L)},
                              key=lambda p: (len(p), p))
            row_of = {p: i for i, p in enumerate(prefixes)}
            net.mode = "smt_retrieval"
            prefix_logits = np.zeros((z.queries, len(prefixes), V), np.float32)
            for t in range(L):
                group = [p for p in prefixes if len(p) == t]
                for q in range(z.queries):
                    dec = np.concatenate([np.repeat(q_ids[q:q + 1], len(group), 0),
                                          np.zeros((len(group), 1), np.int64),
                                          np.array(group, np.int64).reshape(len(group), t)], 1)
                    o = net(input_ids=torch.tensor(np.repeat(q_ids[q:q + 1], len(group), 0)),
                            attention_mask=torch.tensor(np.repeat(q_mask[q:q + 1], len(group), 0)),
                            decoder_input_ids=torch.tensor(dec), return_dict=True)
                    prefix_logits[q, [row_of[p] for p in group]] = o.logits[:, -1].numpy()
            step0 = np.stack([net(input_ids=torch.tensor(np.array(queries[q].tolist() + [1])[None]),
                                  decoder_input_ids=torch.tensor(np.array(queries[q].tolist() + [1, 0])[None]),
                                  return_dict=True).logits[0, -1].numpy() for q in range(z.queries)])
        seq = np.zeros((z.queries, z.docs), np.float32)
        for q in range(z.queries):
            for d in range(z.docs):
                total = np.float32(0)
                for t in range(L):
                    total = np.float32(total + prefix_logits[q, row_of[tuple(docid_tokens[d, :t])], docid_tokens[d, t]])
                seq[q, d] = total
        s_np, plan_idx, plan_val = s_lex.numpy(), planning.indices.numpy(), planning.values.numpy()
        set_margin = float((sorted_d.values[:, z.m - 1] - sorted_d.values[:, z.m]).min())
        plan_margin = float(np.min(np.sort(s_np, 1)[:, ::-1][:, z.planning - 1] - np.sort(s_np, 1)[:, ::-1][:, z.planning]))
        docs_of = {}
        for d, r in enumerate(docid_tokens.tolist()):
            docs_of.setdefault(tuple(r), []).append(str(d))
        decoder_length = q_ids.shape[1] + 1 + L
        per_query, min_sel, finals = [], np.inf, []
        for q in range(z.queries):
            planned_docs = [int(d) for d in plan_idx[q]]
            planned = {}
            for d in planned_docs:
                planned.setdefault(tuple(docid_tokens[d].tolist()), []).append(d)
            lex_of = {tok: max(float(s_np[q, d]) for d in ds) for tok, ds in planned.items()}
            runs = {}
            for B in beams:
                for guided in (True, False):
                    steps, final, margin = replay(lambda p: prefix_logits[q, row_of[p]], planned,
                                                  {d: float(s_np[q, d]) for d in planned_docs}, B, L,
                                                  decoder_length, guided)
                    min_sel = min(min_sel, margin)
                    with_lex, raw_only = {}, {}
                    for tokens, raw_sum, rel, normalised in final:
                        for d in docs_of[tuple(tokens)]:
                            with_lex[d] = rel + lex_of[tuple(tokens)]
                            raw_only[d] = rel if guided else normalised * L
                    rank = lambda run: sorted(run.items(), key=lambda kv: kv[1], reverse=True)  # noqa: E731
                    run = {"steps": steps, "final_hypotheses": [
                        {"tokens": tokens, "codes": [int(c) for c in (np.array(tokens) - base - np.arange(L) * K)],
                         "raw_sum": raw_sum, "length_normalised_fp32": normalised,
                         "lex_bonus": lex_of[tuple(tokens)], "docs": docs_of[tuple(tokens)]}
                        for tokens, raw_sum, rel, normalised in final]}
                    if guided:
                        run["ranking_pag"], run["ranking_pag_no_final_lex"] = rank(with_lex), rank(raw_only)
                    else:
                        run["ranking_raw_plus_lex"], run["ranking_lexical_condition"] = rank(with_lex), rank(raw_only)
                    finals += sorted({v for v in with_lex.values()})
                    runs[f"beam{B}_{'guided' if guided else 'unguided'}"] = run
            per_query.append({"query": q, "planning_set": [[str(d), float(s_np[q, d])] for d in planned_docs],
                              "runs": runs})
        if min(set_margin, plan_margin, min_sel) < MIN_GAP:
            raise ValueError(f"seed {seed}: a set docid, planning or beam decision gap below {MIN_GAP}; pick another")
        decoding = {"max_new_tokens": L, "decoder_length_at_finalize": decoder_length, "length_penalty": 1.0,
                    "planning_set_size": z.planning, "beams": list(beams), "pooling": "max", "per_query": per_query}
        meta = {"method": "PAG (LexicalRipor / T5ForLexicalSemanticGeneration): lexical planning + lexically-guided "
                          "sequential decoding (replayed)", "repo": "HansiZeng/PAG", "commit": commit or git_commit(repo),
                "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                             "numpy": np.__version__},
                "model_seed": seed, "data_seed": seed + 200, "feed_forward": feed_forward,
                "weight_init": f"HF init after torch.manual_seed({seed}); docid rows of the embedding × {docid_scale}; "
                               f"layer norms 1 + {norm_spread}·N(0, 1)",
                "tiny_config": {"base_vocab": base, "levels": L, "codes": K, "d_model": z.d_model, "d_kv": z.d_kv,
                                "d_ff": z.d_ff, "enc_layers": z.encoder_layers, "dec_layers": z.decoder_layers,
                                "heads": z.heads, "vocab": V},
                "sizes": vars(z), "n_queries": z.queries, "n_docs": z.docs, "m": z.m, "planning_set_size": z.planning,
                "beams": list(beams), "query_lengths": [len(q) + 1 for q in queries],
                "unique_smtids": len(docs_of), "n_prefixes": len(prefixes),
                "checks": {"min_set_docid_boundary_gap": set_margin, "min_planning_boundary_gap": plan_margin,
                           "min_beam_selection_margin": float(min_sel)},
                "command": " ".join(["python tools/pag_fixtures.py --pag_repo PAG", f"--out {out}"]
                                    + [f"--{k} {v}" for k, v in sorted(vars(z).items()) if DEFAULTS.get(k) != v]
                                    + ([f"--feed_forward {feed_forward}"] if feed_forward != "relu" else [])
                                    + ([f"--docid_scale {docid_scale}"] if docid_scale != 0.25 else [])
                                    + ([f"--norm_spread {norm_spread}"] if norm_spread != 0.1 else [])
                                    + ([f"--beams {' '.join(map(str, beams))}"] if list(beams) != [4, 16] else [])
                                    + ([f"--commit {commit}"] if commit else [])
                                    + ([f"--seed {seed}"] if seed else []))}
        np.savez(tmp / "inputs.npz", query_input_ids=q_ids, query_attention_mask=q_mask, query_gold_doc=gold,
                 doc_input_ids=d_ids, doc_attention_mask=d_mask, rq_codes=codes, docid_token_ids=docid_tokens,
                 forced_collision_pairs=pairs)
        prefix_rows = np.full((len(prefixes), L), -1, np.int64)
        for i, p in enumerate(prefixes):
            prefix_rows[i, :len(p)] = p
        np.savez(tmp / "outputs.npz", query_lex_rep=rep_q.numpy(), doc_lex_rep=rep_d.numpy(),
                 doc_set_ids=set_ids.numpy(), s_lex=s_np, planning_doc_idx=plan_idx, planning_scores=plan_val,
                 prefix_tokens=prefix_rows, prefix_len=np.array([len(p) for p in prefixes], np.int64),
                 prefix_logits=prefix_logits, seq_score_all_docs=seq, step0_logits_unpadded=step0)
        write = lambda name, obj: (tmp / name).write_text(json.dumps(obj, indent=1) + "\n")  # noqa: E731
        write("smt_docid_to_tokenids.json", {str(d): r for d, r in enumerate(docid_tokens.tolist())})
        write("lex_docid_to_tokenids.json", {str(d): r for d, r in enumerate(set_ids.tolist())})
        write("lex_run.json", {str(q): {str(d): float(v) for d, v in zip(plan_idx[q], plan_val[q])}
                               for q in range(z.queries)})
        write("decoding.json", decoding)
        write("meta.json", meta)
    return meta


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pag_repo", required=True, help="a working tree of HansiZeng/PAG (its t5_pretrainer/)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=cli.natural, default=0)
    parser.add_argument("--commit", help="the commit of --pag_repo when it is not a git working tree")
    parser.add_argument("--feed_forward", choices=("relu", "gated-gelu"), default="relu")
    parser.add_argument("--docid_scale", type=cli.positive, default=0.25)
    parser.add_argument("--norm_spread", type=cli.nonnegative, default=0.1)
    parser.add_argument("--beams", type=cli.count, nargs="+", default=[4, 16])
    for name, default in DEFAULTS.items():
        kind = cli.natural if name in ("short_queries", "collisions") else cli.count
        parser.add_argument(f"--{name}", type=kind, default=default)
    args = parser.parse_args(argv)
    cli.setup_logging()
    problems = [msg for bad, msg in (
        (args.planning > args.docs, "--planning ≤ --docs"), (args.m >= args.base_vocab - args.sentinels - 3,
                                                              "--m < the regular tokens (--base_vocab − --sentinels − 3)"),
        (args.doc_max < 6, "--doc_max ≥ 6"), (args.collisions * 2 > args.docs, "--collisions ≤ --docs / 2"),
        (args.short_queries > args.queries, "--short_queries ≤ --queries"),
        (max(args.beams) > args.planning, "every --beams ≤ --planning")) if bad]
    if problems:
        parser.error("; ".join(problems))
    repo = Path(args.pag_repo)
    if not (repo / "t5_pretrainer" / "modeling" / "t5_generative_retriever.py").is_file():
        sys.stderr.write(f"{repo}: not a PAG checkout (no t5_pretrainer/modeling/t5_generative_retriever.py; git "
                         "clone https://github.com/HansiZeng/PAG)\n")
        return 2
    sizes = argparse.Namespace(**{k: getattr(args, k) for k in DEFAULTS})
    try:
        meta = write_fixture(repo, Path(args.out), args.seed, sizes, args.feed_forward, args.docid_scale,
                             args.norm_spread, tuple(args.beams), args.commit)
    except (ValueError, OSError, RuntimeError) as e:
        sys.stderr.write(f"{e}\n")
        return 2
    sys.stdout.write(json.dumps({"out": args.out, **meta["checks"], "unique_smtids": meta["unique_smtids"]}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
