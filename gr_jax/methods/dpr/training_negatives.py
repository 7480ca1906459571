"""Hard negatives for DPR-HN: for each training pair, the top documents of its query under BM25 or under a dense
retriever, other than the query's judged positives. Each list is ranked by score, equal scores by document id;
−1 fills a list the retriever could not fill."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from gr_jax.methods.api import hard_negatives as bm25_negatives

__all__ = ["bm25_negatives", "dense_negatives", "positives_of"]


def positives_of(qids: Sequence[str], rows: Sequence[int]) -> dict[str, set]:
    out: dict[str, set] = {}
    for q, r in zip(qids, rows):
        out.setdefault(q, set()).add(int(r))
    return out


def dense_negatives(embedder, corpus, qids: Sequence[str], texts: Sequence[str], rows: Sequence[int],
                    depth: int) -> np.ndarray:
    """Corpus rows [n, depth] of the dense retriever `embedder` (queries by `embed_queries`, documents by
    `embed`) over the whole `corpus`, positives left out."""
    from gr_jax.methods.api import DenseIndex

    positives = positives_of(qids, rows)
    text_of = dict(zip(qids, texts))
    order = sorted(text_of)
    index = DenseIndex.build(embedder, corpus, fit=False)
    run = index.search([text_of[q] for q in order], order, k=depth + max(len(v) for v in positives.values()))
    out = np.full((len(qids), depth), -1, np.int64)
    for i, (q, r) in enumerate(zip(qids, rows)):
        ranked = sorted(run.get(q, {}).items(), key=lambda kv: (-kv[1], kv[0]))
        found = [x for x in (corpus.index_of(d) for d, _ in ranked) if x not in positives[q]][:depth]
        out[i, : len(found)] = found
    return out
