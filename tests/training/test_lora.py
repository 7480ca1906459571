"""LoRA (training/lora.py): adapters beside the Dense kernels of T5 and Llama, trained alone by the trainer.

Hand-checkable facts: B = 0 at the start, so the adapted network is the same function bit for bit; merge folds
scale · A B into the kernel, so merged and unmerged logits agree to float32 rounding; only A and B move in
training; the checkpoints hold the adapters and the digest of everything else."""

from __future__ import annotations

import textwrap
from pathlib import Path

import gin
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from gr_jax import compose
from gr_jax.backbones import llama, t5
from gr_jax.runtime import gin_utils
from gr_jax.training import initial, lora, trainer
from tests.conftest import sweep


def _t5():
    config = t5.get_config("tiny", vocab_size=64)
    return config, t5.T5(config), t5.init_params(config, seed=1)


def _t5_logits(net, params):
    enc = jnp.asarray(np.arange(2 * 7).reshape(2, 7) % 60 + 2, jnp.int32)
    dec = jnp.asarray(np.arange(2 * 5).reshape(2, 5) % 50 + 2, jnp.int32)
    return net.apply({"params": params}, enc, dec)


def _llama():
    config = llama.get_config("llama_tiny", vocab_size=64)
    return config, llama.Llama(config), llama.init_params(config, seed=2)


def _llama_logits(net, params):
    tokens = jnp.asarray(np.arange(2 * 9).reshape(2, 9) % 60 + 2, jnp.int32)
    return net.apply({"params": params}, tokens)


NETWORKS = {"t5": (_t5, _t5_logits), "llama": (_llama, _llama_logits)}


def _random_b(params, seed=5):
    """Every adapter's B drawn at random (a trained adapter), so that the adapters change the function."""
    key = jax.random.PRNGKey(seed)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    out = []
    for i, (path, leaf) in enumerate(leaves):
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        out.append(jax.random.normal(jax.random.fold_in(key, i), leaf.shape) * 0.3 if name.endswith("lora_b")
                   else leaf)
    return treedef.unflatten(out)


@pytest.mark.parametrize("arch", sweep("arch", sorted(NETWORKS), ["llama"]))  # T5's case in the slow tier
def test_zero_initialised_adapters_leave_the_logits_unchanged(arch):
    build, logits = NETWORKS[arch]
    _, net, params = build()
    adapted = lora.Lora(rank=4, targets=("q", "k", "v", "o")).add(params)
    names = lora.leaf_names(adapted)
    # every attention projection of every layer got an adapter (T5: encoder self, decoder self and cross)
    parent = lambda n: n.split("/")[-2] if "/" in n else ""
    assert sum(n.endswith("/lora_a") for n in names) == sum(parent(n) in ("q", "k", "v", "o")
                                                           and n.endswith("/kernel") for n in names) > 0
    assert np.array_equal(np.asarray(logits(net, params)), np.asarray(logits(net, adapted)))
    # and the adapters are really read: a non-zero B changes the logits
    assert float(jnp.max(jnp.abs(logits(net, _random_b(adapted)) - logits(net, params)))) > 1e-3


@pytest.mark.parametrize("arch", sweep("arch", sorted(NETWORKS), ["t5"]))  # Llama's case in the slow tier
def test_merge_equals_unmerged_and_unmerge_gives_the_base_back(arch):
    build, logits = NETWORKS[arch]
    _, net, params = build()
    adapted = _random_b(lora.Lora(rank=4, targets=("q", "v", "o", "wi", "wo", "gate", "up", "down")).add(params))
    merged = lora.merge(adapted)
    assert not lora.has_adapters(merged)
    assert jax.tree_util.tree_structure(merged) == jax.tree_util.tree_structure(params)
    unmerged_logits, merged_logits = logits(net, adapted), logits(net, merged)
    # the same sums in another order (W x + s (x A) B against (W + s A B) x): float32 rounding of the logits'
    # magnitude, far below the adapters' own effect (checked > 1e-3 above)
    scale = float(jnp.max(jnp.abs(unmerged_logits)))
    assert float(jnp.max(jnp.abs(unmerged_logits - merged_logits))) <= 1e-5 * scale
    back = lora.unmerge(merged, lora.adapters_of(adapted))
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(adapted)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6 * max(1.0, float(np.abs(b).max())))


