"""`python -m gr_jax.dynamic`: The dynamic-corpora protocol (gr_jax/commands.py: `dynamic`). The usage: `python -m
gr_jax.dynamic --help`."""

import sys

from gr_jax import commands


def main(argv=None) -> int:
    return commands.run("dynamic", argv)


if __name__ == "__main__":
    sys.exit(main())
