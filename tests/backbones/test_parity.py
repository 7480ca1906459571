"""Parity against transformers' PyTorch T5 (random tiny configs written by save_pretrained), round trips, and
the two command-line tools."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.backbones import t5, t5_convert, t5_parity
from tests.conftest import require, run_tool

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def torch():
    return require("torch")


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_parity_padded_batch_and_greedy(hf_t5_dirs, version):
    result = t5_parity.check_parity(hf_t5_dirs[version], batch=4, encoder_length=24, decoder_length=7, greedy_steps=6)
    assert result["max_abs_diff_encoder"] <= 1e-4, result
    assert result["max_abs_diff_logits"] <= 1e-4, result
    assert result["greedy_identical"], result
    assert result["tie_word_embeddings"] == (version == "1.0")


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_cached_decoding_matches_torch_incremental(hf_t5_dirs, version, torch):
    """Our cached steps vs transformers' own cached steps (past_key_values), token by token."""
    hf_dir = hf_t5_dirs[version]
    config, params = t5_convert.load_hf(hf_dir)
    tm = t5_parity.load_torch_t5(hf_dir)
    ids, mask = t5_parity.random_padded_batch(config.vocab_size, 3, 16, seed=5)
    dec, _ = t5_parity.random_padded_batch(config.vocab_size, 3, 5, seed=6)
    model = t5.T5(config)
    v = {"params": params}
    enc = model.apply(v, jnp.asarray(ids), jnp.asarray(mask), method="encode")
    cache = model.apply(v, enc, jnp.asarray(mask), 5, method="init_cache")
    past = None
    with torch.no_grad():
        enc_out = tm.get_encoder()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
        for t in range(5):
            ours, cache = model.apply(v, cache, jnp.asarray(dec[:, t]), method="decode_step")
            out = tm(encoder_outputs=enc_out, attention_mask=torch.tensor(mask),
                     decoder_input_ids=torch.tensor(dec[:, t:t + 1]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            np.testing.assert_allclose(np.asarray(ours), out.logits[:, 0].numpy(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_relative_position_bucket_matches_transformers(version, torch):
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = np.arange(-300, 300)
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 16)):
            want = T5Attention._relative_position_bucket(torch.tensor(rel), bidirectional, buckets, distance)
            got = t5.relative_position_bucket(jnp.asarray(rel), bidirectional, buckets, distance)
            np.testing.assert_array_equal(np.asarray(got), want.numpy())


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_hf_round_trip_identical_tensors(hf_t5_dirs, version, tmp_path, torch):
    hf_dir = hf_t5_dirs[version]
    tensors = t5_convert.read_hf_tensors(hf_dir)
    config, params = t5_convert.load_hf(hf_dir)
    back = t5_convert.params_to_hf(params, config)
    assert set(back) == set(tensors)
    for k in tensors:
        np.testing.assert_array_equal(back[k], tensors[k], err_msg=k)
    # Through our orbax checkpoint and back to an HF directory that transformers loads.
    t5_convert.save_checkpoint(params, config, tmp_path / "ours")
    config2, params2 = t5_convert.load_checkpoint(tmp_path / "ours")
    assert config2 == config
    t5_convert.save_hf(params2, config2, tmp_path / "hf_again")
    again = t5_convert.read_hf_tensors(tmp_path / "hf_again")
    for k in tensors:
        np.testing.assert_array_equal(again[k], tensors[k], err_msg=k)
    ref, exported = t5_parity.load_torch_t5(hf_dir), t5_parity.load_torch_t5(tmp_path / "hf_again")
    ids = torch.tensor([[5, 6, 7, 1]])
    dec = torch.tensor([[0, 9, 10]])
    with torch.no_grad():
        a = ref(input_ids=ids, decoder_input_ids=dec).logits
        b = exported(input_ids=ids, decoder_input_ids=dec).logits
    assert torch.equal(a, b)


def test_pytorch_bin_with_tied_aliases(hf_t5_dirs, tmp_path, torch):
    """pytorch_model.bin (read with weights_only=True) holding the tied alias keys that state_dict() emits."""
    tm = t5_parity.load_torch_t5(hf_t5_dirs["1.0"])
    d = tmp_path / "bin"
    d.mkdir()
    (d / "config.json").write_text((hf_t5_dirs["1.0"] / "config.json").read_text())
    state = tm.state_dict()
    assert "encoder.embed_tokens.weight" in state and "lm_head.weight" in state
    torch.save(state, d / "pytorch_model.bin")
    config, params = t5_convert.load_hf(d)
    _, from_safetensors = t5_convert.load_hf(hf_t5_dirs["1.0"])
    assert config.tie_word_embeddings
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, from_safetensors)


def test_pytorch_bin_with_pickled_object_is_refused(tmp_path, torch):
    d = tmp_path / "evil"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "t5", "vocab_size": 8, "d_model": 4, "d_kv": 2,
                                               "d_ff": 8, "num_layers": 1, "num_heads": 2}))
    torch.save({"shared.weight": torch.zeros(8, 4), "payload": Path("x")}, d / "pytorch_model.bin")
    with pytest.raises(t5_convert.CheckpointError, match="pytorch_model.bin"):
        t5_convert.load_hf(d)


@pytest.mark.slow
def test_tools_convert_and_check_parity(hf_t5_dirs, tmp_path, capsys):
    for version, hf_dir in hf_t5_dirs.items():
        out = tmp_path / f"ckpt_{version}"
        rc, stdout, err = run_tool("convert_checkpoint", ["--hf_dir", hf_dir, "--out", out], capsys)
        assert rc == 0, err
        assert json.loads(stdout)["out"] == str(out)
        assert (out / "config.json").exists() and (out / "params").is_dir()
        rc, stdout, err = run_tool("check_parity", ["--hf_dir", hf_dir, "--gr_jax_checkpoint", out, "--batch", "3"],
                                   capsys)
        assert rc == 0, err
        line = json.loads(stdout.strip().splitlines()[-1])
        assert line["max_abs_diff_encoder"] <= 1e-4 and line["max_abs_diff_logits"] <= 1e-4, line
        assert line["greedy_identical"] is True
        # Export back through the tool.
        rc, _, err = run_tool("convert_checkpoint", ["--to_hf", "--out", out, "--hf_dir", tmp_path / f"hf_{version}"],
                              capsys)
        assert rc == 0, err
        back = t5_convert.read_hf_tensors(tmp_path / f"hf_{version}")
        orig = t5_convert.read_hf_tensors(hf_dir)
        assert all(np.array_equal(back[k], orig[k]) for k in orig)


def test_convert_tool_on_corrupt_checkpoint_writes_nothing(hf_t5_dirs, tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((hf_t5_dirs["1.0"] / "config.json").read_text())
    data = (hf_t5_dirs["1.0"] / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 3])  # truncated download
    out = tmp_path / "out"
    rc, _, err = run_tool("convert_checkpoint", ["--hf_dir", bad, "--out", out], capsys)
    assert rc == 2
    assert "model.safetensors" in err
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")]
