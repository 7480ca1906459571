"""PAG benchmarks in the shape of Table 4 of 004_pag_lost_in_decoding.txt: set-docid size m × beam k → index
memory, simultaneous (planner) latency, sequential latency, and effectiveness of Seq-only / SimulOnly / PAG;
plus the search error of decoding without and with the look-ahead bonus. Prints one JSON line per row and
replaces its section of BENCHMARKS.md.

    python tools/bench_pag.py --model_dir runs/demo_pag          # demo part: the trained demo PAG
    python tools/bench_pag.py --synthetic 1000000                # synthetic index part
    python tools/bench_pag.py --model_dir runs/demo_pag --synthetic 1000000
    python tools/bench_pag.py --model_dir runs/demo_pag --latency_only   # memory and latency only (a minute)

(demo) the model of experiments/demo/pag.gin (train it first: README "The methods and protocols as commands"), its test queries; set docids
    re-made at each m as the top-m TF-IDF ids (the model was trained at m = 16; the paper likewise truncates
    the released m = 64 lists for m ∈ {16, 32}). Effectiveness (MRR@10, Hit@10) of the three modes; ms/query of
    the planner (s_simul + top-n) and of the whole search; search error on 200 queries: Seq-only against the
    exact best docid by the raw sequential score over the whole corpus; PAG without the bonus (planning-set
    trie) and with it, both against the exact best docid by PAG's final score (raw sum + max s_simul of its
    planned documents) over the planning set — what the bonus repairs is the difference of the last two.
(synthetic) a tiny random T5, N random sequential docids (M 8 × K 2048 above T5's 32000-id text vocabulary) and
    random set docids of m distinct ids, at query_terms 0 (every positive weight of the random network: the dense
    product) and 32 (query-term pruning, the sparse queries of a trained planner: the inverted index): index
    memory (trie; set docids + order keys; inverted index; per-document trie paths; per-document docids and docid
    order, which the planning sets' trie reads), the planner's ms/query beside the dense product's on the same
    queries and whether both planned the same sets with the same scores, Seq-only and PAG ms/query at k 10 and
    100, and their ratio (target ≤ 1.3); beside them PAG over the corpus trie with bonus tables (the search
    before `methods.pag.planned`) and whether it returns the same docids (`--no_corpus_trie` leaves it out).
Latencies are CPU figures of this machine, 8 queries a batch, every contender warmed up; only ratios carry
over to other hardware. `--runtime entry` (default) runs JAX as the entry points do (`python -m gr_jax.infer`:
synchronous CPU dispatch, freed memory kept: `host_memory.as_entry_points`); `--runtime jax` with
JAX's defaults (the rows before 2026-11-27).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.runtime import cli, host_memory
from gr_jax.runtime.cli import setup_logging
from gr_jax.evaluation.report import benchmark_writer

ROOT = Path(__file__).resolve().parents[1]
LOG = logging.getLogger("gr_jax.bench_pag")
ROWS: list[dict] = []
MS = (16, 32, 64, 128)
BEAMS = (10, 100)
QUERY_TERMS = (0, 32)  # planner_query_terms of the synthetic rows: 0 = every weight of the random network


def emit(**row):
    ROWS.append(row)
    sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.flush()


def timed(fn, repeats: int = 3, what: str = "call") -> float:
    """The best of `repeats` warm calls (seconds); the first call, compilation included, is logged."""
    return timed_in_turns({what: fn}, repeats)[what]


def timed_in_turns(fns: dict, repeats: int = 5, what: str = "") -> dict:
    """Per contender the best of `repeats` warm calls (seconds), the contenders taking turns in every round, so
    that a shared machine's drift reaches them alike; each first call, compilation included, is logged."""
    for name, fn in fns.items():
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        LOG.info("%s%s: first call (compilation included) %.1f s", what, name, time.perf_counter() - t0)
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def _search_corpus_trie(model, params, q, index, k):
    """PAG as it searched before the planning sets' own trie (`methods.pag.planned`): the planner, the bonus
    tables, then the corpus trie with every unplanned node at −inf (`searcher(...).search(query_state=...)`)."""
    model.mode = "pag"
    state = model.query_state(params, q, index)
    res = model.searcher(k, True).search(params, model._queries(q), index.device(), query_state=state)
    return res, state


