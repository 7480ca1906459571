"""GLEN's phase-2 training (002_glen.txt §3.3.2): the loss terms as pure functions of arrays, the objective
that feeds them (`glen_objective`, bound as `GlenRetriever.objective`), and the batch source
(`Phase2Batches`: each training query with its positive document and prefix-aware negatives).

* `identifier_repr` — r_t = Softmax(ℓ_t / τ) · E (Eq. 6): a document's soft identifier, ℓ_t its step logits;
* `relevance` — rel(q, d) = Σ_t q_t · r_t (Eq. 6), q_t the query's decoder output at step t;
* `pairwise_loss` — Eq. 5: −log softmax of rel over the positive and the negatives (the query's own sampled
  negatives, and with `in_batch` every other query's documents in the batch);
* `pointwise_loss` — Eq. 7: cross-entropy of the query's step distributions to the positive's identifier
  z⁺ (the argmax of the positive's masked logits) + λ_dist · cosine distance between w^q and w^{d⁺}, the two
  logit vectors at z⁺'s tokens;
* `temperature` — τ = max(1e-5, exp(−epoch)) (the annealing of §3.3.2);
* `prefix_negatives` — prefix-aware negatives: the documents sharing the positive's whole docid, else its
  first M−1 tokens, …, the longest prefix whose group has at least N_neg other documents; N_neg drawn from it.

The step logits are the model's (for a tied T5 v1.0: d_t · Eᵀ · d_model^-0.5); the paper writes d_t · Eᵀ,
which differs by that constant factor inside the softmax — the annealed τ (→ 1e-5) makes both the argmax.
Dimension letters: B queries, G documents per query (positive first, then negatives), M docid length,
V vocabulary, D d_model.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Optional

import gin
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.api import Count, ObjectivesConfig


def temperature(epoch: float, floor: float = 1e-5) -> float:
    """τ = max(floor, exp(−epoch)); `epoch` counts passes over the training queries (fractional)."""
    return max(floor, math.exp(-float(epoch)))


def identifier_repr(logits_xMxV, embedding_VxD, tau):
    """r_t = Softmax(ℓ_t / τ) · E for every step: [..., M, D]."""
    p = jax.nn.softmax(logits_xMxV.astype(jnp.float32) / tau, axis=-1)
    return jnp.einsum("...mv,vd->...md", p, embedding_VxD.astype(jnp.float32))


def relevance(query_hidden_BxMxD, doc_repr_CxMxD):
    """rel(q, d) = Σ_t q_t · r_t for every query × candidate: [B, C]."""
    return jnp.einsum("bmd,cmd->bc", query_hidden_BxMxD.astype(jnp.float32), doc_repr_CxMxD)


def pairwise_loss(query_hidden_BxMxD, doc_repr_BxGxMxD, in_batch: bool = True):
    """Eq. 5 averaged over the B queries. Query b's positive is document (b, 0); its negatives are (b, 1..G−1)
    and, with `in_batch`, every document of the other queries. Returns (loss, accuracy of the positive
    being ranked first)."""
    B, G = doc_repr_BxGxMxD.shape[:2]
    flat = doc_repr_BxGxMxD.reshape((B * G,) + doc_repr_BxGxMxD.shape[2:])
    scores = relevance(query_hidden_BxMxD, flat)  # [B, B·G]
    owner = jnp.arange(B * G) // G
    if not in_batch:
        scores = jnp.where(owner[None, :] == jnp.arange(B)[:, None], scores, -jnp.inf)
    target = jnp.arange(B) * G
    logp = jax.nn.log_softmax(scores, axis=-1)
    loss = -jnp.take_along_axis(logp, target[:, None], axis=-1)[:, 0]
    return loss.mean(), (jnp.argmax(scores, axis=-1) == target).astype(jnp.float32).mean()


def _cosine(a, b, eps: float = 1e-8):
    na = jnp.maximum(jnp.linalg.norm(a, axis=-1), eps)
    nb = jnp.maximum(jnp.linalg.norm(b, axis=-1), eps)
    return (a * b).sum(-1) / (na * nb)


def pointwise_loss(query_logits_BxMxV, pos_logits_BxMxV, masked_ids=(), lambda_dist: float = 0.5):
    """Eq. 7 averaged over the B queries: −Σ_t log P(z⁺_t | q) + λ_dist · (1 − cos(w^q, w^{d⁺})), with
    z⁺ = argmax of the positive's masked logits (no gradient through the argmax), P the softmax of the
    query's masked logits, and w = the raw logits at z⁺'s tokens. Returns (loss, z⁺ [B, M])."""
    q = query_logits_BxMxV.astype(jnp.float32)
    d = pos_logits_BxMxV.astype(jnp.float32)
    if len(masked_ids):
        ids = jnp.asarray(np.asarray(masked_ids, np.int32))
        q_masked, d_masked = q.at[..., ids].set(-jnp.inf), d.at[..., ids].set(-jnp.inf)
    else:
        q_masked, d_masked = q, d
    z = jax.lax.stop_gradient(jnp.argmax(d_masked, axis=-1))  # [B, M]
    logp = jax.nn.log_softmax(q_masked, axis=-1)
    nll = -jnp.take_along_axis(logp, z[..., None], axis=-1)[..., 0].sum(-1)  # Σ over the M steps
    w_q = jnp.take_along_axis(q, z[..., None], axis=-1)[..., 0]
    w_d = jnp.take_along_axis(d, z[..., None], axis=-1)[..., 0]
    return (nll + lambda_dist * (1.0 - _cosine(w_q, w_d))).mean(), z


def glen_loss(pair: jax.Array, point: jax.Array, lambda_point: float = 0.5):
    """Eq. 8: L = L_pair + λ_point · L_point."""
    return pair + lambda_point * point


def prefix_negatives(docids_NxM: np.ndarray, positives: np.ndarray, num_negatives: int,
                     rng: np.random.Generator, doc_keys: Optional[np.ndarray] = None) -> np.ndarray:
    """Prefix-aware negatives for each positive row: [len(positives), num_negatives] rows of `docids_NxM`.

    For prefix lengths k = M, M−1, …, 0 the candidates are the other documents whose first k docid tokens
    equal the positive's; the first k whose candidates number at least `num_negatives` is used (k = 0: every
    other document), and `num_negatives` are drawn from them without replacement (with replacement when the
    corpus has fewer). Candidates are taken in `doc_keys` order (default: row) before drawing, so the draw
    depends on the documents' keys and the generator, not on their row order when keys are given."""
    docids = np.asarray(docids_NxM)
    n, M = docids.shape
    keys = np.arange(n) if doc_keys is None else np.asarray(doc_keys)
    by_key = np.argsort(keys, kind="stable")
    groups = []  # per k: group id of every row for the prefix of length k
    for k in range(M + 1):
        if k == 0:
            groups.append(np.zeros(n, np.int64))
        else:
            _, g = np.unique(docids[:, :k], axis=0, return_inverse=True)
            groups.append(g.reshape(-1))
    out = np.empty((len(positives), num_negatives), np.int64)
    for i, p in enumerate(np.asarray(positives)):
        for k in range(M, -1, -1):
            members = by_key[groups[k][by_key] == groups[k][p]]
            members = members[members != p]
            if len(members) >= num_negatives or k == 0:
                break
        if len(members) == 0:
            raise ValueError("prefix_negatives: the corpus has no document besides the positive")
        out[i] = rng.choice(members, size=num_negatives, replace=len(members) < num_negatives)
    return out


