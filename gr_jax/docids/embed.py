"""Document embedders for numeric docids, behind one interface: `fit(texts)` then `embed(texts)` → [N, D]
float32, L2-normalised rows; `state()` / `load_state()` as JSON + arrays (no pickle).

* `TfidfSvdEmbedder` — TF-IDF over words, then truncated SVD (LSA) to `dim` dimensions; scikit-learn, needs
  no weights, so it works offline everywhere.
* `T5MeanEmbedder` — mean-pooled encoder states of a gr_jax T5 (params + vocabulary given).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


@gin.configurable
@dataclasses.dataclass
class TfidfSvdEmbedder:
    dim: int = 64
    max_features: int = 50_000
    seed: int = 0
    name = "tfidf_svd"
    _vectorizer: object = dataclasses.field(default=None, repr=False)
    _components: Optional[np.ndarray] = dataclasses.field(default=None, repr=False)

    def fit(self, texts: Sequence[str]) -> "TfidfSvdEmbedder":
        from sklearn.decomposition import TruncatedSVD
        from sklearn.feature_extraction.text import TfidfVectorizer

        texts = list(texts)
        vec = TfidfVectorizer(max_features=self.max_features, sublinear_tf=True, dtype=np.float32)
        m = vec.fit_transform(texts)
        dim = min(self.dim, m.shape[1] - 1, len(texts) - 1)
        if dim < 1:
            raise ValueError(f"TfidfSvdEmbedder: {len(texts)} texts with {m.shape[1]} terms are too few to embed")
        svd = TruncatedSVD(dim, random_state=self.seed, algorithm="randomized", n_iter=7).fit(m)
        self._vectorizer, self._components = vec, svd.components_.astype(np.float32)
        return self

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self._vectorizer is None:
            raise ValueError("TfidfSvdEmbedder.embed before fit()")
        return _normalise(self._vectorizer.transform(list(texts)) @ self._components.T)

    def state(self):
        vocab = sorted(self._vectorizer.vocabulary_, key=self._vectorizer.vocabulary_.get)
        return ({"dim": self.dim, "max_features": self.max_features, "seed": self.seed, "terms": vocab},
                {"idf": self._vectorizer.idf_.astype(np.float32), "components": self._components})

    def load_state(self, meta, arrays) -> None:
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.dim, self.max_features, self.seed = int(meta["dim"]), int(meta["max_features"]), int(meta["seed"])
        vec = TfidfVectorizer(vocabulary={t: i for i, t in enumerate(meta["terms"])}, sublinear_tf=True,
                              dtype=np.float32)
        vec.idf_ = np.asarray(arrays["idf"])
        self._vectorizer, self._components = vec, np.asarray(arrays["components"])


@dataclasses.dataclass
class T5MeanEmbedder:
    """Mean of the encoder's output states over non-padding positions."""

    model: object  # gr_jax.models.t5.T5
    params: object
    vocab: object
    length: int = 128
    batch_size: int = 64
    name = "t5_mean"

    def fit(self, texts) -> "T5MeanEmbedder":
        return self

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        from gr_jax.data.pipeline import tokenize
        from gr_jax.models import t5

        tokens = tokenize(list(texts), self.vocab, self.length, what="embed")

        @jax.jit
        def pooled(p, ids):
            mask = ids != 0
            h = self.model.apply({"params": p}, ids, mask, method=t5.T5.encode).astype(jnp.float32)
            return (h * mask[..., None]).sum(1) / jnp.maximum(mask.sum(1, keepdims=True), 1)

        out = [np.asarray(pooled(self.params, jnp.asarray(tokens[s:s + self.batch_size], jnp.int32)))
               for s in range(0, len(tokens), self.batch_size)]
        return _normalise(np.concatenate(out))
