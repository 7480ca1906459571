"""Markdown tables for metrics and dynamic-corpora reports."""

from __future__ import annotations

from typing import Mapping, Sequence


def fmt(value, digits: int = 4) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return "" if value is None else str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence], digits: int = 4) -> str:
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v, digits) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def metrics_table(results: Mapping[str, Mapping[str, float]], digits: int = 4) -> str:
    """One row per system/subset, one column per metric (in first-seen order)."""
    names: list[str] = []
    for values in results.values():
        names += [n for n in values if n not in names]
    rows = [[system] + [values.get(n) for n in names] for system, values in results.items()]
    return markdown_table(["run"] + names, rows, digits)
