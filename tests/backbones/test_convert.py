"""Checkpoint conversion without torch: key maps, error reporting, atomic writes, our checkpoint format."""

import json

import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

from gr_jax.backbones import t5, t5_convert


@pytest.fixture(scope="module", params=["tiny", "t5_1_1_tiny"])
def model(request):
    config = t5.get_config(request.param)
    return config, t5.init_params(config, seed=7)


def _write_hf(d, config, tensors):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(t5_convert.config_to_hf(config)))
    save_file(tensors, str(d / "model.safetensors"))
    return d


def test_params_hf_params_round_trip(model, tmp_path):
    config, params = model
    tensors = t5_convert.params_to_hf(params, config)
    ffn = 3 if config.is_gated else 2
    per_encoder_layer = 4 + 1 + ffn + 1  # q k v o, norm, FFN projections, norm
    per_decoder_layer = 2 * (4 + 1) + ffn + 1  # self and cross attention with their norms, FFN, norm
    expected = (1 + (0 if config.tie_word_embeddings else 1) + 2 * 2  # shared, lm_head, relpos + final norms
                + config.num_layers * per_encoder_layer + config.num_decoder_layers * per_decoder_layer)
    assert len(tensors) == expected
    d = _write_hf(tmp_path / "hf", config, tensors)
    config2, params2 = t5_convert.load_hf(d)
    assert config2 == config
    jax.tree_util.tree_map(np.testing.assert_array_equal, params2, jax.tree_util.tree_map(np.asarray, params))


def test_mismatch_lists_every_problem(model, tmp_path):
    config, params = model
    tensors = t5_convert.params_to_hf(params, config)
    del tensors["encoder.block.1.layer.0.SelfAttention.k.weight"]
    del tensors["decoder.final_layer_norm.weight"]
    tensors["encoder.block.7.layer.0.SelfAttention.q.weight"] = np.zeros((2, 2), np.float32)
    tensors["decoder.block.0.layer.1.EncDecAttention.o.weight"] = np.zeros((3, 5), np.float32)
    d = _write_hf(tmp_path / "hf", config, tensors)
    with pytest.raises(t5_convert.CheckpointMismatchError) as err:
        t5_convert.load_hf(d)
    e = err.value
    assert e.missing == ["decoder.final_layer_norm.weight", "encoder.block.1.layer.0.SelfAttention.k.weight"]
    assert e.unexpected == ["encoder.block.7.layer.0.SelfAttention.q.weight"]
    assert [k for k, _, _ in e.mis_shaped] == ["decoder.block.0.layer.1.EncDecAttention.o.weight"]
    assert e.mis_shaped[0][1:] == ((3, 5), (config.d_model, config.num_heads * config.d_kv))
    msg = str(e)
    for key in ("decoder.final_layer_norm.weight", "encoder.block.7", "EncDecAttention.o.weight (3, 5)"):
        assert key in msg


def test_tied_aliases_accepted_only_when_equal():
    config = t5.get_config("tiny")
    params = t5.init_params(config)
    tensors = t5_convert.params_to_hf(params, config)
    tensors["encoder.embed_tokens.weight"] = tensors["shared.weight"].copy()
    tensors["lm_head.weight"] = tensors["shared.weight"].copy()
    got_config = t5_convert.config_from_hf(t5_convert.config_to_hf(config), tensors)
    assert got_config.tie_word_embeddings
    t5_convert.params_from_hf(tensors, got_config)  # accepted: stored copies of the tied embedding
    tensors["decoder.embed_tokens.weight"] = tensors["shared.weight"] + 1.0
    with pytest.raises(t5_convert.CheckpointMismatchError, match="decoder.embed_tokens.weight"):
        t5_convert.params_from_hf(tensors, got_config)


