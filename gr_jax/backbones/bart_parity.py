"""Numeric parity of gr_jax's BART against transformers' `BartForConditionalGeneration` on the same weights.

Needs the `torch` extra. `check_parity` is what `tools/check_parity.py --arch bart` runs on a user's HF directory
or fairseq checkpoint; the tests call it on tiny random models (`write_random_hf_bart`: every parameter drawn at
random, LayerNorms and the logits bias included, so a swapped or mis-mapped weight shows).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.backbones import bart, bart_convert

log = logging.getLogger(__name__)


def load_torch_bart(hf_dir: str | os.PathLike):
    import transformers

    return transformers.BartForConditionalGeneration.from_pretrained(str(hf_dir), dtype="float32").eval()


def write_random_hf_bart(out_dir: str | os.PathLike, seed: int = 0, vocab_size: int = 96, d_model: int = 32,
                         encoder_layers: int = 2, decoder_layers: int = 2, encoder_heads: int = 4,
                         decoder_heads: int = 2, encoder_ffn: int = 64, decoder_ffn: int = 48,
                         max_positions: int = 40, scale_embedding: bool = True) -> Path:
    """A tiny HF BART with every parameter random (`save_pretrained`); the encoder and decoder differ in heads
    and FFN width so that a stack mix-up shows."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.BartConfig(
        vocab_size=vocab_size, d_model=d_model, encoder_layers=encoder_layers, decoder_layers=decoder_layers,
        encoder_attention_heads=encoder_heads, decoder_attention_heads=decoder_heads, encoder_ffn_dim=encoder_ffn,
        decoder_ffn_dim=decoder_ffn, max_position_embeddings=max_positions, scale_embedding=scale_embedding,
        forced_bos_token_id=None, forced_eos_token_id=None, dropout=0.0)
    model = transformers.BartForConditionalGeneration(cfg).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name or "layernorm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(p.shape, generator=generator))
        model.final_logits_bias.copy_(0.5 * torch.randn(model.final_logits_bias.shape, generator=generator))
    model.save_pretrained(str(out_dir))
    return Path(out_dir)


def random_batch(config: bart.BartConfig, batch: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids in [4, vocab) with more right padding on later rows (row 0 unpadded); pads are the pad id."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, config.vocab_size, (batch, length))
    lengths = np.maximum(1, length - (np.arange(batch) * length) // max(batch, 1))
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
    return np.where(mask == 1, ids, config.pad_token_id), mask


def forward(config: bart.BartConfig, params, ids, mask, dec) -> tuple[np.ndarray, np.ndarray]:
    """(encoder states, teacher-forced logits) of our network."""
    net = bart.Bart(config)
    variables = {"params": params}
    encoded = net.apply(variables, jnp.asarray(ids), jnp.asarray(mask), method="encode")
    logits = net.apply(variables, encoded, jnp.asarray(mask), jnp.asarray(dec), method="decode")
    return np.asarray(encoded), np.asarray(logits)


def greedy_jax(config: bart.BartConfig, params, ids, mask, steps: int) -> np.ndarray:
    """Greedy decoding through the key/value cache; every row runs `steps` steps, EOS never chosen (what
    transformers' `min_new_tokens = steps` does)."""
    net = bart.Bart(config)
    variables = {"params": params}
    encoded = net.apply(variables, jnp.asarray(ids), jnp.asarray(mask), method="encode")
    cache = net.apply(variables, encoded, jnp.asarray(mask), steps, method="init_cache")
    step = jax.jit(lambda c, tok: net.apply(variables, c, tok, method="decode_step"))
    token = jnp.full((ids.shape[0],), config.decoder_start_token_id, jnp.int32)
    out = []
    for _ in range(steps):
        logits, cache = step(cache, token)
        logits = logits.at[:, config.eos_token_id].set(-jnp.inf)
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        out.append(np.asarray(token))
    return np.stack(out, axis=1)


def check_parity(hf_dir: str | os.PathLike, fairseq_checkpoint: str | os.PathLike | None = None, batch: int = 4,
                 encoder_length: int = 24, decoder_length: int = 8, greedy_steps: int = 6,
                 seed: int = 0) -> dict[str, Any]:
    """transformers on `hf_dir` against gr_jax on `hf_dir` converted in memory (or on `fairseq_checkpoint`, the
    same weights in fairseq's format, against transformers without `final_logits_bias`, which fairseq's BART does
    not have), over one random padded batch."""
    import torch

    config, params = (bart_convert.load_hf(hf_dir) if fairseq_checkpoint is None
                      else bart_convert.load_fairseq(fairseq_checkpoint))
    torch_model = load_torch_bart(hf_dir)
    removed_bias = 0.0
    if fairseq_checkpoint is not None:  # fairseq's BART has no logits bias: compare against HF's logits without it
        removed_bias = float(torch_model.final_logits_bias.abs().max())
        with torch.no_grad():
            torch_model.final_logits_bias.zero_()
    ids, mask = random_batch(config, batch, encoder_length, seed)
    dec, _ = random_batch(config, batch, decoder_length, seed + 1)
    dec[:, 0] = config.decoder_start_token_id
    with torch.no_grad():
        ref = torch_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                          decoder_input_ids=torch.tensor(dec))
        theirs = torch_model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                                      max_new_tokens=greedy_steps, min_new_tokens=greedy_steps, do_sample=False,
                                      num_beams=1, forced_bos_token_id=None, forced_eos_token_id=None)
    encoded, logits = forward(config, params, ids, mask, dec)
    ref_logits = ref.logits.numpy()
    scale = float(np.max(np.abs(ref_logits)))
    logit_diff = float(np.max(np.abs(logits - ref_logits)))
    ours = greedy_jax(config, params, ids, mask, greedy_steps)
    return {
        "hf_dir": str(Path(hf_dir)),
        "fairseq_checkpoint": None if fairseq_checkpoint is None else str(fairseq_checkpoint),
        # with --fairseq, the HF directory's final_logits_bias (largest |entry|) left out of its logits
        "hf_final_logits_bias_removed": removed_bias,
        "batch": batch, "encoder_length": encoder_length, "decoder_length": decoder_length,
        "max_abs_diff_encoder": float(np.max(np.abs(encoded - ref.encoder_last_hidden_state.numpy())
                                             * mask[..., None])),
        "max_abs_diff_logits": logit_diff,
        "max_abs_logit": scale,
        # the tolerance applies to this figure: logits of a trained model run far above 1
        "relative_diff_logits": logit_diff / max(scale, 1e-12),
        "greedy_steps": greedy_steps,
        "greedy_identical": bool(np.array_equal(ours, theirs.numpy()[:, 1:])),
    }
