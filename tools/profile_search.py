"""Where a constrained search's time goes on this device: a `jax.profiler` trace of warm searches, its XLA ops
grouped by kind (a fusion's name without its number), with counts and time per search; and the same search
timed with XLA's library dot fusions (YNNPACK on CPU) switched off, in a fresh process, for comparison.

Tiny T5 (random weights: the time does not depend on their values), 10k random docids of 4 tokens over its
vocabulary, 16 queries of 32 tokens (`--batch`), beam 10 by default: the shape of issue 32's "tiny-T5
constrained decoding at beam 10" (bench_decoding's part a measures it against transformers).

    python tools/profile_search.py                  # appends a section to BENCHMARKS.md
    python tools/profile_search.py --beams 100 --no_write
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import jax
import numpy as np

from gr_jax.runtime import cli
from gr_jax.runtime.cli import setup_logging

ROOT = Path(__file__).resolve().parents[1]
ROWS: list[dict] = []
REPEATS = 5


def emit(**row):
    ROWS.append(row)
    sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.flush()


def dot_flops(hlo_text: str) -> float:
    """FLOPs of every dot of an optimized HLO module's text (each executed once: no loops in a search's program):
    2 × output elements × contracted size, the operands' shapes read from their defining instructions."""
    shape_of, total = {}, 0.0
    for line in hlo_text.splitlines():
        m = re.match(r"\s*(?:ROOT )?%(\S+) = \w+\[([\d,]*)\]", line)
        if not m:
            continue
        dims = [int(x) for x in m.group(2).split(",") if x]
        shape_of[m.group(1)] = dims
        d = re.search(r" dot\(%(\S+), %(\S+)\).*?lhs_contracting_dims=\{([\d,]*)\}", line)
        if d:
            lhs = shape_of[d.group(1)]
            contracted = int(np.prod([lhs[int(i)] for i in d.group(3).split(",") if i]))
            total += 2.0 * float(np.prod(dims)) * contracted
    return total


def matmul_gflops(m: int = 1024, k: Optional[int] = None, n: Optional[int] = None) -> float:
    """This device's rate on one float32 matrix product [m, k] × [k, n] (k and n default to m; best of 10)."""
    k, n = k or m, n or m
    a, b = jax.numpy.ones((m, k), jax.numpy.float32), jax.numpy.ones((k, n), jax.numpy.float32)
    f = jax.jit(jax.numpy.dot)
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(10):
        t0 = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * m * k * n / best / 1e9


def _search(beams: int, batch: int = 16):
    """(run(), batch, the compiled program's text) for the benchmark's search, compiled and warmed up."""
    from gr_jax.index.trie import TrieIndex
    from gr_jax.backbones import t5
    from gr_jax.retriever.search import T5Searcher

    config = t5.get_config("tiny", dropout_rate=0.0)
    params = t5.init_params(config, seed=0)
    rng = np.random.default_rng(3)
    V = config.vocab_size
    docids = np.unique(rng.integers(3, V, (10_400, 4)), axis=0)[:10_000]
    trie = TrieIndex.build(docids, vocab_size=V).device()
    queries = rng.integers(3, V, (batch, 32)).astype(np.int32)
    searcher = T5Searcher(t5.T5(config), num_beams=beams, mesh=None)

    def run():
        return jax.block_until_ready(searcher.search(params, queries, trie).tokens)

    for _ in range(5):
        run()
    return run, len(queries), searcher._search.lower(params, queries, trie, None).compile().as_text()


def best_ms_per_query(beams: int, batch: int = 16) -> float:
    run, batch, _ = _search(beams, batch)
    best = float("inf")
    for _ in range(30):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best / batch * 1e3


