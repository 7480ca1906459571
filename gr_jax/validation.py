"""Checks of numeric arguments that run before any work: a wrong value becomes a `ValueError` naming the
setting (its gin name) and what it accepts, instead of a ZeroDivisionError after compiling, a training that
runs backwards (negative learning rate) or a summary that names a checkpoint that does not exist."""

from __future__ import annotations

import math
import numbers


def integer(name: str, value, minimum: int | None = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer{f' ≥ {minimum}' if minimum is not None else ''}, "
                         f"got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be ≥ {minimum}, got {value}")
    return int(value)


def number(name: str, value, positive: bool = True, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be ≥ {minimum}, got {value}")
    return float(value)


def feature_lengths(name: str, value) -> dict[str, int]:
    if not isinstance(value, dict) or not {"inputs", "targets"} <= set(value) <= {"inputs", "targets", "documents"}:
        raise ValueError(f"{name} must be a dict {{'inputs': N, 'targets': M}} (GLEN's phase 2 adds "
                         f"'documents': the document length), got {value!r}")
    return {k: integer(f"{name}[{k!r}]", v) for k, v in value.items()}
