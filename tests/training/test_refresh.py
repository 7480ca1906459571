"""`trainer.fit`'s refresh may rewrite the parameters: by hand on a toy model (SGD on a quadratic); runs resumed
from a checkpoint saved after a rewrite, or before one, end where the uninterrupted run ends."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from gr_jax.training import trainer


class _Model:
    def loss_fn(self, params, batch, dropout_rng=None):
        loss = jnp.sum((params["w"] - batch["x"][0]) ** 2)
        return loss, {"loss": (loss, jnp.float32(1.0))}

    def param_axes(self, params):
        return jax.tree_util.tree_map(lambda _: P(), params)


class _Batches:
    """Batch s holds x = s (three components)."""

    def __init__(self):
        self.step = 0

    def __next__(self):
        batch = {"x": np.full((2, 3), float(self.step), np.float32)}
        self.step += 1
        return batch

    def get_state(self):
        return {"step": self.step}

    def set_state(self, state):
        self.step = int(state["step"])

    def epochs(self):
        return [self.step / 10]


def _rewrite(calls):
    def refresh(step, params):  # every refresh sets w to 10·step: the same when applied to its own result
        calls.append(step)
        if step == 0:
            return None  # keeps the initial parameters
        return {"w": jnp.full(3, 10.0 * step, jnp.float32)}

    return refresh


def _fit(model_dir, steps, calls):
    return trainer.fit(_Model(), {"w": jnp.zeros(3, jnp.float32)}, _Batches(), optax.sgd(0.1), model_dir=model_dir,
                       train_steps=steps, batch_size=2, meta={"toy": 1}, log_period=1, checkpoint_period=2,
                       progress=False, refresh=_rewrite(calls), refresh_period=2)


def test_a_refresh_rewrites_the_parameters_and_a_resume_repeats_it(tmp_path):
    calls = []
    out = _fit(tmp_path / "a", 6, calls)
    assert calls == [0, 2, 4]
    # after step 4 w = 40; step 5 reads x = 4: w = 40 − 0.1·2·(40 − 4) = 32.8; step 6 reads x = 5:
    # w = 32.8 − 0.1·2·(32.8 − 5) = 27.24 (float32 steps from values ~40: 1e-6 relative)
    np.testing.assert_allclose(np.asarray(out["state"]["params"]["w"]), 27.24, rtol=1e-6)
    # resumed from checkpoint 4, saved after that step's rewrite: the refresh at the start applies it again
    import shutil

    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "6")
    calls = []
    resumed = _fit(tmp_path / "b", 6, calls)
    assert resumed["resumed_from"] == 4 and calls == [4]
    np.testing.assert_array_equal(np.asarray(resumed["state"]["params"]["w"]), np.asarray(out["state"]["params"]["w"]))
    # a run that stops at 4 saves before any refresh after its last step; resumed to 6, it ends the same
    calls = []
    _fit(tmp_path / "c", 4, calls)
    assert calls == [0, 2]
    resumed = _fit(tmp_path / "c", 6, [])
    np.testing.assert_array_equal(np.asarray(resumed["state"]["params"]["w"]), np.asarray(out["state"]["params"]["w"]))


def test_a_refresh_returning_other_shapes_is_refused(tmp_path):
    import pytest

    with pytest.raises(trainer.TrainingError, match="another structure, shape or dtype"):
        trainer.fit(_Model(), {"w": jnp.zeros(3, jnp.float32)}, _Batches(), optax.sgd(0.1), model_dir=tmp_path,
                    train_steps=2, batch_size=2, meta={"toy": 1}, log_period=1, checkpoint_period=2,
                    progress=False, refresh=lambda step, params: {"w": jnp.zeros(4, jnp.float32)},
                    refresh_period=1)
