"""python -m gr_jax.cross_lingual --gin_file=EXPERIMENT.gin --gin_file=runs/cross_lingual.gin --gin.MODEL_DIR="'DIR'"
    --gin.CROSS_LINGUAL_QUERIES="{'de': 'mmarco/german_queries.dev.tsv'}" [--gin.NAME=VALUE ...]

Cross-lingual query shift with the index fixed (protocols/cross_lingual.py): non-English queries against the
English corpus and docids of a trained MODEL_DIR in the settings Naive, Seq-only, Translate and Aligned, with
overlap diagnostics against the English queries (004 Table 9 shape) and effectiveness (Fig. 5 shape).
"""

from __future__ import annotations

import sys

from gr_jax.runtime import gin_utils
from gr_jax.runtime.cli import setup_logging


def main(argv=None) -> int:
    setup_logging()

    def configured():
        from gr_jax.protocols import cross_lingual

        return cross_lingual.run_cross_lingual

    rc, result = gin_utils.run_entry(argv, __doc__, configured, ["TRAIN_STEPS = 1", "BATCH_SIZE = 1"],
                                     root="run_cross_lingual", allow_unused=("train", "make_optimizer", "EvalConfig"))
    if rc:
        return rc
    from gr_jax.protocols.cross_lingual import cross_lingual_markdown

    sys.stdout.write("\n" + cross_lingual_markdown(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
