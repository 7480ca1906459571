"""An independent oracle for PAG's set-based planner (paper §2): plain numpy, written from the specification only.

s_simul(q, d) = Σ_j rep[q, set_ids[d, j]] over the non-padding j, summed in float32 in j order
((x_0 + x_1) + x_2) + …; the planning set of q = the first n documents sorted by (s_simul descending, document
key descending). `plan_from_rep` must return exactly that set, with the scores bit for bit, on the dense path
(any chunk), on the inverted index, and on the inverted planner's dense fallback when the budgets are too small.
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.methods.pag.model_planner import Postings, budgets_for, plan_from_rep
from tests.conftest import sweep


# ----------------------------------------------------------------------------------------------------------
# the oracle
# ----------------------------------------------------------------------------------------------------------


def oracle_scores(rep_BxV, set_ids_DxM):
    """s_simul [B, D] in float32, accumulated one set position at a time in j order (padding adds 0.0)."""
    rep = np.asarray(rep_BxV, np.float32)
    ids = np.asarray(set_ids_DxM)
    acc = np.zeros((rep.shape[0], ids.shape[0]), np.float32)
    for j in range(ids.shape[1]):
        col = ids[:, j]
        x = np.where(col[None, :] >= 0, rep[:, np.maximum(col, 0)], np.float32(0.0)).astype(np.float32)
        acc = (acc + x).astype(np.float32)  # float32 + float32: one rounding per position, as specified
    assert acc.dtype == np.float32
    return acc


def oracle_plan(rep_BxV, set_ids_DxM, keys_D, n):
    """(planning sets [B, n] in rank order, s_simul [B, D]): sort by (score desc, key desc), take the first n."""
    s = oracle_scores(rep_BxV, set_ids_DxM)
    keys = np.asarray(keys_D).astype(np.int64)
    rows = np.stack([np.lexsort((-keys, -s[b].astype(np.float64)))[:n] for b in range(s.shape[0])])
    return rows, s


def check_against_oracle(out, rep, set_ids, keys, n, exact):
    """exact=True: the rows are the planning set and the scores are s_simul bit for bit, tie is False.
    exact=False: when tie is False the rows are still the planning set (scores are not specified then)."""
    rows, scores, tie = jax.device_get(out)
    rows, scores = np.asarray(rows), np.asarray(scores)
    B = rep.shape[0]
    assert rows.shape == (B, n) and scores.shape == (B, n)
    assert rows.dtype == np.int32 and scores.dtype == np.float32
    want, s = oracle_plan(rep, set_ids, keys, n)
    tie = bool(np.asarray(tie))
    if exact:
        assert not tie
    if exact or not tie:
        for b in range(B):
            got_b, want_b = sorted(rows[b].tolist()), sorted(want[b].tolist())
            assert got_b == want_b, (
                f"query {b}, n={n}: planned rows differ; missing {sorted(set(want_b) - set(got_b))} "
                f"(oracle scores {s[b][sorted(set(want_b) - set(got_b))].tolist()}, keys "
                f"{np.asarray(keys)[sorted(set(want_b) - set(got_b))].tolist()}), extra "
                f"{sorted(set(got_b) - set(want_b))} (oracle scores "
                f"{s[b][[r for r in sorted(set(got_b) - set(want_b)) if 0 <= r < len(keys)]].tolist()})")
    if exact:
        # scores equal bit for bit: no tolerance, the j-order float32 sum is the specification
        expect = np.take_along_axis(s, rows, axis=1)
        assert np.array_equal(scores.view(np.uint32), expect.view(np.uint32)), (
            np.argwhere(scores.view(np.uint32) != expect.view(np.uint32))[:5].tolist())
    return tie


def _postings(set_ids, vocab, keys):
    """The inverted index's device arrays."""
    return Postings(np.asarray(set_ids, np.int32), vocab, np.asarray(keys, np.int32)).device()


def _plan(rep, set_ids, keys, n, chunk, postings=None, budgets=None, exact=False):
    return plan_from_rep(jnp.asarray(rep, jnp.float32), jnp.asarray(set_ids, jnp.int32), jnp.asarray(keys, jnp.int32),
                         n, chunk, postings=postings, budgets=budgets, exact=exact)


# ----------------------------------------------------------------------------------------------------------
# the oracle on its own (so that a failure below is the planner's, not the oracle's)
# ----------------------------------------------------------------------------------------------------------


