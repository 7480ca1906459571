"""Docvec's model: a pretrained sentence encoder reads the query, and the docid is the code whose vector is
nearest (cosine) — a one-step generation over atomic docids, with the output vectors a parameter table.

Parameters: {"encoder": the BERT's, "docids": [P, D], the vectors of the P codes the docid table had when the
parameters were made, started from the table's "vector" extras (`docids.DocvecDocids`)}. The query is read as
the encoder was trained ([CLS] tokens [SEP], mean pooling, normalised) from the run's vocabulary, the encoder's
own WordPiece one (VOCABULARY = 'all-MiniLM-L6-v2'; the inputs' end token becomes [SEP]).

  training   cross-entropy of the target code over the P codes, logits cosine / `temperature`;
  ranking    every code of the docid table (the constraint: only documents the index holds), by cosine: codes
             < P with their trained vector, later codes (documents added after training) with the encoder's
             vector of their text; score = cosine; the top `num_beams` per query, ties by decreasing document
             id (the evaluation's order).

Before training the ranking is dense retrieval with the frozen encoder (the test compares it with
sentence-transformers' embeddings)."""

from __future__ import annotations

import functools
import gin
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from gr_jax.methods.api import EOS_ID, PAD_ID, Capabilities, Positive, l2_normalise, load_sentence_encoder
from gr_jax.methods.docvec.docids import DOC_ID, VECTOR


@functools.lru_cache(maxsize=4)
def _encoder(spec: str):
    return load_sentence_encoder(spec)


class CosineOrder:
    """The ranker a run records for Docvec: `rank` orders documents itself (cosine, ties by decreasing document
    id); there are no beams to merge."""

    def __call__(self, *beams):
        raise ValueError("DocvecRetriever has no beams to merge: its rank orders the documents itself")


@gin.configurable
class DocvecRetriever:
    """`config`: the run's network config; its `pretrained_encoder` names the sentence encoder (a T5Config with
    `pretrained_encoder = 'all-MiniLM-L6-v2'` or a sentence-transformers directory). `temperature`: of the
    training softmax over codes."""

    ranker = CosineOrder()

    def __init__(self, config, head=None, score_mode: str = "cosine", *, temperature: Positive = 0.05):
        spec = getattr(config, "pretrained_encoder", "")
        if not spec:
            raise ValueError("DocvecRetriever reads queries with a pretrained sentence encoder: set "
                             "t5.get_config.pretrained_encoder = 'all-MiniLM-L6-v2' (prepare.network)")
        self.config = config
        self.head = head
        self.temperature = float(temperature)
        self.spec = spec
        self.encoder = _encoder(spec)
        self._codes = self._vectors = self._rows = self._tie_key = None
        self._score = jax.jit(self._scores)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities()

    def describe(self) -> str:
        return f"DocvecRetriever(encoder={self.spec!r}, temperature={self.temperature})"

    def decode_docids(self, params, doc_tokens):
        raise ValueError("DocvecRetriever does not decode docids from documents: DocvecDocids assigns them")

    # -- docids -------------------------------------------------------------------------------------------
    def use_docids(self, table) -> None:
        """Keeps each code's document row and vector (the table's "vector" extras, `DocvecDocids`)."""
        if table.extras is None or VECTOR not in table.extras or table.space.kind != "codebook" \
                or table.space.length != 1:
            raise ValueError("DocvecRetriever needs DocvecDocids (prepare.docid_scheme = @DocvecDocids()): one "
                             "code per document with its vector")
        codes = table.sequences[:, 0].astype(np.int64)
        n = int(codes.max()) + 1 if len(codes) else 0
        if len(np.unique(codes)) != len(codes) or n != len(codes):
            raise ValueError("DocvecRetriever: the docid table's codes are not 0..n-1, one per document")
        order = np.argsort(codes)
        self._vectors = np.asarray(table.extras[VECTOR], np.float32)[order]
        self._rows = np.asarray(table.doc_rows, np.int64)[order]
        ids = np.asarray(table.extras[DOC_ID])[order]
        self._tie_key = np.argsort(np.argsort(ids, kind="stable")[::-1], kind="stable")  # 0: the largest id
        self._codes = n

    def _need_docids(self):
        if self._vectors is None:
            raise ValueError("DocvecRetriever: no docid table yet (use_docids)")

    # -- parameters ---------------------------------------------------------------------------------------
    def init_params(self, seed: int = 0) -> dict:
        """The encoder's pretrained weights and the codes' vectors (nothing random: `seed` is not read)."""
        self._need_docids()
        copy = lambda x: jnp.array(x, copy=True)  # noqa: E731 — buffers of their own (training donates them)
        return {"encoder": jax.tree_util.tree_map(copy, self.encoder.params), "docids": copy(self._vectors)}

    def param_axes(self, params) -> dict:
        return jax.tree_util.tree_map(lambda x: P(), params)  # replicated: a small encoder and table

    # -- the network --------------------------------------------------------------------------------------
    def encode(self, encoder_params, tokens_BxL) -> jax.Array:
        """Normalised query vectors [B, D] of the run's input tokens (EOS-terminated, PAD-padded)."""
        return self.encoder.encode_run_tokens(encoder_params, tokens_BxL, PAD_ID, EOS_ID)

    def loss_fn(self, params, batch, dropout_rng=None):
        """Cross-entropy of the target code (optional per-row `weights`); metrics loss and docid_accuracy."""
        q = self.encode(params["encoder"], batch["inputs"])
        logits = q @ l2_normalise(params["docids"]).T / self.temperature
        labels = batch["targets"][:, 0].astype(jnp.int32)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, labels[:, None], axis=1)[:, 0]
        weights = batch.get("weights")
        w = jnp.ones(labels.shape[0], jnp.float32) if weights is None else weights.astype(jnp.float32)
        hit = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
        metrics = {"loss": ((nll * w).sum(), w.sum()), "docid_accuracy": ((hit * w).sum(), w.sum())}
        return (nll * w).sum() / jnp.maximum(w.sum(), 1.0), metrics

    # -- ranking ------------------------------------------------------------------------------------------
    def _scores(self, params, tokens_BxL, later_vectors):
        table = jnp.concatenate([l2_normalise(params["docids"]), l2_normalise(later_vectors)], axis=0)
        return self.encode(params["encoder"], tokens_BxL) @ table.T

    def rank(self, params, query_tokens_BxL, index=None, num_beams: int = 10):
        """(query, document row, score) of each query's `num_beams` best codes of the docid table."""
        self._need_docids()
        trained = int(params["docids"].shape[0])
        if trained > self._codes:
            raise ValueError(f"DocvecRetriever: the parameters hold {trained} code vectors but the docid table only "
                             f"{self._codes} codes; the parameters belong to another docid table")
        later = self._vectors[trained:] if trained < self._codes else np.zeros((0, self._vectors.shape[1]),
                                                                                  np.float32)
        scores = np.asarray(self._score(params, jnp.asarray(query_tokens_BxL), jnp.asarray(later)), np.float64)
        key = self._tie_key
        k = min(int(num_beams), self._codes)
        q, d, s = [], [], []
        for b in range(scores.shape[0]):
            top = np.lexsort((key, -scores[b]))[:k]  # score descending, then decreasing document id
            q.append(np.full(k, b, np.int64))
            d.append(self._rows[top])
            s.append(scores[b, top])
        return np.concatenate(q), np.concatenate(d), np.concatenate(s)
