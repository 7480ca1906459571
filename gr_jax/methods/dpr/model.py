"""DPR's dual encoder, its training data and the embedder the dense system uses.

Training (`DprEmbedder.train`, through the library's training loop: checkpoints, resume, NaN guard):
* examples: every (P0 query, judged relevant D0 document) pair, ordered by (query id, document id);
* a batch: B examples of one seeded permutation per epoch (the rest of an epoch that does not fill a batch is
  left for the next permutation); for each, `bm25_negatives` + `dense_negatives` hard negatives drawn without
  replacement, seeded by (seed, epoch, example), from the top `negative_depth` of BM25 and of the starting
  encoder (a list too short is filled from random D0 documents that are not positives of the query);
* the loss: cross-entropy of q_i · d_j / temperature over the columns j = the B positives then the B·m hard
  negatives, label i; a column whose document is judged relevant to query i, other than i's own, is masked
  (two queries of a batch may share a document).
Vectors are sentence-transformers' (mean pooled, L2-normalised), so q·d is a cosine.

At indexing and search the document encoder embeds documents and the query encoder queries; after `train` the
document encoder does not change (000: frozen while D1..Dn are indexed).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Optional

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from gr_jax.methods.api import (
    Bert,
    Count,
    DataError,
    Embedder,
    file_digest,
    fingerprint,
    l2_normalise,
    load_sentence_encoder,
    mean_pool,
    Positive,
    query_pairs,
    SentenceEncoder,
    trainer,
    validation,
)
from gr_jax.methods.dpr import training_negatives as hard

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DprModel:
    """The dual encoder as the training loop sees it: `loss_fn` and `param_axes`. Parameters {"query",
    "document"} (or {"shared"})."""

    network: Bert
    temperature: float

    def encode(self, params, ids, mask):
        return l2_normalise(mean_pool(self.network.apply({"params": params}, ids, mask), mask))

    def loss_fn(self, params, batch, dropout_rng=None):
        q_side = params.get("query", params.get("shared"))
        d_side = params.get("document", params.get("shared"))
        q_BxD = self.encode(q_side, batch["query_ids"], batch["query_mask"])
        d_CxD = self.encode(d_side, batch["doc_ids"], batch["doc_mask"])
        logits_BxC = jnp.where(batch["exclude"], -1e9, q_BxD @ d_CxD.T / self.temperature)
        labels = jnp.arange(q_BxD.shape[0])
        loss_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxC, labels)
        right = (jnp.argmax(logits_BxC, axis=-1) == labels).astype(jnp.float32)
        n = jnp.asarray(q_BxD.shape[0], jnp.float32)
        return loss_B.mean(), {"loss": (loss_B.sum(), n), "accuracy": (right.sum(), n)}

    def param_axes(self, params):
        return jax.tree_util.tree_map(lambda _: P(), params)  # replicated: a small encoder


class DprIterator:
    """Batches of DPR examples, resumable (`get_state`/`set_state`), in an order that depends on the seed only."""

    def __init__(self, query_tokens, doc_tokens, rows, qids, candidates, counts, batch_size: int, seed: int,
                 pool: np.ndarray):
        self.q_ids, self.q_mask = query_tokens
        self.d_ids, self.d_mask = doc_tokens
        self.rows, self.qids = np.asarray(rows, np.int64), list(qids)
        # [[n, depth] per source] or a function that mines them, called at the first batch drawn (a run restored
        # at its last step draws none); [how many from each]
        self._candidates, self.counts = candidates, counts
        self.batch_size, self.seed, self.pool = int(batch_size), int(seed), np.asarray(pool, np.int64)
        self.positives = hard.positives_of(self.qids, self.rows)
        self.epoch, self.position = 0, 0
        if len(self.rows) < self.batch_size:
            raise DataError(f"DPR: {len(self.rows)} training pairs cannot fill a batch of {self.batch_size}; "
                            f"lower DprEmbedder.batch_size")
        most = max(len(v) for v in self.positives.values())
        if sum(counts) > len(self.pool) - most:
            raise DataError(f"DPR: {sum(counts)} hard negatives a query, but {len(self.pool)} documents with up to "
                            f"{most} positives a query; lower DprEmbedder.bm25_negatives / dense_negatives")

    @property
    def candidates(self) -> list:
        if callable(self._candidates):
            self._candidates = self._candidates()
        return self._candidates

    def get_state(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def set_state(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def epochs(self) -> list:
        return [self.epoch + self.position / len(self.rows)]

    def negatives(self, i: int) -> list:
        """The hard negatives of example i in this epoch: `counts[s]` from source s's candidates, a short list
        filled with random pool documents that are neither positives of the query nor chosen already."""
        rng = np.random.default_rng([self.seed, self.epoch, i])
        blocked = self.positives[self.qids[i]]
        chosen: list = []
        for cand, count in zip(self.candidates, self.counts):
            found = [int(x) for x in cand[i] if x >= 0 and int(x) not in chosen]
            picks = [found[j] for j in rng.choice(len(found), size=min(count, len(found)), replace=False)]
            chosen += picks
            for _ in range(count - len(picks)):
                while True:
                    x = int(self.pool[rng.integers(len(self.pool))])
                    if x not in blocked and x not in chosen:
                        chosen.append(x)
                        break
        return chosen

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        n = len(self.rows)
        if self.position + self.batch_size > n:
            self.epoch, self.position = self.epoch + 1, 0
        order = np.random.default_rng([self.seed, self.epoch]).permutation(n)
        picked = order[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        negs = [self.negatives(int(i)) for i in picked]
        cols = np.concatenate([self.rows[picked], np.asarray([x for ns in negs for x in ns], np.int64)])
        exclude = np.zeros((len(picked), len(cols)), bool)
        for b, i in enumerate(picked):
            relevant = self.positives[self.qids[int(i)]]
            exclude[b] = [int(c) in relevant for c in cols]
            exclude[b, b] = False
        return {"query_ids": self.q_ids[picked], "query_mask": self.q_mask[picked],
                "doc_ids": self.d_ids[cols], "doc_mask": self.d_mask[cols], "exclude": exclude}


@gin.configurable
@dataclasses.dataclass
class DprEmbedder(Embedder):
    """DPR (no hard negatives) or DPR-HN (`bm25_negatives` and/or `dense_negatives` > 0) on a pretrained sentence
    encoder (`path`: a sentence-transformers directory; default all-MiniLM-L6-v2 from its wheel)."""

    path: Optional[str] = None
    shared: bool = False  # one encoder for queries and documents
    steps: Count = 300
    batch_size: Count = 32
    learning_rate: Positive = 2e-5
    warmup_steps: int = 30
    temperature: Positive = 0.05
    query_length: Count = 32
    document_length: Count = 256
    bm25_negatives: int = 0
    dense_negatives: int = 0
    negative_depth: Count = 30
    embed_batch_size: Count = 64
    seed: int = 0
    progress: bool = True
    checkpoint_period: Count = 100  # the loop's; a killed training resumes from the last one
    trains_on_queries = True
    encoder: Optional[SentenceEncoder] = dataclasses.field(default=None, repr=False)
    params: Optional[dict] = dataclasses.field(default=None, repr=False)

    @property
    def name(self) -> str:
        return "dpr_hn" if self.bm25_negatives or self.dense_negatives else "dpr"

    def settings(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items()
                if k not in ("encoder", "params", "progress", "embed_batch_size", "path", "checkpoint_period")}

    def load(self) -> SentenceEncoder:
        if self.encoder is None:
            self.encoder = load_sentence_encoder(self.path)
        return self.encoder

    def _side(self, which: str):
        if self.params is None:
            raise ValueError(f"DprEmbedder: embed before train (the {which} encoder is not trained)")
        return self.params.get(which, self.params.get("shared"))

    def embed(self, texts) -> np.ndarray:
        return self.load().embed(self._side("document"), texts, self.embed_batch_size, self.document_length)

    def embed_queries(self, texts) -> np.ndarray:
        return self.load().embed(self._side("query"), texts, self.embed_batch_size, self.query_length)

    def recipe(self) -> dict:
        """The trained document encoder's digest (`SentenceEncoder.recipe`): each training gives its own vectors."""
        return {"class": type(self).__name__,
                **self.load().recipe(self._side("document"), self.document_length, self.embed_batch_size)}

    def train(self, dataset, split: str, model_dir) -> None:
        """Fine-tunes on the judged `split` queries of `dataset` (checkpoints in `model_dir`/dpr; a finished run
        is restored, an interrupted one resumes)."""
        validation.integer("DprEmbedder.bm25_negatives", self.bm25_negatives, minimum=0)
        validation.integer("DprEmbedder.dense_negatives", self.dense_negatives, minimum=0)
        validation.integer("DprEmbedder.warmup_steps", self.warmup_steps, minimum=0)
        if split not in dataset.queries:
            raise DataError(f"DPR: the dataset has no {split!r} queries (it has {sorted(dataset.queries)})")
        enc = self.load()
        corpus = dataset.corpus
        pairs = query_pairs(dataset.queries[split], dataset.qrels[split], corpus)
        order = sorted(range(len(pairs)), key=lambda i: (pairs.qids[i], corpus.doc_ids[int(pairs.rows[i])]))
        qids = [pairs.qids[i] for i in order]
        texts = [pairs.texts[i] for i in order]
        rows = pairs.rows[order]
        copy = lambda tree: jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), tree)  # noqa: E731
        # two encoders start from the same weights in buffers of their own (the training step donates them)
        start = {"shared": copy(enc.params)} if self.shared else {"query": copy(enc.params),
                                                                   "document": copy(enc.params)}
        counts = [c for c in (self.bm25_negatives, self.dense_negatives) if c]

        def candidates() -> list:  # mined only if a batch is drawn (not when a finished run is restored)
            out = []
            if self.bm25_negatives:
                out.append(hard.bm25_negatives(corpus, qids, texts, rows, self.negative_depth))
            if self.dense_negatives:
                frozen = dataclasses.replace(self, params=start, bm25_negatives=0, dense_negatives=0)
                out.append(hard.dense_negatives(frozen, corpus, qids, texts, rows, self.negative_depth))
            return out

        iterator = DprIterator(enc.tokenize(texts, max_length=self.query_length, width=self.query_length),
                               enc.tokenize(corpus.texts, max_length=self.document_length,
                                            width=self.document_length),
                               rows, qids, candidates, counts, self.batch_size, self.seed,
                               pool=np.arange(len(corpus)))
        meta = {"method": self.name, "encoder": file_digest(Path(enc.path) / "model.safetensors", "encoder weights"),
                "corpus": corpus.fingerprint(), "pairs": fingerprint(qids, texts, [str(int(r)) for r in rows]),
                "settings": self.settings()}
        schedule = optax.join_schedules(
            [optax.linear_schedule(0.0, self.learning_rate, max(self.warmup_steps, 1)),
             optax.linear_schedule(self.learning_rate, 0.0, max(self.steps - self.warmup_steps, 1))],
            [self.warmup_steps])
        tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))
        model = DprModel(enc.network, float(self.temperature))
        loop = trainer.LoopConfig(self.steps, self.batch_size, seed=self.seed, log_period=max(1, min(50, self.steps)),
                                  checkpoint_period=max(1, min(self.checkpoint_period, self.steps)),
                                  keep_checkpoints=1,
                                  progress=self.progress, name="dpr")
        out = trainer.fit(model, start, iterator, tx, run_dir=Path(model_dir) / "dpr", loop=loop, meta=meta)
        self.params = out["state"]["params"]
        log.info("DPR (%s) trained on %d pairs: %d steps", self.name, len(rows), self.steps)
