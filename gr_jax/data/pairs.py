"""DSI training pairs: (input text, document row), the data of the DSI objectives.

* indexing — document text → its docid (DSI's "indexing" task; optionally the title is prepended);
* retrieval — query → docid, one pair per (query, relevant document) with grade ≥ `min_grade`;
* pseudo-query — a generated query → docid (the NCI/DSI-QG `nq_512_qg.tsv` split, or any query split).

Targets are *document rows* of the corpus, not docids: the docid scheme turns rows into token sequences,
so one set of pairs serves every scheme. The trainer's `Objectives` tokenizes them into `ExampleStore`s for
the `MixtureIterator`, whose rates gin sets.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional, Sequence

import numpy as np

from gr_jax.data.readers import Corpus, DataError, QuerySet
from gr_jax.data.trec import Qrels

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Pairs:
    """Input texts and the corpus rows they should retrieve (parallel lists)."""

    name: str
    texts: list[str]
    rows: np.ndarray
    qids: Optional[list[str]] = None
    docid_index: Optional[np.ndarray] = None  # a specific docid (table index) per pair, e.g. MDGR chunk → its code

    def __len__(self) -> int:
        return len(self.texts)


def indexing_pairs(corpus: Corpus, rows: Optional[Sequence[int]] = None, with_title: bool = False,
                   max_chars: Optional[int] = None) -> Pairs:
    """Document text → document (DSI indexing). `max_chars` trims the text before tokenization, which keeps
    tokenizing a long corpus cheap when only the first `inputs` tokens are kept anyway."""
    rows = np.arange(len(corpus)) if rows is None else np.asarray(rows, dtype=np.int64)
    if with_title and corpus.titles is None:
        raise DataError("indexing_pairs(with_title=True): the corpus has no titles")
    texts = []
    for r in rows:
        t = corpus.texts[int(r)]
        if with_title and corpus.titles[int(r)]:
            t = f"{corpus.titles[int(r)]}. {t}"
        texts.append(t[:max_chars] if max_chars else t)
    return Pairs("indexing", texts, rows)


def query_pairs(queries: QuerySet, qrels: Qrels, corpus: Corpus, min_grade: int = 1, name: str = "retrieval",
                restrict_rows: Optional[Sequence[int]] = None) -> Pairs:
    """Query → each relevant document (grade ≥ `min_grade`). A judged document missing from the corpus is an
    error; with `restrict_rows`, pairs whose document is outside those rows are left out (dynamic corpora:
    train only on D0)."""
    allowed = None if restrict_rows is None else set(int(r) for r in restrict_rows)
    text_of = dict(zip(queries.qids, queries.texts))
    texts, rows, qids = [], [], []
    for qid, judged in qrels.items():
        if qid not in text_of:
            raise DataError(f"{name}: judged query {qid!r} has no text")
        for doc, grade in sorted(judged.items()):
            if grade < min_grade:
                continue
            if doc not in corpus:
                raise DataError(f"{name}: query {qid!r} is judged against unknown document {doc!r}")
            row = corpus.index_of(doc)
            if allowed is not None and row not in allowed:
                continue
            texts.append(text_of[qid])
            rows.append(row)
            qids.append(qid)
    return Pairs(name, texts, np.asarray(rows, dtype=np.int64), qids)


def document_query_pairs(queries_of: dict, corpus: Corpus, name: str = "pseudo-query",
                         restrict_rows: Optional[Sequence[int]] = None, source: str = "") -> Pairs:
    """Generated query → the document it was generated from (`queries_of`: doc_id → query texts). Pairs come in
    document-id order, a document's queries in file order; a document missing from the corpus is an error
    naming `source`; with `restrict_rows`, documents outside those rows are left out. Query ids are
    "<doc_id>#<k>"."""
    unknown = sorted(d for d in queries_of if d not in corpus)
    if unknown:
        raise DataError(f"{source or name}: {len(unknown)} document(s) not in the corpus, e.g. {unknown[:3]}; "
                        f"the queries were generated for another corpus")
    allowed = None if restrict_rows is None else set(int(r) for r in restrict_rows)
    texts, rows, qids = [], [], []
    for doc in sorted(queries_of):
        row = corpus.index_of(doc)
        if allowed is not None and row not in allowed:
            continue
        for k, text in enumerate(queries_of[doc]):
            texts.append(text)
            rows.append(row)
            qids.append(f"{doc}#{k}")
    if not texts:
        raise DataError(f"{source or name}: no generated query for the documents trained on")
    return Pairs(name, texts, np.asarray(rows, dtype=np.int64), qids)
