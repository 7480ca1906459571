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
  position of z among the beams;
* `CollisionFree` — GLEN (002_glen.txt §3.4, Eq. 9): the beams in order; documents sharing a beam's docid
  ordered by cos(w^q, w^d) between the query's raw logits at the docid's tokens (`beam_weights [B, N, M]`,
  passed by `models.glen.GlenRetriever`) and the document's stored docid logits (`doc_weights [rows, M]`,
  the docid table's token weights); cut to N documents after the groups are expanded. `RandomTieOrder` is
  its baseline: the same, with colliding documents in a seeded random order.
A ranker that reads token weights declares `uses_token_weights = True` and takes them as the keywords
`beam_weights` and `doc_weights`; a model that has them (GLEN's) passes them only to such a ranker.

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


def _cosine(a_RxM: np.ndarray, b_RxM: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """Cosine per row, float64; each norm floored at `eps` (torch.nn.functional.cosine_similarity's rule)."""
    a, b = np.asarray(a_RxM, np.float64), np.asarray(b_RxM, np.float64)
    na = np.maximum(np.linalg.norm(a, axis=-1), eps)
    nb = np.maximum(np.linalg.norm(b, axis=-1), eps)
    return (a * b).sum(-1) / (na * nb)


def beam_then_key_arrays(q: np.ndarray, n: np.ndarray, d: np.ndarray, tie_key: np.ndarray, keep: int):
    """Documents in beam order, a beam's documents by `tie_key` descending (then row), each (query, document)
    once at its first beam, at most `keep` per query → (query, document, beam, tie key) in rank order."""
    o = np.lexsort((d, -tie_key, n, q))
    q, n, d, key = q[o], n[o], d[o], tie_key[o]
    seen = np.lexsort((n, d, q))  # a document reached by two beams keeps the first (GLEN: one docid each)
    first = np.zeros(len(q), bool)
    first[seen[_starts(q[seen], d[seen])]] = True
    q, n, d, key = q[first], n[first], d[first], key[first]
    starts = _starts(q)
    within = np.arange(len(q)) - np.repeat(starts, np.diff(np.append(starts, len(q))))
    cut = within < keep
    return q[cut], d[cut], n[cut], key[cut]


def collision_free_arrays(docs_BxNxP, valid_BxNxP, beam_weights_BxNxM, doc_weights_RxM):
    """GLEN's ranking → (query, document, beam index, cosine) in rank order, N documents per query at most."""
    if doc_weights_RxM is None:
        raise ValueError("collision-free ranking needs the docids' token weights (GLEN's docid logits); this "
                         "docid table has none — use GLEN docids or another ranker")
    q, n, d = _flat(docs_BxNxP, valid_BxNxP)
    cos = _cosine(np.asarray(doc_weights_RxM)[d], np.asarray(beam_weights_BxNxM)[q, n])
    return beam_then_key_arrays(q, n, d, cos, keep=np.shape(valid_BxNxP)[1])


def _beam_rank_score(n: np.ndarray, key01: np.ndarray, beams: int) -> np.ndarray:
    """A score whose order is (beam, then key in [0, 1]): (number of beams − beam index) + key / 2."""
    return (beams - n).astype(np.float64) + 0.5 * key01


@gin.configurable
@dataclasses.dataclass(frozen=True)
class CollisionFree:
    """GLEN's collision-free ranking (module docstring). The run's score is (N − beam index) + (1 + cos)/4:
    beam order first, then the cosine; documents with equal cosines tie and are read in trec order."""

    uses_token_weights = True

    def __call__(self, docs_BxNxP, valid_BxNxP, beam_scores_BxN, *, beam_weights, doc_weights):
        q, d, n, cos = collision_free_arrays(docs_BxNxP, valid_BxNxP, beam_weights, doc_weights)
        return q, d, _beam_rank_score(n, (1.0 + cos) / 2.0, np.shape(beam_scores_BxN)[1])


@gin.configurable
@dataclasses.dataclass(frozen=True)
class RandomTieOrder:
    """The baseline of `CollisionFree`: documents sharing a docid in a random order drawn from `seed` and
    the (query position, document row) pair; the run's score is (N − beam index) + u/2, u in [0, 1)."""

    seed: int = 0

    def __call__(self, docs_BxNxP, valid_BxNxP, beam_scores_BxN):
        q, n, d = _flat(docs_BxNxP, valid_BxNxP)
        salt = np.uint64((self.seed * 0x94D049BB133111EB) % (1 << 64))  # a splitmix64-style hash
        mix = (q.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
               + d.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9) + salt)
        mix ^= mix >> np.uint64(31)
        mix *= np.uint64(0xD6E8FEB86659FD93)
        mix ^= mix >> np.uint64(32)
        u = (mix >> np.uint64(11)).astype(np.float64) / float(1 << 53)
        q, d, n, u = beam_then_key_arrays(q, n, d, u, keep=np.shape(valid_BxNxP)[1])
        return q, d, _beam_rank_score(n, u, np.shape(beam_scores_BxN)[1])


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
