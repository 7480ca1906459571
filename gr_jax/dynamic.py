"""python -m gr_jax.dynamic --gin_file=FILE [--gin_file=...] [--gin.NAME=VALUE ...] [--gin_search_paths=A,B]

The dynamic-corpora protocol (protocols/dynamic_corpora.py): build a system on D0, index D1..D5 one after
another without retraining, and write MODEL_DIR/dynamic/{dynamic.json, dynamic.md, dynamic.png} with the P
matrix, F_n, GA_n and IDBI. The method (BM25, dense, a generative retriever with any docid scheme, MDGR) is
chosen by the gin file, e.g. experiments/demo/dynamic_bm25.gin.
"""

from __future__ import annotations

import sys

from gr_jax import gin_utils
from gr_jax.cli import setup_logging


def main(argv=None) -> int:
    setup_logging()
    files, bindings, paths, rest = gin_utils.split_flags(sys.argv[1:] if argv is None else argv)
    if rest or not files:
        sys.stderr.write((f"unknown arguments: {rest}\n" if rest else "") + __doc__ + "\n")
        return 2
    try:
        gin_utils.parse(files, bindings, paths)
        from gr_jax.protocols import dynamic_corpora

        result = gin_utils.call_configured(dynamic_corpora.run_dynamic)
    except (gin_utils.GinConfigError, ValueError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    from gr_jax.protocols.dynamic_corpora import tables_markdown

    sys.stdout.write("\n" + tables_markdown([result]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
