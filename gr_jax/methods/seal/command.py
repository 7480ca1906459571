"""The SEAL family's own command: LTRGR's rank data (`training_ltrgr.write_rank_data`).

    python -m gr_jax.methods.seal.command --gin_file=experiments/demo/minder.gin --gin.MODEL_DIR="'runs/demo_minder'"

(also `python -m gr_jax.methods.seal.rank_data`, its earlier spelling).
"""

from __future__ import annotations

import sys

from gr_jax.methods.api import Command, deferred, ON_A_TRAINED_SYSTEM

RANK_DATA = Command(
    "rank_data", """python -m gr_jax.methods.seal.rank_data --gin_file=FILE [--gin_file=...] [--gin.NAME=VALUE ...]

LTRGR's first stage (methods/seal/training_ltrgr.py): a trained SEAL or MINDER model (MODEL_DIR, with the
experiment file it was trained with) retrieves the top documents of every training query with the keys that
scored each; writes MODEL_DIR/ltrgr_rank_data.jsonl (write_rank_data.output), the input of LtrgrPairs. E.g.
    python -m gr_jax.methods.seal.rank_data --gin_file=experiments/demo/minder.gin \\
        --gin.MODEL_DIR="'runs/demo_minder'" --gin.write_rank_data.max_queries=1000""",
    deferred("gr_jax.methods.seal.training_ltrgr", "write_rank_data"),
    lambda head: (f"rank data: {head['rows']} training queries, {head['queries_with_a_positive']} with a judged "
                  f"document retrieved\n"),
    root="write_rank_data", fixed=(*ON_A_TRAINED_SYSTEM["fixed"], "write_rank_data.model_dir = %MODEL_DIR"),
    allow_unused=ON_A_TRAINED_SYSTEM["allow_unused"])


def main(argv=None) -> int:
    return RANK_DATA.main(argv)


if __name__ == "__main__":
    sys.exit(main())
