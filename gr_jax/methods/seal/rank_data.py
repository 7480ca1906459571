"""python -m gr_jax.methods.seal.rank_data --gin_file=FILE [--gin_file=...] [--gin.NAME=VALUE ...]

LTRGR's first stage (methods/seal/ltrgr.py): a trained SEAL or MINDER model (MODEL_DIR, with the experiment file
it was trained with) retrieves the top documents of every training query with the keys that scored each;
writes MODEL_DIR/ltrgr_rank_data.jsonl (write_rank_data.output), the input of LtrgrPairs. E.g.
    python -m gr_jax.methods.seal.rank_data --gin_file=experiments/demo/minder.gin \\
        --gin.MODEL_DIR="'runs/demo_minder'" --gin.write_rank_data.max_queries=1000
"""

from __future__ import annotations

import sys

from gr_jax.runtime import gin_utils
from gr_jax.runtime.cli import setup_logging


def main(argv=None) -> int:
    setup_logging()

    def configured():
        from gr_jax.methods.seal.ltrgr import write_rank_data

        return write_rank_data

    rc, head = gin_utils.run_entry(argv, __doc__, configured,
                                   ["TRAIN_STEPS = 1", "BATCH_SIZE = 1", "write_rank_data.model_dir = %MODEL_DIR"],
                                   root="write_rank_data", allow_unused=("train", "make_optimizer", "EvalConfig"))
    if rc:
        return rc
    sys.stdout.write(f"rank data: {head['rows']} training queries, {head['queries_with_a_positive']} with a judged "
                     f"document retrieved\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
