"""N-gram multi-docids (SEAL, 000 §5): every substring of a document identifies it; a model generates an
n-gram and the documents containing it are retrieved. The FM-index decoder that lets a model generate *any*
substring is a separate piece; this module gives the representation used to train and index such a model —
token n-grams of the document (optionally its title first) taken at a stride — and their statistics.

A document's docids are the spans `tokens[s : s + n]` for s = 0, stride, 2·stride, ... (the last span may be
shorter when the text is), at most `max_per_document`, duplicates within a document dropped. The primary
docid (the training target) is the first span, i.e. the document's beginning, or its title with
`title_first`. N-grams are shared by documents by design: `multi_docid_stats` reports how many identify one
document, which is what decides whether SEAL-style retrieval can tell documents apart.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Optional, Sequence

import gin
import numpy as np

from gr_jax.docids.base import DocidScheme, DocidTable, FitContext
from gr_jax.data.vocab import DocidTokenSpace
from gr_jax.runtime.validation import Count


@gin.configurable
@dataclasses.dataclass
class NgramDocids(DocidScheme):
    n: Count = 10
    stride: Count = 5
    max_per_document: Optional[int] = 64
    max_text_tokens: Count = 512
    title_first: bool = False
    name = "ngram"
    text_vocab_size: int = 0
    _vocab: object = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        if self.n < 1 or self.stride < 1:
            raise ValueError(f"NgramDocids: n and stride must be ≥ 1 (got n={self.n}, stride={self.stride})")

    def fit(self, corpus, context: FitContext = FitContext()) -> "NgramDocids":
        vocab = context.vocab
        if vocab is None:
            raise ValueError("n-gram docids need the text vocabulary")
        if self.title_first and corpus.titles is None:
            raise ValueError("NgramDocids(title_first=True): the corpus has no titles")
        self._vocab, self.text_vocab_size = vocab, int(vocab.size)
        return self

    def bind(self, vocab) -> None:
        self._vocab = vocab

    def spans(self, tokens: Sequence[int]) -> list[tuple[int, ...]]:
        """The n-grams of one token sequence at the stride (a text shorter than n gives itself)."""
        tokens = list(tokens)
        if len(tokens) <= self.n:
            return [tuple(tokens)] if tokens else []
        out, seen = [], set()
        for s in range(0, len(tokens) - self.n + self.stride, self.stride):
            span = tuple(tokens[s:s + self.n])
            if span and span not in seen:
                seen.add(span)
                out.append(span)
        return out

    def assign(self, corpus, rows: Optional[Sequence[int]] = None, embeddings=None) -> DocidTable:
        if self._vocab is None:
            raise ValueError("NgramDocids.assign before fit() (or bind(vocab) after loading)")
        rows = np.arange(len(corpus)) if rows is None else np.asarray(rows, dtype=np.int64)
        seqs, owners = [], []
        for r in rows.tolist():
            doc_spans = []
            if self.title_first:
                title = corpus.titles[r] if corpus.titles is not None else ""
                ids = tuple(self._vocab.encode(title)[: self.n]) if title else ()
                if ids:
                    doc_spans.append(ids)
            for span in self.spans(self._vocab.encode(corpus.texts[r])[: self.max_text_tokens]):
                if span not in doc_spans:
                    doc_spans.append(span)
            if self.max_per_document:
                doc_spans = doc_spans[: self.max_per_document]
            if not doc_spans:
                raise ValueError(f"n-gram docids: document {corpus.doc_ids[r]!r} has no text")
            seqs.extend(list(s) for s in doc_spans)
            owners.extend([r] * len(doc_spans))
        return DocidTable.from_lists(seqs, owners, DocidTokenSpace("text", self.text_vocab_size))

    def state(self):
        return {"n": self.n, "stride": self.stride, "max_per_document": self.max_per_document,
                "max_text_tokens": self.max_text_tokens, "title_first": self.title_first,
                "text_vocab_size": self.text_vocab_size}, {}

    def load_state(self, meta, arrays) -> None:
        self.n, self.stride = int(meta["n"]), int(meta["stride"])
        self.max_per_document = meta["max_per_document"]
        self.max_text_tokens, self.title_first = int(meta["max_text_tokens"]), bool(meta["title_first"])
        self.text_vocab_size = int(meta["text_vocab_size"])


def multi_docid_stats(table: DocidTable) -> dict:
    """Statistics of a multi-docid table: how many docids per document, how many distinct docids, the share
    of docids that point to exactly one document ("identifying"), documents reached per docid, and the share
    of documents that own at least one identifying docid."""
    owners: dict[tuple, set] = defaultdict(set)
    for i in range(len(table)):
        owners[tuple(table.sequence(i))].add(int(table.doc_rows[i]))
    reach = np.array([len(s) for s in owners.values()], np.int64) if owners else np.zeros(0, np.int64)
    docs = set(table.doc_rows.tolist())
    with_unique = {next(iter(s)) for s in owners.values() if len(s) == 1}
    per_doc = np.bincount(np.unique(table.doc_rows, return_inverse=True)[1]) if len(table) else np.zeros(0)
    return {"documents": len(docs), "docids": len(table), "distinct_docids": len(owners),
            "docids_per_document_mean": float(per_doc.mean()) if per_doc.size else 0.0,
            "identifying_fraction": float((reach == 1).mean()) if reach.size else 0.0,
            "documents_per_docid_mean": float(reach.mean()) if reach.size else 0.0,
            "documents_per_docid_max": int(reach.max()) if reach.size else 0,
            "documents_with_identifying_docid": len(with_unique) / max(len(docs), 1)}
