"""The beam search's row hooks: a cache object that tiles and reorders its own rows (its layer axis comes
before the rows) is handed the work; plain leaves with that many leading rows are repeated / taken."""

import numpy as np

import flax.struct
import jax.numpy as jnp

from gr_jax.decoding.beam_search import gather_rows, tile_rows


@flax.struct.dataclass
class LayerFirst:
    kv: jnp.ndarray  # [layers, rows, 2]

    def tile_rows(self, n, rows):
        return self.replace(kv=jnp.repeat(self.kv, n, axis=1)) if self.kv.shape[1] == rows else self

    def gather_rows(self, index, rows):
        return self.replace(kv=jnp.take(self.kv, index, axis=1)) if self.kv.shape[1] == rows else self


def _tree():
    kv = jnp.arange(2 * 3 * 2).reshape(2, 3, 2)  # 2 layers, 3 rows
    return {"own": LayerFirst(kv), "rows": jnp.array([10, 11, 12]), "other": jnp.array([7, 8]),
            "scalar": jnp.array(5)}


def test_gather_hands_a_cache_object_its_rows():
    out = gather_rows(_tree(), jnp.array([2, 0, 0]), 3)
    # by hand: rows 2, 0, 0 of each layer
    np.testing.assert_array_equal(np.asarray(out["own"].kv[0]), [[4, 5], [0, 1], [0, 1]])
    np.testing.assert_array_equal(np.asarray(out["own"].kv[1]), [[10, 11], [6, 7], [6, 7]])
    np.testing.assert_array_equal(np.asarray(out["rows"]), [12, 10, 10])
    np.testing.assert_array_equal(np.asarray(out["other"]), [7, 8])  # 2 leading rows ≠ 3: untouched
    assert int(out["scalar"]) == 5


def test_tile_hands_a_cache_object_its_rows():
    out = tile_rows(_tree(), 2, 3)
    np.testing.assert_array_equal(np.asarray(out["own"].kv[1, :, 0]), [6, 6, 8, 8, 10, 10])
    np.testing.assert_array_equal(np.asarray(out["rows"]), [10, 10, 11, 11, 12, 12])
    np.testing.assert_array_equal(np.asarray(out["other"]), [7, 8])
    # a cache object whose rows are another count keeps them
    kept = tile_rows({"own": LayerFirst(jnp.zeros((2, 4, 2)))}, 2, 3)
    assert kept["own"].kv.shape == (2, 4, 2)
