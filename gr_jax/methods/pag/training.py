"""Training a PAG model here (PAG itself trains in stages with distillation from other models, which the
reproduction paper does not redo; 004 §2). Two objectives over one forward pass — the decoder reads
[query, start, c_1 … c_{M−1}], so its first L positions give the planner's representation (causal) and the
last M the sequential step logits:

* **set objective** (`set_loss`) — the planner scores a batch's documents by s_simul(q, d) = Σ_{v ∈ t_d} rep_q[v]
  over their set docids; "softmax": cross-entropy of the positive among the batch's documents (in-batch
  negatives; other copies of the positive's document are left out), "margin": mean hinge
  max(0, margin − s⁺ + s⁻) over the in-batch negatives;
* **sequential prefix objective** (`seq_loss`) — at every level i the raw logits of the level's K code tokens
  (base + K·i + j) are a softmax over the codes; cross-entropy of the positive's code given its prefix, i.e.
  each prefix learns to rank its true continuation first among its siblings' codes.

`PagObjective` (bind `PagRetriever.objective = @PagObjective()`) returns set_weight · set + seq_weight · seq.
`PagObjectives` (`prepare.objectives_config = @PagObjectives()`) makes the batches: the DSI pairs of
`training.objectives.Objectives` (document text → docid, training query → docid) with the positive's set docid and corpus
row.
"""

from __future__ import annotations

import dataclasses
import logging

import gin
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.api import dsi_pairs, ExampleStore, MixtureIterator, ObjectivesConfig, tokenize
from gr_jax.methods.pag import model as pag

log = logging.getLogger(__name__)
SET_LOSSES = ("softmax", "margin")


def in_batch_simul(rep_BxV, set_ids_BxM):
    """s_simul of every query against every document of the batch [B, B]."""
    return pag.simul_scores(rep_BxV, set_ids_BxM)


def set_objective(s_BxB, rows_B, kind: str = "softmax", margin: float = 1.0):
    """(loss, accuracy of the positive ranked first) for in-batch scores; query b's positive is document b;
    documents with query b's row other than b itself are not negatives."""
    B = s_BxB.shape[0]
    eye = jnp.eye(B, dtype=bool)
    same = (rows_B[:, None] == rows_B[None, :]) & ~eye
    pos = jnp.diagonal(s_BxB)
    neg = jnp.where(same | eye, -jnp.inf, s_BxB)
    acc = (pos >= neg.max(axis=1)).astype(jnp.float32).mean()
    if kind == "softmax":
        logits = jnp.where(same, -jnp.inf, s_BxB)
        return (jax.nn.logsumexp(logits, axis=1) - pos).mean(), acc
    if kind == "margin":
        valid = ~(same | eye)
        hinge = jnp.where(valid, jax.nn.relu(margin - pos[:, None] + s_BxB), 0.0)
        return hinge.sum() / jnp.maximum(valid.sum(), 1), acc
    raise ValueError(f"set_loss must be one of {SET_LOSSES}, got {kind!r}")


def prefix_objective(logits_BxMxV, targets_BxM, base: int, codes: int):
    """(mean cross-entropy over levels of the true code among the level's K codes, token accuracy)."""
    M = targets_BxM.shape[1]
    level_tokens = base + codes * jnp.arange(M)[:, None] + jnp.arange(codes)[None, :]  # [M, K]
    level_logits = jnp.take_along_axis(logits_BxMxV, jnp.broadcast_to(level_tokens, (logits_BxMxV.shape[0], M, codes)),
                                       axis=-1)
    code = targets_BxM - base - codes * jnp.arange(M)[None, :]
    logp = jax.nn.log_softmax(level_logits, axis=-1)
    nll = -jnp.take_along_axis(logp, code[..., None], axis=-1)[..., 0]
    return nll.mean(), (jnp.argmax(level_logits, axis=-1) == code).astype(jnp.float32).mean()