def test_the_oracle_sums_in_j_order():
    big = np.float32(2.0 ** 24)  # 2^24 + 1 is not a float32: it rounds (to even) back down to 2^24
    rep = np.array([[big, 1.0, 1.0]], np.float32)
    ids = np.array([[0, 1, 2], [1, 2, 0], [1, 0, 2], [0, -1, 1]], np.int32)
    s = oracle_scores(rep, ids)
    # (2^24+1)+1 = 2^24; (1+1)+2^24 = 2^24+2 exactly; (1+2^24)+1 = 2^24; (2^24+0)+1 = 2^24
    assert s[0].tolist() == [2.0 ** 24, 2.0 ** 24 + 2, 2.0 ** 24, 2.0 ** 24]
    rows, _ = oracle_plan(rep, ids, np.array([5, 1, 9, 7]), 3)
    assert rows[0].tolist() == [1, 2, 3]  # 2^24+2 first, then of the three tied at 2^24 keys 9 and 7


# ----------------------------------------------------------------------------------------------------------
# 1. hand-worked
# ----------------------------------------------------------------------------------------------------------

# V = 6, D = 5, m = 3.
#   doc  set_ids        key
#   d0   [1, 2, -1]     100
#   d1   [4, -1, -1]      7
#   d2   [3, 3, 1]      500     (id 3 listed twice: it counts twice)
#   d3   [2, 1, 5]      300
#   d4   [0, 5, -1]     900
HAND_IDS = np.array([[1, 2, -1], [4, -1, -1], [3, 3, 1], [2, 1, 5], [0, 5, -1]], np.int32)
HAND_KEYS = np.array([100, 7, 500, 300, 900], np.int32)
HAND_REP = np.array([
    # q0: d0 = 1+2 = 3, d1 = 4, d2 = .5+.5+1 = 2, d3 = 2+1+0 = 3, d4 = 0.
    #     n=2: d1 (4), then d0 and d3 tie at 3 -> the larger key 300 = d3 (the LATER row).  -> {1, 3}
    [0.0, 1.0, 2.0, 0.5, 4.0, 0.0],
    # q1: d0 = 0, d1 = 0, d2 = 1+1+0 = 2, d3 = 0+0+2 = 2, d4 = 0+2 = 2: a three-way tie for two places
    #     -> keys 900 (d4) and 500 (d2); the smallest rows would be d2,d3, the largest d3,d4.  -> {2, 4}
    [0.0, 0.0, 0.0, 1.0, 0.0, 2.0],
    # q2: all zero: every document scores 0 -> the two largest keys, d4 (900) and d2 (500).  -> {2, 4}
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    # q3: only id 3: d2 = 3+3+0 = 6 (the repeated id counts twice), others 0 -> d2, then the largest key
    #     among the zeros, d4 (900).  -> {2, 4} with scores 6 and 0
    [0.0, 0.0, 0.0, 3.0, 0.0, 0.0],
], np.float32)
HAND_N2 = [{1, 3}, {2, 4}, {2, 4}, {2, 4}]
HAND_N2_SCORES = [{1: 4.0, 3: 3.0}, {2: 2.0, 4: 2.0}, {2: 0.0, 4: 0.0}, {2: 6.0, 4: 0.0}]


@pytest.mark.parametrize("path", ["dense", "dense_chunk2", "inverted", "fallback"])
def test_hand_worked_planning_sets(path):
    chunk = 2 if path == "dense_chunk2" else 64
    postings = budgets = None
    if path in ("inverted", "fallback"):
        postings = _postings(HAND_IDS, 6, HAND_KEYS)
        budgets = budgets_for(15 if path == "inverted" else 1, 6)
    rows, scores, tie = jax.device_get(_plan(HAND_REP, HAND_IDS, HAND_KEYS, 2, chunk, postings, budgets, exact=True))
    assert not bool(tie)
    for b in range(4):
        got = dict(zip(np.asarray(rows[b]).tolist(), np.asarray(scores[b]).tolist()))
        assert set(got) == HAND_N2[b], (b, got)
        assert got == HAND_N2_SCORES[b], (b, got)  # small dyadic values: exact in float32
    # the oracle agrees with the hand-worked answers
    want, _ = oracle_plan(HAND_REP, HAND_IDS, HAND_KEYS, 2)
    assert [set(r.tolist()) for r in want] == HAND_N2


