"""A T5 checkpoint in t5x's format → our T5 (`python -m gr_jax.t5x.pretrained`; its conversion in-process, its
refusals as the command): tiny T5.1.1 (gated GELU, separate head) and T5.1.0 (ReLU, head = embedding) networks of
t5x's own T5 example, written by t5x's own checkpointer in the layout of the public checkpoints, give our T5 the
logits t5x's network computes. The oracle is t5x's code, which shares nothing with ours."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def convert(*args: str, expect: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "gr_jax.t5x.pretrained", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == expect, res.stderr[-3000:]
    return res


def t5x_checkpoint(tmp_path: Path, gated: bool):
    """A tiny network of t5x's T5 example, saved by t5x's Checkpointer (msgpack + tensorstore, as published)."""
    from t5x import checkpoints, partitioning, train_state
    from t5x.examples.t5 import network

    cfg = network.T5Config(vocab_size=64, dtype="float32", emb_dim=16, num_heads=2, num_encoder_layers=2,
                           num_decoder_layers=2, head_dim=8, mlp_dim=32, dropout_rate=0.0,
                           mlp_activations=("gelu", "linear") if gated else ("relu",),
                           logits_via_embedding=not gated)
    module = network.Transformer(cfg)
    enc = np.array([[5, 6, 7, 8, 1, 0, 0], [9, 3, 1, 0, 0, 0, 0]], np.int32)
    dec_in = np.array([[0, 11, 12, 13], [0, 4, 4, 2]], np.int32)
    dec_target = np.array([[11, 12, 13, 1], [4, 4, 2, 1]], np.int32)
    variables = module.init(jax.random.PRNGKey(3), enc, dec_in, dec_target, enable_dropout=False)
    # T5's own init leaves the layer-norm scales at 1: move them so a scale in the wrong place shows
    variables = jax.tree_util.tree_map_with_path(
        lambda p, x: x * (1.0 + 0.1 * np.arange(x.size).reshape(x.shape) / x.size)
        if "scale" in jax.tree_util.keystr(p) else x, variables)
    state = train_state.InferenceState.create(variables)
    checkpoints.Checkpointer(state, partitioning.PjitPartitioner(num_partitions=1), str(tmp_path / "t5x")).save(state)
    logits = module.apply(variables, enc, dec_in, dec_target, enable_dropout=False)
    return tmp_path / "t5x" / "checkpoint_0", (enc, dec_in), np.asarray(logits)


@pytest.mark.parametrize("gated", [True, False], ids=["t5.1.1", "t5.1.0"])
def test_a_t5x_checkpoint_gives_our_t5_t5xs_logits(tmp_path, gated):
    from gr_jax.backbones import t5_convert as ours
    from gr_jax.backbones import t5

    from gr_jax.t5x.pretrained import convert_t5x_t5

    path, (enc, dec_in), expected = t5x_checkpoint(tmp_path, gated)
    out = convert_t5x_t5(str(path), str(tmp_path / "ours"))  # what the command runs and prints
    assert out["config"]["feed_forward_proj"] == ("gated-gelu" if gated else "relu")
    assert out["config"]["tie_word_embeddings"] is (not gated)
    assert (out["config"]["num_heads"], out["config"]["d_kv"], out["config"]["num_decoder_layers"]) == (2, 8, 2)
    config, params = ours.load_checkpoint(tmp_path / "ours")
    got = np.asarray(t5.T5(config).apply({"params": params}, enc, dec_in))
    # one computation in two float32 implementations: rounding relative to the logits' magnitude; a transposed
    # kernel, a swapped layer norm or a missing output scaling moves them by the magnitude itself
    assert got.shape == expected.shape
    assert float(np.abs(got - expected).max()) <= 1e-5 * float(np.abs(expected).max())


@pytest.mark.slow
def test_bad_input_exits_2_with_one_message(tmp_path):
    """The command as a user types it: one message, exit code 2, no traceback, nothing written."""
    res = convert("--checkpoint", str(tmp_path / "nothing"), "--out", str(tmp_path / "o"), expect=2)
    assert "not a directory" in res.stderr and "Traceback" not in res.stderr
    (tmp_path / "empty").mkdir()
    res = convert("--checkpoint", str(tmp_path / "empty"), "--out", str(tmp_path / "o"), expect=2)
    assert "not a t5x checkpoint" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "o").exists()
