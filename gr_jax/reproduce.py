"""`python -m gr_jax.reproduce`: A paper's tables in one command (gr_jax/commands.py: `reproduce_main`). The usage:
`python -m gr_jax.reproduce --help`."""

import sys

from gr_jax import commands


def main(argv=None) -> int:
    return commands.run("reproduce", argv)


if __name__ == "__main__":
    sys.exit(main())
