"""python -m gr_jax.fewshot --gin_file=FILE [--gin_file=...] [--gin.NAME=VALUE ...] [--gin_search_paths=A,B]

Few-Shot GR (methods/fewshot/run.py): an LM writes a docid bank for the corpus (no training), then retrieves
with constrained beam search over it; writes MODEL_DIR/{docid_bank.jsonl, fewshot.json, fewshot.md, runs/}
and prints the table (one row per bank size n, BM25 beside). E.g. experiments/demo/fewshot_smollm2.gin.
"""

from __future__ import annotations

import sys

from gr_jax.runtime import gin_utils
from gr_jax.runtime.cli import setup_logging


def main(argv=None) -> int:
    setup_logging()

    def configured():
        from gr_jax.methods.fewshot import run as fewshot_gr

        return fewshot_gr.run_fewshot

    rc, result = gin_utils.run_entry(argv, __doc__, configured, root="run_fewshot")
    if rc:
        return rc
    from gr_jax.methods.fewshot.run import tables_markdown

    sys.stdout.write("\n" + tables_markdown(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