def test_hand_worked_larger_n_and_the_order_of_the_sum():
    # q0 with n=4: d1 (4), d3 (3, key 300), d0 (3, key 100), d2 (2); d4 (0) is out.
    rows, scores, _ = jax.device_get(_plan(HAND_REP[:1], HAND_IDS, HAND_KEYS, 4, 64, exact=True))
    assert dict(zip(rows[0].tolist(), scores[0].tolist())) == {1: 4.0, 3: 3.0, 0: 3.0, 2: 2.0}
    # the float32 sum goes in j order: with rep = [2^24, 1, 1] the documents below score
    #   [0,1,2]: (2^24+1)+1 = 2^24      [1,2,0]: (1+1)+2^24 = 2^24+2      [1,0,2]: (1+2^24)+1 = 2^24
    #   [0,-1,1]: (2^24+0)+1 = 2^24     [2,-1,-1]: 1
    # n=3: 2^24+2 (row 1), then the largest keys among the three tied at 2^24: keys 9 (row 2) and 7 (row 3)
    ids = np.array([[0, 1, 2], [1, 2, 0], [1, 0, 2], [0, -1, 1], [2, -1, -1]], np.int32)
    keys = np.array([5, 1, 9, 7, 1000], np.int32)
    rep = np.array([[2.0 ** 24, 1.0, 1.0]], np.float32)
    expect = {1: 2.0 ** 24 + 2, 2: 2.0 ** 24, 3: 2.0 ** 24}
    for postings, budgets in ((None, None), (_postings(ids, 3, keys), budgets_for(13, 3))):
        rows, scores, tie = jax.device_get(_plan(rep, ids, keys, 3, 64, postings, budgets, exact=True))
        assert not bool(tie)
        assert dict(zip(rows[0].tolist(), scores[0].tolist())) == expect


# ----------------------------------------------------------------------------------------------------------
# 2-4. random corpora against the oracle
# ----------------------------------------------------------------------------------------------------------

B, V, D, M = 8, 384, 3000, 6  # one shape throughout: JIT compiles once per (n, chunk, path, exact)


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(20240611)
    ids = rng.integers(0, V, size=(D, M)).astype(np.int32)  # drawn with replacement: repeats happen by chance
    length = rng.integers(0, M + 1, size=D)  # 0..M real ids, the rest padding
    ids[np.arange(M)[None, :] >= length[:, None]] = -1
    ids[::97, 2] = -1  # some padding in the middle of a set docid too (it adds 0.0 at its position)
    ids[5] = [7, 7, 7, 11, -1, -1]  # explicit repeats: id 7 counts three times
    ids[6] = [7, 11, -1, -1, -1, -1]
    ids[7] = [11, 7, 7, -1, -1, -1]
    ids[8] = ids[9] = [3, 4, 5, 6, -1, -1]  # identical set docids: they tie on every query
    ids[10] = -1  # a document with no real id at all: it scores 0 everywhere
    keys = rng.choice(2 ** 30, size=D, replace=False).astype(np.int32)  # distinct, unrelated to the row
    assert len(np.unique(keys)) == D
    return ids, keys, _postings(ids, V, keys)


def _sparse_queries(rng, values):
    """B sparse queries, the number of positive weights per query from 0 (all zero) to 40."""
    rep = np.zeros((B, V), np.float32)
    for b, k in enumerate([0, 1, 2, 5, 10, 20, 40, 3]):
        cols = rng.choice(V, size=k, replace=False)
        rep[b, cols] = values(rng, k)
    rep[7] = 0.0
    rep[7, [3, 7, 11]] = [1.0, 2.0, 0.5]  # touches the hand-made rows 5..9 (repeats, identical set docids)
    return rep


def _discrete(rng, k):
    return rng.choice(np.array([0.5, 1.0, 2.0], np.float32), size=k)  # exact ties are common


def _continuous(rng, k):
    return (rng.random(k) * 10.0 ** rng.uniform(-3, 3, size=k)).astype(np.float32)  # order of the sum matters


QUERIES = {"discrete": (1, _discrete), "continuous": (2, _continuous)}
PATHS = {  # name -> (chunk, postings?, per-query postings budget or None)
    "dense_64": (64, False, None),
    "dense_1000": (1000, False, None),  # D is not a multiple of the chunk
    "dense_8192": (8192, False, None),  # one chunk larger than the corpus
    "inverted": (64, True, D * M),  # every query fits
    "fallback": (64, True, 8),  # no batch fits: the dense product
}


# 700 > the positive documents of the sparser queries: zeros fill by key; the inverted path at 1 and 700 in the slow
# tier (each compiles its own planner)
@pytest.mark.parametrize("path,n", sweep("path,n", (list(PATHS), (1, 25, 700)),
                                         [(p, n) for p in PATHS for n in (1, 25, 700)
                                          if (p, n) not in (("inverted", 1), ("inverted", 700))]))
def test_exact_plans_match_the_oracle(corpus, path, n):
    ids, keys, postings = corpus
    chunk, use_postings, budget = PATHS[path]
    for name, (seed, values) in QUERIES.items():
        rep = _sparse_queries(np.random.default_rng(seed), values)
        out = _plan(rep, ids, keys, n, chunk, postings if use_postings else None,
                    budgets_for(budget, V) if use_postings else None, exact=True)
        check_against_oracle(out, rep, ids, keys, n, exact=True)