def test_config_semantics_transformers_4_and_5():
    base = {"model_type": "t5", "vocab_size": 32, "d_model": 8, "d_kv": 2, "d_ff": 16, "num_layers": 1,
            "num_heads": 4, "feed_forward_proj": "gated-gelu"}
    # transformers 4.x v1.1: tie_word_embeddings false → untied head, no output scaling.
    c4 = t5_convert.config_from_hf({**base, "tie_word_embeddings": False})
    assert not c4.tie_word_embeddings and not c4.scale_decoder_outputs
    # transformers 5.x writes tie_word_embeddings true always; the tensors decide.
    head = np.ones((32, 8), np.float32)
    c5 = t5_convert.config_from_hf({**base, "tie_word_embeddings": True, "scale_decoder_outputs": False},
                                {"shared.weight": np.zeros((32, 8), np.float32), "lm_head.weight": head})
    assert not c5.tie_word_embeddings and not c5.scale_decoder_outputs
    with pytest.raises(t5_convert.CheckpointError, match="model_type 'bert'"):
        t5_convert.config_from_hf({**base, "model_type": "bert"})
    with pytest.raises(t5_convert.CheckpointError, match="'d_model'"):
        t5_convert.config_from_hf({k: v for k, v in base.items() if k != "d_model"})


def test_corrupt_or_missing_files_name_the_file(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    with pytest.raises(t5_convert.CheckpointError, match="config.json: not found"):
        t5_convert.load_hf(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(t5_convert.CheckpointError, match="config.json: invalid JSON"):
        t5_convert.load_hf(d)
    (d / "config.json").write_text(json.dumps(t5_convert.config_to_hf(t5.get_config("tiny"))))
    with pytest.raises(t5_convert.CheckpointError, match="no model.safetensors"):
        t5_convert.load_hf(d)
    (d / "model.safetensors").write_bytes(b"\x00garbage" * 20)
    with pytest.raises(t5_convert.CheckpointError, match=r"model\.safetensors: cannot read"):
        t5_convert.load_hf(d)


def test_failed_conversion_writes_nothing(tmp_path):
    config = t5.get_config("tiny")
    tensors = t5_convert.params_to_hf(t5.init_params(config), config)
    del tensors["shared.weight"]
    d = _write_hf(tmp_path / "hf", config, tensors)
    out = tmp_path / "out"
    with pytest.raises(t5_convert.CheckpointMismatchError, match="shared.weight"):
        t5_convert.convert_hf_to_checkpoint(d, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_sharded_safetensors(tmp_path):
    config = t5.get_config("tiny")
    params = t5.init_params(config, seed=2)
    tensors = t5_convert.params_to_hf(params, config)
    d = tmp_path / "sharded"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(t5_convert.config_to_hf(config)))
    keys = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2:])):
        name = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({k: tensors[k] for k in part}, str(d / name))
        weight_map.update({k: name for k in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    _, got = t5_convert.load_hf(d)
    jax.tree_util.tree_map(np.testing.assert_array_equal, got, jax.tree_util.tree_map(np.asarray, params))


def test_checkpoint_round_trip_and_corruption(model, tmp_path):
    config, params = model
    out = t5_convert.save_checkpoint(params, config, tmp_path / "ckpt")
    config2, params2 = t5_convert.load_checkpoint(out)
    assert config2 == config
    jax.tree_util.tree_map(np.testing.assert_array_equal, params2, jax.tree_util.tree_map(np.asarray, params))
    with pytest.raises(FileExistsError):
        t5_convert.save_checkpoint(params, config, out)
    # A checkpoint whose config does not match its arrays.
    meta = json.loads((out / "config.json").read_text())
    meta["t5_config"]["d_ff"] *= 2
    (out / "config.json").write_text(json.dumps(meta))
    with pytest.raises(t5_convert.CheckpointMismatchError, match=rf"encoder/layers_1/mlp/wo/kernel \({config.d_ff}, 64\)") as e:
        t5_convert.load_checkpoint(out)
    n_ffn = 3 if config.is_gated else 2
    assert len(e.value.mis_shaped) == n_ffn * (config.num_layers + config.num_decoder_layers)
    assert not e.value.missing and not e.value.unexpected
    # Corrupt array data.
    meta["t5_config"]["d_ff"] //= 2
    (out / "config.json").write_text(json.dumps(meta))
    for f in (out / "params").rglob("*"):
        if f.is_file() and f.stat().st_size > 1000:
            f.write_bytes(b"\x00" * 64)
    with pytest.raises(t5_convert.CheckpointError, match="params"):
        t5_convert.load_checkpoint(out)
    (out / "config.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(t5_convert.CheckpointError, match="format tag"):
        t5_convert.load_checkpoint(out)