def test_fused_generation_kernels_fold_the_adapters_in():
    _, net, params = _llama()
    adapted = _random_b(lora.Lora(rank=2, targets=("q", "k", "v", "gate", "up")).add(params))
    fused = llama.fuse_projections(adapted["layers_0"])
    plain = llama.fuse_projections(lora.merge(adapted)["layers_0"])
    np.testing.assert_allclose(np.asarray(fused["attention"]["qkv"]["kernel"]),
                               np.asarray(plain["attention"]["qkv"]["kernel"]), rtol=0, atol=1e-6)


def test_targets_that_name_nothing_are_refused():
    _, _, params = _t5()
    with pytest.raises(ValueError, match="name no Dense"):
        lora.Lora(targets=("query",)).add(params)
    with pytest.raises(ValueError, match="list of Dense names"):
        lora.Lora(targets="q")


def test_partition_splits_and_joins_and_a_step_moves_only_the_adapters():
    config, net, params = _t5()
    adapted = lora.Lora(rank=4).add(params)
    part = trainer.Partition(adapted, lora.trainable)
    train, frozen = part.split(adapted)
    assert set(lora.leaf_names(train)) == {n for n in lora.leaf_names(adapted) if n.endswith(("lora_a", "lora_b"))}
    rejoined = part.join(train, frozen)
    assert all(a is b for a, b in zip(jax.tree_util.tree_leaves(rejoined), jax.tree_util.tree_leaves(adapted)))

    enc = jnp.asarray(np.arange(4 * 7).reshape(4, 7) % 60 + 2, jnp.int32)
    dec = jnp.asarray(np.arange(4 * 5).reshape(4, 5) % 50 + 2, jnp.int32)

    def loss_fn(p, batch, rng):
        out = net.apply({"params": p}, enc, dec)
        loss = -jnp.mean(jax.nn.log_softmax(out)[..., 3])
        return loss, {"loss": (loss, jnp.ones(()))}

    import optax

    tx = optax.adam(1e-2)
    state = {"step": jnp.zeros((), jnp.int32), "params": train, "opt_state": tx.init(train),
             "nonfinite": jnp.zeros((), jnp.int32)}
    step = jax.jit(trainer.make_train_step(loss_fn, tx, part))
    for _ in range(2):
        state, _ = step(state, {}, jax.random.PRNGKey(0), frozen)
    # the gradient and the optimizer see the trainable part only: its leaves are the state's whole tree
    assert lora.leaf_names(state["params"]) == lora.leaf_names(train)
    moved = [n for n, a, b in zip(lora.leaf_names(train), jax.tree_util.tree_leaves(state["params"]),
                                  jax.tree_util.tree_leaves(train)) if not np.array_equal(a, b)]
    assert any(n.endswith("lora_b") for n in moved)
    # and the loss went down through the adapters alone
    before = loss_fn(adapted, None, None)[0]
    after = loss_fn(part.join(state["params"], frozen), None, None)[0]
    assert float(after) < float(before)


# ---------------------------------------------------------------------------------------------------------------
# the whole path: train (checkpoints of adapters), resume, restore
# ---------------------------------------------------------------------------------------------------------------

LORA_RUN = """
include 'experiments/demo/dsi_naive.gin'
load_dataset.demo_docs = 40
BATCH_SIZE = 8
prepare.vocab_size = 200
train.progress = False
train.log_period = 1
train.final_eval = False
EvalConfig.compare_bm25 = False
EvalConfig.num_beams = 3
make_optimizer.learning_rate = 1e-2
make_optimizer.warmup_steps = 0
make_optimizer.decay = 'constant'
prepare.adapters = @Lora()
Lora.rank = 4
Lora.targets = ['q', 'v', 'wo']
"""


