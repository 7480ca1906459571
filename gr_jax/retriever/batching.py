"""Running a jitted function over the rows of arrays in batches of one shape (one compilation)."""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def map_padded(fn: Callable, arrays: Sequence[np.ndarray], batch_size: int) -> tuple[np.ndarray, ...]:
    """`fn(*batch)` over consecutive `batch_size` rows of the parallel `arrays`; the last batch is padded with
    zero rows so every call has one shape, and the padding rows are dropped from the outputs. `fn` returns an
    array or a tuple of arrays with one row per input row; → the outputs of all batches, concatenated (numpy)."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"map_padded: batch_size must be an integer ≥ 1, got {batch_size!r}")
    n = len(arrays[0])
    if n == 0 or any(len(a) != n for a in arrays):
        raise ValueError(f"map_padded: parallel, non-empty arrays expected, got lengths {[len(a) for a in arrays]}")
    outs: list[list[np.ndarray]] = []
    for start in range(0, n, batch_size):
        parts = [np.asarray(a[start:start + batch_size]) for a in arrays]
        keep = len(parts[0])
        if keep < batch_size:
            parts = [np.concatenate([p, np.zeros((batch_size - keep,) + p.shape[1:], p.dtype)]) for p in parts]
        res = jax.device_get(fn(*(jnp.asarray(p) for p in parts)))
        res = res if isinstance(res, tuple) else (res,)
        if not outs:
            outs = [[] for _ in res]
        for acc, r in zip(outs, res):
            acc.append(np.asarray(r)[:keep])
    return tuple(np.concatenate(acc) for acc in outs)