def pag_objective(model, params, batch, rng=None, set_weight: float = 1.0, seq_weight: float = 1.0,
                  set_loss: str = "softmax", margin: float = 1.0):
    """The joint objective for `PagObjectives` batches (`inputs`, `targets` [B, M] docid tokens, `set_ids`
    [B, m] the positive's set docid, `row` [B, 1]); metrics as (sum, count) pairs."""
    q = batch["inputs"]
    targets = batch["targets"][:, : model.docid_length].astype(jnp.int32)
    hidden, mask = pag.sequential_hidden(model.network, params["network"], q, targets[:, :-1], rng)
    L = q.shape[1]
    rep = pag.lexical_rep_from_hidden(model.network, params["network"], hidden[:, :L], mask)
    s = in_batch_simul(rep, batch["set_ids"].astype(jnp.int32))
    l_set, set_acc = set_objective(s, batch["row"][:, 0], set_loss, margin)
    logits = pag.raw_logits(model.network, params["network"], hidden[:, L:])
    l_seq, tok_acc = prefix_objective(logits, targets, model.docid_base, model.codes)
    loss = set_weight * l_set + seq_weight * l_seq
    n = jnp.float32(q.shape[0])
    return loss, {"loss": (loss * n, n), "set_loss": (l_set * n, n), "seq_loss": (l_seq * n, n),
                  "set_accuracy": (set_acc * n, n), "token_accuracy": (tok_acc * n, n)}


@gin.configurable
@dataclasses.dataclass(frozen=True)
class PagObjective:
    """`pag_objective` with its weights (bind `PagRetriever.objective = @PagObjective()`)."""

    set_weight: float = 1.0
    seq_weight: float = 1.0
    set_loss: str = "softmax"
    margin: float = 1.0

    def __post_init__(self):
        if self.set_loss not in SET_LOSSES:
            raise ValueError(f"PagObjective.set_loss must be one of {SET_LOSSES}, got {self.set_loss!r}")
        if self.set_weight < 0 or self.seq_weight < 0 or self.set_weight + self.seq_weight <= 0:
            raise ValueError("PagObjective: set_weight and seq_weight must be ≥ 0 and not both 0")

    def __call__(self, model, params, batch, rng=None):
        return pag_objective(model, params, batch, rng, self.set_weight, self.seq_weight, self.set_loss,
                             self.margin)


@gin.configurable
@dataclasses.dataclass
class PagObjectives(ObjectivesConfig):
    """DSI pairs (indexing and retrieval, `training.objectives.Objectives` rates) with each positive's set docid and row."""

    indexing_rate: float = 1.0
    retrieval_rate: float = 1.0
    refresh_period = 0

    def iterator(self, inp) -> MixtureIterator:
        if inp.table is None or inp.table.extras is None or "set_ids" not in inp.table.extras:
            raise ValueError("PagObjectives needs set docids: prepare.docid_scheme = @PagDocids()")
        pairs, rates = [], []
        data = inp.dataset
        if self.indexing_rate > 0:
            pairs.append(dsi_pairs.indexing_pairs(data.corpus))
            rates.append(self.indexing_rate)
        if self.retrieval_rate > 0:
            if inp.train_split not in data.queries:
                raise ValueError(f"the dataset has no query split {inp.train_split!r} (TRAIN_SPLIT); it has "
                                 f"{sorted(data.queries)}")
            pairs.append(dsi_pairs.query_pairs(data.queries[inp.train_split], data.qrels[inp.train_split],
                                               data.corpus))
            rates.append(self.retrieval_rate)
        if not pairs:
            raise ValueError("PagObjectives: indexing_rate and retrieval_rate are both 0: nothing to train on")
        table = inp.table
        stores = []
        for p in pairs:
            idx = table.primary(p.rows)
            stores.append(ExampleStore({
                "inputs": tokenize(p.texts, inp.vocab, inp.lengths["inputs"], what=p.name, progress=len(p) > 50000),
                "targets": table.targets_of(idx, inp.lengths["targets"]),
                "set_ids": table.extras["set_ids"][idx],
                "row": np.asarray(p.rows, np.int64)[:, None]}))
        log.info("training examples: %s", {p.name: len(s) for p, s in zip(pairs, stores)})
        return MixtureIterator(stores, inp.batch_size, seed=inp.seed, rates=rates, names=[p.name for p in pairs])
