"""Compile time of constrained searches, scanned layer stacks beside the unrolled layers, in one run.

Each row times a search's first call (tracing, compilation and one search) and its best warm call on the same
inputs; compile_s = first − warm. Both variants return the same docids (checked: same_docids). Random weights:
compile time and speed do not depend on their values.

* fewshot_bank: SmolLM2-135M's shape (30 layers), a bank of random docids of 3–14 tokens + the newline (depth
  15, the Few-Shot GR bank's), a shared 60-token prefix, 8 queries of 40 tokens, beam 10 (Few-Shot GR's
  retrieval: `methods/fewshot`, issue 32's "new bank" compile).
* fewshot_levels: the same bank's search, scanned layers, with its runs of levels scanned beside unrolled.
* t5_search: T5 configs (tiny / t5_small / t5_base), 10k random docids of 4 tokens, 16 queries, beam 10;
  two rounds in alternating order, the best compile of each variant.
* levels: a trie of depth 13 (5000 ragged docids of 4–12 tokens + EOS), T5 configs (`--t5`), 16 queries, beam 10:
  the search with its runs of levels scanned (`scan_levels`, the default) beside every level unrolled.
* dynamic: the dynamic-corpora protocol on the demo (`python -m gr_jax.dynamic`) for each `--dynamic` experiment:
  a model trained `--dynamic_train_steps` steps in runs/bench_compile/<experiment>/ (once; compile time does not
  depend on how well it is trained), then the protocol run again in a fresh process that sums every compilation
  (trace, lowering, XLA) and counts the search's. `--dynamic_baseline <checkout>` runs another checkout's library
  too (e.g. a `git worktree` of an earlier commit), alternating with this one's; each row names its `code`.

    python tools/bench_compile.py                       # all, replaces its section of BENCHMARKS.md
    python tools/bench_compile.py --only fewshot_bank --no_write
    python tools/bench_compile.py --only levels
    python tools/bench_compile.py --only dynamic --dynamic_baseline ../gr_jax_before   # a worktree of the baseline
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.runtime import cli
from gr_jax.runtime.cli import setup_logging
from gr_jax.evaluation.report import benchmark_writer

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


def _fewshot_bank_search(n_docs: int, n_queries: int, beams: int, scan_layers: bool, scan_levels: bool):
    """A search as methods/fewshot's over a bank of random docids: run() → BeamResult, and the trie's depth."""
    from gr_jax.index.trie import TrieIndex
    from gr_jax.backbones import llama
    from gr_jax.retriever.search import Searcher

    config = llama.get_config("smollm2_135m")
    params = llama.init_params(config, seed=0)
    rng = np.random.default_rng(0)
    newline = 198  # SmolLM2's "\n"
    docids = [list(rng.integers(300, 2000, int(rng.integers(3, 15)))) + [newline] for _ in range(n_docs)]
    trie = TrieIndex.build(docids, vocab_size=config.vocab_size).device()
    queries = rng.integers(3, 3000, (n_queries, 40)).astype(np.int32)
    prompt = rng.integers(3, 3000, 60)
    model = llama.Llama(config, scan_layers=scan_layers)
    state = {"lm": params, "prefix": llama.prefix_cache(model, params, prompt)}

    def cache_fn(p, q, max_length):
        B, T = q.shape
        c = model.apply({"params": p["lm"]}, B, T + max_length + 1, p["prefix"], method=llama.Llama.init_cache)
        return model.apply({"params": p["lm"]}, c, jnp.maximum(q, 0), q >= 0, method=llama.Llama.prefill_hidden)[1]

    def step_fn(p, c, tokens):
        return model.apply({"params": p["lm"]}, c, tokens, method=llama.Llama.decode_step)

    searcher = Searcher(step_fn, cache_fn, start_token=28, eos_id=newline, vocab_size=config.vocab_size,
                        num_beams=beams, tile_fn=lambda c, n: c.repeat(n), mesh=None, scan_levels=scan_levels,
                        params_fn=(lambda p: {**p, "lm": llama.with_stacked_layers(p["lm"], config)}) if scan_layers
                        else None)  # as methods/fewshot's searcher
    return (lambda: searcher.search(state, queries, trie)), trie, config


def bench_fewshot_bank(n_docs: int, n_queries: int = 8, beams: int = 10, levels: bool = False):
    """Scanned layers beside unrolled (levels unrolled); with `levels`, the bank's search with its layers scanned
    and its runs of levels scanned beside unrolled."""
    results = {}
    for scan in (True, False):
        run, trie, config = _fewshot_bank_search(n_docs, n_queries, beams, scan_layers=scan or levels,
                                                 scan_levels=scan and levels)
        out, first, warm = _first_and_warm(run)
        results[scan] = (np.asarray(out.tokens), first, warm)
    if levels:
        runs = ";".join(f"{r.start}-{r.stop - 1}:C{r.slots}" for r in trie.run_specs)
        _rows("fewshot_levels", "smollm2_135m", config.num_layers, n_docs, trie.depth, beams, results,
              variant="levels_scanned", extra={"runs": runs})
    else:
        _rows("fewshot_bank", "smollm2_135m", config.num_layers, n_docs, trie.depth, beams, results)


def bench_t5_search(name: str, n_docs: int = 10_000, n_queries: int = 16, beams: int = 10):
    from gr_jax.index.trie import TrieIndex
    from gr_jax.backbones import t5
    from gr_jax.retriever.search import T5Searcher

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


def bench_levels(name: str, n_docs: int = 5_000, n_queries: int = 16, beams: int = 10):
    """A deep trie's levels scanned (`scan_levels`: its runs of levels as `lax.scan` bodies) beside unrolled, T5 with
    its layers unrolled: ragged docids of 4–12 tokens + EOS over 37 tokens (a URL-like trie of depth 13)."""
    from gr_jax.index.trie import TrieIndex
    from gr_jax.backbones import t5
    from gr_jax.retriever.search import T5Searcher

    config = t5.get_config(name, dropout_rate=0.0)
    params = t5.init_params(config, seed=1)
    rng = np.random.default_rng(0)
    docids: set = set()
    while len(docids) < n_docs:
        docids.add(tuple(int(x) for x in rng.integers(3, 40, int(rng.integers(4, 13)))) + (1,))
    trie = TrieIndex.build([list(d) for d in sorted(docids)], vocab_size=config.vocab_size, eos_id=1).device()
    queries = rng.integers(3, config.vocab_size, (n_queries, 20)).astype(np.int32)
    results = {}
    for order in ((True, False), (False, True)):  # as bench_t5_search: alternating, the best compile of each
        for scan in order:
            searcher = T5Searcher(t5.T5(config), num_beams=beams, mesh=None, scan_levels=scan)
            out, first, warm = _first_and_warm(lambda: searcher.search(params, queries, trie), repeats=5)
            if scan not in results or first - warm < results[scan][1] - results[scan][2]:
                results[scan] = (np.asarray(out.tokens), first, warm)
    runs = ";".join(f"{r.start}-{r.stop - 1}:C{r.slots}" for r in trie.run_specs)
    _rows("levels", name, config.num_layers, n_docs, trie.depth, beams, results, variant="levels_scanned",
          extra={"runs": runs})


def _rows(figure, model, layers, docs, depth, beams, results, variant="layers_scanned", extra=None):
    same = bool(np.array_equal(results[True][0], results[False][0]))
    for scan in (True, False):
        _, first, warm = results[scan]
        emit(figure=figure, model=model, layers=layers, docids=docs, depth=depth, beam=beams,
             **{variant: scan}, **(extra or {}), first_call_s=round(first, 2), warm_s=round(warm, 3),
             compile_s=round(first - warm, 2), same_docids=same)
    (_, f1, w1), (_, f0, w0) = results[True], results[False]
    emit(figure=figure + "_ratio", model=model, compile_unrolled_over_scanned=round((f0 - w0) / (f1 - w1), 2),
         warm_scanned_over_unrolled=round(w1 / w0, 3))


def _dynamic_child(experiment: str, model_dir: str, train_steps: int) -> None:
    """In its own process: one protocol run, its compile time by phase and the search's compilations."""
    import collections

    from jax._src import monitoring

    from gr_jax import dynamic

    total, search = collections.defaultdict(float), [0, 0.0]

    def listen(event, duration, **kw):
        if event.startswith("/jax/core/compile/"):
            total[event.rsplit("/", 1)[-1]] += duration
            if event.endswith("backend_compile_duration") and "_search_impl" in str(kw.get("fun_name", "")):
                search[0] += 1
                search[1] += duration

    monitoring.register_event_duration_secs_listener(listen)
    t0 = time.perf_counter()
    rc = dynamic.main([f"--gin_file=gin_configs/experiments/demo/{experiment}.gin", f"--gin.MODEL_DIR='{model_dir}'",
                       f"--gin.TRAIN_STEPS={train_steps}"])
    wall = time.perf_counter() - t0
    timings = json.loads(Path(model_dir, "dynamic_timing.json").read_text()) if rc == 0 else []
    sys.stdout.write("RESULT " + json.dumps({
        "rc": rc, "wall_s": round(wall, 1), "compile_s": round(sum(total.values()), 2),
        "xla_compile_s": round(total["backend_compile_duration"], 2), "search_compiles": search[0],
        "search_xla_compile_s": round(search[1], 2),
        "search_s_per_step": [round(t["search_s"], 2) for t in timings]}) + "\n")


