"""SEAL's scoring on the device against the host scorer (`rank_documents`, the oracle: numpy, per key, float64) and
against a hand computation: the same documents, scores within float32 rounding."""

import math

import chex
import numpy as np
import pytest

from gr_jax.methods.seal.device_ranker import DeviceScorer
from gr_jax.methods.seal.ranker import Key, occurrences, rank_documents, weight

# float32 sums of at most a few dozen terms of magnitude ≤ ~1e3 (squared log-odds): rounding stays near 1e-6
# relative; 1e-5 is the acceptance's bound, and a wrong greedy or cover moves a score by a whole term (≥ 1e-2)
RTOL = 1e-5


def _table(docs: dict):
    rows = sorted(docs)
    width = max(len(docs[r]) for r in rows)
    table = np.array([docs[r] + [-1] * (width - len(docs[r])) for r in rows], np.int32)
    where = np.full(max(rows) + 1, -1, np.int64)
    where[rows] = np.arange(len(rows))
    return where, table


def _found(docs: dict, key):
    hits = [(r, s) for r in sorted(docs) for s in occurrences(docs[r], key).tolist()]
    return np.array([r for r, _ in hits], np.int64), np.array([s for _, s in hits], np.int64)


def _same(got, want):
    """Same documents, scores within RTOL; the order agrees wherever two scores differ by more than RTOL."""
    assert [r for r, *_ in got] == [r for r, *_ in want] or _reorders_only_near_ties(got, want)
    g, w = {r: v for r, v, *_ in got}, {r: v for r, v, *_ in want}
    assert set(g) == set(w)
    for r in w:
        assert abs(g[r] - w[r]) <= RTOL * abs(w[r]), (r, g[r], w[r])


def _reorders_only_near_ties(got, want) -> bool:
    w = {r: v for r, v, *_ in want}
    scores = [w[r] for r, *_ in got if r in w]
    return all(a >= b - RTOL * abs(b) for a, b in zip(scores, scores[1:]))


def test_three_documents_by_hand():
    docs = {0: [7, 8, 5, 6, 7], 1: [6, 7, 8, 6, 7], 2: [9]}
    keys = [Key((6, 7), math.log(0.5), 3), Key((7, 8), math.log(0.2), 2), Key((9,), math.log(0.01), 1)]
    positions = 995  # + smoothing 5 = 1000
    w1 = math.log(0.5 * 0.992 / (0.008 * 0.5)) ** 2
    w2 = math.log(0.2 * 0.993 / (0.007 * 0.8)) ** 2
    w3 = math.log(0.01 * 0.994 / (0.006 * 0.99)) ** 2
    # d0: (6,7) at 3 → w1; (7,8) at 0 free, its type 7 taken → w2 (1 - .8 + .8 / 2); d1: (7,8) at 1 overlaps
    # the (6,7) at 0 → w1 only; d2: w3
    want = [(0, w1 + 0.6 * w2), (1, w1), (2, w3)]
    got = DeviceScorer(*_table(docs)).rank([(keys, [_found(docs, k.tokens) for k in keys], None)], positions)[0]
    _same(got, want)
    # a self-overlapping key: (1, 1) in [1 1 1 1 1] is taken at 0 and 2 (left first), (1,) then only at 4
    docs = {0: [1, 1, 1, 1, 1], 1: [2]}
    keys = [Key((1, 1), 0.0, 4, weight=3.0), Key((1,), 0.0, 5, weight=2.0), Key((2,), 0.0, 1, weight=1.0)]
    got = DeviceScorer(*_table(docs)).rank([(keys, [_found(docs, k.tokens) for k in keys], None)], 100,
                                           matched=True)[0]
    # d0: (1,1) → 3; (1,) at 4 is free but its one type is taken → 2 · (1 − .8) = 0.4
    assert [(r, k) for r, _, k in got] == [(0, [0, 1]), (1, [2])]
    assert abs(got[0][1] - 3.4) <= RTOL * 3.4 and abs(got[1][1] - 1.0) <= RTOL


