"""From beam search output (docids in beam order) to a document ranking.

A beam's docid leads to one document, to several (colliding docids, or a multi-docid scheme where documents
share a chunk code / n-gram), and one document may be reached by several beams. Rankers turn
`beams = [[doc, ...] per beam, best beam first]` into `[(doc, score), ...]`, best first:

* `first_occurrence` — a document takes the rank of the first beam that reaches it (DSI practice; the
  beam's score is kept, documents of one beam in document order).
* `mdgr` — formula (8) of 000_dynamic_corpora.txt: Score(d) = CoverageCount(d) + λ·Σ_{z ∈ d} 1/rank(z),
  where CoverageCount(d) is the number of distinct generated docids that d contains and rank(z) the 1-based
  position of z among the beams. Ties keep the order of first appearance.
"""

from __future__ import annotations

from typing import Sequence

RANKERS = ("first", "mdgr")


def first_occurrence(beams: Sequence[Sequence[int]], beam_scores: Sequence[float]) -> list[tuple[int, float]]:
    out, seen = [], set()
    for docs, score in zip(beams, beam_scores):
        for d in docs:
            if d not in seen:
                seen.add(d)
                out.append((int(d), float(score)))
    return out


def mdgr(beams: Sequence[Sequence[int]], lam: float = 1.0) -> list[tuple[int, float]]:
    """Beams must be distinct docids (beam search output is); a document listed twice under one beam counts
    once for that beam."""
    coverage: dict[int, int] = {}
    rank_sum: dict[int, float] = {}
    for rank, docs in enumerate(beams, start=1):
        for d in set(int(x) for x in docs):
            coverage[d] = coverage.get(d, 0) + 1
            rank_sum[d] = rank_sum.get(d, 0.0) + 1.0 / rank
    appearance = _appearance(beams)
    scored = [(d, coverage[d] + lam * rank_sum[d]) for d in coverage]
    scored.sort(key=lambda ds: (-ds[1], appearance[ds[0]]))
    return scored


def _appearance(beams: Sequence[Sequence[int]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for docs in beams:
        for d in docs:
            out.setdefault(int(d), len(out))
    return out


def rank(beams: Sequence[Sequence[int]], beam_scores: Sequence[float], method: str = "first",
         lam: float = 1.0) -> list[tuple[int, float]]:
    if method == "first":
        return first_occurrence(beams, beam_scores)
    if method == "mdgr":
        return mdgr(beams, lam)
    raise ValueError(f"unknown ranker {method!r}; choose one of {RANKERS}")
