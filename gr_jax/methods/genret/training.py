"""GenRET's progressive training (`GenretTraining`, `genret_objective`): the docid is learned one position at a
time. TRAIN_STEPS is split into T stages; stage t trains position t:

* at the stage's start every document's docid is decoded with the current parameters (the composition's
  re-decoding, `refresh_period` = the stage length): its codes at positions < t are the fixed prefix of the
  stage, and both the document and its query are teacher-forced over that prefix; then E_t is initialised by
  a balanced k-means of the documents' states at t (`on_refresh`);
* the codebooks of positions < t are frozen (no gradient reaches them) and positions > t are not trained yet;
* the document's target code at t is its *balanced* assignment within the batch (`balanced_codes`): the
  argmax of the entropic optimal-transport plan between the batch's documents and the K codes (`sinkhorn`,
  uniform marginals), which spreads the batch over the codes instead of letting every document take the most
  popular one (GenRET's diverse clustering).

The loss of a batch of (query, document) pairs at position t, h the decoder states, ℓ the codebook logits:

    ce    = CE(ℓ^q_t, c) + CE(ℓ^d_t, c)                    both texts predict the balanced code c
    cl    = in-batch CE of h^q_t · h^dᵀ_t                    query → its document in the batch (no temperature)
    code  = mean over p < t of CE(ℓ^q_p, prefix_p) + CE(ℓ^d_p, prefix_p)      keeps the earlier codes stable
    rec   = in-batch CE of (E_t[c] + h^d_t − sg(h^d_t)) · sg(h^d)ᵀ_t          the code must identify its document
                                                                           (straight-through reconstruction)
    loss  = w_ce·ce + w_cl·cl + w_code·code + w_rec·rec       (GenRET's main stage: 0.5, 0.5, 0.5, 0.1)

In the in-batch terms a column holding the same document as the row's own (a document drawn twice) is masked.
The batches of position t > 0 are prefix groups (`GenretBatches`), as GenRET's released code builds them.

Differences from GenRET's released code (sunnweiwei/GenRet @ a1d80e1, run.py), and the flag that reproduces theirs.
On the same weights and inputs (checked against their code: `methods/genret/parity.py`, tests/fixtures/genret_parity/<shape>):
* the start input: theirs a learned vector (row 0 of its first code-input table) — `GenretHead.start = 'learned'`
  (ours: the start token's text embedding);
* the code logits: theirs the raw h_t · E_tᵀ — `GenretHead.raw_logits = True` (ours: the T5 v1.0 head's d_model^-0.5,
  a constant factor inside the softmax);
* the Sinkhorn: theirs centres the scores and divides by half their range, then enforces the per-code mass only (its
  per-row step divides by the total mass) — `genret_objective.sinkhorn = 'released'` (ours: both marginals, the
  paper's algorithm, scores divided by their largest magnitude);
* duplicates: theirs counts another copy of the row's document as a negative in the contrastive and reconstruction
  terms — `genret_objective.mask_duplicates = False` (ours masks it).
In the training procedure:
* before each main stage it trains a "pre" stage (contrastive + prefix codes), then initialises E_t — position 0
  included — by `k-means-constrained` (min-cost flow, cluster sizes in [min(N/2K, K/4), 2K], 10 restarts, unseeded)
  of the prefix-centred states; here no "pre" stage, no k-means at position 0, and the core k-means then Lloyd steps
  with the capped assignment (no cluster above twice the mean size);
* it keeps each document's earlier codes fixed once learned; here every stage re-decodes the whole docid greedily;
* it rebuilds AdamW per stage (constant lr 5e-4, weight decay 0.01, clip 1.0); here one AdamW with the run's
  schedule runs through, so the moments of a frozen codebook decay over a few steps after its stage;
* its batches are an anchor document and up to 127 others of its prefix group, redrawn each step, with one query
  drawn per visit (training and generated queries); here every training pair once per epoch, groups partitioned;
* its final "fit" stage appends each document's occurrence index among the documents sharing its docid and fails as
  shipped (its label count does not match); not built: documents sharing a docid share a leaf and are returned
  together, as the released inference returns them;
* its beam search keeps T5's end token (code 1 ends a beam before the last position, so such docids are never
  returned); ours has no end token.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Mapping, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.api import Count, ObjectivesConfig, Positive

log = logging.getLogger(__name__)


def sinkhorn(scores_BxK, epsilon: float = 1.0, iterations: int = 100):
    """The entropic optimal-transport plan [B, K] between B rows of mass 1/B and K codes of mass 1/K for the
    score matrix rescaled to [−1, 1] (divided by its largest magnitude): P = diag(u) exp(S'/ε) diag(v), the
    scalings found by `iterations` alternating column / row normalisations in the log domain (rows last, so
    each row sums to 1/B exactly)."""
    s = scores_BxK.astype(jnp.float32)
    s = s / jnp.maximum(jnp.max(jnp.abs(s)), 1e-12)
    B, K = s.shape
    log_p = s / epsilon

    def body(_, lp):
        lp = lp - jax.nn.logsumexp(lp, axis=0, keepdims=True) - jnp.log(K)
        return lp - jax.nn.logsumexp(lp, axis=1, keepdims=True) - jnp.log(B)

    return jnp.exp(jax.lax.fori_loop(0, iterations, body, log_p))


def released_plan(scores_BxK, epsilon: float = 1.0):
    """GenRET's released Sinkhorn (run.py `sinkhorn_raw` after `center_distance_for_constraint`): the scores
    centred and divided by half their range over the whole batch, (s − (max + min)/2) / ((max − min)/2 + 1e-5),
    then only the per-code mass 1/K enforced (its per-row step divides by the total mass, which is 1), whatever the
    iteration count: P[b, k] = exp(s_bk/ε) / (K Σ_b' exp(s_b'k/ε))."""
    s = scores_BxK.astype(jnp.float32)
    hi, lo = jnp.max(s), jnp.min(s)
    s = (s - (hi + lo) / 2) / ((hi - lo) / 2 + 1e-5) / epsilon
    K = s.shape[1]
    return jnp.exp(s - jax.nn.logsumexp(s, axis=0, keepdims=True)) / K


SINKHORN = ("balanced", "released")


def balanced_codes(scores_BxK, epsilon: float = 1.0, iterations: int = 100, kind: str = "balanced"):
    """Each row's code under the balanced plan, no gradient: [B] int32. `kind` "balanced": both marginals
    (`sinkhorn`, the paper's algorithm); "released": GenRET's released code (`released_plan`, per-code mass
    only)."""
    scores = jax.lax.stop_gradient(scores_BxK)
    if kind == "released":
        plan = released_plan(scores, epsilon)
    elif kind == "balanced":
        plan = sinkhorn(scores, epsilon, iterations)
    else:
        raise ValueError(f"genret_objective.sinkhorn = {kind!r}: one of {SINKHORN}")
    return jnp.argmax(plan, axis=-1).astype(jnp.int32)


def prefix_centered(states_NxD: np.ndarray, prefixes_NxT: np.ndarray) -> np.ndarray:
    """Each state minus the mean of the states sharing its prefix, plus the mean of all (GenRET's
    `norm_by_prefix`): clusters at a later position then split every prefix group rather than repeat the earlier
    positions' split. An empty prefix (position 0) leaves the states as they are."""
    x = np.asarray(states_NxD, np.float64)
    if prefixes_NxT.shape[1] == 0:
        return x.astype(np.float32)
    _, g = np.unique(prefixes_NxT, axis=0, return_inverse=True)
    g = g.reshape(-1)
    sums = np.zeros((g.max() + 1, x.shape[1]))
    np.add.at(sums, g, x)
    means = sums / np.bincount(g)[:, None]
    return (x - means[g] + x.mean(0)).astype(np.float32)


def capped_assignment(d_NxK: np.ndarray, cap: int) -> np.ndarray:
    """Each row's cluster when no cluster takes more than `cap` rows → [N] int. In rounds: every unassigned row
    proposes to its nearest cluster not yet tried; a cluster keeps the nearest proposals that fit (ties by row) and
    refuses the rest, which propose to their next cluster in the following round (at most K rounds, each
    vectorised)."""
    d = np.asarray(d_NxK, np.float64)
    n, k = d.shape
    if cap * k < n:
        raise ValueError(f"capped assignment: {k} clusters of at most {cap} cannot hold {n} rows")
    prefs = np.argsort(d, axis=1, kind="stable")  # each row's clusters, nearest first (ties by cluster)
    tried = np.zeros(n, np.int64)
    out = np.full(n, -1, np.int64)
    size = np.zeros(k, np.int64)
    while True:
        rows = np.flatnonzero(out < 0)
        if not len(rows):
            return out
        cand = prefs[rows, tried[rows]]
        o = np.lexsort((rows, d[rows, cand], cand))  # by cluster, then distance, then row
        rows, cand = rows[o], cand[o]
        first = np.searchsorted(cand, cand, side="left")  # where each cluster's proposals start
        fits = (np.arange(len(rows)) - first) < (cap - size[cand])
        out[rows[fits]] = cand[fits]
        np.add.at(size, cand[fits], 1)
        tried[rows[~fits]] += 1


def balanced_kmeans(x_NxD: np.ndarray, k: int, iters: int = 10, seed: int = 0, max_ratio: float = 2.0) -> np.ndarray:
    """k centroids [k, D]: k-means (the core's, k-means++ start), then `iters` Lloyd steps whose assignment caps
    every cluster at `max_ratio` times the mean size (`capped_assignment`; GenRET's size-constrained k-means, whose
    largest cluster is bounded the same way); an empty cluster keeps its centroid."""
    from gr_jax.methods.api import kmeans

    x = np.asarray(x_NxD, np.float32)
    c = kmeans(x, k, seed=seed).centroids.astype(np.float32)
    cap = max(1, math.ceil(max_ratio * len(x) / k))
    for _ in range(iters):
        d = (x * x).sum(1)[:, None] - 2.0 * x @ c.T + (c * c).sum(1)[None]  # squared distances [N, k]
        codes = capped_assignment(d, cap)
        for j in range(k):
            members = x[codes == j]
            if len(members):
                c[j] = members.mean(0)
    return c


def _ce(logits_BxK, targets_B):
    logp = jax.nn.log_softmax(logits_BxK.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, targets_B[:, None], axis=-1)[:, 0]


def in_batch_ce(scores_BxB, rows_B, mask_duplicates: bool = True):
    """Mean over rows of −log softmax(scores)[i, i]; columns j ≠ i with rows_B[j] == rows_B[i] are masked (unless
    `mask_duplicates` is off, as in GenRET's released code)."""
    B = scores_BxB.shape[0]
    eye = jnp.eye(B, dtype=bool)
    same = (rows_B[:, None] == rows_B[None, :]) & ~eye & mask_duplicates
    s = jnp.where(same, -jnp.inf, scores_BxB.astype(jnp.float32))
    return -jnp.diagonal(jax.nn.log_softmax(s, axis=-1)).mean()


def genret_losses(q_h_BxTxD, q_logits_BxTxK, d_h_BxTxD, d_logits_BxTxK, prefix_BxT, t, rows_B, codebook_KxD,
                  epsilon: float = 1.0, iterations: int = 100, sinkhorn: str = "balanced",
                  mask_duplicates: bool = True, targets_B=None) -> dict:
    """The four terms at position `t` (see the module docstring) and the balanced codes: {"ce", "cl", "code",
    "rec", "codes"}. `codebook_KxD` is E_t. `targets_B`: the codes at t where they are ≥ 0 (the fit stage's), instead
    of the balanced assignment."""
    T = prefix_BxT.shape[1]
    q_h, d_h = q_h_BxTxD[:, t], d_h_BxTxD[:, t]
    q_l, d_l = q_logits_BxTxK[:, t], d_logits_BxTxK[:, t]
    codes = balanced_codes(d_l, epsilon, iterations, sinkhorn)
    if targets_B is not None:
        codes = jnp.where(targets_B >= 0, targets_B, codes)
    ce = (_ce(q_l, codes) + _ce(d_l, codes)).mean()
    cl = in_batch_ce(q_h @ d_h.T, rows_B, mask_duplicates)
    earlier = (jnp.arange(T) < t).astype(jnp.float32)  # [T]
    per_pos = jax.vmap(lambda ql, dl, c: (_ce(ql, c) + _ce(dl, c)).mean(), in_axes=(1, 1, 1))(
        q_logits_BxTxK, d_logits_BxTxK, prefix_BxT)  # [T]
    code = (per_pos * earlier).sum() / jnp.maximum(earlier.sum(), 1.0)
    sg_d = jax.lax.stop_gradient(d_h)
    quantized = codebook_KxD[codes].astype(jnp.float32) + d_h - sg_d  # straight-through
    rec = in_batch_ce(quantized @ sg_d.T, rows_B, mask_duplicates)
    return {"ce": ce, "cl": cl, "code": code, "rec": rec, "codes": codes}


@gin.configurable
def genret_objective(model, params, batch, rng=None, w_ce: float = 0.5, w_cl: float = 0.5, w_code: float = 0.5,
                     w_rec: float = 0.1, epsilon: Positive = 1.0, iterations: Count = 100, sinkhorn: str = "balanced",
                     mask_duplicates: bool = True):
    """GenRET's loss for a batch of `GenretBatches` (`GenretRetriever.objective = @genret_objective`):
    "inputs" [B, Lq] queries, "documents" [B, Ld], "prefix" [B, T] the documents' codes decoded at the stage's
    start, "rows" [B] their corpus rows, "position" [B] the stage's position t (the same in every row).
    `sinkhorn` "released" and `mask_duplicates = False` reproduce GenRET's released code (module docstring)."""
    t = batch["position"][0]
    T, K = model.head.length, model.head.codes
    table = params["head"]["codebook"].reshape(T, K, -1)
    frozen = (jnp.arange(T) < t)[:, None, None]  # the codebooks of finished positions get no gradient
    table = jnp.where(frozen, jax.lax.stop_gradient(table), table)
    params = {**params, "head": {**params["head"], "codebook": table.reshape(T * K, -1)}}
    q_rng = d_rng = None
    if rng is not None:
        q_rng, d_rng = jax.random.split(rng)
    prefix = batch["prefix"].astype(jnp.int32)
    q_h, q_logits = model.positions(params, batch["inputs"], prefix, q_rng)
    d_h, d_logits = model.positions(params, batch["documents"], prefix, d_rng)
    targets = None
    weights = jnp.array([w_ce, w_cl, w_code, w_rec], jnp.float32)
    if "phase" in batch:  # a run with "pre" / "fit" stages (GenretTraining): the stage's weights and targets
        phase = batch["phase"][0]
        weights = jnp.stack([weights, jnp.array(PRE_WEIGHTS), jnp.array(FIT_WEIGHTS)])[phase]
        targets = jnp.where(phase == PHASES.index("fit"), batch["fit_codes"].astype(jnp.int32), -1)
    terms = genret_losses(q_h, q_logits, d_h, d_logits, prefix, t, batch["rows"], table[t], epsilon, iterations,
                          sinkhorn, mask_duplicates, targets)
    loss = weights[0] * terms["ce"] + weights[1] * terms["cl"] + weights[2] * terms["code"] + weights[3] * terms["rec"]
    B = batch["inputs"].shape[0]
    n = jnp.float32(B)
    q_hit = (jnp.argmax(q_logits[:, t], axis=-1) == terms["codes"]).astype(jnp.float32).sum()
    used = (jnp.zeros(K, jnp.float32).at[terms["codes"]].add(1.0) > 0).sum()
    return loss, {"loss": (loss * n, n), "ce": (terms["ce"] * n, n), "cl": (terms["cl"] * n, n),
                  "code": (terms["code"] * n, n), "rec": (terms["rec"] * n, n), "query_code_accuracy": (q_hit, n),
                  "codes_used_in_batch": (used, jnp.float32(1.0)), "position": (t.astype(jnp.float32), 1.0)}


PHASES = ("main", "pre", "fit")
# GenRET's released loss weights of its "pre" and "fit" stages (run.py: w_1, w_3), as (ce, cl, code, rec)
PRE_WEIGHTS = (0.0, 0.5, 0.5, 0.0)
FIT_WEIGHTS = (0.5, 0.0, 1.0, 0.0)


def occurrence_codes(prefixes_NxT: np.ndarray, doc_rank_N: np.ndarray, codes: int) -> np.ndarray:
    """The fit stage's code of each document (GenRET's `add_last`): its 1-based place among the documents that share
    its docid, by document id (`doc_rank`), modulo K — a document alone gets 1, the second of a shared docid 2, the
    K-th 0. → [N] int32."""
    prefixes = np.asarray(prefixes_NxT)
    n = len(prefixes)
    if not n:
        return np.zeros(0, np.int32)
    order = np.lexsort((np.asarray(doc_rank_N), *prefixes.T[::-1]))  # by docid, then document id
    ranked = prefixes[order]
    new_group = np.ones(n, bool)
    new_group[1:] = (ranked[1:] != ranked[:-1]).any(axis=1)
    starts = np.maximum.accumulate(np.where(new_group, np.arange(n), 0))
    out = np.empty(n, np.int64)
    out[order] = (np.arange(n) - starts + 1) % codes
    return out.astype(np.int32)


class GenretBatches:
    """Endless, resumable batches of (query, document) pairs: {"inputs", "documents", "prefix", "rows",
    "position"}, the position of batch s (counted from the run's first batch) being t = min(s // stage_steps,
    T − 1) and "prefix" the documents' codes decoded at the stage's start (`set_docids`).

    As GenRET's released code builds them, the batches of position t > 0 are *prefix groups*: the pairs whose
    documents share the codes before t, shuffled and cut into batches, the last batch of a group filled with
    pairs drawn from the other groups. So the balanced assignment, the contrastive and the reconstruction terms
    separate documents that the earlier positions could not. At t = 0 every pair is in one group.

    The batches of a stage's epoch e are a function of (seed, t, e, the docids): pairs enter their group in the
    order of their key (query id, document id), groups in the order of their prefix, and a generator seeded by
    (seed, t, e) shuffles; so the row order of the corpus and of the queries changes nothing, and the state is the
    step alone."""

    def __init__(self, inputs: np.ndarray, rows: np.ndarray, keys, doc_tokens: np.ndarray, batch_size: int,
                 stage_steps: int, positions: int, seed: int = 0, stages: Optional[Sequence[tuple]] = None,
                 doc_rank: Optional[np.ndarray] = None, codes: int = 0):
        self.inputs, self.rows = np.asarray(inputs), np.asarray(rows, np.int64)
        if len(self.inputs) != len(self.rows) or len(keys) != len(self.rows) or not len(self.rows):
            raise ValueError("GenRET batches: inputs, document rows and keys must be parallel and non-empty")
        self._by_key = np.asarray(sorted(range(len(keys)), key=lambda i: keys[i]), np.int64)
        self.doc_tokens = np.asarray(doc_tokens, np.int32)
        self.batch_size, self.stage_steps, self.positions = int(batch_size), int(stage_steps), int(positions)
        self.seed = int(seed)
        # (kind, position) of each stage: "main" per position by default; "pre" before a main stage and a final "fit"
        # (`GenretTraining.pre_stage` / `fit_stage`) add the batches' "phase" and "fit_codes"
        self.stages = list(stages) if stages is not None else [("main", t) for t in range(self.positions)]
        self.phased = any(kind != "main" for kind, _ in self.stages)
        self.fit = any(kind == "fit" for kind, _ in self.stages)
        if self.fit and codes < 1:
            raise ValueError("GenRET batches: a fit stage needs the codes per position (K) to number the documents")
        self.codes = int(codes)
        # each document row's rank by document id: the fit stage numbers the documents of a shared docid in this order
        self.doc_rank = np.asarray(doc_rank if doc_rank is not None else np.arange(len(doc_tokens)), np.int64)
        self.fit_codes = None
        self.step = 0
        self.docids = None
        self._plans: dict = {}
        self._per_epoch: dict = {}

    def set_docids(self, docids_by_row: np.ndarray) -> None:
        docids = np.asarray(docids_by_row)
        if docids.shape != (len(self.doc_tokens), self.positions):
            raise ValueError(f"GenRET batches: docids [{len(self.doc_tokens)}, {self.positions}] expected (one per "
                             f"document row), got {docids.shape}")
        self.docids = docids.astype(np.int32)
        self._plans, self._per_epoch = {}, {}
        if self.phased:  # the fit stage's codes (zeros, never read, in a run without one)
            self.fit_codes = occurrence_codes(self.docids[:, :-1], self.doc_rank, self.codes) if self.fit else \
                np.zeros(len(self.docids), np.int32)

    def stage(self, step: int) -> int:
        return min(int(step) // self.stage_steps, len(self.stages) - 1)

    def position(self, step: int) -> int:
        return self.stages[self.stage(step)][1]

    def groups(self, t: int) -> list[np.ndarray]:
        """The pairs (indices, by key) of each prefix group at position t, groups by prefix."""
        if t == 0:
            return [self._by_key]
        prefix = self.docids[self.rows[self._by_key], :t]
        _, g = np.unique(prefix, axis=0, return_inverse=True)
        g = g.reshape(-1)
        o = np.argsort(g, kind="stable")  # by group, key order kept inside each
        bounds = np.flatnonzero(np.diff(g[o])) + 1
        return [self._by_key[part] for part in np.split(o, bounds)]

    def plan(self, t: int, epoch: int, stage: Optional[int] = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """The batches of stage t's epoch `epoch`: (the group's pairs, the pairs filling the batch) each."""
        key = t if stage is None else stage  # the stage seeds its shuffles (= t when every stage is a main one)
        if (key, t, epoch) in self._plans:
            return self._plans[(key, t, epoch)]
        rng = np.random.default_rng([self.seed, key, epoch])
        n, B = len(self.rows), self.batch_size
        batches = []
        for members in self.groups(t):
            members = rng.permutation(members)
            for start in range(0, len(members), B):
                part = members[start:start + B]
                need = B - len(part)
                fill = np.empty(0, np.int64)
                if need and len(members) < n:  # distinct pairs of other groups: draw enough, drop members
                    draw = self._by_key[rng.choice(n, size=min(n, need + len(members)), replace=False)]
                    fill = draw[~np.isin(draw, members)][:need]
                    if len(fill) < need:  # fewer other pairs than the batch needs: repeat them
                        fill = rng.choice(fill, size=need, replace=True)
                elif need:
                    fill = rng.choice(self._by_key, size=need, replace=True)
                batches.append((part, fill))
        order = rng.permutation(len(batches))
        self._plans = {(key, t, epoch): [batches[i] for i in order]}  # one epoch's plan kept
        return self._plans[(key, t, epoch)]

    def get_state(self) -> dict:
        return {"step": self.step}

    def set_state(self, state: Mapping) -> None:
        self.step = int(state["step"])

    def epochs(self) -> list[float]:
        return [self.step * self.batch_size / len(self.rows)]

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.docids is None:
            raise RuntimeError("GenRET batches need the decoded docids (set_docids) before the first batch")
        stage = self.stage(self.step)
        kind, t = self.stages[stage]
        i = self.step - stage * self.stage_steps
        if i == 0 and self.step:
            log.info("step %d: GenRET's %s stage of docid position %d of %d", self.step, kind, t + 1, self.positions)
        if t not in self._per_epoch:  # batches per epoch: one per started batch of each group
            self._per_epoch[t] = sum(-(-len(m) // self.batch_size) for m in self.groups(t))
        per_epoch = self._per_epoch[t]
        part, fill = self.plan(t, i // per_epoch, stage)[i % per_epoch]
        pairs = np.concatenate([part, fill])
        rows = self.rows[pairs]
        self.step += 1
        out = {"inputs": self.inputs[pairs], "documents": self.doc_tokens[rows], "prefix": self.docids[rows],
               "rows": rows.astype(np.int32), "position": np.full(len(rows), t, np.int32)}
        if self.phased:
            out["phase"] = np.full(len(rows), PHASES.index(kind), np.int32)
            out["fit_codes"] = self.fit_codes[rows].astype(np.int32)
        return out


@gin.configurable
@dataclasses.dataclass
class GenretTraining(ObjectivesConfig):
    """GenRET's training data and stages (`prepare.objectives_config = @GenretTraining()`, with
    `prepare.model_fn = @GenretRetriever`, `GenretRetriever.objective = @genret_objective` and
    `prepare.docid_scheme = @GenretDocids()`): the training queries with their documents, TRAIN_STEPS
    (`train_steps = %TRAIN_STEPS`) split into one stage per docid position, the docids decoded again at every
    stage's start (train.checkpoint_period must be a multiple of the stage length)."""

    train_steps: Count = gin.REQUIRED  # bind to %TRAIN_STEPS
    positions: Count = 3  # the learned positions: GenretDocids.length (one less with the fit stage)
    kmeans_init: bool = True  # each position's codebook from a balanced k-means of the documents' states
    seed: int = 0
    # GenRET's released code (module docstring): a "pre" stage (contrastive + prefix codes) before each position's main
    # stage, the k-means then at position 0 too; a final "fit" stage that learns one more position, the document's
    # place among those sharing its docid (GenretDocids.length = positions + 1). Stages are of equal length.
    pre_stage: bool = False
    fit_stage: bool = False
    # the corpus rows in document-id order (set by `iterator`): the k-means reads the documents in this order, so the
    # codebook does not depend on the corpus's row order
    _by_key: Optional[np.ndarray] = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def stages(self) -> list[tuple[str, int]]:
        """(kind, docid position) of every stage, in order."""
        out = []
        for t in range(self.positions):
            out += ([("pre", t)] if self.pre_stage else []) + [("main", t)]
        return out + ([("fit", self.positions)] if self.fit_stage else [])

    @property
    def length(self) -> int:
        """The docid length these stages make (GenretDocids.length)."""
        return self.positions + (1 if self.fit_stage else 0)

    @property
    def stage_steps(self) -> int:
        n = len(self.stages)
        if self.train_steps % n:
            raise ValueError(f"GenretTraining: TRAIN_STEPS ({self.train_steps}, GenretTraining.train_steps) must be a "
                             f"multiple of the {n} stages ({self.positions} docid positions"
                             f"{', a pre stage each' if self.pre_stage else ''}{', the fit stage' if self.fit_stage else ''})")
        return self.train_steps // n

    @property
    def refresh_period(self) -> int:
        return self.stage_steps

    def on_refresh(self, step: int, params, model, table, doc_tokens):
        """At each stage's start (after its docids are decoded): position t's codebook E_t ← the balanced k-means
        centroids of the documents' states at t (teacher-forced over their decoded prefix; prefix groups centred,
        `prefix_centered`). The states at t do not read E_t, so applying this to its own result changes nothing
        (a resumed run repeats it exactly). Off with `kmeans_init = False`."""
        if not self.kmeans_init or step % self.stage_steps or step >= self.train_steps:
            return None
        kind, t = self.stages[step // self.stage_steps]
        if kind != "main" or (t == 0 and not self.pre_stage):  # with pre stages, position 0 too (as theirs)
            return None
        T, K = model.head.length, model.head.codes
        if len(doc_tokens) < K:
            raise ValueError(f"GenRET: {len(doc_tokens)} documents cannot initialise {K} codes per position; lower "
                             f"GenretDocids.codes or set GenretTraining.kmeans_init = False")
        by_key = self._by_key if self._by_key is not None else np.arange(len(doc_tokens))
        codes = np.asarray(table.sequences)[np.argsort(table.doc_rows, kind="stable")][:, :T][by_key]
        states = model.document_states(params, np.asarray(doc_tokens)[by_key], codes, t)
        centroids = balanced_kmeans(prefix_centered(states, codes[:, :t]), K, seed=self.seed + t)
        old_book = params["head"]["codebook"]
        book = np.array(old_book, np.float32).reshape(T, K, -1)
        book[t] = centroids
        log.info("step %d: codebook of docid position %d initialised by balanced k-means of %d documents' states",
                 step, t + 1, len(states))
        new_book = jnp.asarray(book.reshape(T * K, -1), dtype=old_book.dtype)
        return {**params, "head": {**params["head"], "codebook": new_book}}

    def iterator(self, inp) -> GenretBatches:
        from gr_jax.methods.api import dsi_pairs
        from gr_jax.methods.api import tokenize

        length = getattr(inp.scheme, "length", None)
        if length != self.length:
            raise ValueError(f"GenretTraining.positions = {self.positions}{' with the fit stage' if self.fit_stage else ''}"
                             f" makes docids of {self.length} positions but the docid scheme "
                             f"{getattr(inp.scheme, 'name', '?')!r} has {length}; GenRET trains with GenretDocids, set "
                             f"GenretDocids.length = {self.length}")
        ds, split = inp.dataset, inp.train_split
        if self.stage_steps < 1:  # stage_steps refuses a TRAIN_STEPS the stages cannot split
            raise ValueError(f"GenretTraining: TRAIN_STEPS {self.train_steps} < {self.positions} positions")
        self._by_key = np.argsort(np.asarray(ds.corpus.doc_ids), kind="stable")
        if split not in ds.queries:
            raise ValueError(f"GenRET trains on queries: the dataset has no split {split!r} (TRAIN_SPLIT); it has "
                             f"{sorted(ds.queries)}")
        pairs = dsi_pairs.query_pairs(ds.queries[split], ds.qrels[split], ds.corpus, name="genret")
        if not len(pairs):
            raise ValueError(f"GenRET: split {split!r} has no judged query with a document in the corpus")
        inputs = tokenize(pairs.texts, inp.vocab, inp.lengths["inputs"], what=pairs.name)
        keys = [(q, ds.corpus.doc_ids[r]) for q, r in zip(pairs.qids, pairs.rows)]
        log.info("GenRET: %d training pairs, %d stages of %d steps", len(pairs), len(self.stages), self.stage_steps)
        doc_rank = np.empty(len(self._by_key), np.int64)
        doc_rank[self._by_key] = np.arange(len(self._by_key))
        return GenretBatches(inputs, pairs.rows, keys, inp.doc_tokens(), inp.batch_size, self.stage_steps,
                             self.length, seed=inp.seed, stages=self.stages, doc_rank=doc_rank,
                             codes=int(getattr(inp.scheme, "codes", 0)))
