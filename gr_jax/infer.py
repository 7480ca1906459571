"""`python -m gr_jax.infer`: Queries of a split → a TREC run with a trained MODEL_DIR (gr_jax/commands.py: `infer`).
The usage: `python -m gr_jax.infer --help`."""

import sys

from gr_jax import commands


def main(argv=None) -> int:
    return commands.run("infer", argv)


if __name__ == "__main__":
    sys.exit(main())