def test_the_random_cases_exercise_what_they_claim(corpus):
    """Guards on the fixture: ties across the n-th place, zero fill, repeats and identical set docids occur."""
    ids, keys, _ = corpus
    rep = _sparse_queries(np.random.default_rng(1), _discrete)
    s = oracle_scores(rep, ids)
    positive = (s > 0).sum(1)
    assert positive.min() < 25 and (positive < 700).sum() >= 4  # n=25 and n=700 reach into the zero scores
    assert positive.max() > 700  # and some query has more positive documents than the largest n
    crossings = 0
    for n in (25, 700):
        rows, _ = oracle_plan(rep, ids, keys, n)
        for b in range(B):
            last = s[b, rows[b, -1]]
            crossings += int((s[b] == last).sum() > (s[b, rows[b]] == last).sum())  # tied documents left out
    assert crossings >= 4
    # query 7 has weights 1 (id 3), 2 (id 7), 0.5 (id 11) and nothing else: id 7 counted three times in row 5
    assert s[7, 5] == np.float32(2.0 + 2.0 + 2.0 + 0.5) and s[7, 6] == 2.5 and s[7, 7] == 4.5
    assert s[7, 8] == s[7, 9] == np.float32(1.0)


def _untied_queries(ids, keys, n):
    """B continuous queries chosen (by the oracle) to have no tie at the n-th place, so that a fast plan has the
    chance to say tie=False and have its rows checked (the batches above all hold queries tied at the n-th place:
    the all-zero query, and documents whose set docids coincide)."""
    rng, picked = np.random.default_rng(3), []
    while len(picked) < B:
        rep = np.zeros((1, V), np.float32)
        k = int(rng.integers(8, 41))
        rep[0, rng.choice(V, size=k, replace=False)] = _continuous(rng, k)
        s = np.sort(oracle_scores(rep, ids)[0])[::-1]
        if s[n - 1] != s[n] and s[n] > 0:
            picked.append(rep[0])
    return np.stack(picked)


def test_the_inverted_and_fallback_cases_take_the_paths_they_claim(corpus):
    """A guard on this file's coverage, not on the specification: handed the index of a DIFFERENT corpus (an
    inconsistent input on purpose), the generous budgets must change the plan (the inverted index was read) and
    the tiny ones must not (the batch did not fit: the dense product over the real set docids)."""
    ids, keys, postings = corpus
    other = ids.copy()
    other[:, 0] = np.where(other[:, 0] >= 0, (other[:, 0] + 1) % V, -1)
    wrong = _postings(other, V, keys)
    rep = _sparse_queries(np.random.default_rng(1), _discrete)
    n = 25
    for path, read in (("inverted", True), ("fallback", False)):
        budgets = budgets_for(PATHS[path][2], V)
        right = np.sort(np.asarray(_plan(rep, ids, keys, n, 64, postings, budgets, exact=True)[0]), axis=1)
        misled = np.sort(np.asarray(_plan(rep, ids, keys, n, 64, wrong, budgets, exact=True)[0]), axis=1)
        assert (not np.array_equal(right, misled)) == read, path


@pytest.mark.parametrize("path", ["dense_64", "inverted", "fallback"])
def test_fast_plans_are_right_whenever_they_claim_no_tie(corpus, path):
    ids, keys, postings = corpus
    chunk, use_postings, budget = PATHS[path]
    n = 25
    batches = [_sparse_queries(np.random.default_rng(seed), values) for seed, values in QUERIES.values()]
    batches.append(_untied_queries(ids, keys, n))
    for rep in batches:
        out = _plan(rep, ids, keys, n, chunk, postings if use_postings else None,
                    budgets_for(budget, V) if use_postings else None, exact=False)
        check_against_oracle(out, rep, ids, keys, n, exact=False)  # rows checked whenever tie is False
    # (tie=True is always allowed, so nothing asserts tie=False here; when this was written the untied batch came
    # back with tie=False on all three paths, the others with tie=True on the dense paths, so the rows were checked)


def test_the_chunk_and_the_path_do_not_change_the_result(corpus):
    """Same (rows as sets, scores per row) from every path on one batch: a direct comparison, oracle aside."""
    ids, keys, postings = corpus
    rep = _sparse_queries(np.random.default_rng(2), _continuous)
    n = 25
    results = []
    for path, (chunk, use_postings, budget) in PATHS.items():
        rows, scores, _ = jax.device_get(_plan(rep, ids, keys, n, chunk, postings if use_postings else None,
                                               budgets_for(budget, V) if use_postings else None, exact=True))
        results.append([sorted(zip(r.tolist(), np.asarray(s).view(np.uint32).tolist())) for r, s in zip(rows, scores)])
    assert all(r == results[0] for r in results[1:])
