"""SEAL's intersective scoring: a hand computation on three documents, the candidate rule, and the vectorised
ranking against the plain per-document greedy on random inputs."""

import math

import numpy as np

from gr_jax.methods.seal.ranker import Key, cover, document_score, occurrences, rank_documents, weight

DOCS = {0: [7, 8, 5, 6, 7], 1: [6, 7, 8, 6, 7], 2: [9]}


def _documents(rows):
    width = max(len(DOCS[int(r)]) for r in rows)
    return np.array([DOCS[int(r)] + [-1] * (width - len(DOCS[int(r)])) for r in rows])


def _found(key):
    hits = [(r, s) for r, d in DOCS.items() for s in range(len(d) - len(key) + 1) if tuple(d[s:s + len(key)]) == key]
    return np.array([r for r, _ in hits], np.int64), np.array([s for _, s in hits], np.int64)


KEYS = [Key((6, 7), math.log(0.5), 3), Key((7, 8), math.log(0.2), 2), Key((9,), math.log(0.01), 1)]
POSITIONS = 995  # + smoothing 5 = 1000


def test_three_documents_by_hand():
    # P(n) = (F + 5) / 1000; w = log(Pq (1 - P) / (P (1 - Pq)))², written out
    w1 = math.log(0.5 * 0.992 / (0.008 * 0.5)) ** 2  # (6, 7): F 3
    w2 = math.log(0.2 * 0.993 / (0.007 * 0.8)) ** 2  # (7, 8): F 2
    w3 = math.log(0.01 * 0.994 / (0.006 * 0.99)) ** 2  # (9,): F 1
    for key, want in zip(KEYS, (w1, w2, w3)):
        # log-odds of magnitude ~5 squared; the 1e-10 SEAL subtracts from log P(n|q) moves w by ~1e-9
        assert abs(weight(key.score, key.count, POSITIONS) - want) <= 1e-8 * want
    # d0 [7 8 5 6 7]: (6,7) at 3 → w1; (7,8) at 0 is free, its type 7 already taken → w2 (1 - .8 + .8 / 2)
    # d1 [6 7 8 6 7]: (6,7) at 0 → w1, at 3 marks only; (7,8) at 1 overlaps the first (6,7): nothing
    # d2 [9]: w3
    want = [(0, w1 + 0.6 * w2), (1, w1), (2, w3)]
    got = rank_documents(KEYS, [_found(k.tokens) for k in KEYS], _documents, POSITIONS)
    assert [r for r, _ in got] == [r for r, _ in want]
    for (_, a), (_, b) in zip(got, want):
        assert abs(a - b) <= 1e-9 * b  # float64 sums of three terms
    # keys occurring more than max_hits times make no candidates but still score the others
    assert [r for r, _ in rank_documents(KEYS, [None, *(_found(k.tokens) for k in KEYS[1:])], _documents,
                                         POSITIONS, max_hits=2)] == [0, 1, 2]
    only = rank_documents(KEYS, [None, None, _found((9,))], _documents, POSITIONS, max_hits=1)
    assert [r for r, _ in only] == [2]


def test_keys_that_do_not_help_weigh_nothing():
    assert weight(math.log(0.001), 50, POSITIONS) == 0.0  # P(n|q) below P(n): clipped
    assert weight(-math.inf, 3, POSITIONS) == 0.0 and weight(-1.0, 0, POSITIONS) == 0.0
    assert cover((1, 1, 2), {1}, 0.8) == 1 - 0.8 + 0.8 * 1 / 2  # types, not tokens


def test_occurrences_overlap():
    assert occurrences([1, 1, 1, 2], [1, 1]).tolist() == [0, 1]
    assert occurrences([1], [1, 1]).tolist() == []


def test_vectorised_ranking_equals_the_plain_greedy():
    """Random documents over 4 tokens (many overlaps, self-overlapping keys such as (1, 1)), random scores."""
    rng = np.random.default_rng(0)
    for trial in range(60):
        docs = {int(r): rng.integers(1, 5, size=rng.integers(1, 12)).tolist()
                for r in rng.choice(50, size=rng.integers(1, 8), replace=False)}
        grams = sorted({tuple(d[s:s + n]) for d in docs.values() for n in (1, 2, 3) for s in range(len(d) - n + 1)})
        pick = rng.choice(len(grams), size=min(len(grams), int(rng.integers(1, 9))), replace=False)
        keys, found = [], []
        for g in (grams[i] for i in sorted(pick)):
            hits = [(r, s) for r, d in docs.items() for s in occurrences(d, g).tolist()]
            keys.append(Key(g, float(np.log(rng.uniform(0.05, 1.0))), len(hits)))
            found.append((np.array([r for r, _ in hits], np.int64), np.array([s for _, s in hits], np.int64)))
        if trial % 3 == 0:  # exact ties between keys: the order falls back to the tokens
            keys = [Key(k.tokens, keys[0].score, k.count) for k in keys]
        positions = sum(map(len, docs.values())) + len(docs)

        def documents(rows):
            width = max(len(docs[int(r)]) for r in rows)
            return np.array([docs[int(r)] + [-1] * (width - len(docs[int(r)])) for r in rows])

        max_hits = int(rng.integers(1, 6))
        got = rank_documents(keys, [f if k.count <= max_hits else None for k, f in zip(keys, found)], documents,
                             positions, max_hits=max_hits)
        w = [weight(k.score, k.count, positions) for k in keys]
        candidates = {int(r) for k, f, wi in zip(keys, found, w) if wi > 0 and k.count <= max_hits for r in f[0]}
        want, want_keys = [], {}
        for r in sorted(candidates):
            hits = {i: occurrences(docs[r], k.tokens).tolist() for i, k in enumerate(keys)}
            s, taken = document_score(keys, w, {i: p for i, p in hits.items() if p}, 0.8, matched=True)
            if s > 0:
                want.append((r, s))
                want_keys[r] = taken
        want.sort(key=lambda x: (-x[1], x[0]))
        assert [r for r, _ in got] == [r for r, _ in want]
        # the same float64 terms summed in the same order per document
        assert np.allclose([s for _, s in got], [s for _, s in want], rtol=1e-12, atol=0)
        # LTRGR's stored keys: the keys that counted for each document, in the greedy order
        with_keys = rank_documents(keys, [f if k.count <= max_hits else None for k, f in zip(keys, found)],
                                   documents, positions, max_hits=max_hits, matched=True)
        assert [(r, s) for r, s, _ in with_keys] == got
        assert {r: taken for r, _, taken in with_keys} == want_keys
