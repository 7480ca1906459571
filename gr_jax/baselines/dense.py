"""Dense retrieval with any embedder (docids/embed.py): exact inner-product search in JAX → a TREC Run, plus
DPR-style fine-tuning of a Flax T5 dual encoder with in-batch negatives.

`DenseIndex` holds one L2-normalised row per document. `search` scores query blocks against document blocks
under jit and merges a running top-k, so memory is O(query block × document block) whatever the corpus size,
and the result is exact (no approximation). `add` encodes new documents with the frozen embedder and
appends them: the dynamic-corpora protocol's "dense retrieval with the D0 encoder re-encoding new documents".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from gr_jax.data.trec import Run, fetch_deciding_ties, top_k
from gr_jax.docids.quantize import exact_search
from gr_jax.runtime.io_utils import atomic_dir, read_json
from gr_jax.runtime.validation import Count, Positive

log = logging.getLogger(__name__)


@gin.configurable
@dataclasses.dataclass
class DenseIndex:
    embedder: object
    doc_ids: list = dataclasses.field(default_factory=list)
    matrix: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0), np.float32))
    query_block: Count = 256
    doc_block: Count = 65536

    @classmethod
    def build(cls, embedder, corpus, rows: Optional[Sequence[int]] = None, fit: bool = True,
              **kwargs) -> "DenseIndex":
        """Fit the embedder on these documents (when it learns from text, e.g. TF-IDF) and encode them."""
        rows = np.arange(len(corpus)) if rows is None else np.asarray(rows, np.int64)
        texts = [corpus.texts[int(r)] for r in rows]
        if fit:
            embedder.fit(texts)
        index = cls(embedder, **kwargs)
        index.add(corpus, rows)
        return index

    def add(self, corpus, rows: Sequence[int]) -> None:
        """Encode more documents with the frozen embedder and append them (no refit)."""
        rows = np.asarray(rows, np.int64)
        if not len(rows):
            return
        new_ids = [corpus.doc_ids[int(r)] for r in rows]
        held = set(self.doc_ids)
        dup = [d for d in new_ids if d in held]
        if dup or len(set(new_ids)) != len(new_ids):
            raise ValueError(f"DenseIndex.add: documents already indexed or repeated, e.g. {(dup or new_ids)[:3]}")
        emb = np.asarray(self.embedder.embed([corpus.texts[int(r)] for r in rows]), np.float32)
        if emb.shape[0] != len(rows) or (self.matrix.size and emb.shape[1] != self.matrix.shape[1]):
            raise ValueError(f"DenseIndex.add: embedder returned {emb.shape}, expected ({len(rows)}, "
                             f"{self.matrix.shape[1] if self.matrix.size else 'D'})")
        self.matrix = emb if not self.matrix.size else np.concatenate([self.matrix, emb])
        self.doc_ids = list(self.doc_ids) + new_ids

    def __len__(self) -> int:
        return len(self.doc_ids)

    def search(self, texts: Sequence[str], qids: Sequence[str], k: int = 100) -> Run:
        if len(texts) != len(qids):
            raise ValueError(f"DenseIndex.search: {len(texts)} queries for {len(qids)} ids")
        empty = [q for q, t in zip(qids, texts) if not t.strip()]
        if empty:
            raise ValueError(f"DenseIndex.search: empty query text for {empty[:3]}")
        q = np.asarray(self.embedder.embed_queries(list(texts)), np.float32)

        def fetch(n: int):  # `exact_search` keeps the earlier row on a tie: fetch past the cut, cut by docid
            scores, rows = exact_search(q, self.matrix, n, self.query_block, self.doc_block)
            return (scores, rows), [srow[rrow >= 0] for srow, rrow in zip(scores, rows)]

        scores, rows = fetch_deciding_ties(fetch, k, len(self))
        return {qid: top_k({self.doc_ids[int(r)]: float(s) for s, r in zip(srow, rrow) if r >= 0}, k)
                for qid, srow, rrow in zip(qids, scores, rows)}

    def save(self, path: str | os.PathLike) -> None:
        """Document ids + matrix (the embedder is configured separately, e.g. by gin)."""
        with atomic_dir(path) as tmp:
            np.save(tmp / "matrix.npy", self.matrix)
            (tmp / "dense.json").write_text(json.dumps({"embedder": getattr(self.embedder, "name", "?"),
                                                         "doc_ids": list(self.doc_ids)}))

    @classmethod
    def load(cls, path: str | os.PathLike, embedder) -> "DenseIndex":
        path = Path(path)
        try:
            meta = read_json(path / "dense.json")
            matrix = np.load(path / "matrix.npy", allow_pickle=False)
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not a saved DenseIndex ({e})") from None
        if matrix.shape[0] != len(meta["doc_ids"]):
            raise ValueError(f"{path}: {matrix.shape[0]} vectors for {len(meta['doc_ids'])} document ids")
        if meta["embedder"] != getattr(embedder, "name", "?"):
            raise ValueError(f"{path}: built with embedder {meta['embedder']!r}, given {embedder.name!r}")
        return cls(embedder, list(meta["doc_ids"]), matrix)


# ----------------------------------------------------------------------------------------------------------
# DPR-style fine-tuning of a T5 dual encoder (shared encoder, mean pooling, in-batch negatives)
# ----------------------------------------------------------------------------------------------------------


def in_batch_loss(q_BxD, d_BxD, temperature: float):
    """Cross-entropy of each query against all documents of the batch (its own is the positive)."""
    q = q_BxD / jnp.maximum(jnp.linalg.norm(q_BxD, axis=-1, keepdims=True), 1e-6)
    d = d_BxD / jnp.maximum(jnp.linalg.norm(d_BxD, axis=-1, keepdims=True), 1e-6)
    logits = q @ d.T / temperature
    return optax.softmax_cross_entropy_with_integer_labels(logits, jnp.arange(len(q))).mean()


class _DualEncoderObjective:
    """The in-batch loss of a shared T5 encoder (mean pooling), as the training loop's model."""

    def __init__(self, model, temperature: float):
        self.model, self.temperature = model, float(temperature)

    def loss_fn(self, params, batch, rng):
        from gr_jax.backbones.t5_embed import t5_mean_pool

        loss = in_batch_loss(t5_mean_pool(self.model, params, batch["q"]), t5_mean_pool(self.model, params, batch["d"]),
                             self.temperature)
        return loss, {"loss": (loss, jnp.ones((), jnp.float32))}

    def param_axes(self, params):
        from jax.sharding import PartitionSpec

        return jax.tree_util.tree_map(lambda _: PartitionSpec(), params)  # replicated: a small encoder


