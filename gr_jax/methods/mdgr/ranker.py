"""MDGR's ranker: formula (8) of 000_dynamic_corpora.txt — Score(d) = CoverageCount(d) + λ·Σ_{z ∈ d} 1/rank(z),
where CoverageCount(d) is the number of distinct generated docids that d contains and rank(z) the 1-based
position of z among the beams. `mdgr(beams, ...)` takes per-beam document lists (by-hand examples)."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import gin
import numpy as np

from gr_jax.methods.api import beams_to_arrays, flat_slots, group_starts, per_query


def mdgr_arrays(docs_BxNxP, valid_BxNxP, lam: float = 1.0):
    q, n, d = flat_slots(docs_BxNxP, valid_BxNxP)
    once = group_starts(q, d, n)  # a document listed twice under one beam counts once for that beam
    q, n, d = q[once], n[once], d[once]
    group = group_starts(q, d)
    coverage = np.diff(np.append(group, len(q)))
    rank_sum = np.add.reduceat(1.0 / (n + 1.0), group) if len(group) else np.zeros(0)
    return q[group], d[group], coverage + lam * rank_sum


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


def mdgr(beams: Sequence[Sequence[int]], lam: float = 1.0, keys: Optional[Sequence] = None) -> list[tuple[int, float]]:
    docs, valid = beams_to_arrays(beams)
    return per_query(*mdgr_arrays(docs, valid, lam), 1, keys)[0]
