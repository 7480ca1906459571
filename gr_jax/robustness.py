"""`python -m gr_jax.robustness`: The query-variation robustness protocol (gr_jax/commands.py: `robustness`). The
usage: `python -m gr_jax.robustness --help`."""

import sys

from gr_jax import commands


def main(argv=None) -> int:
    return commands.run("robustness", argv)


if __name__ == "__main__":
    sys.exit(main())