class _DistinctDocumentBatches:
    """One pair per distinct document in each batch (so in-batch negatives are real negatives), drawn from a new
    permutation of the pairs each step by one seeded generator; resumable (the state is the batches drawn)."""

    def __init__(self, q_tok: np.ndarray, d_tok: np.ndarray, doc_key: np.ndarray, batch_size: int, seed: int):
        self.q_tok, self.d_tok, self.doc_key, self.batch_size, self.seed = q_tok, d_tok, doc_key, batch_size, seed
        self.set_state({"drawn": 0})

    def set_state(self, state: dict) -> None:
        self.drawn, self.rng = 0, np.random.default_rng(self.seed)
        for _ in range(int(state["drawn"])):
            self._rows()

    def get_state(self) -> dict:
        return {"drawn": self.drawn}

    def _rows(self) -> np.ndarray:
        order = self.rng.permutation(len(self.q_tok))
        _, first = np.unique(self.doc_key[order], return_index=True)  # one pair per distinct document
        self.drawn += 1
        return order[np.sort(first)][:self.batch_size]

    def __next__(self) -> dict:
        pick = self._rows()
        return {"q": self.q_tok[pick], "d": self.d_tok[pick]}

    def epochs(self) -> list:
        return [self.drawn * self.batch_size / len(self.q_tok)]


@gin.configurable
def finetune_dual_encoder(embedder, queries: Sequence[str], documents: Sequence[str], run_dir: str | os.PathLike,
                          steps: Count = 200, batch_size: Count = 32, learning_rate: Positive = 1e-3,
                          temperature: Positive = 0.05, seed: int = 0, progress: bool = True):
    """Train `embedder` (a `T5MeanEmbedder`) on (query, positive document) pairs through the library's training
    loop (`trainer.fit`: checkpoints in `run_dir`, where a killed run resumes exactly; the non-finite guard);
    returns a copy with the new parameters and the loss of every step (`dual_encoder_metrics.jsonl` there).
    Batches hold distinct documents, so in-batch negatives are real negatives."""
    from gr_jax.data.pipeline import tokenize
    from gr_jax.runtime.io_utils import read_jsonl
    from gr_jax.runtime.run_dir import RunDir
    from gr_jax.training import trainer

    if len(queries) != len(documents) or not len(queries):
        raise ValueError(f"finetune_dual_encoder: {len(queries)} queries for {len(documents)} documents")
    q_tok = tokenize(list(queries), embedder.vocab, embedder.length, what="query")
    d_tok = tokenize(list(documents), embedder.vocab, embedder.length, what="document")
    doc_key = np.unique(np.asarray(documents, dtype=object), return_inverse=True)[1]
    batch_size = min(batch_size, int(doc_key.max()) + 1)  # a constant batch shape: one compilation
    if batch_size < 2:
        raise ValueError("finetune_dual_encoder: need at least two distinct documents")
    batches = _DistinctDocumentBatches(q_tok, d_tok, doc_key, batch_size, seed)
    loop = trainer.LoopConfig(steps, batch_size, seed=seed, log_period=1, checkpoint_period=max(1, min(100, steps)),
                              keep_checkpoints=1, progress=progress, name="dual_encoder")
    meta = {"embedder": getattr(embedder, "name", type(embedder).__name__),
            "pairs": hashlib.blake2b("\x00".join([*queries, "\x01", *documents]).encode(), digest_size=12).hexdigest(),
            "temperature": float(temperature), "learning_rate": float(learning_rate)}
    out = trainer.fit(_DualEncoderObjective(embedder.model, temperature), embedder.params, batches,
                      optax.adamw(learning_rate, weight_decay=0.0), run_dir=run_dir, loop=loop, meta=meta)
    losses = [row["loss"] for row in read_jsonl(RunDir(run_dir).metrics_log("dual_encoder"), "the loop's metrics")]
    return dataclasses.replace(embedder, params=out["state"]["params"]), losses
