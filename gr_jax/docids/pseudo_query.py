"""Pseudo-query docids: a document is named by the text of queries about it, several per document (the docid
banks of Few-Shot GR, 003; docT5query-style generated queries). The first query of a document is its primary
docid (the training target); all of them go into the prefix tree, so generating any one retrieves it.

Where the queries come from (`source`):
* "train" — the judged queries of the dataset's training split (`prepare` passes them to `fit`);
* "file"  — `queries_file`: TSV `doc_id<TAB>query` lines, or JSONL lines `{"doc_id": ..., "query": ...}` /
  `{"doc_id": ..., "queries": [...]}` (generated queries, e.g. written by an LLM or a doc2query model; the
  file of `python -m gr_jax.pseudo_queries` is one, its first line the provenance).

Documents without a query (new documents of a dynamic corpus, or documents the source does not cover) get
the leading `max_tokens` tokens of their text when `fallback="leading"`, or an error with `fallback="error"`.
`assign` never refits: queries seen at `fit` (and those in the file) are the only ones used.

State: the queries actually held, as packed UTF-8 arrays (no pickle, no JSON blow-up for large corpora).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Optional, Sequence

import gin
import numpy as np

from gr_jax.data.readers import DataError, PackedStrings
from gr_jax.docids.base import DocidScheme, DocidTable, FitContext
from gr_jax.data.vocab import DocidTokenSpace
from gr_jax.runtime.validation import Count

log = logging.getLogger(__name__)

SOURCES = ("train", "file")
FALLBACKS = ("leading", "error")


def queries_by_document(dataset, split: str = "train", min_grade: int = 1) -> dict[str, list[str]]:
    """doc_id → the texts of the queries of `split` judged relevant to it (qrels order, duplicates kept once)."""
    if split not in dataset.queries:
        raise DataError(f"pseudo-query docids: the dataset has no {split!r} queries "
                        f"(it has {sorted(dataset.queries)})")
    text_of = dict(zip(dataset.queries[split].qids, dataset.queries[split].texts))
    out: dict[str, list[str]] = {}
    for qid, judged in dataset.qrels.get(split, {}).items():
        for doc, grade in sorted(judged.items()):
            if grade >= min_grade and qid in text_of:
                texts = out.setdefault(doc, [])
                if text_of[qid] not in texts:
                    texts.append(text_of[qid])
    return out


def read_queries_file(path: str | Path) -> dict[str, list[str]]:
    """TSV (`doc_id<TAB>query`) or JSONL (`doc_id` with `query` or `queries`); errors name file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: pseudo-query file not found")
    out: dict[str, list[str]] = {}
    jsonl = path.suffix in (".jsonl", ".json")
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if jsonl:
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{n}: not JSON ({e.msg})") from None
                if n == 1 and isinstance(obj, dict) and "built_from" in obj and "doc_id" not in obj:
                    continue  # the provenance line of `python -m gr_jax.pseudo_queries`
                if not isinstance(obj, dict) or "doc_id" not in obj or not ("query" in obj or "queries" in obj):
                    raise DataError(f"{path}:{n}: expected an object with 'doc_id' and 'query' or 'queries'")
                doc, texts = str(obj["doc_id"]), obj.get("queries", [obj.get("query")])
                if not isinstance(texts, list):
                    raise DataError(f"{path}:{n}: 'queries' must be a list of strings")
            else:
                parts = line.split("\t")
                if len(parts) != 2:
                    raise DataError(f"{path}:{n}: expected 'doc_id<TAB>query', got {len(parts)} fields")
                doc, texts = parts[0], [parts[1]]
            for t in texts:
                if not isinstance(t, str) or not t.strip():
                    raise DataError(f"{path}:{n}: empty query for document {doc!r}")
                held = out.setdefault(doc, [])
                if t.strip() not in held:
                    held.append(t.strip())
    return out