# ----------------------------------------------------------------------------------------------------------
# the objective and its batches
# ----------------------------------------------------------------------------------------------------------


@gin.configurable
def glen_objective(model, params, batch, rng=None, lambda_point: float = 0.5, lambda_dist: float = 0.5,
                   in_batch: bool = True):
    """L = L_pair + λ_point · L_point (Eq. 8) for a batch of `Phase2Batches`: `inputs` [B, Lq] queries,
    `documents` [B, G, Ld] (the positive first), `tau` [B]. `model` is a GLEN model object (`hidden_fed`,
    `masked_ids`, parameters with the network's `embedding`). Metrics as (sum, count) pairs."""
    docs = batch["documents"]
    B, G, Ld = docs.shape
    q_rng = d_rng = None
    if rng is not None:
        q_rng, d_rng = jax.random.split(rng)
    q_logits, q_hidden = model.hidden_fed(params, batch["inputs"], q_rng)
    d_logits, _ = model.hidden_fed(params, docs.reshape(B * G, Ld), d_rng)
    M = d_logits.shape[1]
    reprs = identifier_repr(d_logits, params["network"]["embedding"], batch["tau"][0])
    pair, pair_acc = pairwise_loss(q_hidden, reprs.reshape((B, G) + reprs.shape[1:]), in_batch)
    positive = d_logits.reshape((B, G, M, -1))[:, 0]
    point, _ = pointwise_loss(q_logits, positive, model.masked_ids, lambda_dist)
    loss = glen_loss(pair, point, lambda_point)
    n = jnp.float32(B)
    return loss, {"loss": (loss * n, n), "pair_loss": (pair * n, n), "point_loss": (point * n, n),
                  "pair_accuracy": (pair_acc * n, n)}


