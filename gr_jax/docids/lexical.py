"""Lexical docids from a document field: the title (Ultron-title) or the URL (Ultron-URL), tokenized with the
text vocabulary. Several documents may share one (a collision); the index keeps all of them under that docid.
A corpus without the field is an error, not an empty docid."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import gin
import numpy as np

from gr_jax.docids.base import DocidScheme, DocidTable, FitContext
from gr_jax.data.vocab import DocidTokenSpace
from gr_jax.runtime.validation import Count

FIELDS = ("title", "url")


@gin.configurable
@dataclasses.dataclass
class FieldDocids(DocidScheme):
    field: str = "title"
    max_tokens: Count = 32
    text_vocab_size: int = 0
    _vocab: object = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        if self.field not in FIELDS:
            raise ValueError(f"FieldDocids.field must be one of {FIELDS}, got {self.field!r}")

    @property
    def name(self) -> str:
        return self.field

    def fit(self, corpus, context: FitContext = FitContext()) -> "FieldDocids":
        vocab = context.vocab
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
        rows = np.arange(len(corpus)) if rows is None else np.asarray(rows, dtype=np.int64)
        seqs = []
        for r in rows:
            text = self.field_text(corpus, int(r))
            ids = self._vocab.encode(text)[: self.max_tokens] if text else []
            if not ids:
                raise ValueError(f"document {corpus.doc_ids[int(r)]!r} has an empty {self.field}")
            seqs.append(ids)
        return DocidTable.from_lists(seqs, rows, DocidTokenSpace("text", self.text_vocab_size))

    def field_text(self, corpus, row: int) -> str:
        """The text that names document `row` (a subclass may rewrite the field, e.g. Ultron's URL docids)."""
        return getattr(corpus, f"{self.field}s")[row]

    def state(self):
        return {"field": self.field, "max_tokens": self.max_tokens, "text_vocab_size": self.text_vocab_size}, {}

    def load_state(self, meta, arrays) -> None:
        if meta["field"] != self.field:
            raise ValueError(f"saved {meta['field']} docids, configured {self.field} docids")
        self.max_tokens = int(meta["max_tokens"])
        self.text_vocab_size = int(meta["text_vocab_size"])


@gin.configurable
@dataclasses.dataclass
class KeywordDocids(DocidScheme):
    """GLEN phase 1 (002_glen.txt §3.3): the docid is the document's top-`n` vocabulary tokens by BM25 weight
    (term frequency in the document × inverse document frequency over the initial corpus), in decreasing
    weight, ties by token id. Tokens whose piece has no letter (digits, punctuation, the bare "▁") and special
    ids are dropped. `split_collisions` appends the tokenized collision number ("1", "2", ...) to the second,
    third, ... document that would share a docid. n = 3 for NQ320k, 7 for MS MARCO in the paper.
    `fixed_length` (GLEN's model): every docid exactly n tokens and no EOS (`DocidTokenSpace(length=n)`); a
    document with fewer than n distinct keyword tokens is an error naming it (collisions stay: GLEN ranks them
    apart at inference)."""

    n: Count = 3
    k1: float = 0.9
    b: float = 0.4
    split_collisions: bool = False
    fixed_length: bool = False
    name = "keywords"
    text_vocab_size: int = 0
    df: Optional[np.ndarray] = None  # document frequency of every vocabulary id over the initial corpus
    num_docs: int = 0
    avg_len: float = 0.0
    _vocab: object = dataclasses.field(default=None, repr=False)
    _seen: dict = dataclasses.field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.fixed_length and self.split_collisions:
            raise ValueError("KeywordDocids: split_collisions appends tokens, fixed_length forbids them; choose one")

    def fit(self, corpus, context: FitContext = FitContext()) -> "KeywordDocids":
        vocab = context.vocab
        if vocab is None:
            raise ValueError("keyword docids need the text vocabulary")
        self._vocab, self.text_vocab_size = vocab, int(vocab.size)
        df = np.zeros(vocab.size, np.int64)
        total = 0
        for text in corpus.texts:
            ids = vocab.encode(text)
            total += len(ids)
            df[np.unique(np.asarray(ids, np.int64))] += 1
        self.df, self.num_docs, self.avg_len = df, len(corpus), total / max(len(corpus), 1)
        self._seen = {}
        return self

    def bind(self, vocab) -> None:
        self._vocab = vocab

    def _allowed(self) -> np.ndarray:
        if not hasattr(self, "_allowed_cache") or len(self._allowed_cache) != self.text_vocab_size:
            ok = np.zeros(self.text_vocab_size, bool)
            for i in range(3, getattr(self._vocab, "base_size", self.text_vocab_size)):
                piece = self._vocab.id_to_piece(i) if hasattr(self._vocab, "id_to_piece") else self._vocab.decode([i])
                ok[i] = any(ch.isalpha() for ch in piece.replace("▁", ""))
            self._allowed_cache = ok
        return self._allowed_cache

    def keywords(self, text: str) -> list[int]:
        ids = np.asarray(self._vocab.encode(text), np.int64)
        ids = ids[self._allowed()[ids]] if ids.size else ids
        if not ids.size:
            return []
        tokens, tf = np.unique(ids, return_counts=True)
        idf = np.log(1.0 + (self.num_docs - self.df[tokens] + 0.5) / (self.df[tokens] + 0.5))
        norm = tf + self.k1 * (1 - self.b + self.b * len(ids) / max(self.avg_len, 1e-9))
        weight = idf * tf * (self.k1 + 1) / norm
        order = np.lexsort((tokens, -weight))
        return tokens[order[: self.n]].tolist()

    def assign(self, corpus, rows: Optional[Sequence[int]] = None, embeddings=None) -> DocidTable:
        if self._vocab is None or self.df is None:
            raise ValueError("KeywordDocids.assign before fit() (or bind(vocab) after loading)")
        rows = np.arange(len(corpus)) if rows is None else np.asarray(rows, dtype=np.int64)
        seqs = []
        for r in rows:
            kw = self.keywords(corpus.texts[int(r)])
            if not kw:
                raise ValueError(f"document {corpus.doc_ids[int(r)]!r} has no alphabetic token for a keyword docid")
            if self.fixed_length and len(kw) < self.n:
                raise ValueError(f"document {corpus.doc_ids[int(r)]!r} has {len(kw)} distinct keyword tokens, fewer "
                                 f"than KeywordDocids.n = {self.n} (fixed_length); lower n or drop the document")
            if self.split_collisions:
                key = tuple(kw)
                count = self._seen.setdefault(key, {})
                doc = corpus.doc_ids[int(r)]
                if doc not in count:
                    count[doc] = len(count)
                if count[doc]:
                    kw = kw + self._vocab.encode(str(count[doc]))
            seqs.append(kw)
        length = self.n if self.fixed_length else 0
        return DocidTable.from_lists(seqs, rows, DocidTokenSpace("text", self.text_vocab_size, length=length))

    def state(self):
        return ({"n": self.n, "k1": self.k1, "b": self.b, "split_collisions": self.split_collisions,
                 "fixed_length": self.fixed_length,
                 "text_vocab_size": self.text_vocab_size, "num_docs": self.num_docs, "avg_len": self.avg_len,
                 "seen": [[list(k), v] for k, v in self._seen.items()]}, {"df": self.df})

    def load_state(self, meta, arrays) -> None:
        self.n, self.k1, self.b = int(meta["n"]), float(meta["k1"]), float(meta["b"])
        self.split_collisions = bool(meta["split_collisions"])
        self.fixed_length = bool(meta.get("fixed_length", False))
        self.text_vocab_size, self.num_docs = int(meta["text_vocab_size"]), int(meta["num_docs"])
        self.avg_len = float(meta["avg_len"])
        self._seen = {tuple(k): dict(v) for k, v in meta["seen"]}
        self.df = np.asarray(arrays["df"])