@gin.configurable
@dataclasses.dataclass
class PseudoQueryDocids(DocidScheme):
    source: str = "train"
    queries_file: Optional[str] = None
    per_document: Count = 5
    max_tokens: Count = 32
    fallback: str = "leading"
    split: str = "train"
    name = "pseudo_query"
    text_vocab_size: int = 0
    _queries: dict = dataclasses.field(default_factory=dict, repr=False)
    _vocab: object = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"PseudoQueryDocids.source must be one of {SOURCES}, got {self.source!r}")
        if self.fallback not in FALLBACKS:
            raise ValueError(f"PseudoQueryDocids.fallback must be one of {FALLBACKS}, got {self.fallback!r}")
        if self.source == "file" and not self.queries_file:
            raise ValueError("PseudoQueryDocids(source='file') needs queries_file")
        if self.per_document < 1:
            raise ValueError("PseudoQueryDocids.per_document must be ≥ 1")

    @property
    def uses_training_queries(self) -> bool:
        """Source "train": `prepare` passes the training split's queries to fit (FitContext.queries)."""
        return self.source == "train"

    def fit(self, corpus, context: FitContext = FitContext()) -> "PseudoQueryDocids":
        vocab, queries = context.vocab, context.queries
        if vocab is None:
            raise ValueError("pseudo-query docids need the text vocabulary")
        if self.source == "file":
            queries = read_queries_file(self.queries_file)
        elif queries is None:
            raise ValueError("pseudo-query docids with source 'train' need the training queries "
                             "(fit(corpus, FitContext(vocab, queries=queries_by_document(dataset))))")
        self._vocab, self.text_vocab_size = vocab, int(vocab.size)
        self._queries = {str(d): [t for t in ts if t.strip()][: self.per_document] for d, ts in queries.items()}
        covered = sum(1 for d in corpus.doc_ids if self._queries.get(d))
        log.info("pseudo-query docids: %d of %d documents have queries (%s)", covered, len(corpus), self.source)
        return self

    def bind(self, vocab) -> None:
        self._vocab = vocab

    def assign(self, corpus, rows: Optional[Sequence[int]] = None, embeddings=None) -> DocidTable:
        if self._vocab is None:
            raise ValueError("PseudoQueryDocids.assign before fit() (or bind(vocab) after loading)")
        rows = np.arange(len(corpus)) if rows is None else np.asarray(rows, dtype=np.int64)
        seqs, owners, fallbacks = [], [], 0
        for r in rows.tolist():
            doc = corpus.doc_ids[r]
            texts = self._queries.get(doc)
            if not texts:
                if self.fallback == "error":
                    raise ValueError(f"pseudo-query docids: document {doc!r} has no query "
                                     f"(source {self.source!r}); set fallback='leading' to use its text")
                texts, fallbacks = [corpus.texts[r]], fallbacks + 1
            done = set()
            for t in texts:
                ids = tuple(self._vocab.encode(t)[: self.max_tokens])
                if not ids:
                    raise ValueError(f"pseudo-query docids: document {doc!r} has an empty query or text")
                if ids not in done:
                    done.add(ids)
                    seqs.append(list(ids))
                    owners.append(r)
        if fallbacks:
            log.info("pseudo-query docids: %d documents without queries use their leading text", fallbacks)
        return DocidTable.from_lists(seqs, owners, DocidTokenSpace("text", self.text_vocab_size))

    def state(self):
        docs = sorted(self._queries)
        texts = [t for d in docs for t in self._queries[d]]
        counts = np.array([len(self._queries[d]) for d in docs], np.int64)
        doc_buf, doc_off = PackedStrings.from_list(docs).to_arrays()
        q_buf, q_off = PackedStrings.from_list(texts).to_arrays()
        meta = {"source": self.source, "per_document": self.per_document, "max_tokens": self.max_tokens,
                "fallback": self.fallback, "text_vocab_size": self.text_vocab_size}
        return meta, {"doc_utf8": doc_buf, "doc_offsets": doc_off, "query_utf8": q_buf, "query_offsets": q_off,
                      "counts": counts}

    def load_state(self, meta, arrays) -> None:
        self.per_document, self.max_tokens = int(meta["per_document"]), int(meta["max_tokens"])
        self.fallback, self.text_vocab_size = meta["fallback"], int(meta["text_vocab_size"])
        docs = list(PackedStrings.from_arrays(arrays["doc_utf8"], arrays["doc_offsets"]))
        texts = list(PackedStrings.from_arrays(arrays["query_utf8"], arrays["query_offsets"]))
        ends = np.cumsum(arrays["counts"]).tolist()
        starts = [0] + ends[:-1]
        self._queries = {d: texts[s:e] for d, s, e in zip(docs, starts, ends)}
