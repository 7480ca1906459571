"""`python -m gr_jax.pseudo_queries`: Pseudo-queries written by an LM for every document (gr_jax/commands.py:
`pseudo_queries`). The usage: `python -m gr_jax.pseudo_queries --help`."""

import sys

from gr_jax import commands


def main(argv=None) -> int:
    return commands.run("pseudo_queries", argv)


if __name__ == "__main__":
    sys.exit(main())