def _same_as_corpus_trie(model, params, q, index, k) -> bool:
    """Whether PAG returns the same docids in the same order as over the corpus trie, with final scores equal to
    float32 rounding (the same logits from dots of another shape)."""
    model.mode = "pag"
    res, state = model.beams_and_state(params, q, index, k)
    got = jax.device_get((res.leaf_ids, res.valid, model.final_scores(res, state)))
    res, state = _search_corpus_trie(model, params, q, index, k)
    want = jax.device_get((res.leaf_ids, res.valid, model.final_scores(res, state)))
    v = want[1]
    return bool(np.array_equal(got[1], v) and np.array_equal(got[0][v], want[0][v]) and np.allclose(
        got[2][v], want[2][v], rtol=0, atol=1e-5 * max(1.0, float(np.abs(want[2][v]).max(initial=0.0)))))


def _index_mb(model, index, table) -> dict:
    set_ids = table.extras["set_ids"]
    paths = model._doc_paths(index)
    return {"trie_MB": round(index.nbytes / 1e6, 1),
            "set_index_MB": round((set_ids.nbytes + table.extras["order_key"].nbytes) / 1e6, 1),
            "postings_MB": round(model._postings.nbytes / 1e6, 1) if model._postings is not None else 0.0,
            "paths_MB": round(sum(int(np.prod(p.shape)) * 4 for p in paths) / 1e6, 1),
            "docids_MB": round(sum(int(np.prod(a.shape)) * 4 for a in model._docids) / 1e6, 1)}


def _search(model, params, q, index, k, mode):
    model.mode = mode
    res, state = model.beams_and_state(params, q, index, k)
    return model.final_scores(res, state) if state is not None else res.scores


# ----------------------------------------------------------------------------------------------------------
# synthetic index
# ----------------------------------------------------------------------------------------------------------


