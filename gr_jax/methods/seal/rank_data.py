"""`python -m gr_jax.methods.seal.rank_data`: LTRGR's rank data (gr_jax/methods/seal/command.py), its earlier
spelling. The usage: `python -m gr_jax.methods.seal.rank_data --help`."""

import sys

from gr_jax.methods.seal import command


def main(argv=None) -> int:
    return command.main(argv)


if __name__ == "__main__":
    sys.exit(main())
