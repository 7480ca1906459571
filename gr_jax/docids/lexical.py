"""Lexical docids from a document field: the title (Ultron-title) or the URL (Ultron-URL), tokenized with the
text vocabulary. Several documents may share one (a collision); the index keeps all of them under that docid.
A corpus without the field is an error, not an empty docid."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import gin
import numpy as np

from gr_jax.docids.base import DocidTable
from gr_jax.models.vocab import DocidTokenSpace

FIELDS = ("title", "url")


@gin.configurable
@dataclasses.dataclass
class FieldDocids:
    field: str = "title"
    max_tokens: int = 32
    text_vocab_size: int = 0
    _vocab: object = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        if self.field not in FIELDS:
            raise ValueError(f"FieldDocids.field must be one of {FIELDS}, got {self.field!r}")

    @property
    def name(self) -> str:
        return self.field

    def fit(self, corpus, embeddings=None, *, vocab=None) -> "FieldDocids":
        if vocab is None:
            raise ValueError(f"{self.field} docids need the text vocabulary")
        self._check(corpus)
        self._vocab = vocab
        self.text_vocab_size = int(vocab.size)
        return self

    def bind(self, vocab) -> None:
        self._vocab = vocab

    def _check(self, corpus):
        if getattr(corpus, f"{self.field}s") is None:
            raise ValueError(f"{self.field} docids: the corpus has no {self.field}s; choose another docid scheme")

    def assign(self, corpus, rows: Optional[Sequence[int]] = None, embeddings=None) -> DocidTable:
        if self._vocab is None:
            raise ValueError("FieldDocids.assign before fit() (or bind(vocab) after loading)")
        self._check(corpus)
        values = getattr(corpus, f"{self.field}s")
        rows = np.arange(len(corpus)) if rows is None else np.asarray(rows, dtype=np.int64)
        seqs = []
        for r in rows:
            text = values[int(r)]
            ids = self._vocab.encode(text)[: self.max_tokens] if text else []
            if not ids:
                raise ValueError(f"document {corpus.doc_ids[int(r)]!r} has an empty {self.field}")
            seqs.append(ids)
        return DocidTable.from_lists(seqs, rows, DocidTokenSpace("text", self.text_vocab_size))

    def state(self):
        return {"field": self.field, "max_tokens": self.max_tokens, "text_vocab_size": self.text_vocab_size}, {}

    def load_state(self, meta, arrays) -> None:
        if meta["field"] != self.field:
            raise ValueError(f"saved {meta['field']} docids, configured {self.field} docids")
        self.max_tokens = int(meta["max_tokens"])
        self.text_vocab_size = int(meta["text_vocab_size"])
