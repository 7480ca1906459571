"""Substring-index benchmarks (SEAL's index, issue "substring-constrained GR"): memory per corpus token, build
time against pydivsufsort alone, insert 10% against a rebuild, and the constrained search step against the
unconstrained step of the same model, on one device and split over 2 host devices. Prints one JSON line per
row and replaces its section of BENCHMARKS.md.

    python tools/bench_substring.py                          # 10^7 tokens, demo-sized search
    python tools/bench_substring.py --tokens 100000000       # the issue's 10^8 tokens (≈ 3 GB of memory)

(a) memory: `SubstringIndex.nbytes` per token (int32 text and suffix array, a start and a row per document)
    beside a plain suffix array with its text (int64 suffix array + int32 text, what a suffix sorter returns)
    and SEAL's FM-index as published (000 Table 7: 2,200 MB for its NQ corpus; no token count is published,
    so only the MB figure is quoted).
(b) build: `SubstringIndex.build` (pydivsufsort, then the suffixes that start at a separator dropped) against
    pydivsufsort's `divsufsort` on the same token array; random documents of 50–400 tokens over a 32k vocabulary
    with Zipf-distributed ids (repeats like text).
(c) insert: an index of 90% of the documents plus `insert` of the last 10%, against building all of them.
(d) search: a tiny random T5 (V 1006, the demo's vocabulary with SEAL's six markers), 2,000 documents of demo
    size, 32 queries a batch, beam 15, 10 levels; SEAL's body view (`keep_history`) against the unconstrained beam
    search of the same model and length, both jitted and warmed up — beside the same search without the child lists
    (wide ranges searched for every token) and with every range searched for every token; then the same constrained search with the
    batch split over 2 host devices (a subprocess with 2 XLA host devices; they share this machine's 2 cores).
Times are CPU figures of this machine, the median of 5 (search) or 3 (build) runs: only ratios carry over.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ROWS: list[dict] = []


def _row(**kw):
    ROWS.append(kw)
    print(json.dumps(kw), flush=True)


def _documents(tokens: int, vocab: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    docs, total = [], 0
    while total < tokens:
        n = int(rng.integers(50, 401))
        docs.append(np.minimum(rng.zipf(1.2, size=n) + 1, vocab - 1).astype(np.int32))
        total += n
    return docs


def _median_of_rounds(fns, repeats: int) -> list[float]:
    """Each function's median time over `repeats` rounds, the functions alternating within a round (a machine
    that slows down or speeds up weighs on all of them alike)."""
    times = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return [float(np.median(t)) for t in times]


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def bench_index(tokens: int, vocab: int = 32000) -> None:
    import pydivsufsort

    from gr_jax.index.substring import SubstringIndex

    docs = _documents(tokens, vocab)
    n = sum(map(len, docs))
    index = SubstringIndex.build(docs, vocab)
    plain = 8 * (n + len(docs)) + 4 * (n + len(docs))  # int64 suffix array + int32 text, separators included
    dev = index.device(10)
    lists = dev.listed.nbytes + dev.listed_at.nbytes
    _row(figure="memory", tokens=n, documents=len(docs), ours_bytes_per_token=round(index.nbytes / n, 2),
         device_bytes_per_token=round(dev.nbytes / n, 2), child_lists_bytes_per_token=round(lists / n, 2),
         plain_sa_bytes_per_token=round(plain / n, 2), seal_fm_index_published_mb=2200)
    del dev
    text = index.segments[0].text.copy()
    del index
    t_ours = _median(lambda: SubstringIndex.build(docs, vocab), 3)
    t_dss = _median(lambda: pydivsufsort.divsufsort(text), 3)
    _row(figure="build", tokens=n, ours_s=round(t_ours, 3), divsufsort_s=round(t_dss, 3),
         ratio=round(t_ours / t_dss, 2))
    cut = int(len(docs) * 0.9)

    def insert():
        base = SubstringIndex.build(docs[:cut], vocab)
        t = time.perf_counter()
        base.insert(docs[cut:])
        return time.perf_counter() - t

    t_insert = float(np.median([insert() for _ in range(3)]))
    _row(figure="insert", tokens=n, insert_10pct_s=round(t_insert, 3), rebuild_s=round(t_ours, 3),
         ratio=round(t_insert / t_ours, 3))


def _search_setup(devices: int, documents: int = 2000):
    import jax

    from gr_jax.index.substring import SubstringIndex
    from gr_jax.backbones import t5
    from gr_jax.retriever.model import GenerativeRetriever

    V, B, N, T = 1006, 32, 15, 10
    docs = _documents(documents * 135, 1000, seed=1)
    index = SubstringIndex.build(docs, V)
    model = GenerativeRetriever(t5.get_config("tiny", vocab_size=V))
    params = model.init_params(0)
    q = np.random.default_rng(2).integers(2, 1000, size=(B, 24)).astype(np.int32)
    q[:, -1] = 1
    constrained = model.searcher(N, keep_history=True)
    free = model.searcher(N)
    if devices == 1:
        constrained.use_mesh(None)
        free.use_mesh(None)
    dev = index.device(T)
    every_token = dataclasses.replace(dev, narrow=0)  # the search before narrow ranges were read directly
    no_lists = dataclasses.replace(dev, listed_columns=0)  # narrow ranges read, wide ones searched for every token

    def run_c():
        jax.block_until_ready(constrained.search(params, q, dev))

    def run_v():
        jax.block_until_ready(constrained.search(params, q, every_token))

    def run_n():
        jax.block_until_ready(constrained.search(params, q, no_lists))

    def run_u():
        jax.block_until_ready(free.search_unconstrained(params, q, T))

    return run_c, run_u, run_v, run_n, index.num_tokens


def bench_search(documents: int = 2000, two_devices: bool = True) -> None:
    run_c, run_u, run_v, run_n, tokens = _search_setup(1, documents)
    run_c(), run_u(), run_v(), run_n()  # compile all four
    t_c, t_u, t_v, t_n = _median_of_rounds((run_c, run_u, run_v, run_n), 5)
    row = dict(figure="search", tokens=tokens, batch=32, beams=15, levels=10)
    _row(**row, devices=1, constrained_ms=round(1e3 * t_c, 1), unconstrained_ms=round(1e3 * t_u, 1),
         ratio=round(t_c / t_u, 2), without_child_lists_ratio=round(t_n / t_u, 2),
         every_token_searched_ms=round(1e3 * t_v, 1), every_token_ratio=round(t_v / t_u, 2), speedup_vs_1_device=1.0)
    if not two_devices:
        return
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2".strip()  # kept with others
    env = {**os.environ, "XLA_FLAGS": flags}
    out = subprocess.run([sys.executable, __file__, "--_two_devices"], env=env, capture_output=True, text=True,
                         timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    t_2 = json.loads(out.stdout.strip().splitlines()[-1])["constrained_s"]
    _row(**row, devices=2, constrained_ms=round(1e3 * t_2, 1), unconstrained_ms=None, ratio=None,
         without_child_lists_ratio=None, every_token_searched_ms=None, every_token_ratio=None,
         speedup_vs_1_device=round(t_c / t_2, 2))


def _two_devices() -> None:
    run_c = _search_setup(2)[0]
    run_c()
    print(json.dumps({"constrained_s": _median(run_c, 5)}))


def _write(command: str, path: Path) -> None:
    import jax

    from gr_jax.evaluation.report import benchmark_section

    header = f"device: {jax.devices()[0].platform.upper()}, {jax.device_count()} device(s); command: `{command}`"
    from gr_jax.evaluation.report import benchmark_writer

    with benchmark_writer(path, "bench_substring") as f:
        f.write(benchmark_section("bench_substring", header, ROWS))


def main(argv=None) -> int:
    from gr_jax.runtime import cli

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=cli.count, default=10_000_000, help="corpus tokens of parts a–c")
    parser.add_argument("--skip_search", action="store_true")
    parser.add_argument("--search_documents", type=cli.count, default=2000, help="documents of the search part (d)")
    parser.add_argument("--one_device", action="store_true", help="(d) without the 2-host-device run (accelerators)")
    parser.add_argument("--no_write", action="store_true", help="print JSON lines only, do not touch BENCHMARKS.md")
    parser.add_argument("--_two_devices", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._two_devices:
        _two_devices()
        return 0
    cli.setup_logging()
    bench_index(args.tokens)
    if not args.skip_search:
        bench_search(args.search_documents, two_devices=not args.one_device)
    if not args.no_write:
        _write("python tools/bench_substring.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               ROOT / "BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
