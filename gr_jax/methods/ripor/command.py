"""RIPOR's own command: the dense phase of its T5 layout (`dense.train_dense`).

    python -m gr_jax.methods.ripor.command --gin_file=experiments/msmarco/ripor_dense.gin \\
        --gin.OUTPUT_DIR="'runs/ripor_dense'" --gin.INITIAL_CHECKPOINT_PATH="'T5_DIR'" --gin.DATA_DIR="'D'"

then `python -m gr_jax.train --gin_file=experiments/msmarco/ripor.gin
--gin.INITIAL_CHECKPOINT_PATH="'runs/ripor_dense/t5'" ...` (the experiment file's header).
"""

from __future__ import annotations

import json
import sys

from gr_jax.methods.api import Command, deferred

RIPOR_DENSE = Command(
    "ripor_dense", """python -m gr_jax.methods.ripor.command --gin_file=experiments/msmarco/ripor_dense.gin
    --gin.OUTPUT_DIR="'runs/ripor_dense'" --gin.INITIAL_CHECKPOINT_PATH="'T5_DIR'" --gin.DATA_DIR="'D'"

RIPOR's dense phase (methods/ripor/dense.py): trains the T5 of INITIAL_CHECKPOINT_PATH (an HF directory with its
tokenizer) as a dense retriever whose vector is the decoder's state at position 0, on the dataset's judged training
queries with in-batch and BM25 negatives; writes OUTPUT_DIR/t5, the INITIAL_CHECKPOINT_PATH of the RIPOR
experiment (experiments/<dataset>/ripor.gin).""",
    deferred("gr_jax.methods.ripor.dense", "train_dense"),
    lambda result: json.dumps(result, indent=1) + "\n", root="ripor_dense")


def main(argv=None) -> int:
    return RIPOR_DENSE.main(argv)


if __name__ == "__main__":
    sys.exit(main())
