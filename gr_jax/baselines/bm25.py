"""BM25 through `bm25s` (sparse, numpy): build over a Corpus, search → Run, save / load without pickle.

Tokenisation: lower-cased word tokens of ≥ 2 characters, English stop words removed (bm25s' defaults), the
same for documents and queries. Scoring: bm25s' "lucene" variant with k1 = 0.9, b = 0.4 (Anserini's MS MARCO
defaults) unless given.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from gr_jax.data.trec import Run, fetch_deciding_ties, top_k
from gr_jax.runtime.io_utils import atomic_dir, read_json

log = logging.getLogger(__name__)


def _bm25s():
    try:
        import bm25s
    except ImportError:
        raise ImportError("the BM25 baseline needs bm25s: pip install bm25s") from None
    logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its logger to DEBUG when imported
    return bm25s


class BM25:
    def __init__(self, retriever, doc_ids: list[str]):
        self.retriever = retriever
        self.doc_ids = doc_ids

    @classmethod
    def build(cls, doc_ids: Sequence[str], texts: Sequence[str], k1: float = 0.9, b: float = 0.4,
              method: str = "lucene") -> "BM25":
        bm25s = _bm25s()
        if len(doc_ids) != len(texts):
            raise ValueError(f"BM25.build: {len(doc_ids)} ids for {len(texts)} texts")
        tokens = bm25s.tokenize(list(texts), stopwords="en", show_progress=False)
        retriever = bm25s.BM25(k1=k1, b=b, method=method)
        retriever.index(tokens, show_progress=False)
        log.info("BM25 index over %d documents", len(doc_ids))
        return cls(retriever, [str(d) for d in doc_ids])

    def search(self, qids: Sequence[str], queries: Sequence[str], k: int = 100) -> Run:
        """Top k per query (documents with a positive score). bm25s cuts score ties at the k-th place in index
        order, which favours documents indexed first (in the dynamic-corpora protocol, D0: an IDBI of ≈ 0.3 on
        the demo corpus from that alone); we fetch more until no tie crosses the cut and cut in trec_eval
        order (`runs.top_k`) instead."""
        bm25s = _bm25s()
        tokens = bm25s.tokenize(list(queries), stopwords="en", show_progress=False)

        def fetch(n: int):
            docs, scores = self.retriever.retrieve(tokens, k=n, show_progress=False)
            return (docs, scores), [row for row in np.asarray(scores)]

        docs, scores = fetch_deciding_ties(fetch, k, len(self.doc_ids))
        run: Run = {}
        for qid, row_docs, row_scores in zip(qids, docs, scores):
            hits = {self.doc_ids[int(d)]: float(s) for d, s in zip(row_docs, row_scores) if s > 0}
            run[str(qid)] = top_k(hits, k)
        return run

    def save(self, path: str | os.PathLike) -> None:
        with atomic_dir(path) as tmp:
            self.retriever.save(str(tmp), show_progress=False)
            (tmp / "doc_ids.json").write_text(json.dumps(self.doc_ids))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "BM25":
        bm25s = _bm25s()
        path = Path(path)
        if not (path / "doc_ids.json").exists():
            raise ValueError(f"{path}: not a saved BM25 index (doc_ids.json missing)")
        retriever = bm25s.BM25.load(str(path), show_progress=False, allow_pickle=False)
        return cls(retriever, read_json(path / "doc_ids.json"))


def hard_negatives(corpus, qids: Sequence[str], texts: Sequence[str], rows: Sequence[int], depth: int) -> np.ndarray:
    """For each (query id, text, positive corpus row) pair, the top-`depth` BM25 documents of its query other
    than the query's judged positives: corpus rows [n, depth], −1 where BM25 returns fewer. Equal scores are
    ordered by document id (never by corpus row)."""
    bm25 = BM25.build(list(corpus.doc_ids), list(corpus.texts))
    positives: dict[str, set] = {}
    text_of = {}
    for q, t, r in zip(qids, texts, rows):
        positives.setdefault(q, set()).add(int(r))
        text_of[q] = t
    order = sorted(text_of)
    run = bm25.search(order, [text_of[q] for q in order], k=depth + max(len(v) for v in positives.values()))
    out = np.full((len(qids), depth), -1, np.int64)
    for i, (q, r) in enumerate(zip(qids, rows)):
        ranked = sorted(run.get(q, {}).items(), key=lambda kv: (-kv[1], kv[0]))
        found = [corpus.index_of(d) for d, _ in ranked]
        found = [x for x in found if x not in positives[q]][:depth]
        out[i, : len(found)] = found
    return out
