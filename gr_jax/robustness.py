"""python -m gr_jax.robustness --gin_file=FILE [--gin_file=...] [--gin.NAME=VALUE ...] [--gin_search_paths=A,B]

The robustness protocol (protocols/robustness.py): a retriever under intent-preserving query variations
(misspelling, reordering, synonym, paraphrase, naturality; five seeds), with plan-drift diagnostics, plan
collapse, tables shaped like 004's Tables 6–8 and boxplots like its Figs. 2–3. A trained MODEL_DIR: its
experiment file, then runs/robustness.gin (e.g. experiments/demo/robustness_dsi.gin); BM25:
experiments/demo/robustness_bm25.gin.
"""

from __future__ import annotations

import sys

from gr_jax.runtime import gin_utils
from gr_jax.runtime.cli import setup_logging


def main(argv=None) -> int:
    setup_logging()

    def configured():
        from gr_jax.protocols import robustness

        return robustness.run_robustness

    # a trained system's experiment file is its training one: the training settings stay unused here
    rc, result = gin_utils.run_entry(argv, __doc__, configured, ["TRAIN_STEPS = 1", "BATCH_SIZE = 1"],
                                     root="run_robustness", allow_unused=("train", "make_optimizer", "EvalConfig"))
    if rc:
        return rc
    from gr_jax.protocols.robustness import tables_markdown

    sys.stdout.write("\n" + tables_markdown(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
