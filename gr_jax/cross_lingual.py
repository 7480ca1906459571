"""`python -m gr_jax.cross_lingual`: Cross-lingual query shift with the index fixed (gr_jax/commands.py:
`cross_lingual`). The usage: `python -m gr_jax.cross_lingual --help`."""

import sys

from gr_jax import commands


def main(argv=None) -> int:
    return commands.run("cross_lingual", argv)


if __name__ == "__main__":
    sys.exit(main())
