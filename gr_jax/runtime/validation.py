"""Checks of numeric arguments that run before any work: a wrong value becomes a `ValueError` naming the
setting (its gin name) and what it accepts, instead of a ZeroDivisionError after compiling, a training that
runs backwards (negative learning rate) or a summary that names a checkpoint that does not exist.

Ranges are declared where a setting is declared, in the signature of the configurable:

    def run(..., batch_size: Count = 32, temperature: Positive = 1.0, max_documents: int = 0, ...)

`check_value(name, annotation, value)` checks a value against its annotation; `gin_utils.parse` applies it to
every value a gin file or flag binds, before anything runs. What is not annotated with a range gets the
range of its type, so a new parameter cannot go unchecked: an `int` must be an integer ≥ 0 (a negative count
is never a Python slice here), a `float` a finite number; `Optional[...]` admits None; a sequence of them is
checked element by element. The explicit ranges: `Count` (integer ≥ 1), `Positive` (number > 0),
`Fraction` (number in [0, 1]), `Signed` / `SignedInt` (any finite number / integer, e.g. a length penalty),
`Range(...)` for others.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import math
import numbers
import typing
from typing import Annotated, Optional


@dataclasses.dataclass(frozen=True)
class Range:
    """A numeric range: `integer` values only when set; `low` < value (`open_low`) or ≤ value; value ≤ `high`."""

    integer: bool = False
    low: Optional[float] = None
    high: Optional[float] = None
    open_low: bool = False

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        bounds = []
        if self.low is not None:
            bounds.append(f"{'>' if self.open_low else '≥'} {self.low:g}")
        if self.high is not None:
            bounds.append(f"≤ {self.high:g}")
        return kind + (" " + " and ".join(bounds) if bounds else "")

    def admits(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            return False
        if self.integer and not isinstance(value, numbers.Integral):
            return False
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or value <= self.high


@dataclasses.dataclass(frozen=True)
class OneOf:
    """A choice among names (a scorer, a mode): checked when gin binds it, like a numeric `Range`."""

    values: tuple

    def describe(self) -> str:
        return f"one of {', '.join(repr(v) for v in self.values)}"

    def admits(self, value) -> bool:
        return isinstance(value, str) and value in self.values


def one_of(*values: str):
    """`Annotated[str, OneOf(values)]`: a setting whose value must be one of `values`."""
    return Annotated[str, OneOf(tuple(values))]


Count = Annotated[int, Range(integer=True, low=1)]
Positive = Annotated[float, Range(low=0, open_low=True)]
Fraction = Annotated[float, Range(low=0, high=1)]
Signed = Annotated[float, Range()]
SignedInt = Annotated[int, Range(integer=True)]
_DEFAULT = {int: Range(integer=True, low=0), float: Range()}


def range_of(annotation) -> tuple[Optional[Range], bool, bool]:
    """(range, None allowed, is a sequence) of an annotation; (None, ...) when it declares no number."""
    optional = sequence = False
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Union:
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            optional = optional or len(args) < len(typing.get_args(annotation))
            if len(args) != 1:
                return None, optional, sequence
            annotation = args[0]
        elif origin is Annotated:
            base, *extra = typing.get_args(annotation)
            ranges = [e for e in extra if isinstance(e, (Range, OneOf))]
            if ranges:
                return ranges[0], optional, sequence
            annotation = base
        elif origin in (collections.abc.Sequence, list, tuple) and not sequence:
            args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
            if len(set(args)) != 1:
                return None, optional, sequence
            sequence, annotation = True, args[0]
        else:
            return _DEFAULT.get(annotation), optional, sequence


def check_value(name: str, annotation, value) -> None:
    """A `ValueError` naming `name` when `value` is outside what `annotation` declares (module docstring)."""
    rng, optional, sequence = range_of(annotation)
    if rng is None or (value is None and optional):
        return
    values = value if sequence and isinstance(value, (list, tuple)) else [value]
    for v in values:
        if not rng.admits(v):
            raise ValueError(f"{name} must be {rng.describe()}{' (or None)' if optional else ''}, got {value!r}")


def annotations_of(fn) -> dict:
    """(Cached: resolving annotations costs ~1 ms, and configs are made often.) See `_annotations_of`."""
    try:
        return dict(_annotations_cached(fn))
    except TypeError:  # not hashable
        return _annotations_of(fn)


@functools.lru_cache(maxsize=None)
def _annotations_cached(fn) -> dict:
    return _annotations_of(fn)


def _annotations_of(fn) -> dict:
    """The resolved annotations of a function's parameters, or of a class's fields and `__init__` (its bases'
    first, so a subclass's own win: keyword arguments passed on to a base are checked as the base declares them).
    A function whose `**overrides` are the fields of a config dataclass names it as `fn.keyword_fields`."""
    out = {}
    targets = [fn]
    if isinstance(fn, type):
        targets = [t for c in reversed(fn.__mro__) if c is not object for t in (c, c.__dict__.get("__init__"))
                   if t is not None]
    for target in targets:
        try:
            out.update(typing.get_type_hints(target, include_extras=True))
        except (NameError, TypeError, AttributeError):
            continue
    fields = getattr(fn, "keyword_fields", None)
    if fields is not None:
        out = {**annotations_of(fields), **out}
    out.pop("return", None)
    return out


def check_fields(obj) -> None:
    """Every field of a config dataclass against the range its annotation declares (a `ValueError` naming
    `<Class>.<field>`): the same ranges for a value from a gin override, a saved config.json or code."""
    hints = annotations_of(type(obj))
    for f in dataclasses.fields(obj):
        if f.name in hints:
            check_value(f"{type(obj).__name__}.{f.name}", hints[f.name], getattr(obj, f.name))


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
