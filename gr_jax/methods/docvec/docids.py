"""Atomic docids that carry their documents' vectors: document k (in the order documents are first assigned)
gets code k, one position of a codebook space of `capacity` codes, and the docid table's extras hold the
embedder's vector of its text ("vector" [M, D]), which `model.DocvecRetriever` starts its code vectors from.

Unlike DSI's atomic tokens, a new document's code is not unknown to a trained model: its vector is the
embedder's (frozen) vector of its text, so `adds_tokens_per_document` stays False and the dynamic-corpora
protocol may add documents."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import gin
import numpy as np

from gr_jax.methods.api import (Count, DocidScheme, DocidTable, DocidTokenSpace, FitContext, checked_embeddings,
                                first_seen_codes)

VECTOR = "vector"  # the docid table's extra: the embedder's vector of each docid's document [M, D]
DOC_ID = "doc_id"  # and its document id [M] (unicode): the model breaks ties of scores by it


def _rows(corpus, rows) -> np.ndarray:
    return np.arange(len(corpus)) if rows is None else np.asarray(rows, dtype=np.int64)


@gin.configurable
@dataclasses.dataclass
class DocvecDocids(DocidScheme):
    """`capacity`: the most documents the code space holds (D0 and every document added later)."""

    name = "docvec"
    needs_embeddings = True
    capacity: Count = 1 << 20
    doc_ids: list = dataclasses.field(default_factory=list)  # document id of code k

    def fit(self, corpus, context: FitContext = FitContext()) -> "DocvecDocids":
        checked_embeddings(corpus, context.embeddings, None, "DOCVEC")
        self.doc_ids = []
        return self

    def space(self, vocab_size: int = 0) -> DocidTokenSpace:
        return DocidTokenSpace.codebook(1, int(self.capacity))

    def assign(self, corpus, rows: Optional[Sequence[int]] = None, embeddings=None) -> DocidTable:
        vectors = checked_embeddings(corpus, embeddings, rows, "DOCVEC")  # one row per assigned document
        rows = _rows(corpus, rows)
        codes = first_seen_codes(self.doc_ids, corpus, rows)
        if len(self.doc_ids) > self.capacity:
            raise ValueError(f"DocvecDocids.capacity = {self.capacity} codes, but {len(self.doc_ids)} documents "
                             f"have one now; raise DocvecDocids.capacity")
        return DocidTable(np.asarray(codes, np.int32).reshape(-1, 1), np.ones(len(codes), np.int32), rows,
                          self.space(), extras={VECTOR: np.asarray(vectors, np.float32),
                                  DOC_ID: np.asarray([str(corpus.doc_ids[int(r)]) for r in rows], dtype=str)})

    def state(self):
        return {"capacity": int(self.capacity), "doc_ids": list(self.doc_ids)}, {}

    def load_state(self, meta, arrays) -> None:
        self.capacity = int(meta["capacity"])
        self.doc_ids = list(meta["doc_ids"])
