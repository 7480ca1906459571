"""`python -m gr_jax.train`: Trains a generative retriever (gr_jax/commands.py: `train`). The usage: `python -m
gr_jax.train --help`."""

import sys

from gr_jax import commands


def main(argv=None) -> int:
    return commands.run("train", argv)


if __name__ == "__main__":
    sys.exit(main())
