"""The parity checks' shared pieces: differences relative to the reference's magnitude (`rel_diff`, `worst`), and
mutation testing of a check (`tools/check_parity.py --mutate`): swap two rows of one parameter tensor of
a fixture, run the same comparison, and see whether it fails. A check that passes a mutated tensor cannot see that
tensor. A method's parity module builds on this (`methods/<name>/parity.py`: `mutations(folder, ...)`).
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Optional

import numpy as np


def swapped(value) -> np.ndarray:
    """Row 0 swapped with the first row that differs from it (rows: along the first axis longer than 1; elements,
    for a vector; a scalar negated). Row 0 and the next rows are ones a fixture reads (an embedding's pad and eos,
    the first relative-position buckets); an error when every row is the same, where no swap changes anything."""
    out = np.array(value, copy=True)
    if out.size == 1:
        return -out
    rows = out.reshape((-1,) + out.shape[next(i for i, n in enumerate(out.shape) if n > 1) + 1:])
    flat = rows.reshape(rows.shape[0], -1)
    differ = np.flatnonzero(np.any(flat != flat[0], axis=1))
    if not differ.size:
        raise ValueError("every row of the tensor is the same: swapping two changes nothing")
    j = int(differ[0])
    rows[[0, j]] = rows[[j, 0]]
    return rows.reshape(out.shape)


def chosen(names: Iterable[str], sample: int = 0, seed: int = 0) -> list[str]:
    """The sorted names, or `sample` of them drawn with `seed` (0: all)."""
    names = sorted(names)
    if sample and sample < len(names):
        names = sorted(np.random.default_rng(seed).choice(names, size=sample, replace=False).tolist())
    return names


def sweep(tensors: Mapping[str, np.ndarray], passes: Callable[[dict], bool], names: Optional[Iterable[str]] = None,
          sample: int = 0, seed: int = 0,
          mutate: Optional[Callable[[str, np.ndarray], np.ndarray]] = None) -> dict[str, bool]:
    """{tensor name: whether `passes(tensors with that tensor's two rows swapped)` is False (the mutation caught)},
    for every tensor (or `names`, or a `sample` of them drawn with `seed`). `mutate(name, value)`: the mutation of a
    tensor where two rows of the whole would change nothing the model computes (a method's parity module says which
    part is read, or how a tensor whose entries are all equal changes; default `swapped`). A tensor whose rows are all
    the same (a norm left at its initial ones) cannot be swapped and counts as missed, unless `mutate` changes it
    otherwise (GLEN's and PAG's shared peer fixtures: the first entry negated); a fixture of ours varies it."""
    out = {}
    for name in chosen(tensors if names is None else names, sample, seed):
        try:
            mutated = mutate(name, tensors[name]) if mutate is not None else swapped(tensors[name])
        except ValueError:
            out[name] = False
            continue
        out[name] = not passes({**tensors, name: mutated})
    return out


def rel_diff(ours, theirs, where=None) -> float:
    """max |ours − theirs| / max |theirs| (over `where`, when given): float32 passes of a tiny model agree to ~1e-6 of
    the magnitude, which an absolute figure would hide or exaggerate with the model's scale. A shape mismatch is an
    error."""
    a, b = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shape {a.shape} vs the reference's {b.shape}")
    if where is not None:
        a, b = a[where], b[where]
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) if a.size else 0.0


def worst(*values) -> float:
    """The largest difference; NaN if any is NaN (a plain max keeps whichever comes first)."""
    values = [float(v) for v in values]
    return float("nan") if any(v != v for v in values) else max(values)


def swapped_or_negated(name: str, value) -> np.ndarray:
    """`sweep`'s `mutate` for fixtures that keep some tensors at a constant (HF's norms at one, as the shared peer
    fixtures do): `swapped`, or for a tensor whose entries are all equal its first entry negated, the one change to
    it the model computes with."""
    value = np.asarray(value)
    if value.size > 1 and np.all(value == value.reshape(-1)[0]):
        out = value.copy()
        out.reshape(-1)[0] *= -1
        return out
    return swapped(value)
