"""`rankers.first_occurrence_ranked` (the default ranker traced on the device, for t5x's infer step) against the
host ranker it stands in for, on a hand-worked case and on random beams with shared documents, equal scores and
empty slots: the same documents, scores and trec order (score descending, ties by document id descending)."""

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.decoding import rankers


def host(docs, valid, scores, names):
    """The oracle: the host ranker's flat output, ordered per query as a run file is read (`data.trec.ranked`)."""
    q, d, s = rankers.first_occurrence_arrays(docs, valid, scores)
    out = []
    for b in range(docs.shape[0]):
        pairs = sorted(((float(x), names[int(r)]) for r, x in zip(d[q == b], s[q == b])), reverse=True)
        out.append([(n, x) for x, n in pairs])
    return out


def device(docs, valid, scores, names):
    keys = np.empty(len(names), np.int32)
    keys[np.argsort(np.asarray(names, dtype=object), kind="stable")] = np.arange(len(names))
    rows, out = jax.jit(rankers.first_occurrence_ranked)(jnp.asarray(docs), jnp.asarray(valid),
                                                         jnp.asarray(scores, jnp.float32), jnp.asarray(keys))
    return [[(names[int(r)], float(x)) for r, x in zip(rr, xx) if r >= 0]
            for rr, xx in zip(np.asarray(rows), np.asarray(out))]


def test_by_hand():
    """Beam 0 reaches rows 2 ("a") and 0 ("c"), a shared docid: tied, by document id descending c before a; beam 1
    row 2 again (kept at beam 0's score) and row 1 ("b"), beam 2 row 3 ("d") at beam 1's score: d before b."""
    names = ["c", "b", "a", "d"]
    docs = np.array([[[2, 0], [2, 1], [3, -1]]])
    valid = docs >= 0
    scores = np.array([[-1.0, -2.0, -2.0]])
    expected = [[("c", -1.0), ("a", -1.0), ("d", -2.0), ("b", -2.0)]]
    assert device(docs, valid, scores, names) == expected == host(docs, valid, scores, names)


def test_random_beams_agree_with_the_host_ranker():
    rng = np.random.default_rng(0)
    for _ in range(20):
        B, N, P, D = 3, int(rng.integers(1, 8)), int(rng.integers(1, 4)), int(rng.integers(2, 12))
        names = [f"doc{i:02d}" for i in rng.permutation(D)]
        docs = rng.integers(0, D, (B, N, P))
        valid = rng.random((B, N, P)) < 0.8
        docs = np.where(valid, docs, -1)
        scores = -np.sort(rng.integers(0, 4, (B, N)).astype(np.float64), axis=1)  # best first, many ties
        assert device(docs, valid, scores, names) == host(docs, valid, scores, names)
