"""PAG's planner on the device: s_simul(q, d) = Σ_{v ∈ t_d} rep_q[v] over the corpus and the planning set, the n
best documents by s_simul with ties at the n-th place broken by the larger document key (never the row).

Two ways to the same planning set:

* **Dense product** (`simul_scores`): every document's m set-docid ids gather the queries' weights — D × m reads
  per batch, whatever the query.
* **Inverted index** (`Postings`, `inverted_plan`): token → the documents whose set docid holds it. A query's
  positive weights fire a few tokens (the planner is trained sparse, 004 §2 Stage 1); only the documents on
  those tokens' posting lists get a score, all others have s_simul exactly 0. A document on one fired token
  scores that token's weight, the dense sum's bits; one on several is rescored in the dense order. When a batch
  does not fit the static budgets (more fired tokens or postings than budgeted, or a document on several tokens
  beyond the R rescored ones within rounding distance of the n-th place) it takes the dense product: the set
  and its scores are the same either way (`plan_from_rep`, on the device).

Dimension letters: B queries, V planning vocabulary, D documents (corpus rows), m set-docid size, n planning set,
A fired query tokens, P postings read per query, R postings of documents on several tokens rescored per query.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

def top_set_ids(rep_NxV, m: int, vocab_limit: Optional[int] = None):
    """Set docids from representations: the top-m ids of rep[:, :vocab_limit], by descending weight (ties:
    lower id first) → int32 [N, m]."""
    r = rep_NxV if vocab_limit is None else rep_NxV[:, :vocab_limit]
    return jax.lax.top_k(r, m)[1].astype(jnp.int32)


def ordered_sum(x, axis: int):
    """Σ along `axis` as ((x_0 + x_1) + x_2) + …: one fixed order of float adds whatever the array's shape or
    layout, so a document's s_simul has the same bits in the dense product and in a candidate rescoring."""
    x = jnp.moveaxis(x, axis, 0)
    acc = x[0]
    for j in range(1, x.shape[0]):
        acc = acc + x[j]
    return acc


def simul_scores(rep_BxV, set_ids_DxM, chunk: int = 8192):
    """s_simul [B, D] = Σ_j rep[b, set_ids[d, j]] (ids < 0 are padding), summed in j order (`ordered_sum`): the
    document × token sparse matrix (m entries per row) times the queries' reps. The reps are read as [V, B] rows,
    so every entry gathers B contiguous floats; documents go in chunks so the gathered block stays in cache."""
    D, m = set_ids_DxM.shape
    B, V = rep_BxV.shape
    rep_VxB = jnp.concatenate([rep_BxV.T, jnp.zeros((1, B), rep_BxV.dtype)])  # row V: padding ids read 0
    ids = jnp.where(set_ids_DxM >= 0, set_ids_DxM, V)

    def block(ids_CxM):
        return ordered_sum(jnp.take(rep_VxB, ids_CxM, axis=0, mode="clip"), 1)  # [C, B]; ids in [0, V] already

    if D <= chunk:
        return block(ids).T
    pad = (-D) % chunk
    blocks = jnp.pad(ids, ((0, pad), (0, 0)), constant_values=V).reshape(-1, chunk, m)
    return jax.lax.map(block, blocks).reshape(-1, B)[:D].T


def rescore(rep_BxV, set_ids_DxM, rows_BxC):
    """s_simul of given documents per query [B, C] (rows < 0: −inf), bit-identical to `simul_scores`'s."""
    B, V = rep_BxV.shape
    ids = set_ids_DxM[jnp.maximum(rows_BxC, 0)]  # [B, C, m]
    w = jnp.take_along_axis(rep_BxV, jnp.where(ids >= 0, ids, 0).reshape(B, -1), axis=1).reshape(ids.shape)
    s = ordered_sum(jnp.where(ids >= 0, w, 0.0), 2)
    return jnp.where(rows_BxC >= 0, s, -jnp.inf)


