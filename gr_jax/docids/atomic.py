"""DSI's unstructured docids: atomic (one new vocabulary token per document) and naive (the id as a string).

* `AtomicDocids` — document k (in the order documents are first assigned) gets token `text_vocab + k`; the
  model's vocabulary is grown to hold them (`models.convert.grow_vocab`). New documents continue the count;
  the trained model has never seen their tokens, which is why atomic docids cannot index new documents
  without training (000_dynamic_corpora.txt §5).
* `NaiveDocids` — the document's id string tokenized with the text vocabulary (DSI "naive string"); a new
  document's docid needs nothing new.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import gin
import numpy as np

from gr_jax.docids.base import DocidScheme, DocidTable, FitContext
from gr_jax.data.vocab import DocidTokenSpace


def _rows(corpus, rows) -> np.ndarray:
    return np.arange(len(corpus)) if rows is None else np.asarray(rows, dtype=np.int64)


def first_seen_codes(known: list, corpus, rows: Optional[Sequence[int]] = None) -> list[int]:
    """The code of each row's document: its position in `known` (document ids in the order they were first
    assigned), a new document appended to `known` (so codes continue across parts of a corpus)."""
    position = {d: k for k, d in enumerate(known)}
    codes = []
    for r in _rows(corpus, rows):
        doc = corpus.doc_ids[int(r)]
        if doc not in position:
            position[doc] = len(known)
            known.append(doc)
        codes.append(position[doc])
    return codes


@gin.configurable
@dataclasses.dataclass
class AtomicDocids(DocidScheme):
    name = "atomic"
    adds_tokens_per_document = True
    text_vocab_size: int = 0  # set by fit() from the vocabulary
    doc_ids: list = dataclasses.field(default_factory=list)  # document id of token k

    def fit(self, corpus, context: FitContext = FitContext()) -> "AtomicDocids":
        vocab = context.vocab
        if vocab is None:
            raise ValueError("atomic docids need the text vocabulary (its size is where docid tokens start)")
        self.text_vocab_size = int(vocab.size)
        self.doc_ids = []
        return self

    def assign(self, corpus, rows: Optional[Sequence[int]] = None, embeddings=None) -> DocidTable:
        if not self.text_vocab_size:
            raise ValueError("AtomicDocids.assign before fit()")
        tokens = [[self.text_vocab_size + c] for c in first_seen_codes(self.doc_ids, corpus, rows)]
        space = DocidTokenSpace.above_text(self.text_vocab_size, max(len(self.doc_ids), 1))
        return DocidTable.from_lists(tokens, _rows(corpus, rows), space)

    def state(self):
        return {"text_vocab_size": self.text_vocab_size, "doc_ids": list(self.doc_ids)}, {}

    def load_state(self, meta, arrays) -> None:
        self.text_vocab_size = int(meta["text_vocab_size"])
        self.doc_ids = list(meta["doc_ids"])


@gin.configurable
@dataclasses.dataclass
class NaiveDocids(DocidScheme):
    name = "naive"
    text_vocab_size: int = 0
    _vocab: object = dataclasses.field(default=None, repr=False)

    def fit(self, corpus, context: FitContext = FitContext()) -> "NaiveDocids":
        vocab = context.vocab
        if vocab is None:
            raise ValueError("naive docids need the text vocabulary to tokenize document ids")
        self._vocab = vocab
        self.text_vocab_size = int(vocab.size)
        return self

    def bind(self, vocab) -> None:
        self._vocab = vocab

    def assign(self, corpus, rows: Optional[Sequence[int]] = None, embeddings=None) -> DocidTable:
        if self._vocab is None:
            raise ValueError("NaiveDocids.assign before fit() (or bind(vocab) after loading)")
        seqs = []
        for r in _rows(corpus, rows):
            ids = self._vocab.encode(str(corpus.doc_ids[int(r)]))
            if not ids:
                raise ValueError(f"document id {corpus.doc_ids[int(r)]!r} tokenizes to nothing")
            seqs.append(ids)
        return DocidTable.from_lists(seqs, _rows(corpus, rows), DocidTokenSpace("text", self.text_vocab_size))

    def state(self):
        return {"text_vocab_size": self.text_vocab_size}, {}

    def load_state(self, meta, arrays) -> None:
        self.text_vocab_size = int(meta["text_vocab_size"])