NEGATIVES = ("prefix", "random", "bm25", "none")


class Phase2Batches:
    """Endless, resumable phase-2 batches: {"inputs": query tokens [B, Lq], "documents": [B, 1 + N_neg, Ld]
    (the positive, then its negatives), "tau": [B] the annealed temperature of the current epoch}. Queries
    come from `pairs` (a `MixtureIterator` over an `ExampleStore` with "inputs", "positive" = the positive's
    corpus row [n, 1], and for BM25 negatives "candidates" = corpus rows [n, depth], −1 padded);
    `doc_tokens` [rows, Ld] are the documents' tokens.

    `negatives` (Fig. 2 of the paper): "prefix" — prefix-aware, from the current docids (`set_docids` after
    each re-assignment); "random" — uniform over the other documents; "bm25" — drawn from the query's BM25
    candidates; "none" — no sampled negatives (only the in-batch ones of the objective).
    The negatives of batch s are drawn from a generator seeded by (seed, s), and candidates are ordered by
    `doc_keys` (document ids) before drawing: a resumed run draws what the uninterrupted one drew (given the
    same docids), and the draw does not depend on the corpus row order. Same state protocol as
    `MixtureIterator`."""

    def __init__(self, pairs, doc_tokens: np.ndarray, docids_by_row: Optional[np.ndarray] = None,
                 num_negatives: int = 8, seed: int = 0, doc_keys: Optional[np.ndarray] = None,
                 min_temperature: float = 1e-5, negatives: str = "prefix"):
        if num_negatives < 0:
            raise ValueError(f"num_negatives must be ≥ 0, got {num_negatives}")
        if negatives not in NEGATIVES:
            raise ValueError(f"negatives must be one of {NEGATIVES}, got {negatives!r}")
        self.pairs = pairs
        self.doc_tokens = np.asarray(doc_tokens, np.int32)
        self.negatives = negatives
        self.num_negatives = 0 if negatives == "none" else int(num_negatives)
        self.seed = int(seed)
        self.doc_keys = doc_keys
        n = len(self.doc_tokens)
        self._by_key = np.arange(n) if doc_keys is None else np.argsort(np.asarray(doc_keys), kind="stable")
        self._rank = np.empty(n, np.int64)
        self._rank[self._by_key] = np.arange(n)
        self.min_temperature = float(min_temperature)
        self.docids = None
        if docids_by_row is not None:
            self.set_docids(docids_by_row)

    def set_docids(self, docids_by_row: np.ndarray) -> None:
        docids = np.asarray(docids_by_row)
        if docids.ndim != 2 or len(docids) != len(self.doc_tokens):
            raise ValueError(f"docids [{len(self.doc_tokens)}, M] expected (one per document row), got "
                             f"{docids.shape}")
        self.docids = docids

    def get_state(self) -> dict:
        return self.pairs.get_state()

    def set_state(self, state: Mapping) -> None:
        self.pairs.set_state(state)

    def epochs(self) -> list[float]:
        return self.pairs.epochs()

    def __iter__(self):
        return self

    def _random(self, positives, rng) -> np.ndarray:
        """Uniform over the other documents: rank r among the documents ordered by key, skipping the
        positive's rank."""
        n = len(self.doc_tokens)
        if n < 2:
            raise ValueError("random negatives: the corpus has no document besides the positive")
        r = rng.integers(0, n - 1, size=(len(positives), self.num_negatives))
        r = r + (r >= self._rank[positives][:, None])
        return self._by_key[r]

    def _bm25(self, positives, candidates, rng) -> np.ndarray:
        out = np.empty((len(positives), self.num_negatives), np.int64)
        for i, (p, row) in enumerate(zip(positives, candidates)):
            pool = row[(row >= 0) & (row != p)]
            if not len(pool):  # BM25 found nothing else for this query: fall back to uniform
                out[i] = self._random(positives[i:i + 1], rng)[0]
                continue
            pool = pool[np.argsort(self._rank[pool], kind="stable")]
            out[i] = rng.choice(pool, size=self.num_negatives, replace=len(pool) < self.num_negatives)
        return out

    def __next__(self) -> dict[str, np.ndarray]:
        step = self.pairs.step
        batch = next(self.pairs)
        positives = batch["positive"][:, 0].astype(np.int64)
        rows = positives[:, None]
        if self.num_negatives:
            rng = np.random.default_rng([self.seed, step, 2])
            if self.negatives == "prefix":
                if self.docids is None:
                    raise RuntimeError("Phase2Batches: prefix-aware negatives need the current docids "
                                       "(set_docids) before the first batch")
                negatives = prefix_negatives(self.docids, positives, self.num_negatives, rng, self.doc_keys)
            elif self.negatives == "random":
                negatives = self._random(positives, rng)
            else:
                negatives = self._bm25(positives, batch["candidates"], rng)
            rows = np.concatenate([rows, negatives], axis=1)
        tau = temperature(float(np.mean(self.pairs.epochs())), self.min_temperature)
        return {"inputs": batch["inputs"], "documents": self.doc_tokens[rows],
                "tau": np.full(len(positives), tau, np.float32)}


