"""`python -m gr_jax.align_planner`: PAG's planner alignment (gr_jax/methods/pag/command.py). The usage:
`python -m gr_jax.align_planner --help`."""

import sys

from gr_jax.methods.pag import command


def main(argv=None) -> int:
    return command.main(argv)


if __name__ == "__main__":
    sys.exit(main())
