"""From beam search output (docids in beam order) to document scores.

A beam's docid leads to one document, to several (colliding docids, or a multi-docid scheme where documents
share a chunk code / n-gram), and one document may be reached by several beams. The documents of every beam
come as arrays from the device (`index.device.leaf_documents`): `docs [B, N, P]` corpus rows with `valid
[B, N, P]`, beams best first, and the beams' scores `[B, N]`. A ranker is a callable

    ranker(docs_BxNxP, valid_BxNxP, beam_scores_BxN) -> (query [R], document row [R], score [R])

giving each (query, document) pair once, vectorised over the batch (no Python loop over beams). The model
object holds one (`FirstOccurrence`, `MDGRRanker`, or any callable of that form, bound in gin):

* `first_occurrence` — a document takes the score of the first beam that reaches it (DSI practice);
* `mdgr` — formula (8) of 000_dynamic_corpora.txt: Score(d) = CoverageCount(d) + λ·Σ_{z ∈ d} 1/rank(z),
  where CoverageCount(d) is the number of distinct generated docids that d contains and rank(z) the 1-based
  position of z among the beams.

Order: a run holds these scores and is read in trec_eval's order (score descending, ties by document id
descending — `data.trec.ranked`), so ties never depend on a document's corpus row (which the dynamic-corpora
protocol fills with initial documents first). `order` does the same for lists (`predict_documents`).
`first_occurrence(beams, ...)` / `mdgr(beams, ...)` take per-beam document lists (by-hand examples) and run
the same array code.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Sequence

import gin
import numpy as np


def order(scores: Mapping[int, float], keys: Optional[Sequence] = None) -> list[tuple[int, float]]:
    """(document, score) best first: score descending, ties by `keys[document]` descending (the document
    itself when `keys` is None)."""
    key = (lambda d: d) if keys is None else (lambda d: keys[d])
    return sorted(((int(d), float(s)) for d, s in scores.items()), key=lambda ds: (ds[1], key(ds[0])),
                  reverse=True)


def _flat(docs_BxNxP: np.ndarray, valid_BxNxP: np.ndarray):
    """(query, beam, document) of every valid slot, sorted by query, document, then beam."""
    docs, valid = np.asarray(docs_BxNxP), np.asarray(valid_BxNxP, bool)
    q, n, _ = np.nonzero(valid)
    d = docs[valid].astype(np.int64)
    o = np.lexsort((n, d, q))
    return q[o], n[o], d[o]


def _starts(*keys: np.ndarray) -> np.ndarray:
    """Indices where the tuple of sorted keys changes (the first of each group)."""
    if not len(keys[0]):
        return np.zeros(0, np.int64)
    change = np.zeros(len(keys[0]), bool)
    change[0] = True
    for k in keys:
        change[1:] |= k[1:] != k[:-1]
    return np.flatnonzero(change)


def first_occurrence_arrays(docs_BxNxP, valid_BxNxP, beam_scores_BxN):
    q, n, d = _flat(docs_BxNxP, valid_BxNxP)
    first = _starts(q, d)  # within a (query, document) group the beams are sorted: the first is the best
    return q[first], d[first], np.asarray(beam_scores_BxN, np.float64)[q[first], n[first]]


def mdgr_arrays(docs_BxNxP, valid_BxNxP, lam: float = 1.0):
    q, n, d = _flat(docs_BxNxP, valid_BxNxP)
    once = _starts(q, d, n)  # a document listed twice under one beam counts once for that beam
    q, n, d = q[once], n[once], d[once]
    group = _starts(q, d)
    coverage = np.diff(np.append(group, len(q)))
    rank_sum = np.add.reduceat(1.0 / (n + 1.0), group) if len(group) else np.zeros(0)
    return q[group], d[group], coverage + lam * rank_sum


@gin.configurable
@dataclasses.dataclass(frozen=True)
class FirstOccurrence:
    """The default ranker: a document takes the score of the first beam that reaches it."""

    def __call__(self, docs_BxNxP, valid_BxNxP, beam_scores_BxN):
        return first_occurrence_arrays(docs_BxNxP, valid_BxNxP, beam_scores_BxN)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class MDGRRanker:
    """The ranker of multi-docid schemes: formula (8) of 000_dynamic_corpora.txt with weight `lam`."""

    lam: float = 1.0

    def __post_init__(self):
        if not self.lam >= 0:
            raise ValueError(f"MDGRRanker.lam must be ≥ 0, got {self.lam}")

    def __call__(self, docs_BxNxP, valid_BxNxP, beam_scores_BxN):
        return mdgr_arrays(docs_BxNxP, valid_BxNxP, self.lam)


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


def mdgr(beams: Sequence[Sequence[int]], lam: float = 1.0, keys: Optional[Sequence] = None) -> list[tuple[int, float]]:
    docs, valid = beams_to_arrays(beams)
    return per_query(*mdgr_arrays(docs, valid, lam), 1, keys)[0]
