"""`trainer.fit`'s loop config and hooks, by hand on a toy model (SGD on a quadratic): hooks act in their order at
their points; a refresh may rewrite the parameters, and runs resumed from a checkpoint saved after a rewrite, or
before one, end where the uninterrupted run ends."""

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
    loop = trainer.LoopConfig(steps, 2, log_period=1, checkpoint_period=2, progress=False)
    return trainer.fit(_Model(), {"w": jnp.zeros(3, jnp.float32)}, _Batches(), optax.sgd(0.1), run_dir=model_dir,
                       loop=loop, meta={"toy": 1}, hooks=[trainer.Refresh(_rewrite(calls), 2)])


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
        trainer.fit(_Model(), {"w": jnp.zeros(3, jnp.float32)}, _Batches(), optax.sgd(0.1), run_dir=tmp_path,
                    loop=trainer.LoopConfig(2, 2, log_period=1, checkpoint_period=2, progress=False),
                    meta={"toy": 1}, hooks=[trainer.Refresh(lambda step, params: {"w": jnp.zeros(4, jnp.float32)}, 1)])


def test_fit_takes_a_loop_config_and_hooks_which_act_in_order_at_their_points(tmp_path):
    import inspect
    import json

    import pytest

    assert len(inspect.signature(trainer.fit).parameters) <= 8
    calls = []

    class Record(trainer.Hook):
        def __init__(self, name):
            self.name = name

        def check(self, loop):
            calls.append((self.name, "check", loop.train_steps))

        def on_start(self, ctx):
            calls.append((self.name, "start", ctx.step, ctx.resumed_from))

        def after_step(self, ctx):
            calls.append((self.name, "step", ctx.step))

        def after_log(self, ctx):
            logged = ctx.logged.get("loss")  # the last log line's (none before the first log step)
            calls.append((self.name, "log", ctx.step, None if logged is None else round(logged, 4)))

        def on_end(self, ctx):
            calls.append((self.name, "end", ctx.step))

    evaluated = []
    hooks = [Record("a"), trainer.EveryStep(lambda step: calls.append(("every", step))), Record("b"),
             trainer.Evaluate(lambda params: evaluated.append(1) or {"w0": float(params["w"][0])}, 2)]
    loop = trainer.LoopConfig(3, 2, log_period=3, checkpoint_period=3, progress=False)
    out = trainer.fit(_Model(), {"w": jnp.zeros(3, jnp.float32)}, _Batches(), optax.sgd(0.1), run_dir=tmp_path,
                      loop=loop, meta={"toy": 1}, hooks=hooks)
    assert out["step"] == 3 and out["resumed_from"] is None
    # losses by hand: w0 = 0, x = 0: 0; then w = 0 (no gradient) → step 2 x = 1: loss 3·1 = 3; w = 0.2 → step 3,
    # x = 2: 3·1.8² = 9.72; logged at step 3 as their mean (0 + 3 + 9.72) / 3 = 4.24
    assert calls == [("a", "check", 3), ("b", "check", 3), ("a", "start", 0, None), ("b", "start", 0, None),
                     ("a", "step", 1), ("every", 1), ("b", "step", 1), ("a", "log", 1, None), ("b", "log", 1, None),
                     ("a", "step", 2), ("every", 2), ("b", "step", 2), ("a", "log", 2, None), ("b", "log", 2, None),
                     ("a", "step", 3), ("every", 3), ("b", "step", 3), ("a", "log", 3, 4.24), ("b", "log", 3, 4.24),
                     ("a", "end", 3), ("b", "end", 3)]
    # the periodic evaluation at step 2 (never after the last step), written to the run's eval_metrics.jsonl
    lines = [json.loads(x) for x in (tmp_path / "eval_metrics.jsonl").read_text().splitlines()]
    # (after step 2, w = 0 − 0.1·2·(0 − 1) = 0.2 in float32: 1e-7 relative)
    assert evaluated == [1] and [x["step"] for x in lines] == [2] and lines[0]["w0"] == pytest.approx(0.2, rel=1e-6)
    calls.clear()  # a finished run, run again: restored, no step, the hooks start and end at step 3
    trainer.fit(_Model(), {"w": jnp.zeros(3, jnp.float32)}, _Batches(), optax.sgd(0.1), run_dir=tmp_path,
                loop=loop, meta={"toy": 1}, hooks=[Record("a")])
    assert calls == [("a", "check", 3), ("a", "start", 3, 3), ("a", "end", 3)]


class _TwoPhaseModel(_Model):
    """A batch with "later" reports metric "b", others "a" (a training whose phases log other metrics, as RIPOR's
    ranking batches carry negatives)."""

    def loss_fn(self, params, batch, dropout_rng=None):
        loss, metrics = super().loss_fn(params, batch)
        name = "b" if "later" in batch else "a"
        return loss, {**metrics, name: (batch["x"][0, 0], jnp.float32(1.0))}


class _TwoPhaseBatches(_Batches):
    def __next__(self):
        later = self.step >= 2
        batch = super().__next__()
        return {**batch, "later": np.ones(2, np.int32)} if later else batch


def test_a_log_period_across_phases_with_other_metrics_logs_both(tmp_path):
    import json

    loop = trainer.LoopConfig(4, 2, log_period=4, checkpoint_period=4, progress=False)
    trainer.fit(_TwoPhaseModel(), {"w": jnp.zeros(3, jnp.float32)}, _TwoPhaseBatches(), optax.sgd(0.1),
                run_dir=tmp_path,
                loop=loop, meta={"toy": 2})
    (line,) = [json.loads(x) for x in (tmp_path / "train_metrics.jsonl").read_text().splitlines()]
    # steps read x = 0, 1 (phase a) and 2, 3 (phase b): each metric is the mean over its own steps
    assert line["a"] == 0.5 and line["b"] == 2.5
