"""Embedders built on our networks, with the interface of `docids/embed.py` (`fit(texts)`, then
`embed(texts)` → [N, D] float32, L2-normalised rows).

* `T5MeanEmbedder` — mean-pooled encoder states of a gr_jax T5 (params + vocabulary given); trainable as a
  dual encoder (`baselines/dense.finetune_dual_encoder`).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.data.pipeline import tokenize
from gr_jax.docids.embed import Embedder, normalise
from gr_jax.runtime.validation import Count


def t5_mean_pool(model, params, ids, mask=None):
    """Mean of the T5 encoder's output states over non-padding positions → [B, D] float32 (not normalised)."""
    mask = (ids != 0) if mask is None else mask
    h = model.apply({"params": params}, ids, mask, method="encode").astype(jnp.float32)
    return (h * mask[..., None]).sum(1) / jnp.maximum(mask.sum(1, keepdims=True), 1)


@gin.configurable
@dataclasses.dataclass
class T5MeanEmbedder(Embedder):
    """Mean of the encoder's output states over non-padding positions."""

    model: object = None  # gr_jax.backbones.t5.T5
    params: object = None
    vocab: object = None
    length: Count = 128
    batch_size: Count = 64
    name = "t5_mean"

    def fit(self, texts) -> "T5MeanEmbedder":
        if self.model is None or self.params is None or self.vocab is None:
            raise ValueError("T5MeanEmbedder needs model, params and vocab")
        return self

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.fit(texts)
        tokens = tokenize(list(texts), self.vocab, self.length, what="embed")
        pooled = jax.jit(lambda p, ids: t5_mean_pool(self.model, p, ids))
        out = [np.asarray(pooled(self.params, jnp.asarray(tokens[s:s + self.batch_size], jnp.int32)))
               for s in range(0, len(tokens), self.batch_size)]
        return normalise(np.concatenate(out)) if out else np.zeros((0, self.model.config.d_model), np.float32)
