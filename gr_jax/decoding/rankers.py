"""From beam search output (docids in beam order) to a document ranking.

A beam's docid leads to one document, to several (colliding docids, or a multi-docid scheme where documents
share a chunk code / n-gram), and one document may be reached by several beams. Rankers turn
`beams = [[doc, ...] per beam, best beam first]` into `[(doc, score), ...]`, best first:

* `first_occurrence` — a document takes the score of the first beam that reaches it (DSI practice);
* `mdgr` — formula (8) of 000_dynamic_corpora.txt: Score(d) = CoverageCount(d) + λ·Σ_{z ∈ d} 1/rank(z),
  where CoverageCount(d) is the number of distinct generated docids that d contains and rank(z) the 1-based
  position of z among the beams.

Ties (the documents of one colliding docid, equal MDGR scores) are broken by `order`: score descending, then
the document's key descending — with `keys` the document id strings, that is trec_eval's order, so a run
written with these scores is ranked identically by trec_eval, and no tie ever depends on a document's corpus
row (which the dynamic-corpora protocol fills with initial documents first).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

RANKERS = ("first", "mdgr")


def order(scores: Mapping[int, float], keys: Optional[Sequence] = None) -> list[tuple[int, float]]:
    """(document, score) best first: score descending, ties by `keys[document]` descending (the document
    itself when `keys` is None)."""
    key = (lambda d: d) if keys is None else (lambda d: keys[d])
    return sorted(((int(d), float(s)) for d, s in scores.items()), key=lambda ds: (ds[1], key(ds[0])),
                  reverse=True)


def first_occurrence(beams: Sequence[Sequence[int]], beam_scores: Sequence[float],
                     keys: Optional[Sequence] = None) -> list[tuple[int, float]]:
    best: dict[int, float] = {}
    for docs, score in zip(beams, beam_scores):
        for d in docs:
            best.setdefault(int(d), float(score))
    return order(best, keys)


def mdgr(beams: Sequence[Sequence[int]], lam: float = 1.0, keys: Optional[Sequence] = None) -> list[tuple[int, float]]:
    """Beams must be distinct docids (beam search output is); a document listed twice under one beam counts
    once for that beam."""
    coverage: dict[int, int] = {}
    rank_sum: dict[int, float] = {}
    for rank, docs in enumerate(beams, start=1):
        for d in set(int(x) for x in docs):
            coverage[d] = coverage.get(d, 0) + 1
            rank_sum[d] = rank_sum.get(d, 0.0) + 1.0 / rank
    return order({d: coverage[d] + lam * rank_sum[d] for d in coverage}, keys)


def rank(beams: Sequence[Sequence[int]], beam_scores: Sequence[float], method: str = "first",
         lam: float = 1.0, keys: Optional[Sequence] = None) -> list[tuple[int, float]]:
    if method == "first":
        return first_occurrence(beams, beam_scores, keys)
    if method == "mdgr":
        return mdgr(beams, lam, keys)
    raise ValueError(f"unknown ranker {method!r}; choose one of {RANKERS}")