def _code_revision(src: str) -> str:
    """The commit of the checkout at `src` (+ "-dirty" with uncommitted changes under gr_jax/)."""
    git = lambda *a: subprocess.run(["git", "-C", src, *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
    dirty = "-dirty" if git("status", "--porcelain", "gr_jax") else ""
    return (git("rev-parse", "--short", "HEAD") or "unknown") + dirty


def bench_dynamic(experiments, train_steps: int, baseline: str | None):
    """Each experiment's protocol with this checkout's library and, with `baseline` (the path of another checkout),
    with that one too, alternating, in fresh processes; then the ratio of their total compile times."""
    for experiment in experiments:
        model_dir = f"runs/bench_compile/{experiment}"
        child = [sys.executable, __file__, "--_dynamic_child", experiment, model_dir, str(train_steps)]
        libraries = [str(ROOT)] + ([str(Path(baseline).resolve())] if baseline else [])
        if not Path(ROOT, model_dir, "model").is_dir():  # trains (the protocol's first run), not measured
            subprocess.run(child, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
                           capture_output=True)
        rows = {}
        for library in libraries[::-1] + libraries[1:]:  # baseline, this, baseline: both warm the disk alike
            out = subprocess.run(child, cwd=ROOT, env={**os.environ, "PYTHONPATH": library}, check=True,
                                 capture_output=True, text=True).stdout
            result = json.loads(out[out.rindex("RESULT ") + 7:])
            emit(figure="dynamic", experiment=experiment, code=_code_revision(library), **result)
            if library not in rows or result["compile_s"] < rows[library]["compile_s"]:
                rows[library] = result
        if baseline:
            emit(figure="dynamic_ratio", experiment=experiment,
                 compile_this_over_baseline=round(rows[libraries[0]]["compile_s"] / rows[libraries[1]]["compile_s"], 3))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append",
                        choices=["fewshot_bank", "fewshot_levels", "t5_search", "levels", "dynamic"])
    parser.add_argument("--dynamic", nargs="+", default=["dynamic_dsi_semantic", "dynamic_dsi_url"],
                        help="demo experiments (gin_configs/experiments/demo/<name>.gin) of the dynamic rows")
    parser.add_argument("--dynamic_train_steps", type=cli.count, default=200)
    parser.add_argument("--dynamic_baseline", help="another checkout of the repository: its library's dynamic rows "
                        "too, alternating with this one's (e.g. a `git worktree` of the previous commit)")
    parser.add_argument("--_dynamic_child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--bank_docs", type=cli.count, default=2000)
    parser.add_argument("--t5", nargs="+", default=["tiny", "t5_small"], help="T5 configs of the t5_search rows")
    parser.add_argument("--no_write", action="store_true")
    args = parser.parse_args(argv)
    setup_logging()
    if args._dynamic_child:
        experiment, model_dir, steps = args._dynamic_child
        _dynamic_child(experiment, model_dir, int(steps))
        return 0
    parts = set(args.only or ["fewshot_bank", "fewshot_levels", "t5_search", "levels", "dynamic"])
    if "fewshot_bank" in parts:
        bench_fewshot_bank(args.bank_docs)
    if "fewshot_levels" in parts:
        bench_fewshot_bank(args.bank_docs, levels=True)
    if "t5_search" in parts:
        for name in args.t5:
            bench_t5_search(name)
    if "levels" in parts:
        for name in args.t5:
            bench_levels(name)
    if "dynamic" in parts:
        bench_dynamic(args.dynamic, args.dynamic_train_steps, args.dynamic_baseline)
    if not args.no_write:
        from gr_jax.evaluation.report import benchmark_section

        command = ("python tools/bench_compile.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
        header = f"device: {jax.devices()[0].platform.upper()}, {jax.device_count()} device(s); command: `{command}`"
        with benchmark_writer(ROOT / "BENCHMARKS.md", "bench_compile") as f:
            f.write(benchmark_section("bench_compile", header, ROWS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