@gin.configurable
@dataclasses.dataclass
class GlenPhase2(ObjectivesConfig):
    """The training data of GLEN's phase 2 (`prepare.objectives_config = @GlenPhase2()`, with
    `GlenRetriever.objective = @glen_objective` and `prepare.docid_scheme = @GlenDocids()`): every training
    query with its positive document and `num_negatives` negatives of kind `negatives` (see
    `Phase2Batches`); documents are tokenized to TASK_FEATURE_LENGTHS['documents'] (156 in the paper).
    `reassign_every` R > 0 re-decodes every document's docid every R steps (dynamic docids: the prefix-aware
    negatives follow them); 0 keeps the docids decoded from the initial parameters."""

    num_negatives: int = 8
    negatives: str = "prefix"
    reassign_every: int = 0
    bm25_depth: Count = 100

    def __post_init__(self):
        if self.negatives not in NEGATIVES:
            raise ValueError(f"GlenPhase2.negatives must be one of {NEGATIVES}, got {self.negatives!r}")
        for name in ("num_negatives", "reassign_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"GlenPhase2.{name} must be an integer ≥ 0, got {getattr(self, name)!r}")
        if not isinstance(self.bm25_depth, int) or self.bm25_depth < 1:
            raise ValueError(f"GlenPhase2.bm25_depth must be an integer ≥ 1, got {self.bm25_depth!r}")

    @property
    def refresh_period(self) -> int:
        return self.reassign_every

    def iterator(self, inp) -> "Phase2Batches":
        """`inp`: the composition's `ObjectiveInputs` (dataset, train split, vocabulary, feature lengths,
        batch size, seed); BM25 negatives come from `baselines.bm25.hard_negatives`."""
        from gr_jax.methods.api import dsi_pairs
        from gr_jax.methods.api import ExampleStore, MixtureIterator, tokenize

        ds, split = inp.dataset, inp.train_split
        if split not in ds.queries:
            raise ValueError(f"GLEN phase 2 trains on queries: the dataset has no split {split!r} (TRAIN_SPLIT); "
                             f"it has {sorted(ds.queries)}")
        if "documents" not in inp.lengths:
            raise ValueError("GLEN phase 2 needs the document length: add 'documents' to TASK_FEATURE_LENGTHS "
                             "(156 in the paper)")
        pairs = dsi_pairs.query_pairs(ds.queries[split], ds.qrels[split], ds.corpus, name="glen-phase2")
        features = {"inputs": tokenize(pairs.texts, inp.vocab, inp.lengths["inputs"], what=pairs.name),
                    "positive": pairs.rows[:, None]}
        if self.negatives == "bm25" and self.num_negatives:
            from gr_jax.methods.api import hard_negatives

            features["candidates"] = hard_negatives(ds.corpus, pairs.qids, pairs.texts, pairs.rows, self.bm25_depth)
        mix = MixtureIterator([ExampleStore(features)], inp.batch_size, seed=inp.seed, names=[pairs.name])
        return Phase2Batches(mix, inp.doc_tokens(), None, self.num_negatives, seed=inp.seed,
                             doc_keys=np.asarray(ds.corpus.doc_ids), negatives=self.negatives)