def profile(beams: int, batch: int) -> None:
    run, batch, hlo = _search(beams, batch)
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp)
        t0 = time.perf_counter()
        for _ in range(REPEATS):
            run()
        wall = (time.perf_counter() - t0) / REPEATS
        jax.profiler.stop_trace()
        traces = sorted(Path(tmp).rglob("*.trace.json.gz"))
        if not traces:
            raise SystemExit(f"the profiler wrote no trace under {tmp}")
        events = [e for e in json.load(gzip.open(traces[-1]))["traceEvents"] if e.get("ph") == "X"]
    kinds = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        name = e["name"]
        if name.startswith("$") or name == "ParseArguments" or any(
                w in name for w in ("Thunk", "Pjit", "Execute", "ThreadPool")):
            continue  # Python frames and the runtime's own spans (dispatch, waits): not XLA ops
        kind = re.sub(r"[.\d]+$", "", name)
        kinds[kind][0] += 1
        kinds[kind][1] += e["dur"] / 1e3  # µs → ms
    op_ms = sum(v[1] for v in kinds.values()) / REPEATS
    ops = sum(v[0] for v in kinds.values()) / REPEATS
    emit(figure="profile", kind="(all XLA ops)", ops_per_search=round(ops, 1), ms_per_search=round(op_ms, 3),
         us_per_op=round(op_ms / ops * 1e3, 1), share_of_op_time=1.0, search_wall_ms=round(wall * 1e3, 3),
         beams=beams, batch=batch)
    flops, dots = dot_flops(hlo), kinds.get("ynn_fusion", kinds.get("dot", [0, 0.0]))
    peak = matmul_gflops()
    emit(figure="dots", beams=beams, batch=batch, dot_mflop_per_search=round(flops / 1e6, 1),
         library_dot_ms_per_search=round(dots[1] / REPEATS, 3),
         dot_gflops=round(flops / (dots[1] / REPEATS * 1e-3) / 1e9, 1) if dots[1] else None,
         large_matmul_gflops=round(peak, 1))
    for kind, (n, ms) in sorted(kinds.items(), key=lambda kv: -kv[1][1])[:12]:
        emit(figure="profile", kind=kind, ops_per_search=round(n / REPEATS, 1), ms_per_search=round(ms / REPEATS, 3),
             us_per_op=round(ms / n * 1e3, 1), share_of_op_time=round(ms / REPEATS / op_ms, 3),
             search_wall_ms=None, beams=beams, batch=batch)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beams", type=cli.count, default=10)
    parser.add_argument("--batch", type=cli.count, default=16, help="queries a search")
    parser.add_argument("--no_write", action="store_true")
    parser.add_argument("--_time_only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    setup_logging()
    if args._time_only:
        sys.stdout.write(f"RESULT {best_ms_per_query(args.beams, args.batch)}\n")
        return 0
    profile(args.beams, args.batch)
    # the same search timed with and without the library dot fusions, each in a fresh process, alternating
    flags = os.environ.get("XLA_FLAGS", "")
    variants = {"default": flags, "no_library_dots": (flags + " --xla_cpu_experimental_ynn_fusion_type=").strip()}
    best: dict = {}
    for _ in range(2):
        for name, xla_flags in variants.items():
            out = subprocess.run([sys.executable, __file__, "--_time_only", "--beams", str(args.beams), "--batch",
                                  str(args.batch)], cwd=ROOT,
                                 env={**os.environ, "XLA_FLAGS": xla_flags}, check=True, capture_output=True,
                                 text=True).stdout
            best[name] = min(best.get(name, float("inf")), float(out[out.rindex("RESULT ") + 7:]))
    emit(figure="library_dots", beams=args.beams, batch=args.batch, default_ms_per_query=round(best["default"], 3),
         no_library_dots_ms_per_query=round(best["no_library_dots"], 3),
         off_over_on=round(best["no_library_dots"] / best["default"], 3))
    if not args.no_write:
        from gr_jax.evaluation.report import benchmark_section

        command = ("python tools/profile_search.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
        header = (f"device: {jax.devices()[0].platform.upper()}, {jax.device_count()} device(s), jax {jax.__version__};"
                  f" command: `{command}`")
        from gr_jax.evaluation.report import benchmark_writer

        with benchmark_writer(ROOT / "BENCHMARKS.md", "profile_search") as f:
            f.write(benchmark_section("profile_search", header, ROWS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
