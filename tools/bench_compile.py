"""Compile time of constrained searches, scanned layer stacks beside the unrolled layers, in one run.

Each row times a search's first call (tracing, compilation and one search) and its best warm call on the same
inputs; compile_s = first − warm. Both variants return the same docids (checked: same_docids). Random weights:
compile time and speed do not depend on their values.

* fewshot_bank: SmolLM2-135M's shape (30 layers), a bank of random docids of 3–14 tokens + the newline (depth
  15, the Few-Shot GR bank's), a shared 60-token prefix, 8 queries of 40 tokens, beam 10 (Few-Shot GR's
  retrieval: `methods/fewshot`, issue 32's "new bank" compile).
* t5_search: T5 configs (tiny / t5_small / t5_base), 10k random docids of 4 tokens, 16 queries, beam 10;
  two rounds in alternating order, the best compile of each variant.

    python tools/bench_compile.py                       # both, appends a section to BENCHMARKS.md
    python tools/bench_compile.py --only fewshot_bank --no_write
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax import cli
from gr_jax.cli import setup_logging

ROOT = Path(__file__).resolve().parents[1]
ROWS: list[dict] = []


def emit(**row):
    ROWS.append(row)
    sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.flush()


def _first_and_warm(fn, repeats: int = 2):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    warm = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        warm = min(warm, time.perf_counter() - t0)
    return out, first, warm


def bench_fewshot_bank(n_docs: int, n_queries: int = 8, beams: int = 10):
    from gr_jax.index.trie import TrieIndex
    from gr_jax.models import llama
    from gr_jax.models.search import Searcher

    config = llama.get_config("smollm2_135m")
    params = llama.init_params(config, seed=0)
    rng = np.random.default_rng(0)
    newline = 198  # SmolLM2's "\n"
    docids = [list(rng.integers(300, 2000, int(rng.integers(3, 15)))) + [newline] for _ in range(n_docs)]
    trie = TrieIndex.build(docids, vocab_size=config.vocab_size).device()
    queries = rng.integers(3, 3000, (n_queries, 40)).astype(np.int32)
    prompt = rng.integers(3, 3000, 60)
    results = {}
    for scan in (True, False):
        model = llama.Llama(config, scan_layers=scan)
        state = {"lm": params, "prefix": llama.prefix_cache(model, params, prompt)}

        def cache_fn(p, q, max_length, model=model):
            B, T = q.shape
            c = model.apply({"params": p["lm"]}, B, T + max_length + 1, p["prefix"], method=llama.Llama.init_cache)
            return model.apply({"params": p["lm"]}, c, jnp.maximum(q, 0), q >= 0, method=llama.Llama.prefill_hidden)[1]

        def step_fn(p, c, tokens, model=model):
            return model.apply({"params": p["lm"]}, c, tokens, method=llama.Llama.decode_step)

        searcher = Searcher(step_fn, cache_fn, start_token=28, eos_id=newline, vocab_size=config.vocab_size,
                            num_beams=beams, tile_fn=lambda c, n: c.repeat(n), mesh=None,
                            params_fn=(lambda p: {**p, "lm": llama.with_stacked_layers(p["lm"], config)}) if scan
                            else None)  # as methods/fewshot's searcher
        out, first, warm = _first_and_warm(lambda: searcher.search(state, queries, trie))
        results[scan] = (np.asarray(out.tokens), first, warm)
    _rows("fewshot_bank", "smollm2_135m", config.num_layers, n_docs, trie.depth, beams, results)


def bench_t5_search(name: str, n_docs: int = 10_000, n_queries: int = 16, beams: int = 10):
    from gr_jax.index.trie import TrieIndex
    from gr_jax.models import t5
    from gr_jax.models.search import T5Searcher

    config = t5.get_config(name, dropout_rate=0.0).replace(vocab_size=2048 + 128)
    params = t5.init_params(config, seed=0)
    rng = np.random.default_rng(3)
    docids = np.unique(rng.integers(3, 2048, (int(n_docs * 1.02) + 16, 4)), axis=0)[:n_docs]
    trie = TrieIndex.build(docids, vocab_size=config.vocab_size).device()
    queries = rng.integers(3, 2048, (n_queries, 32)).astype(np.int32)
    results = {}
    # two rounds in alternating order, a new searcher (a new compilation) each time: the first compilation of a
    # process pays one-time costs that would otherwise fall on whichever variant runs first; the best is kept
    for order in ((True, False), (False, True)):
        for scan in order:
            searcher = T5Searcher(t5.T5(config, scan_layers=scan), num_beams=beams, mesh=None)
            out, first, warm = _first_and_warm(lambda: searcher.search(params, queries, trie))
            if scan not in results or first - warm < results[scan][1] - results[scan][2]:
                results[scan] = (np.asarray(out.tokens), first, warm)
    _rows("t5_search", name, config.num_layers, n_docs, trie.depth, beams, results)


def _rows(figure, model, layers, docs, depth, beams, results):
    same = bool(np.array_equal(results[True][0], results[False][0]))
    for scan in (True, False):
        _, first, warm = results[scan]
        emit(figure=figure, model=model, layers=layers, docids=docs, depth=depth, beam=beams,
             layers_scanned=scan, first_call_s=round(first, 2), warm_s=round(warm, 3),
             compile_s=round(first - warm, 2), same_docids=same)
    (_, f1, w1), (_, f0, w0) = results[True], results[False]
    emit(figure=figure + "_ratio", model=model, compile_unrolled_over_scanned=round((f0 - w0) / (f1 - w1), 2),
         warm_scanned_over_unrolled=round(w1 / w0, 3))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=["fewshot_bank", "t5_search"])
    parser.add_argument("--bank_docs", type=cli.count, default=2000)
    parser.add_argument("--t5", nargs="+", default=["tiny", "t5_small"], help="T5 configs of the t5_search rows")
    parser.add_argument("--no_write", action="store_true")
    args = parser.parse_args(argv)
    setup_logging()
    parts = set(args.only or ["fewshot_bank", "t5_search"])
    if "fewshot_bank" in parts:
        bench_fewshot_bank(args.bank_docs)
    if "t5_search" in parts:
        for name in args.t5:
            bench_t5_search(name)
    if not args.no_write:
        from gr_jax.evaluation.report import benchmark_section

        command = ("python tools/bench_compile.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
        header = f"device: {jax.devices()[0].platform.upper()}, {jax.device_count()} device(s); command: `{command}`"
        with (ROOT / "BENCHMARKS.md").open("a") as f:
            f.write(benchmark_section("bench_compile", header, ROWS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
