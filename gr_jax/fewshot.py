"""`python -m gr_jax.fewshot`: Few-Shot GR (gr_jax/methods/fewshot/command.py). The usage:
`python -m gr_jax.fewshot --help`."""

import sys

from gr_jax.methods.fewshot import command


def main(argv=None) -> int:
    return command.main(argv)


if __name__ == "__main__":
    sys.exit(main())
