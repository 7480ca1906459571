"""python -m gr_jax.align_planner --gin_file=EXPERIMENT.gin --gin_file=runs/align_planner.gin --gin.MODEL_DIR="'DIR'"
    --gin.ALIGN_LANGUAGE="'de'" --gin.ALIGN_TRAIN_FILE="'mmarco/german_queries.train.tsv'"
    --gin.ALIGN_DEV_FILE="'mmarco/german_queries.dev.tsv'"

Planner alignment (004 §4.6 "Aligned", methods/pag/align.py): KL distillation of the PAG planner's weights from
English queries to their translations; only the query side is trained, the index stays fixed. Writes
MODEL_DIR/aligned/<language>/, which `python -m gr_jax.cross_lingual` reads for its 'aligned' setting.
"""

from __future__ import annotations

import json
import sys

from gr_jax.runtime import gin_utils
from gr_jax.runtime.cli import setup_logging


def main(argv=None) -> int:
    setup_logging()

    def configured():
        from gr_jax.methods.pag import align

        return align.align_planner

    rc, result = gin_utils.run_entry(argv, __doc__, configured, ["TRAIN_STEPS = 1", "BATCH_SIZE = 1"],
                                     root="align_planner", allow_unused=("train", "make_optimizer", "EvalConfig"))
    if rc:
        return rc
    sys.stdout.write(json.dumps({k: result[k] for k in ("output_dir", "chosen_epoch", "history")}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