def bench_synthetic(n: int, n_queries: int = 8, planning: int = 1000, query_terms=QUERY_TERMS, ms=MS,
                    beams=BEAMS, corpus_trie: bool = True):
    from gr_jax.docids.base import DocidTable
    from gr_jax.methods.pag.docids import order_keys
    from gr_jax.methods.pag import model_planner
    from gr_jax.backbones import t5
    from gr_jax.methods.pag import model as pag
    from gr_jax.data.vocab import DocidTokenSpace

    M, K, base = 8, 2048, 32000  # base: T5's sentencepiece vocabulary, the planning vocabulary
    rng = np.random.default_rng(0)
    codes = np.unique(rng.integers(0, K, (int(n * 1.01) + 16, M), dtype=np.int32), axis=0)
    codes = codes[rng.permutation(len(codes))[:n]]
    seqs = (base + K * np.arange(M)[None] + codes).astype(np.int32)
    set_all = rng.integers(3, base, (n, max(MS)), dtype=np.int32)
    keys = order_keys([f"d{i}" for i in range(n)])
    config = t5.get_config("tiny", dropout_rate=0.0).replace(vocab_size=base + M * K)
    space = DocidTokenSpace("text", M * K, offset=base, length=M)
    q = jnp.asarray(rng.integers(3, base, (n_queries, 16)), jnp.int32)
    index = None
    for m in ms:
        ids = np.sort(set_all[:, :m], axis=1)
        ids[:, 1:][ids[:, 1:] == ids[:, :-1]] = -1  # distinct ids, as a top-m list has: a repeat is padding
        table = DocidTable(seqs, np.full(n, M, np.int32), np.arange(n), space,
                           extras={"set_ids": ids, "order_key": keys})
        if index is None:
            t0 = time.perf_counter()
            index = table.index(vocab_size=config.vocab_size)
            build_s = time.perf_counter() - t0
        for terms in query_terms:
            model = pag.PagRetriever(config, planning_size=planning, planner_query_terms=terms)
            params = model.init_params(0)
            model.use_docids(table)
            t0 = time.perf_counter()
            model._planner_arrays()  # builds the inverted index
            postings_s = time.perf_counter() - t0
            mem = _index_mb(model, index, table)
            rep = model.query_rep(model.lexical_rep(params, q))
            postings = model._planner_arrays()[2]
            budgets = model_planner.budgets_for(model.planner_postings, base)
            # no postings: the planner chose the dense product for this corpus (a small one)
            took = postings is not None and bool(model_planner.inverted_fits(rep, postings[1], budgets)) and bool(
                model_planner.inverted_plan(rep, model.set_ids, postings, planning, budgets)[2])  # exact: no fallback
            fired = np.asarray((rep[:, :base] > 0).sum(axis=1))
            tag = f"m {m}, query_terms {terms}"
            simul = timed(lambda: model.plan(params, q), what=f"{tag}: planner") / n_queries * 1e3
            got = jax.device_get(model.plan(params, q))
            model.planner_postings = 0
            model.use_docids(table)
            dense = timed(lambda: model.plan(params, q), what=f"{tag}: dense product") / n_queries * 1e3
            want = jax.device_get(model.plan(params, q))
            same = all(set(a.tolist()) == set(b.tolist()) for a, b in zip(got[0], want[0]))
            same_scores = all(np.array_equal(np.sort(a), np.sort(b)) for a, b in zip(got[1], want[1]))
            model.planner_postings = 1 << 17
            model.use_docids(table)
            for k in beams:
                fns = {"Seq-only": lambda: _search(model, params, q, index, k, "seq_only"),
                       "PAG": lambda: _search(model, params, q, index, k, "pag")}
                if corpus_trie:
                    fns["PAG over the corpus trie"] = lambda: model.final_scores(
                        *_search_corpus_trie(model, params, q, index, k))
                t = timed_in_turns(fns, what=f"{tag}, beam {k}: ")
                seq, full = t["Seq-only"] / n_queries * 1e3, t["PAG"] / n_queries * 1e3
                extra = {} if not corpus_trie else dict(
                    pag_over_corpus_trie_ms=round(t["PAG over the corpus trie"] / n_queries * 1e3, 2),
                    same_docids_as_corpus_trie=_same_as_corpus_trie(model, params, q, index, k))
                emit(figure="synthetic", docs=n, m=m, query_terms=terms, fired_per_query=int(fired.mean()), k=k,
                     n=planning, **mem, trie_build_s=round(build_s, 1), postings_build_s=round(postings_s, 1),
                     planner="inverted" if took else "dense", dense_planner_ms_per_query=round(dense, 2),
                     simul_ms_per_query=round(simul, 2), same_planning_sets=same and same_scores,
                     seq_only_ms_per_query=round(seq, 2), pag_ms_per_query=round(full, 2),
                     pag_over_seq_only=round(full / seq, 3), **extra)


# ----------------------------------------------------------------------------------------------------------
# the trained demo
# ----------------------------------------------------------------------------------------------------------


