"""`python -m gr_jax.eval`: trec_eval's measures of TREC runs (gr_jax/commands.py: `eval_main`). The usage: `python -m
gr_jax.eval --help`."""

import sys

from gr_jax import commands


def main(argv=None) -> int:
    return commands.run("eval", argv)


if __name__ == "__main__":
    sys.exit(main())
