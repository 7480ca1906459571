"""GLEN's collision-free ranking (002_glen.txt §3.4, Eq. 9) and its baseline.

`CollisionFree`: the beams in order; documents sharing a beam's docid ordered by cos(w^q, w^d) between the
query's raw logits at the docid's tokens (`beam_weights [B, N, M]`, passed by `GlenRetriever`) and the
document's stored docid logits (`doc_weights [rows, M]`, the docid table's token weights); cut to N documents
after the groups are expanded. `RandomTieOrder` is its baseline: the same, with colliding documents in a
seeded random order (`tools/glen_ties.py` compares them over seeds).
"""

from __future__ import annotations

import dataclasses

import gin
import numpy as np

from gr_jax.methods.api import flat_slots, group_starts


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
    first[seen[group_starts(q[seen], d[seen])]] = True
    q, n, d, key = q[first], n[first], d[first], key[first]
    starts = group_starts(q)
    within = np.arange(len(q)) - np.repeat(starts, np.diff(np.append(starts, len(q))))
    cut = within < keep
    return q[cut], d[cut], n[cut], key[cut]


def collision_free_arrays(docs_BxNxP, valid_BxNxP, beam_weights_BxNxM, doc_weights_RxM):
    """GLEN's ranking → (query, document, beam index, cosine) in rank order, N documents per query at most."""
    if doc_weights_RxM is None:
        raise ValueError("collision-free ranking needs the docids' token weights (GLEN's docid logits); this "
                         "docid table has none — use GLEN docids or another ranker")
    q, n, d = flat_slots(docs_BxNxP, valid_BxNxP)
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
        q, n, d = flat_slots(docs_BxNxP, valid_BxNxP)
        salt = np.uint64((self.seed * 0x94D049BB133111EB) % (1 << 64))  # a splitmix64-style hash
        mix = (q.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
               + d.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9) + salt)
        mix ^= mix >> np.uint64(31)
        mix *= np.uint64(0xD6E8FEB86659FD93)
        mix ^= mix >> np.uint64(32)
        u = (mix >> np.uint64(11)).astype(np.float64) / float(1 << 53)
        q, d, n, u = beam_then_key_arrays(q, n, d, u, keep=np.shape(valid_BxNxP)[1])
        return q, d, _beam_rank_score(n, u, np.shape(beam_scores_BxN)[1])