def _top_k(x, k: int):
    """`lax.top_k` behind an optimization barrier: fused with some consumers of its values (a comparison of
    two of them, a slice), XLA's CPU backend drops its top-k kernel for a full sort (~100× slower at 1M). One
    barrier per output: a barrier over the (values, indices) tuple crashes XLA's top-k decomposer when the program
    is partitioned over several devices (t5x's infer step with data parallelism)."""
    vals, idx = jax.lax.top_k(x, k)
    return jax.lax.optimization_barrier(vals), jax.lax.optimization_barrier(idx)


def top_n_fast(scores_BxD, n: int):
    """The n best documents per row by score (rows [B, n], scores [B, n]) and whether any row has a tie across
    the n-th place (then the set depends on the tie rule: use `top_n_exact`). Within the set, the order of
    equal scores is not defined: nothing downstream reads it (the bonus is a max; rankings order ties by key)."""
    n = min(n, scores_BxD.shape[1])
    if n == scores_BxD.shape[1]:
        vals, idx = _top_k(scores_BxD, n)
        return idx.astype(jnp.int32), vals, jnp.zeros((), bool)
    vals, idx = _top_k(scores_BxD, n + 1)
    return idx[:, :n].astype(jnp.int32), vals[:, :n], (vals[:, n - 1] == vals[:, n]).any()


def _key_as_float(keys):
    """Order keys (int32, 0 ≤ key < 2^30; −1: no document) as float32 that order the same way: the bit pattern
    key + 2^23 read as a float is a normal positive float, increasing with the key (XLA's float top-k is fast
    on every device; its integer top-k is not on CPU)."""
    f = jax.lax.bitcast_convert_type(jnp.maximum(keys, 0) + jnp.int32(1 << 23), jnp.float32)
    return jnp.where(keys >= 0, f, -1.0)


def top_n_exact(scores_BxD, keys, n: int):
    """The n best by score, ties at the n-th score broken by the larger key (keys [D] shared by the rows, or [B, D]),
    equal keys by the earlier position: the documents above the n-th score, then of those tied with it the `need`
    largest keys (three float top-k's, no sort of the corpus)."""
    B, D = scores_BxD.shape
    n = min(n, D)
    thr = _top_k(scores_BxD, n)[0][:, n - 1:n]
    greater, tied = scores_BxD > thr, scores_BxD == thr
    need = n - greater.sum(axis=1, keepdims=True)
    keyed = jnp.where(tied, _key_as_float(keys if keys.ndim == 2 else keys[None, :]), -jnp.inf)
    kth = jnp.take_along_axis(_top_k(keyed, n)[0], jnp.maximum(need - 1, 0), axis=1)
    above = tied & (keyed > kth)
    # of the tied with the need-th key itself (keys may repeat: 30-bit hashes, −1 for rows without a document),
    # the first by position fill what the larger keys leave
    at_kth = tied & (keyed == kth)
    rest = need - above.sum(axis=1, keepdims=True)
    pick = greater | ((above | (at_kth & (jnp.cumsum(at_kth, axis=1) <= rest))) & (need > 0))
    vals, idx = _top_k(jnp.where(pick, scores_BxD, -jnp.inf), n)
    return idx.astype(jnp.int32), vals


def top_n_by_key(scores_BxD, keys_D, n: int):
    """The planning set: the n best documents per row by score, ties at the n-th place broken by the larger
    document key (never the position). The fast top-n decides unless a tie crosses the boundary (host check)."""
    idx, vals, tie = jax.jit(top_n_fast, static_argnums=1)(scores_BxD, n)
    if bool(tie):
        return jax.jit(top_n_exact, static_argnums=2)(scores_BxD, keys_D, n)
    return idx, vals