def _random_query(rng, docs, max_hits, with_weights: bool, tied: bool):
    grams = sorted({tuple(d[s:s + n]) for d in docs.values() for n in (1, 2, 3, 5, 40)
                    for s in range(len(d) - n + 1)})
    pick = rng.choice(len(grams), size=min(len(grams), int(rng.integers(1, 14))), replace=False)
    keys, found = [], []
    for g in (grams[i] for i in sorted(pick)):
        f = _found(docs, g)
        if with_weights and rng.random() < 0.2:  # a best unigram: its weight given
            keys.append(Key(g, 0.0, len(f[0]), weight=float(rng.uniform(0.1, 5.0))))
        else:
            keys.append(Key(g, float(np.log(rng.uniform(0.05, 1.0))), len(f[0])))
        found.append(f if len(f[0]) <= max_hits else None)
    if tied and rng.random() < 0.3:  # exact ties between keys: the order falls back to the tokens
        keys = [Key(k.tokens, keys[0].score, k.count) for k in keys]
    return keys, found


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_device_scoring_equals_the_host_scorer(seed):
    """Random corpora over 4 tokens (overlaps, self-overlapping keys), rows up to 90 tokens (three words of bits) with
    a repeated 45-token stretch (keys of 40 tokens: shifts past one word), keys occurring more than max_hits times,
    SEAL's first pass (fully_score below the candidates), the unigram bonus, and a batch of queries of different
    sizes in one call."""
    rng = np.random.default_rng(seed)
    for trial in range(6):
        stretch = rng.integers(1, 5, size=45).tolist()
        docs = {}
        for r in rng.choice(60, size=int(rng.integers(2, 12)), replace=False).tolist():
            d = rng.integers(1, 5, size=int(rng.integers(1, 40))).tolist()
            docs[r] = (d + stretch + rng.integers(1, 5, size=5).tolist()) if rng.random() < 0.4 else d
        where, table = _table(docs)
        scorer = DeviceScorer(where, table)
        positions = sum(map(len, docs.values())) + len(docs)
        max_hits = int(rng.integers(1, 8))
        fully = None if trial % 2 else int(rng.integers(1, 4))
        bonus = trial % 3 == 0
        queries = []
        for _ in range(int(rng.integers(1, 6))):
            # keys of equal weight make first-pass sums that are equal in exact arithmetic but not in floating
            # point (w(1 + .2 + .2) against w(1 + .4)): which one the cut keeps is then the rounding's choice,
            # float64's on the host, float32's on the device; so equal weights only where every candidate goes on
            keys, found = _random_query(rng, docs, max_hits, with_weights=bonus, tied=fully is None)
            types = np.where(rng.random(6) < 0.6, rng.uniform(0, 4, size=6), 0.0) if bonus else None
            queries.append((keys, found, types))
        for matched in (False, True):
            got = scorer.rank(queries, positions, max_hits=max_hits, matched=matched, fully_score=fully)
            for (keys, found, types), g in zip(queries, got):
                want = rank_documents(keys, found, lambda rows: table[where[rows]], positions, max_hits=max_hits,
                                      matched=matched, types=types, fully_score=fully)
                _same(g, want)
                if matched:  # the keys that counted for each document, in the greedy order (LTRGR's rank data)
                    assert {r: k for r, _, k in g} == {r: k for r, _, k in want}


def test_a_candidate_outside_the_table_is_refused():
    docs = {0: [1, 2], 1: [2, 3]}
    where, table = _table(docs)
    keys = [Key((2,), math.log(0.5), 2)]
    found = [(np.array([0, 5]), np.array([1, 0]))]  # row 5: no identifier
    with pytest.raises((ValueError, IndexError)):
        DeviceScorer(where, table).rank([(keys, found, None)], 10)
    with pytest.raises(ValueError, match="occurs 2 times but 1"):
        DeviceScorer(where, table).rank([(keys, [(np.array([0]), np.array([1]))], None)], 10)


def test_weights_are_the_host_formula():
    # the device takes each key's weight from ranker.weight (float64 on the host): a key with w = 0 scores nothing
    docs = {0: [1, 2, 3]}
    keys = [Key((1, 2), math.log(1e-6), 1), Key((3,), math.log(0.9), 1)]
    assert weight(keys[0].score, 1, 10) == 0.0
    got = DeviceScorer(*_table(docs)).rank([(keys, [_found(docs, k.tokens) for k in keys], None)], 10,
                                           matched=True)[0]
    assert [(r, k) for r, _, k in got] == [(0, [1])]


def test_runs_of_one_token():
    """Self-overlapping keys in long runs ([1 1 1 1 1 2 2 1 …]): which of a key's overlapping matches the greedy
    keeps (left first) decides which positions later keys find free."""
    rng = np.random.default_rng(7)
    for trial in range(12):
        docs = {r: np.repeat(rng.integers(1, 3, size=6), rng.integers(1, 9, size=6)).tolist() for r in range(5)}
        where, table = _table(docs)
        positions = sum(map(len, docs.values())) + len(docs)
        grams = sorted({tuple(d[s:s + n]) for d in docs.values() for n in (1, 2, 3, 4) for s in range(len(d) - n + 1)})
        queries = []
        for _ in range(3):
            pick = rng.choice(len(grams), size=min(len(grams), 6), replace=False)
            keys = [Key(grams[i], 0.0, len(_found(docs, grams[i])[0]), weight=float(rng.uniform(0.5, 5.0)))
                    for i in sorted(pick)]
            queries.append((keys, [_found(docs, k.tokens) for k in keys], None))
        got = DeviceScorer(where, table).rank(queries, positions, max_hits=100, matched=True)
        for (keys, found, _), g in zip(queries, got):
            want = rank_documents(keys, found, lambda rows: table[where[rows]], positions, max_hits=100, matched=True)
            _same(g, want)
            assert {r: k for r, _, k in g} == {r: k for r, _, k in want}


class TestDeviceScorerVariants(chex.TestCase):
    """SEAL's device scorer's compiled body (`_score_batch`), jitted and not: the hand-worked three documents and a
    random batch against the host scorer, through the same `DeviceScorer.rank`."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_same_scores_jitted_or_not(self):
        from unittest import mock

        from gr_jax.methods.seal import device_ranker

        body = self.variant(device_ranker._score_batch.__wrapped__,
                            static_argnames=("longest", "keep", "num_types", "beta", "bonus"))
        docs = {0: [7, 8, 5, 6, 7], 1: [6, 7, 8, 6, 7], 2: [9], 4: [6, 7, 9, 9]}
        keys = [Key(g, lp, len(_found(docs, g)[0])) for g, lp in (((6, 7), math.log(0.5)), ((7, 8), math.log(0.2)),
                                                                 ((9,), math.log(0.01)))]
        queries = [(keys, [_found(docs, k.tokens) for k in keys], None),
                   (keys[1:], [_found(docs, k.tokens) for k in keys[1:]], None)]
        with mock.patch.object(device_ranker, "_score_batch", body):
            got = DeviceScorer(*_table(docs)).rank(queries, 995)
        where, table = _table(docs)
        for (k, found, _), g in zip(queries, got):
            _same(g, rank_documents(k, found, lambda rows: table[where[rows]], 995))
