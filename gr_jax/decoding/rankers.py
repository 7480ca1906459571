"""From beam search output (docids in beam order) to document scores.

A beam's docid leads to one document, to several (colliding docids, or a multi-docid scheme where documents
share a chunk code / n-gram), and one document may be reached by several beams. The documents of every beam
come as arrays from the device (`index.device.leaf_documents`): `docs [B, N, P]` corpus rows with `valid
[B, N, P]`, beams best first, and the beams' scores `[B, N]`. A ranker is a callable

    ranker(docs_BxNxP, valid_BxNxP, beam_scores_BxN) -> (query [R], document row [R], score [R])

giving each (query, document) pair once, vectorised over the batch (no Python loop over beams). The model
object holds one (`FirstOccurrence`, or any callable of that form bound in gin: a method's own ranker lives in
its folder, e.g. MDGR's formula (8) in `methods/mdgr/ranker.py`, GLEN's collision-free ranking in
`methods/glen/ranker.py`, built on `flat_slots` and `group_starts` here):

* `first_occurrence` — a document takes the score of the first beam that reaches it (DSI practice).
A ranker that reads token weights declares `uses_token_weights = True` and takes them as the keywords
`beam_weights` and `doc_weights`; a model that has them (GLEN's) passes them only to such a ranker.

Order: a run holds these scores and is read in trec_eval's order (score descending, ties by document id
descending — `data.trec.ranked`), so ties never depend on a document's corpus row (which the dynamic-corpora
protocol fills with initial documents first). `order` does the same for lists (`predict_documents`).
`first_occurrence(beams, ...)` takes per-beam document lists (by-hand examples) and runs the same array code;
`beams_to_arrays` turns such lists into arrays for any ranker.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np


def order(scores: Mapping[int, float], keys: Optional[Sequence] = None) -> list[tuple[int, float]]:
    """(document, score) best first: score descending, ties by `keys[document]` descending (the document
    itself when `keys` is None)."""
    key = (lambda d: d) if keys is None else (lambda d: keys[d])
    return sorted(((int(d), float(s)) for d, s in scores.items()), key=lambda ds: (ds[1], key(ds[0])),
                  reverse=True)


def flat_slots(docs_BxNxP: np.ndarray, valid_BxNxP: np.ndarray):
    """(query, beam, document) of every valid slot, sorted by query, document, then beam."""
    docs, valid = np.asarray(docs_BxNxP), np.asarray(valid_BxNxP, bool)
    q, n, _ = np.nonzero(valid)
    d = docs[valid].astype(np.int64)
    o = np.lexsort((n, d, q))
    return q[o], n[o], d[o]


def group_starts(*keys: np.ndarray) -> np.ndarray:
    """Indices where the tuple of sorted keys changes (the first of each group)."""
    if not len(keys[0]):
        return np.zeros(0, np.int64)
    change = np.zeros(len(keys[0]), bool)
    change[0] = True
    for k in keys:
        change[1:] |= k[1:] != k[:-1]
    return np.flatnonzero(change)


def first_occurrence_arrays(docs_BxNxP, valid_BxNxP, beam_scores_BxN):
    q, n, d = flat_slots(docs_BxNxP, valid_BxNxP)
    first = group_starts(q, d)  # within a (query, document) group the beams are sorted: the first is the best
    return q[first], d[first], np.asarray(beam_scores_BxN, np.float64)[q[first], n[first]]


@gin.configurable
@dataclasses.dataclass(frozen=True)
class FirstOccurrence:
    """The default ranker: a document takes the score of the first beam that reaches it."""

    def __call__(self, docs_BxNxP, valid_BxNxP, beam_scores_BxN):
        return first_occurrence_arrays(docs_BxNxP, valid_BxNxP, beam_scores_BxN)


def first_occurrence_ranked(docs_BxNxP, valid_BxNxP, beam_scores_BxN, doc_keys):
    """`FirstOccurrence` traced on the device, each query's documents already in trec order (score descending, ties
    by `doc_keys[row]` descending: the document ids' order, `data.trec.ranked`) — for a caller that cannot come back
    to the host between search and ranking (t5x's partitioned infer step). Returns (rows [B, K], scores [B, K]),
    K = N·P, the documents first and -1 / 0 after them. A slot is its document's first when no earlier slot (beams
    best first, then the leaf's documents) holds the same document: the best beam reaching it, as on the host."""
    B, N, P = docs_BxNxP.shape
    K = N * P
    d = docs_BxNxP.reshape(B, K)
    v = valid_BxNxP.reshape(B, K)
    s = jnp.repeat(beam_scores_BxN.astype(jnp.float32), P, axis=1)
    earlier = jnp.tril(jnp.ones((K, K), bool), -1)  # [i, j]: slot j comes before slot i
    seen = ((d[:, :, None] == d[:, None, :]) & v[:, None, :] & earlier[None]).any(-1)
    first = v & ~seen
    key = jnp.take(doc_keys, jnp.clip(d, 0, doc_keys.shape[0] - 1))
    big = jnp.iinfo(jnp.int32).max
    by_score = jnp.where(first, -s, jnp.inf)  # the others last
    by_key = jnp.where(first, -key.astype(jnp.int32), big)
    _, _, rows, scores = jax.lax.sort((by_score, by_key, jnp.where(first, d, -1).astype(jnp.int32),
                                       jnp.where(first, s, 0.0)), dimension=1, num_keys=2)
    return rows, scores


def beams_to_arrays(beams: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-beam document lists of one query → (docs [1, N, P], valid [1, N, P])."""
    P = max([len(b) for b in beams] + [1])
    docs = np.full((1, len(beams), P), -1, np.int64)
    valid = np.zeros((1, len(beams), P), bool)
    for i, b in enumerate(beams):
        docs[0, i, :len(b)] = b
        valid[0, i, :len(b)] = True
    return docs, valid


def per_query(q: np.ndarray, d: np.ndarray, s: np.ndarray, batch: int,
              keys: Optional[Sequence] = None) -> list[list[tuple[int, float]]]:
    """A ranker's flat output → per query, (document, score) best first (`order`)."""
    return [order(dict(zip(d[q == b].tolist(), s[q == b].tolist())), keys) for b in range(batch)]


def first_occurrence(beams: Sequence[Sequence[int]], beam_scores: Sequence[float],
                     keys: Optional[Sequence] = None) -> list[tuple[int, float]]:
    docs, valid = beams_to_arrays(beams)
    return per_query(*first_occurrence_arrays(docs, valid, np.asarray([beam_scores], np.float64)), 1, keys)[0]
