"""Numeric parity of gr_jax's T5 against transformers' PyTorch T5 on the same checkpoint.

Needs the `torch` extra. `check_parity` is what `tools/check_parity.py` runs on a user's checkpoint; the tests
call it on tiny random models written by transformers' `save_pretrained`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.backbones import t5, t5_convert

log = logging.getLogger(__name__)


def random_padded_batch(vocab_size: int, batch: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids in [3, vocab) with a different amount of right padding per row (row 0 unpadded)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab_size, (batch, length), dtype=np.int64)
    lengths = np.maximum(1, length - (np.arange(batch) * length) // max(batch, 1))
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
    return ids * mask, mask


def load_torch_t5(hf_dir: str | os.PathLike):
    import torch  # noqa: F401  (fail early with ImportError if the extra is missing)
    import transformers

    model = transformers.T5ForConditionalGeneration.from_pretrained(str(hf_dir), dtype="float32")
    return model.eval()


def greedy_jax(model: t5.T5, params, ids: np.ndarray, mask: np.ndarray, steps: int) -> np.ndarray:
    """Greedy decoding with the key/value cache (no EOS stopping: every row runs `steps` steps)."""
    variables = {"params": params}
    encoded = model.apply(variables, jnp.asarray(ids), jnp.asarray(mask), method="encode")
    cache = model.apply(variables, encoded, jnp.asarray(mask), steps, method="init_cache")
    step = jax.jit(lambda c, tok: model.apply(variables, c, tok, method="decode_step"))
    token = jnp.full((ids.shape[0],), model.config.decoder_start_token_id, jnp.int32)
    out = []
    for _ in range(steps):
        logits, cache = step(cache, token)
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        out.append(token)
    return np.stack([np.asarray(t) for t in out], axis=1)


def greedy_torch(torch_model, ids: np.ndarray, mask: np.ndarray, steps: int) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = torch_model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                                   max_new_tokens=steps, min_new_tokens=steps, do_sample=False, num_beams=1)
    return out[:, 1:].numpy()  # drop the decoder start token


def check_parity(hf_dir: str | os.PathLike, gr_jax_checkpoint: str | os.PathLike | None = None, batch: int = 4,
                 encoder_length: int = 32, decoder_length: int = 8, greedy_steps: int = 5,
                 seed: int = 0) -> dict[str, Any]:
    """Runs transformers on `hf_dir` and gr_jax on `gr_jax_checkpoint` (default: `hf_dir` converted in
    memory) over one random padded batch; returns the figures as a dict."""
    import torch

    if gr_jax_checkpoint is None:
        config, params = t5_convert.load_hf(hf_dir)
    else:
        config, params = t5_convert.load_checkpoint(gr_jax_checkpoint)
    torch_model = load_torch_t5(hf_dir)
    ids, mask = random_padded_batch(config.vocab_size, batch, encoder_length, seed)
    dec, _ = random_padded_batch(config.vocab_size, batch, decoder_length, seed + 1)
    dec[:, 0] = config.decoder_start_token_id
    with torch.no_grad():
        ref = torch_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                          decoder_input_ids=torch.tensor(dec))
    model = t5.T5(config)
    variables = {"params": params}
    encoded = model.apply(variables, jnp.asarray(ids), jnp.asarray(mask), method="encode")
    logits = model.apply(variables, encoded, jnp.asarray(mask), jnp.asarray(dec), method="decode")
    valid = mask[..., None].astype(bool)
    enc_diff = float(np.max(np.abs(np.asarray(encoded) - ref.encoder_last_hidden_state.numpy()) * valid))
    logit_diff = float(np.max(np.abs(np.asarray(logits) - ref.logits.numpy())))
    ours = greedy_jax(model, params, ids, mask, greedy_steps)
    theirs = greedy_torch(torch_model, ids, mask, greedy_steps)
    return {
        "hf_dir": str(Path(hf_dir)),
        "gr_jax_checkpoint": None if gr_jax_checkpoint is None else str(gr_jax_checkpoint),
        "batch": batch,
        "encoder_length": encoder_length,
        "decoder_length": decoder_length,
        "max_abs_diff_encoder": enc_diff,
        "max_abs_diff_logits": logit_diff,
        "max_abs_logit": float(np.max(np.abs(ref.logits.numpy()))),
        "greedy_steps": greedy_steps,
        "greedy_identical": bool(np.array_equal(ours, theirs)),
        "tie_word_embeddings": config.tie_word_embeddings,
        "feed_forward_proj": config.feed_forward_proj,
    }


def write_random_hf_t5(out_dir: str | os.PathLike, version: str = "1.0", seed: int = 0, vocab_size: int = 512,
                       d_model: int = 64, num_layers: int = 2, num_heads: int = 4, d_kv: int = 16,
                       d_ff: int = 128, num_decoder_layers: int | None = None) -> Path:
    """A tiny randomly initialised HF T5 written with `save_pretrained` (v1.0 tied, or v1.1 untied head)."""
    import torch
    import transformers

    if version not in ("1.0", "1.1"):
        raise ValueError(f"version must be '1.0' or '1.1', got {version!r}")
    torch.manual_seed(seed)
    v11 = version == "1.1"
    cfg = transformers.T5Config(vocab_size=vocab_size, d_model=d_model, d_kv=d_kv, d_ff=d_ff, num_layers=num_layers,
                                num_decoder_layers=num_decoder_layers, num_heads=num_heads,
                                feed_forward_proj="gated-gelu" if v11 else "relu",
                                tie_word_embeddings=not v11, decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    if v11:
        # Released v1.1 checkpoints have an lm_head independent of the input embedding.
        generator = torch.Generator().manual_seed(seed + 1)
        model.lm_head.weight = torch.nn.Parameter(torch.randn(model.lm_head.weight.shape, generator=generator))
        model.config.tie_word_embeddings = False
    model.save_pretrained(str(out_dir))
    return Path(out_dir)


def hf_prefix_allowed_fn(docids, eos_id: int):
    """The baseline GR repositories use with `generate(prefix_allowed_tokens_fn=...)`: a nested-dict trie
    walked in Python for every beam at every step (the decoder start token is skipped)."""
    root: dict = {}
    for seq in np.asarray(docids).tolist():
        node = root
        for tok in seq:
            node = node.setdefault(tok, {})

    def allowed(batch_id, sent):
        node = root
        for tok in sent.tolist()[1:]:
            node = node.get(tok, {})
        return list(node) or [eos_id]

    return allowed
