"""`map_padded`: one batch shape for every call, padding dropped, outputs in row order."""

import numpy as np
import pytest

from gr_jax.retriever.batching import map_padded


def test_map_padded_by_hand():
    shapes = []

    def fn(a, b):
        shapes.append((a.shape, b.shape))
        return a * 2, (a + b).sum(-1)

    a = np.arange(10, dtype=np.float32).reshape(5, 2)
    b = np.ones((5, 2), np.float32)
    doubled, sums = map_padded(fn, [a, b], batch_size=2)
    np.testing.assert_array_equal(doubled, a * 2)
    np.testing.assert_array_equal(sums, [3, 7, 11, 15, 19])
    assert shapes == [((2, 2), (2, 2))] * 3  # the last batch of one row padded to two
    (single,) = map_padded(lambda x: x + 1, [a], batch_size=8)
    np.testing.assert_array_equal(single, a + 1)
    with pytest.raises(ValueError, match="parallel, non-empty"):
        map_padded(fn, [a, b[:3]], 2)
    with pytest.raises(ValueError, match="parallel, non-empty"):
        map_padded(fn, [a[:0], b[:0]], 2)