def _train(tmp_path: Path, name: str, base: Path, steps: int, period: int):
    f = tmp_path / "lora.gin"
    f.write_text(textwrap.dedent(LORA_RUN))
    gin.clear_config()
    gin_utils.parse([str(f)], [f"MODEL_DIR = '{tmp_path / name}'", f"INITIAL_CHECKPOINT_PATH = '{base}'",
                               f"TRAIN_STEPS = {steps}", f"train.checkpoint_period = {period}"])
    out = compose.train()
    gin.clear_config()
    return out


def _saved_state(model_dir: Path, step: int) -> dict:
    mngr = ocp.CheckpointManager((model_dir / "checkpoints").absolute())
    return mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]


@pytest.mark.slow
def test_lora_run_checkpoints_adapters_resumes_exactly_and_restores_merged(tmp_path, tiny_dsi):
    _, base_dir = tiny_dsi  # a trained tiny T5 DSI: the pretrained network the adapters adapt
    full = _train(tmp_path, "full", base_dir, 4, 4)
    saved = _saved_state(tmp_path / "full", 4)
    # the checkpoint holds the adapters only (no kernel, no head) and their optimizer state
    names = lora.leaf_names(saved["params"])
    assert names and all(n.endswith(("lora_a", "lora_b")) for n in names)
    held = sum(np.size(x) for x in jax.tree_util.tree_leaves(saved["params"]))
    assert sum(np.size(x) for x in jax.tree_util.tree_leaves(saved["opt_state"])) <= 2 * held + 16  # Adam: μ, ν
    # only the adapters moved: the frozen network is the base run's, bit for bit
    _, base_network = initial._run_network(base_dir)
    trained = full["state"]["params"]
    flat_trained = dict(zip(lora.leaf_names(trained), jax.tree_util.tree_leaves(trained)))
    flat_base = dict(zip(lora.leaf_names({"network": base_network}), jax.tree_util.tree_leaves(base_network)))
    assert len(flat_base) > 10 and all(np.array_equal(flat_trained[n], flat_base[n]) for n in flat_base)
    assert any(float(np.abs(np.asarray(flat_trained[n])).max()) > 0 for n in flat_trained if n.endswith("lora_b"))

    # stopped after 2 steps and resumed: the same adapters as 4 steps in one go
    _train(tmp_path, "split", base_dir, 2, 2)
    resumed = _train(tmp_path, "split", base_dir, 4, 2)
    assert resumed["resumed_from"] == 2
    for a, b in zip(jax.tree_util.tree_leaves(resumed["state"]["params"]), jax.tree_util.tree_leaves(trained)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)

    # restored for inference: the base network read again, the adapters merged in — the trained function
    f = tmp_path / "lora.gin"
    gin_utils.parse([str(f)], [f"MODEL_DIR = '{tmp_path / 'full'}'", f"INITIAL_CHECKPOINT_PATH = '{base_dir}'",
                               "TRAIN_STEPS = 4"])
    setup, params, step = compose.restore(tmp_path / "full")
    gin.clear_config()
    assert step == 4 and not lora.has_adapters(params)
    net = t5.T5(setup.model.config)
    logits = lambda p: _t5_logits(net, p["network"])
    a, b = logits(params), logits(trained)
    assert float(jnp.max(jnp.abs(a - b))) <= 1e-5 * float(jnp.max(jnp.abs(b)))


@pytest.mark.slow
def test_lora_resume_over_other_base_weights_is_refused(tmp_path, tiny_dsi):
    from tests.conftest import _train_in_process
    from tests.test_bad_inputs import TINY

    _, base_dir = tiny_dsi
    _train(tmp_path, "run", base_dir, 2, 2)
    (tmp_path / "other").mkdir()
    _train_in_process(tmp_path / "other" / "tiny.gin", TINY + "\nSEED = 1\n")  # other weights, same shapes
    f = tmp_path / "lora.gin"
    gin_utils.parse([str(f)], [f"MODEL_DIR = '{tmp_path / 'run'}'",
                               f"INITIAL_CHECKPOINT_PATH = '{tmp_path / 'other' / 'model'}'", "TRAIN_STEPS = 4"])
    with pytest.raises(trainer.TrainingError, match="frozen_parameters"):
        compose.train()
    gin.clear_config()
