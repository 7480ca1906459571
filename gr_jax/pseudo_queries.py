"""python -m gr_jax.pseudo_queries --gin_file=FILE [--gin_file=...] [--gin.NAME=VALUE ...] [--gin_search_paths=A,B]

Pseudo-queries for every document of a corpus, written by a decoder-only LM (protocols/pseudo_queries.py), to
MODEL_DIR/pseudo_queries.jsonl with their provenance; resumable. The file feeds
`PseudoQueryDocids(source='file')` and `Objectives.pseudo_queries_file`. E.g.
experiments/demo/pseudo_queries_smollm2.gin.
"""

from __future__ import annotations

import json
import sys

from gr_jax.runtime import gin_utils
from gr_jax.runtime.cli import setup_logging


def main(argv=None) -> int:
    setup_logging()

    def configured():
        from gr_jax.protocols import pseudo_queries

        return pseudo_queries.write_pseudo_queries

    rc, result = gin_utils.run_entry(argv, __doc__, configured, root="write_pseudo_queries")
    if rc:
        return rc
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
