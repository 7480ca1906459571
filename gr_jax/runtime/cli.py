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
    from gr_jax.runtime.io_utils import quiet_orbax_threads

    quiet_orbax_threads()  # their worker threads' tracebacks: to the debug log, the caller names the error once
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


def nonnegative(text: str) -> float:
    """A finite number ≥ 0 (0 often means "off": the help says)."""
    return _number(float, text, 0, False, "a number ≥ 0")


def name_list(choices=None, what: str = "name", parse=None):
    """An argparse type for a comma-separated list: at least one name, no empty one between commas, each one of
    `choices` (when given) or accepted by `parse` (its ValueError becomes the usage error); the names in order."""

    def parse_list(text: str) -> list:
        items = [t.strip() for t in text.split(",")]
        if not any(items):
            raise argparse.ArgumentTypeError(f"{text!r} names no {what}: give a comma-separated list")
        if "" in items:
            raise argparse.ArgumentTypeError(f"{text!r}: an empty {what} between commas")
        if choices is not None:
            unknown = [t for t in items if t not in choices]
            if unknown:
                raise argparse.ArgumentTypeError(f"unknown {what} {unknown}; known: {sorted(choices)}")
        if parse is not None:
            try:
                return [parse(t) for t in items]
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e)) from None
        return items

    return parse_list
