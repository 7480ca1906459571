"""Data-loading benchmark: reads a synthetic MS MARCO `collection.tsv` of the real size (8.8M rows,
~330 bytes a passage) and reports rows/s and peak memory; replaces its section of BENCHMARKS.md.

    python tools/bench_data.py            # 8.8M rows (writes a ~3 GB temporary file)
    python tools/bench_data.py --quick    # 200k rows
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gr_jax.runtime import cli
from gr_jax.runtime.cli import setup_logging
from gr_jax.data.readers import read_msmarco_collection
from gr_jax.evaluation.report import benchmark_writer

ROOT = Path(__file__).resolve().parents[1]


def write_synthetic_collection(path: Path, rows: int, words: int = 55, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(20000)])
    with open(path, "w") as f:
        for start in range(0, rows, 10000):
            n = min(10000, rows - start)
            toks = vocab[rng.integers(0, len(vocab), (n, words))]
            f.write("".join(f"{start + i}\t{' '.join(toks[i])}\n" for i in range(n)))
    return path.stat().st_size


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", type=cli.count, default=None)
    parser.add_argument("--no_write", action="store_true")
    args = parser.parse_args(argv)
    setup_logging()
    rows = args.rows or (200_000 if args.quick else 8_800_000)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "collection.tsv"
        size = write_synthetic_collection(path, rows)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        t0 = time.perf_counter()
        corpus = read_msmarco_collection(path)
        seconds = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        assert len(corpus) == rows
    row = {"figure": "msmarco_collection_load", "rows": rows, "file_mb": size / 2**20, "seconds": seconds,
           "rows_per_s": rows / seconds, "peak_rss_mb": peak / 2**20,
           "peak_over_file": (peak - min(rss_before, peak)) / size if peak > rss_before else 0.0,
           "corpus_mb": (corpus.texts.nbytes + corpus.doc_ids.nbytes) / 2**20}
    sys.stdout.write(json.dumps(row) + "\n")
    if not args.no_write:
        with benchmark_writer(ROOT / "BENCHMARKS.md", "bench_data") as f:
            f.write(f"\n## bench_data — {datetime.date.today().isoformat()}\n\n- command: `python tools/bench_data.py "
                    f"{' '.join(argv if argv is not None else sys.argv[1:])}`\n\n| "
                    + " | ".join(k for k in row if k != "figure") + " |\n|" + "---|" * (len(row) - 1) + "\n| "
                    + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for k, v in row.items()
                                 if k != "figure") + " |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