# ----------------------------------------------------------------------------------------------------------
# the inverted index
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Budgets:
    """Static sizes of one compiled inverted planner, per query: `active` fired tokens and `postings` entries read
    (a batch over either takes the dense product), `rescored` postings of documents on several fired tokens (the
    best by posting score; see `inverted_plan`)."""

    active: int
    postings: int
    rescored: int

    @property
    def rescored_documents(self) -> int:
        """Places for the distinct documents of the R rescored postings: each is on two tokens or more."""
        return max(1, self.rescored // 2)

    @property
    def candidates(self) -> int:
        """What the planning set is chosen from: the postings and the rescored documents (must be ≥ n)."""
        return self.postings + self.rescored_documents


def budgets_for(postings: int, vocab: int) -> Budgets:
    """The budgets of a postings budget P: at most min(V, 1024) fired tokens, P / 32 postings rescored (4096 at
    P = 2^17: about four planning sets of 1000 on two tokens each)."""
    return Budgets(active=int(min(vocab, 1024)), postings=int(postings), rescored=int(max(1, postings // 32)))


RUNGS = 4  # compiled postings sizes per planner: P, P/2, P/4, P/8


def ladder(budgets: Budgets, rungs: Optional[int] = None) -> tuple:
    """The compiled sizes of one inverted planner, smallest first: P, P/2, … (`rungs` of them, default `RUNGS`;
    none below 1) with the same fired-token budget and the same R rescored postings (at most the rung's P). A
    batch takes the smallest rung that holds every query's postings (`rung_of`): the work that grows with P (the
    postings laid out, their top-k's) then follows the batch, not the budget. A rung with P ≥ R reads the same
    postings and rescores the same documents as the largest, so it returns its plan bit for bit; a smaller one
    (R cut to P) can only fall back to the dense product more often, which plans the same set."""
    sizes = sorted({max(1, budgets.postings >> i) for i in range(max(1, RUNGS if rungs is None else rungs))})
    return tuple(budgets if size == budgets.postings else Budgets(budgets.active, size, min(size, budgets.rescored))
                 for size in sizes)


def rung_of(rep_BxV, start_V1, rungs: tuple):
    """The index of the smallest rung (`ladder`) whose budgets every query of the batch fits; len(rungs) when none
    does (the batch takes the dense product). Fired tokens: weight > 0 on a non-empty posting list."""
    lens = start_V1[1:] - start_V1[:-1]
    V = lens.shape[0]
    fired = (rep_BxV[:, :V] > 0) & (lens[None, :] > 0)
    total = jnp.where(fired, lens[None, :], 0).sum(axis=1).max()
    over = [(fired.sum(axis=1).max() > b.active) | (total > b.postings) for b in rungs]
    return sum(o.astype(jnp.int32) for o in over)  # fitting is monotone in P: the rungs that do not fit come first


class Postings:
    """The set docids as an inverted index over *key ranks* (a corpus row's place when the rows are sorted by
    order key descending; `by_key[rank]` = row): for every planning-vocabulary id v, the ranks of the rows whose
    set docid holds it, ascending (`docs[start[v]:start[v + 1]]`; a row holding v twice is listed twice, as the
    dense sum counts it twice). Scores laid out by key rank make the first of equal scores the larger key, the
    planning set's tie rule. Built on the host from the [D, m] set-docid rows (padding −1) and the order keys."""

    def __init__(self, set_ids_DxM: np.ndarray, vocab: int, keys_D: np.ndarray):
        ids = np.asarray(set_ids_DxM)
        if ids.size and int(ids.max()) >= vocab:
            raise ValueError(f"set docids hold id {int(ids.max())}, beyond the planning vocabulary of {vocab}")
        D, m = ids.shape
        self.by_key = np.argsort(-np.asarray(keys_D, np.int64), kind="stable").astype(np.int32)
        flat = ids[self.by_key].reshape(-1)  # the rows in rank order
        keep = np.nonzero(flat >= 0)[0]
        tokens = flat[keep]
        order = np.argsort(tokens, kind="stable")  # by token; within one, by rank (stable over rank order)
        self.docs = (keep[order] // max(m, 1)).astype(np.int32)
        self.start = np.zeros(vocab + 1, np.int64)
        np.cumsum(np.bincount(tokens, minlength=vocab), out=self.start[1:])
        if self.start[-1] >= 2 ** 31:
            raise ValueError(f"{self.start[-1]} set-docid entries: the inverted index counts them in int32")
        self.start = self.start.astype(np.int32)
        self.num_docs = D
        self._device = None

    @property
    def nbytes(self) -> int:
        return int(self.docs.nbytes + self.start.nbytes + self.by_key.nbytes)

    def device(self):
        """(docs, start, by_key) on the device, made once (concrete even when first asked inside a caller's trace)."""
        if self._device is None:
            with jax.ensure_compile_time_eval():
                self._device = (jnp.asarray(self.docs), jnp.asarray(self.start), jnp.asarray(self.by_key))
        return self._device


def rounding_margin(score_B, m: int):
    """δ: a bound on |a − b| for two float32 sums of the same k ≤ m non-negative terms added in different orders,
    for sums up to `score` (each is within γ_{k−1}·s of the exact sum, Higham (2002) Thm 4.4; γ_k = k·u / (1 − k·u),
    u = 2^-24), with room for the bound itself being computed in float32."""
    u = 2.0 ** -24
    gamma = m * u / (1.0 - m * u)
    return 2.0 * gamma * score_B * (1.0 + 1e-3) + 1e-37


def inverted_fits(rep_BxV, start_V1, budgets: Budgets):
    """Whether every query of the batch fits the active-token and postings budgets (cheap: one pass over V)."""
    return rung_of(rep_BxV, start_V1, (budgets,)) == 0


def inverted_plan(rep_BxV, set_ids_DxM, postings, n: int, budgets: Budgets):
    """The planning set through the inverted index → (rows [B, n], s_simul [B, n] in the dense product's bits,
    whether it is exact for every query, whether the top-k over the postings decided). Call only when
    `inverted_fits`.

    Every posting of a fired token counts one for its document (a scatter-add over key ranks). A document on one
    fired token has exactly that token's weight as its s_simul (the dense sum adds that weight to zeros), and an
    unlisted one 0; the documents on several (a count ≥ 2) are rescored in the dense order.
    The planning set is the first n of the single-token postings and the rescored documents, by
    score and, among equals, by rank — which a top-k over the postings gives when the tied ones are all on one
    token; otherwise (two fired tokens weigh the same, a rescored document ties the n-th score, fewer than n
    score) a top-k over the scores laid out by rank and the tie rule over those candidates. Not exact (the caller
    takes the dense product) when a document on several tokens outside the R rescored ones could reach the n-th
    place (its sum in posting order within the rounding margin δ of it, `rounding_margin`)."""
    docs_P, start_V1, by_key_D = postings
    B = rep_BxV.shape[0]
    D = set_ids_DxM.shape[0]
    lens = start_V1[1:] - start_V1[:-1]
    V, A, P, R = lens.shape[0], budgets.active, budgets.postings, budgets.rescored
    w = jnp.where(lens[None, :] > 0, rep_BxV[:, :V], 0.0)
    a_val, a_tok = _top_k(w, A)  # the fired tokens (weight > 0), heaviest first
    a_len = jnp.where(a_val > 0, lens[a_tok], 0)
    a_end = jnp.cumsum(a_len, axis=1)  # [B, A]: where each token's postings end in the query's list
    rows = jnp.arange(B)[:, None]
    # slot[p] = how many tokens' postings end at or before p (a histogram of the ends, summed)
    slot = jnp.cumsum(jnp.zeros((B, P + 1), jnp.int32).at[rows, jnp.minimum(a_end, P)].add(1), axis=1)[:, :P]
    pos = jnp.arange(P, dtype=jnp.int32)[None, :]
    used = pos < a_end[:, -1:]
    slot = jnp.minimum(slot, A - 1)
    tok = jnp.take_along_axis(a_tok, slot, axis=1)
    offset = pos - (jnp.take_along_axis(a_end, slot, axis=1) - jnp.take_along_axis(a_len, slot, axis=1))
    rank = jnp.where(used, docs_P[jnp.clip(start_V1[tok] + offset, 0, docs_P.shape[0] - 1)], D)
    weight = jnp.where(used, jnp.take_along_axis(a_val, slot, axis=1), 0.0)
    # how many fired tokens each posting's document is on (a scatter-add of ones over key ranks; rank D: dropped).
    # A document is on at most m postings (one per set-docid entry), so bytes count it when m < 256: a quarter
    # of the float32 row's memory, which the scatter and the gather back reach at random (~3× faster at 1M)
    count_dtype = jnp.uint8 if set_ids_DxM.shape[1] < 256 else jnp.int32
    count = jnp.zeros((B, D), count_dtype).at[rows, rank].add(jnp.ones((B, P), count_dtype), mode="drop")
    several = used & (jnp.take_along_axis(count, rank, axis=1, mode="clip") >= 2)
    on_several = jnp.cumsum(several, axis=1, dtype=jnp.int32)  # [B, P]: postings on several up to p
    taken_all = on_several[:, -1] <= R

    def sums():  # [B, D] the postings' weights summed per document in posting order (only the rare branches)
        return jnp.zeros((B, D), jnp.float32).at[rows, rank].add(weight, mode="drop")

    def all_of_them():  # every query's postings on several fit in R: their places in posting order, no top-k
        return _first_places(on_several, R), jnp.zeros((B,), jnp.float32), jnp.full((B,), -jnp.inf)  # no δ

    def the_best():
        # the R best postings on documents on several, by the posting's document's sum in posting order: those
        # documents are rescored; any other scores at most the R-th such sum + δ, below the n-th place when that
        # is ≥ 2δ above it (checked below)
        approx = jnp.where(several, jnp.take_along_axis(sums(), rank, axis=1, mode="clip"), -jnp.inf)
        cut, at = _top_k(approx, R)
        return jnp.where(cut > -jnp.inf, at, P), cut[:, 0], cut[:, R - 1]

    at, cut_first, cut_last = jax.lax.cond(taken_all.all(), all_of_them, the_best)
    redo = jnp.sort(jnp.where(at < P, jnp.take_along_axis(rank, jnp.minimum(at, P - 1), axis=1), D), axis=1)
    fresh = jnp.concatenate([jnp.ones((B, 1), bool), redo[:, 1:] != redo[:, :-1]], axis=1) & (redo < D)
    # the distinct documents first, in rank order: each has two or more of the R postings, so R / 2 places hold
    # them (more only when the R-th posting's score cuts through equal ones: the dense product then, below)
    R2 = budgets.rescored_documents
    redo = jnp.full((B, R2), D, jnp.int32).at[rows, jnp.where(fresh, jnp.cumsum(fresh, axis=1) - 1, R2)].set(
        redo, mode="drop")
    distinct_fit = fresh.sum(axis=1) <= R2
    # (the rows made once, behind a barrier: XLA does not fuse their gather into the rescoring's m-fold one)
    redo_rows = jax.lax.optimization_barrier(jnp.where(redo < D, by_key_D[jnp.minimum(redo, D - 1)], -1))
    redo_s = rescore(rep_BxV, set_ids_DxM, redo_rows)  # padding: −inf
    single = jnp.where(used & ~several, weight, -jnp.inf)  # its document's s_simul, bit for bit
    # the postings come token by token, heaviest first, and all of a token's weigh the same: the singles never
    # increase along them, so their n best (equal ones: the earlier) are the first n, and a top-k over those and
    # the rescored documents picks what one over all the postings would, at the same places
    first = _first_places(jnp.minimum(pos + 1, a_end[:, -1:]) - on_several, n)  # P: fewer than n singles
    top_s, at = _top_k(jnp.concatenate(
        [jnp.where(first < P, jnp.take_along_axis(single, jnp.minimum(first, P - 1), axis=1), -jnp.inf), redo_s],
        axis=1), n)
    at = jnp.where(at < n, jnp.take_along_axis(first, jnp.minimum(at, n - 1), axis=1), P + at - n)
    theta = top_s[:, n - 1:n]
    # among equal scores the top-k takes the earlier posting: the earlier rank when the ones tied at the n-th
    # score are all postings of one token or all rescored documents (both ascend by rank) — or there is no tie
    # there; fewer than n scoring documents leave the rest of the set to the zeros, by rank
    tied, tied_redo = single == theta, redo_s == theta
    one_token = (jnp.where(tied, tok, V).min(axis=1) == jnp.where(tied, tok, -1).max(axis=1)) & ~tied_redo.any(axis=1)
    all_redo = ~tied.any(axis=1)
    quick = ((theta[:, 0] > 0) & (one_token | all_redo)).all()

    def by_postings():
        return jnp.take_along_axis(jnp.concatenate([rank, redo], axis=1), at, axis=1), top_s

    def by_rank():  # the first n + R of the scores laid out by rank (zeros included), then the tie rule
        first_s, first_r = _top_k(sums(), min(n + R, D))  # the documents on several: rescored below
        on_several = jnp.take_along_axis(redo, jnp.minimum(jax.vmap(jnp.searchsorted)(redo, first_r), R2 - 1),
                                         axis=1) == first_r
        cand_s = jnp.concatenate([jnp.where(on_several, -jnp.inf, first_s), redo_s], axis=1)
        cand_r = jnp.concatenate([first_r, redo], axis=1)
        at, vals = top_n_exact(cand_s, (1 << 30) - 1 - cand_r, n)  # the larger key: the earlier rank
        return jnp.take_along_axis(cand_r, at, axis=1), vals

    ranks, scores = jax.lax.cond(quick, by_postings, by_rank)
    delta = rounding_margin(jnp.maximum(cut_first, 0.0), set_ids_DxM.shape[1])
    fits = distinct_fit & (taken_all | (cut_last + 2 * delta < scores[:, n - 1]))
    return by_key_D[jnp.minimum(ranks, D - 1)], scores, fits.all(), quick


def _first_places(counts_BxP, k: int):
    """Per row, the places of the first k counted entries, given their running count (non-decreasing): the j-th
    is the first place where the count reaches j; P where fewer than k are counted. [B, k] int32."""
    want = jnp.arange(1, k + 1, dtype=counts_BxP.dtype)
    return jax.vmap(lambda c: jnp.searchsorted(c, want, side="left"))(counts_BxP).astype(jnp.int32)


def plan_from_rep(rep_BxV, set_ids_DxM, keys_D, n: int, chunk: int, postings=None, budgets: Optional[Budgets] = None,
                  exact: bool = False):
    """The planning set of a batch → (rows [B, n], s_simul [B, n], tie): through the inverted index when
    `postings` (`Postings.device()`) and the batch fits its budgets (at the smallest rung of their `ladder` that
    holds it), else the dense product; the weights must be
    ≥ 0 (the planner's log(1 + ReLU)), which the inverted index assumes (a weight ≤ 0 fires no token). With `exact`,
    a tie at the n-th place of the dense product is settled here by key (`top_n_exact`) and `tie` is False;
    without, `tie` says the caller must redo the batch with `top_n_exact`. Traceable."""
    D = set_ids_DxM.shape[0]
    n = min(n, D)

    def dense():
        simul = simul_scores(rep_BxV, set_ids_DxM, chunk)
        rows, scores, tie = top_n_fast(simul, n)
        if exact:
            rows, scores = jax.lax.cond(tie, lambda: top_n_exact(simul, keys_D, n), lambda: (rows, scores))
            tie = jnp.zeros((), bool)
        return rows, scores, tie

    if postings is None or postings[0].shape[0] == 0 or budgets.candidates < n:
        # no index, an empty one (every set docid padding) or budgets below n postings: the dense product
        return dense()
    B = rep_BxV.shape[0]
    rungs = tuple(b for b in ladder(budgets) if b.candidates >= n)

    def none():
        return jnp.zeros((B, n), jnp.int32), jnp.zeros((B, n), jnp.float32), jnp.zeros((), bool)

    def through(b):
        return lambda: inverted_plan(rep_BxV, set_ids_DxM, postings, n, b)[:3]

    rows, scores, ok = jax.lax.switch(rung_of(rep_BxV, postings[1], rungs), [through(b) for b in rungs] + [none])
    return jax.lax.cond(ok, lambda: (rows, scores, jnp.zeros((), bool)), dense)