def bench_demo(model_dir: str, n_eval: int, n_search_error: int, latency_only: bool = False):
    import gin

    from gr_jax import compose
    from gr_jax.runtime import gin_utils
    from gr_jax.data.pipeline import tokenize
    from gr_jax.decoding import rankers
    from gr_jax.docids.base import DocidTable
    from gr_jax.methods.pag.docids import tfidf_set_ids
    from gr_jax.evaluation.metrics import evaluate

    gin.clear_config()
    gin_utils.register_configurables()
    gin_utils.parse(["experiments/demo/pag.gin"], [f"MODEL_DIR = '{model_dir}'"])
    setup, params, step = compose.restore(model_dir)
    model, ds, base_table = setup.model, setup.dataset, setup.table
    index = setup.index
    queries, qrels = ds.queries["test"], ds.qrels["test"]
    qids = sorted(q for q in queries.qids if q in qrels)[:n_eval]
    text_of = dict(zip(queries.qids, queries.texts))
    tokens = tokenize([text_of[q] for q in qids], setup.vocab, setup.feature_lengths["inputs"])
    doc_tokens = [setup.vocab.encode(t) for t in ds.corpus.texts]
    doc_ids = list(ds.corpus.doc_ids)
    B = 8

    def run_of(mode, k):
        model.mode = mode
        run = {}
        for lo in range(0, len(qids), 64):
            q, d, s = model.rank(params, tokens[lo:lo + 64], index, k)
            for b, ranked in enumerate(rankers.per_query(q, d, s, len(tokens[lo:lo + 64]), doc_ids)):
                run[qids[lo + b]] = {doc_ids[r]: sc for r, sc in ranked}
        return evaluate(run, {x: qrels[x] for x in qids}, ("MRR@10", "Hit@10"))

    q8 = jnp.asarray(tokens[:B])
    seq_only = {} if latency_only else {k: run_of("seq_only", k) for k in BEAMS}  # no planner: same at every m
    for m in MS:
        set_ids = tfidf_set_ids(doc_tokens, setup.scheme._idf, m)
        t = base_table
        table = DocidTable(t.sequences, t.lengths, t.doc_rows, t.space,
                           extras={"set_ids": set_ids[t.doc_rows], "order_key": t.extras["order_key"]})
        model.use_docids(table)
        model._planner_arrays()  # builds the inverted index
        mem = _index_mb(model, index, table)
        model.mode = "pag"
        simul = timed(lambda: model.plan(params, q8)) / B * 1e3
        simul_only = None if latency_only else run_of("simul_only", 10)
        for k in BEAMS:
            seq_ms = timed(lambda: _search(model, params, q8, index, k, "seq_only")) / B * 1e3
            pag_ms = timed(lambda: _search(model, params, q8, index, k, "pag")) / B * 1e3
            row = dict(figure="demo_latency" if latency_only else "demo", step=step, queries=len(qids), m=m, k=k,
                       n=model.planning_size, **mem, simul_ms_per_query=round(simul, 2),
                       seq_ms_per_query=round(seq_ms, 2), pag_ms_per_query=round(pag_ms, 2),
                       pag_over_seq_only=round(pag_ms / seq_ms, 3))
            if not latency_only:
                seq_m, pag_m = seq_only[k], run_of("pag", k)
                row.update(seq_only_mrr10=round(seq_m["MRR@10"], 4), simul_only_mrr10=round(simul_only["MRR@10"], 4),
                           pag_mrr10=round(pag_m["MRR@10"], 4), seq_only_hit10=round(seq_m["Hit@10"], 4),
                           simul_only_hit10=round(simul_only["Hit@10"], 4), pag_hit10=round(pag_m["Hit@10"], 4))
                row.update(_search_errors(model, params, tokens[:n_search_error], index, k))
            emit(**row)


def _search_errors(model, params, tokens, index, k) -> dict:
    """Search error of Seq-only (raw objective, whole corpus) and of PAG without / with the bonus (PAG's final
    objective over the planning set), on the same queries."""
    from gr_jax.decoding.exhaustive import search_error
    from gr_jax.methods.pag import model as pag

    model.mode = "pag"
    searcher = model.searcher(k)
    out = {"seq_only": [], "unguided": [], "guided": []}
    for lo in range(0, len(tokens), 8):
        q = jnp.asarray(tokens[lo:lo + 8])
        raw = searcher.exhaustive_scores(params, q, index)  # [B, leaves], raw sums
        state = model.query_state(params, q, index)
        leaves = jnp.arange(raw.shape[1], dtype=jnp.int32)[None].repeat(q.shape[0], 0)
        bonus = np.asarray(pag.leaf_bonus(leaves, state))
        planned_leaf = np.zeros(raw.shape, bool)
        doc_leaf = np.asarray(model._doc_paths(index)[1])
        rows = np.asarray(state["planned"])
        for b in range(q.shape[0]):
            planned_leaf[b, doc_leaf[rows[b]]] = True
        final = np.where(planned_leaf, raw + bonus, -np.inf)
        model.mode = "seq_only"
        seq = jax.device_get(model.beams_and_state(params, q, index, k)[0])
        model.mode = "pag"
        unguided = jax.device_get(model.beams_and_state(params, q, index, k, guided=False)[0])
        guided = jax.device_get(model.beams_and_state(params, q, index, k, guided=True)[0])
        for name, res, exact in (("seq_only", seq, raw), ("unguided", unguided, final), ("guided", guided, final)):
            out[name].append(search_error(np.where(res.valid, res.leaf_ids, -1), exact) * q.shape[0])
    n = len(tokens)
    return {"search_error_seq_only": round(sum(out["seq_only"]) / n, 4),
            "search_error_pag_no_bonus": round(sum(out["unguided"]) / n, 4),
            "search_error_pag": round(sum(out["guided"]) / n, 4)}


