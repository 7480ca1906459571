"""Loaders of decoder-only checkpoints: our GGUF reader against the `gguf` package's reader (files written by
its writer), a hand-worked Q4_1 block, HF safetensors and GGUF of the same random model giving the same logits,
and the errors a bad file gets."""

import json

import numpy as np
import pytest

import jax.numpy as jnp

from gr_jax.backbones import llama, llama_io, t5_convert
from gr_jax.backbones import gguf as ours_gguf
from tests.conftest import require


def _write_gguf(path, tensors, meta=None, arch="llama"):
    """tensors: name → (float32 array, GGML type name). Quantized with gguf's own quantizer."""
    gguf = require("gguf")
    w = gguf.GGUFWriter(str(path), arch)
    for k, v in (meta or {}).items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        else:
            w.add_array(k, v)
    for name, (arr, kind) in tensors.items():
        qt = getattr(gguf.GGMLQuantizationType, kind)
        if kind == "F32":
            w.add_tensor(name, arr.astype(np.float32))
        elif kind == "F16":
            w.add_tensor(name, arr.astype(np.float16))
        elif arr.dtype == np.uint8:  # already the bytes of the type (one gguf cannot quantize to)
            w.add_tensor(name, arr, raw_dtype=qt)
        else:
            w.add_tensor(name, gguf.quants.quantize(arr.astype(np.float32), qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_reader_matches_the_gguf_package(tmp_path):
    gguf = require("gguf")
    rng = np.random.default_rng(0)
    tensors = {f"t_{kind}": (rng.normal(size=(6, 64)).astype(np.float32), kind)
               for kind in ("F32", "F16", "Q8_0", "Q4_0", "Q4_1")}
    meta = {"general.name": "tiny", "x.count": 7, "x.eps": 1e-5, "x.flag": True, "x.words": ["a", "b c", "ü"],
            "x.ints": [3, 1, 4]}
    path = _write_gguf(tmp_path / "m.gguf", tensors, meta)
    ours = ours_gguf.GGUFFile(path)
    ref = gguf.GGUFReader(str(path))
    for name, field in ref.fields.items():
        if name.startswith("GGUF."):
            continue
        want = field.contents()
        got = ours.metadata[name]
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-7)
        else:
            assert got == want, name
    for t in ref.tensors:
        want = gguf.quants.dequantize(t.data, t.tensor_type)
        got = ours.tensor(t.name)
        assert got.shape == want.shape == (6, 64)
        np.testing.assert_array_equal(got, want)  # the same arithmetic on the same bytes: exact
        assert ours.tensors[t.name].type_name == t.tensor_type.name
    # and the quantized values are near the originals (a reader that returned zeros would fail here)
    src = tensors["t_Q4_1"][0]
    assert np.abs(ours.tensor("t_Q4_1") - src).max() <= (src.max() - src.min()) / 15 + 1e-6


def test_q4_1_block_by_hand():
    """One block: d = 0.5, m = −1; byte j holds value j (low nibble) and value j + 16 (high nibble)."""
    d, m = np.float16(0.5), np.float16(-1.0)
    low = np.arange(16, dtype=np.uint8)  # values 0..15 → q = 0..15
    high = (15 - np.arange(16)).astype(np.uint8)  # values 16..31 → q = 15..0
    raw = np.concatenate([np.frombuffer(d.tobytes() + m.tobytes(), np.uint8), low | (high << 4)])
    got = ours_gguf.dequantize(raw, 3, 32)
    want = [0.5 * q - 1.0 for q in range(16)] + [0.5 * q - 1.0 for q in range(15, -1, -1)]
    np.testing.assert_array_equal(got, np.array(want, np.float32))
    q8 = np.concatenate([np.frombuffer(np.float16(0.25).tobytes(), np.uint8),
                         np.arange(-16, 16, dtype=np.int8).view(np.uint8)])
    np.testing.assert_array_equal(ours_gguf.dequantize(q8, 8, 32), np.arange(-16, 16) * 0.25)


def _llama_cpp_rows(w_OUTxIN, heads):
    """llama.cpp's converter order of q/k rows: within each head, (first half i, second half i) interleaved."""
    out, inp = w_OUTxIN.shape
    half = out // heads // 2
    return w_OUTxIN.reshape(heads, 2, half, inp).transpose(0, 2, 1, 3).reshape(out, inp)


@pytest.mark.torch
def test_hf_and_gguf_of_one_model_give_the_same_logits(tmp_path):
    require("torch")
    from gr_jax.backbones import llama_parity

    hf_dir = llama_parity.write_random_hf_llama(tmp_path / "hf", seed=5, num_kv_heads=2, tie_word_embeddings=False)
    config, params = llama_io.load_hf_llama(hf_dir)
    hf = t5_convert.read_hf_tensors(hf_dir)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    tensors = {}
    for k, v in hf.items():
        if k in names:
            tensors[names[k]] = (v, "F32")
            continue
        i, rest = k.split(".")[2], ".".join(k.split(".")[3:-1])
        if rest == "self_attn.q_proj":
            v = _llama_cpp_rows(v, config.num_heads)
        elif rest == "self_attn.k_proj":
            v = _llama_cpp_rows(v, config.num_kv_heads)
        tensors[f"blk.{i}.{per_layer[rest]}.weight"] = (v, "F32")
    meta = {"llama.block_count": 2, "llama.embedding_length": 64, "llama.feed_forward_length": 96,
            "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2, "llama.rope.freq_base": 10000.0,
            "llama.attention.layer_norm_rms_epsilon": 1e-6, "llama.vocab_size": 256, "llama.context_length": 256}
    path = _write_gguf(tmp_path / "m.gguf", tensors, meta)
    g_config, g_params, _ = llama_io.load_gguf(path)
    assert not g_config.tie_word_embeddings and g_config.num_kv_heads == 2
    ids = jnp.asarray([[5, 9, 33, 100, 7, 250]])
    a = np.asarray(llama.Llama(config).apply({"params": params}, ids))
    b = np.asarray(llama.Llama(g_config).apply({"params": g_params}, ids))
    np.testing.assert_allclose(b, a, atol=1e-5 * np.abs(a).max())
    # the un-permutation is what makes them equal: without it the logits differ
    g_params["layers_0"]["attention"]["q"]["kernel"] = _llama_cpp_rows(
        params["layers_0"]["attention"]["q"]["kernel"].T, 4).T
    c = np.asarray(llama.Llama(config).apply({"params": g_params}, ids))
    assert np.abs(c - a).max() > 1e-3 * np.abs(a).max()


def test_bad_files_are_named(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOTAGGUF" + bytes(40))
    with pytest.raises(t5_convert.CheckpointError, match="bad.gguf.*bad magic"):
        ours_gguf.GGUFFile(bad)
    good = _write_gguf(tmp_path / "g.gguf", {"w": (np.ones((2, 32), np.float32), "Q8_0")})
    cut = tmp_path / "cut.gguf"
    end_of_header = ours_gguf.GGUFFile(good).tensors["w"].offset
    cut.write_bytes(good.read_bytes()[:end_of_header + 30])  # the tensor needs 68 bytes
    with pytest.raises(t5_convert.CheckpointError, match="cut.gguf.*truncated"):
        ours_gguf.GGUFFile(cut).tensor("w")
    with pytest.raises(t5_convert.CheckpointError, match="architecture 'gpt2' is not supported"):
        llama_io.load_gguf(_write_gguf(tmp_path / "a.gguf", {"w": (np.ones((2, 32)), "F32")}, arch="gpt2"))
    gguf = require("gguf")
    q6 = _write_gguf(tmp_path / "q6.gguf", {"w": (np.zeros((2, 210), np.uint8), "Q6_K")})  # 2 blocks of 256
    assert gguf.GGUFReader(str(q6)).tensors[0].tensor_type.name == "Q6_K"
    with pytest.raises(t5_convert.CheckpointError, match="w is Q6_K, which this reader does not dequantize"):
        ours_gguf.GGUFFile(q6).tensor("w")


def test_hf_config_errors(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    with pytest.raises(t5_convert.CheckpointError, match="'gpt_neox' is not a dense Llama-family model"):
        llama_io.load_hf_llama(d)
    with pytest.raises(t5_convert.CheckpointError, match="unknown pretrained model"):
        llama_io.load_named("llama-70b")
