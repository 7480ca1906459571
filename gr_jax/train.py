"""python -m gr_jax.train --gin_file=FILE [--gin_file=...] [--gin.NAME=VALUE ...] [--gin_search_paths=A,B]
    [--multiprocess [--coordinator_address=HOST:PORT --process_count=N --process_index=I]]

Parses the gin flags, calls `compose.train` (which writes the final config to MODEL_DIR/config.gin), and
prints where the checkpoint, run file and metrics went (with BM25 next to the model when configured).
With `--multiprocess` it is one of N processes of one run (`gr_jax/runtime/distributed.py`); process 0 prints.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from gr_jax.runtime.cli import setup_logging
from gr_jax.runtime import distributed, gin_utils

log = logging.getLogger("gr_jax.train")


def summary_table(summary: dict) -> str:
    from gr_jax.evaluation.report import markdown_table

    metrics = summary.get("metrics", {})
    rows = [["generative retriever", *[f"{v:.4f}" for v in metrics.values()]]]
    if "bm25_metrics" in summary:
        rows.append(["BM25", *[f"{summary['bm25_metrics'][k]:.4f}" for k in metrics]])
    return markdown_table(["system", *metrics], rows)


def main(argv=None) -> int:
    setup_logging()

    def configured():
        from gr_jax import compose

        return compose.train

    rc, summary = gin_utils.run_entry(argv, __doc__, configured, root="train", multiprocess=True)
    if rc:
        return rc
    summary.pop("state", None)
    summary.pop("setup", None)
    if not distributed.is_primary():
        return 0
    if "metrics" in summary:
        sys.stdout.write(f"\n{summary['split']} ({summary['queries']} queries):\n{summary_table(summary)}\n\n")
        sys.stdout.write(f"run file:   {summary['run']}\n")
    sys.stdout.write(f"checkpoint: {summary['checkpoint']}\n")
    sys.stdout.write(f"metrics:    {Path(summary['model_dir']) / 'final_metrics.json'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
