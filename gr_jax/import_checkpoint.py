"""Imports a network trained elsewhere into a MODEL_DIR that `python -m gr_jax.infer` evaluates:

    python -m gr_jax.import_checkpoint --gin_file=experiments/nq320k/glen_released.gin \
        --gin.MODEL_DIR="'runs/glen_released'" --gin.INITIAL_CHECKPOINT_PATH="'path/to/GLEN_P2_final'" \
        --gin.DATA_DIR="'data/nq320k'" --gin.GlenDocids.docid_file="'path/to/GLEN_P2_final_docids.tsv'"

INITIAL_CHECKPOINT_PATH is an HF T5 directory (GLEN's released phase-2 model is one; a GLEN phase-1
checkpoint is refused by name), a converted checkpoint (tools/convert_checkpoint.py) or a MODEL_DIR trained
here. The experiment file names the data, vocabulary, docid scheme and model object as for training; the
docid table and prefix tree are built from them (GLEN: its docid file, or the model's own greedy decodings
when no file is given). Writes MODEL_DIR/checkpoints/0 with the provenance `infer` checks; prints one JSON
line. Exit 2 with a message on bad input.
"""

from __future__ import annotations

import json
import sys


from gr_jax.runtime import gin_checks, gin_utils
from gr_jax.runtime.cli import setup_logging


def main(argv=None) -> int:
    setup_logging()

    def configured():
        from gr_jax import compose

        return lambda: compose.import_checkpoint(
            model_dir=gin_checks.macro("MODEL_DIR"), initial_checkpoint_path=gin_checks.macro("INITIAL_CHECKPOINT_PATH"),
            feature_lengths=gin_checks.macro("TASK_FEATURE_LENGTHS"), task=gin_checks.macro("MIXTURE_OR_TASK_NAME"))

    rc, out = gin_utils.run_entry(argv, __doc__, configured, ["TRAIN_STEPS = 1", "BATCH_SIZE = 1"], root="infer",
                                  allow_unused=("train", "make_optimizer", "EvalConfig"))
    if rc or out is None:  # (None: --help)
        return rc
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