def _write(command: str, path: Path, runtime: str):
    from gr_jax.evaluation.report import benchmark_section

    how = "as the entry points (synchronous dispatch, freed memory kept)" if runtime == "entry" else "JAX defaults"
    header = (f"device: {jax.devices()[0].platform.upper()}, {jax.device_count()} device(s); runtime: {how}; "
              f"command: `{command}`")
    with benchmark_writer(path, "bench_pag") as f:
        f.write(benchmark_section("bench_pag", header, ROWS))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_dir", help="the trained demo PAG (experiments/demo/pag.gin)")
    parser.add_argument("--synthetic", type=cli.natural, default=0, help="documents of the synthetic index (0: skip)")
    parser.add_argument("--m", type=cli.count, nargs="+", default=list(MS), help="set-docid sizes of the rows")
    parser.add_argument("--query_terms", type=cli.natural, nargs="+", default=list(QUERY_TERMS),
                        help="planner_query_terms of the synthetic rows (0: every weight of the random network)")
    parser.add_argument("--beams", type=cli.count, nargs="+", default=list(BEAMS),
                        help="beam sizes k of the synthetic rows")
    parser.add_argument("--eval_queries", type=cli.count, default=2000)
    parser.add_argument("--search_error_queries", type=cli.count, default=200)
    parser.add_argument("--latency_only", action="store_true",
                        help="demo part: memory and latency only (no effectiveness, no search error)")
    parser.add_argument("--no_corpus_trie", action="store_true",
                        help="synthetic part: leave out PAG over the corpus trie (the search before the planning "
                             "sets' own trie), which compiles a third search per row")
    parser.add_argument("--no_write", action="store_true", help="print JSON lines only, do not touch BENCHMARKS.md")
    parser.add_argument("--runtime", choices=("entry", "jax"), default="entry",
                        help="entry: as the entry points run JAX (synchronous CPU dispatch, freed memory kept); "
                             "jax: JAX's defaults")
    args = parser.parse_args(argv)
    setup_logging()
    with host_memory.as_entry_points() if args.runtime == "entry" else contextlib.nullcontext():
        return _main(parser, args, argv)


def _main(parser, args, argv) -> int:
    if not args.model_dir and not args.synthetic:
        parser.error("give --model_dir, --synthetic N, or both")
    if args.model_dir and not (Path(args.model_dir) / "checkpoints").is_dir():
        sys.stderr.write(f"error: {args.model_dir} holds no checkpoints/: train experiments/demo/pag.gin first\n")
        return 2
    if args.model_dir:
        bench_demo(args.model_dir, args.eval_queries, args.search_error_queries, args.latency_only)
    if args.synthetic:
        bench_synthetic(args.synthetic, query_terms=tuple(args.query_terms), ms=tuple(args.m), beams=tuple(args.beams),
                        corpus_trie=not args.no_corpus_trie)
    if not args.no_write:
        _write("python tools/bench_pag.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               ROOT / "BENCHMARKS.md", args.runtime)
    return 0


if __name__ == "__main__":
    sys.exit(main())
