"""python -m gr_jax.dynamic --gin_file=FILE [--gin_file=...] [--gin.NAME=VALUE ...] [--gin_search_paths=A,B]

The dynamic-corpora protocol (protocols/dynamic_corpora.py): build a system on D0, index D1..D5 one after
another without retraining, and write MODEL_DIR/dynamic/{dynamic.json, dynamic.md, dynamic.png} with the P
matrix, F_n, GA_n and IDBI. The method (BM25, dense, a generative retriever with any docid scheme, MDGR) is
chosen by the gin file, e.g. experiments/demo/dynamic_bm25.gin.
"""

from __future__ import annotations

import sys

from gr_jax.runtime import gin_utils
from gr_jax.runtime.cli import setup_logging


def main(argv=None) -> int:
    setup_logging()

    def configured():
        from gr_jax.protocols import dynamic_corpora

        return dynamic_corpora.run_dynamic

    # a GR system trains in MODEL_DIR/model: the protocol passes train's model_dir itself
    rc, result = gin_utils.run_entry(argv, __doc__, configured, root="run_dynamic", allow_unused=("train.model_dir",))
    if rc:
        return rc
    from gr_jax.protocols.dynamic_corpora import tables_markdown

    sys.stdout.write("\n" + tables_markdown([result]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
