"""PAG's own command: planner alignment (004 §4.6 "Aligned", `training_align.align_planner`).

    python -m gr_jax.methods.pag.command --gin_file=EXPERIMENT.gin --gin_file=runs/align_planner.gin \\
        --gin.MODEL_DIR="'DIR'" --gin.ALIGN_LANGUAGE="'de'" --gin.ALIGN_TRAIN_FILE="'queries.train.tsv'" \\
        --gin.ALIGN_DEV_FILE="'queries.dev.tsv'"

(also `python -m gr_jax.align_planner`, its earlier spelling).
"""

from __future__ import annotations

import json
import sys

from gr_jax.methods.api import Command, deferred, ON_A_TRAINED_SYSTEM

ALIGN_PLANNER = Command(
    "align_planner", """python -m gr_jax.align_planner --gin_file=EXPERIMENT.gin --gin_file=runs/align_planner.gin --gin.MODEL_DIR="'DIR'"
    --gin.ALIGN_LANGUAGE="'de'" --gin.ALIGN_TRAIN_FILE="'mmarco/german_queries.train.tsv'"
    --gin.ALIGN_DEV_FILE="'mmarco/german_queries.dev.tsv'"

Planner alignment (004 §4.6 "Aligned", methods/pag/training_align.py): KL distillation of the PAG planner's
weights from English queries to their translations; only the query side is trained, the index stays fixed.
Writes MODEL_DIR/aligned/<language>/, which `python -m gr_jax.cross_lingual` reads for its 'aligned' setting.""",
    deferred("gr_jax.methods.pag.training_align", "align_planner"),
    lambda result: json.dumps({k: result[k] for k in ("output_dir", "chosen_epoch", "history")}, indent=1) + "\n",
    root="align_planner", **ON_A_TRAINED_SYSTEM)


def main(argv=None) -> int:
    return ALIGN_PLANNER.main(argv)


if __name__ == "__main__":
    sys.exit(main())
