"""Shared set-up for command-line entry points (`python -m gr_jax.*`, `tools/*.py`)."""

from __future__ import annotations

import argparse
import logging
import math


def setup_logging(level: int = logging.INFO) -> None:
    """gr_jax's own loggers at `level`; third-party loggers (absl/orbax, jax, transformers) at WARNING."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("gr_jax").setLevel(level)
    for name in ("absl", "jax", "orbax", "transformers"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        import absl.logging

        absl.logging.set_verbosity(absl.logging.WARNING)
    except ImportError:
        pass


# argparse types of the tools' numeric arguments (tests/test_repo.py: no tool takes a bare `type=int`): a bad
# value is argparse's usage error and exit code 2, before any work


def _number(kind, text: str, low: float, open_low: bool, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not math.isfinite(value) or (value <= low if open_low else value < low):
        raise argparse.ArgumentTypeError(f"{text!r}: must be {what}")
    return value


def count(text: str) -> int:
    """An integer ≥ 1."""
    return _number(int, text, 1, False, "an integer ≥ 1")


def natural(text: str) -> int:
    """An integer ≥ 0 (0 often means "all" or "off": the help says)."""
    return _number(int, text, 0, False, "an integer ≥ 0")


def positive(text: str) -> float:
    """A finite number > 0."""
    return _number(float, text, 0, True, "a number > 0")
