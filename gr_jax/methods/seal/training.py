"""SEAL's and MINDER's training pairs (the authors' dataset scripts, in token ids of the run's vocabulary).

Supervised, per (training query, relevant document):
  query + VIEW_TITLE → title TITLE_END                        `title_samples` copies (SEAL: 3)
  query + VIEW_BODY  → a span of `span_length` body tokens    `span_samples` spans (SEAL: 10 of 10 words)
  query + VIEW_QUERY → pseudo-query TITLE_END                 the first `query_samples` (MINDER: 5) other
                                                              than the query itself
A span starts at position i with probability softmax(m / temperature), m[i] the overlap of the body's trigram at
i with the query's trigrams (Σ over query positions of the share of the three tokens that agree; SEAL uses a
fuzzy character match of word trigrams), drawn with replacement.
Unsupervised, per training document (SEAL's `make_unsupervised_dataset`, MINDER's `make_generated_dataset`):
  body + VIEW_TITLE → title TITLE_END; a random span + VIEW_TITLE → title TITLE_END, or title + VIEW_BODY → a
  random span (even odds); `unsupervised_spans` × (a random span + VIEW_BODY → another random span); with
  pseudo-queries: a pseudo-query + VIEW_QUERY → another of the same document.
Span targets carry no EOS (keys are read from every level of the search, never ended); title and pseudo-query
targets end with TITLE_END, which ends their search. Every draw comes from a generator seeded by (seed, query
id, the document's identifier text): the pairs do not depend on the order of the data.
"""

from __future__ import annotations

import dataclasses
import logging
import zlib
import gin
import numpy as np

from gr_jax.methods.api import (
    Count,
    dsi_pairs,
    EOS_ID,
    ExampleStore,
    MixtureIterator,
    ObjectivesConfig,
    PAD_ID,
    pad_sequences,
    Positive,
    tokenize,
)
from gr_jax.methods.seal.docids import Markers, markers_of
from gr_jax.methods.seal.model import mark

log = logging.getLogger(__name__)


def split_views(identifier, markers: Markers) -> tuple[list, list, list]:
    """(title, body, pseudo-queries) of an identifier text (`docids` module docstring)."""
    ids = list(identifier)[1:]  # after DOC_START
    title = []
    if markers.title_end in ids and (markers.query_start not in ids
                                     or ids.index(markers.title_end) < ids.index(markers.query_start)):
        cut = ids.index(markers.title_end)
        title, ids = ids[:cut], ids[cut + 1:]
    body_end = ids.index(markers.query_start) if markers.query_start in ids else len(ids)
    body, rest, queries = ids[:body_end], ids[body_end:], []
    while rest:  # QUERY_START q TITLE_END ...
        end = rest.index(markers.title_end) if markers.title_end in rest else len(rest)
        queries.append(rest[1:end])
        rest = rest[end + 1:]
    return title, body, queries


def overlap_starts(body, query) -> np.ndarray:
    """m[i] of the module docstring for every start i of the body."""
    b, q = np.asarray(body), np.asarray(query)
    if not len(b) or not len(q):
        return np.zeros(len(b))
    pad = lambda x: np.concatenate([x, np.full(2, -1)])  # noqa: E731 (a trigram past the end matches nothing)
    tb = np.lib.stride_tricks.sliding_window_view(pad(b), 3)
    tq = np.lib.stride_tricks.sliding_window_view(pad(q), 3)
    agree = (tb[:, None, :] == tq[None, :, :]) & (tb[:, None, :] >= 0)
    return agree.mean(axis=-1).sum(axis=-1)


def _content(identifier) -> int:
    """A document's seed part: its identifier text (never its row, which depends on the corpus order)."""
    return zlib.crc32(np.asarray(identifier, np.int64).tobytes())


def _rng(seed: int, *parts) -> np.random.Generator:
    return np.random.default_rng([seed] + [zlib.crc32(str(p).encode()) for p in parts])


@gin.configurable
@dataclasses.dataclass
class SealPairs(ObjectivesConfig):
    """SEAL's (and with pseudo-queries MINDER's) training data; the objectives config of `prepare`. Given pairs
    (`examples`: SEAL++'s continued training), a document pair (no query ids: DSI's indexing pairs) gives the
    document's unsupervised pairs, a query pair its supervised ones."""

    supervised_rate: float = 1.0
    unsupervised_rate: float = 1.0
    title_samples: int = 3  # each of these four: 0 turns the pairs off
    span_samples: int = 10
    span_length: Count = 10
    query_samples: int = 5
    unsupervised_spans: int = 3
    temperature: Positive = 1.0
    # which pseudo-queries become targets: 'first' (MINDER: the first query_samples other than the query), or
    # 'overlap' (query_samples drawn with replacement, P ∝ softmax(tokens shared with the query / temperature):
    # for the document's own units, SealDocids.units, as spans are drawn)
    query_sampling: str = "first"

    def __post_init__(self):
        if self.query_sampling not in ("first", "overlap"):
            raise ValueError(f"SealPairs.query_sampling must be 'first' or 'overlap', got {self.query_sampling!r}")
    refresh_period = 0

    def _span(self, body, start: int):
        return body[start: start + self.span_length]

    def supervised(self, qid: str, query_ids, identifier, row: int, m: Markers, seed: int) -> list:
        """(input ids, marker, target ids) of one (query, relevant document) pair."""
        title, body, queries = split_views(identifier, m)
        out = []
        if title:
            out += [(query_ids, m.view_title, title + [m.title_end])] * self.title_samples
        if body:
            w = overlap_starts(body, query_ids) / self.temperature
            p = np.exp(w - w.max())
            starts = _rng(seed, "span", qid, _content(identifier)).choice(len(body), size=self.span_samples,
                                                                           p=p / p.sum())
            out += [(query_ids, m.view_body, self._span(body, int(s))) for s in starts]
        others = [q for q in queries if q != list(query_ids)]  # never the query itself
        if self.query_sampling == "overlap" and others and self.query_samples:
            shared = np.array([len(set(q) & set(query_ids)) for q in others], float) / self.temperature
            p = np.exp(shared - shared.max())
            picks = _rng(seed, "query", qid, _content(identifier)).choice(len(others), size=self.query_samples,
                                                                          p=p / p.sum())
            others = [others[int(i)] for i in picks]
        for q in others[: self.query_samples]:
            out.append((query_ids, m.view_query, q + [m.title_end]))
        return out

    def unsupervised(self, identifier, row: int, m: Markers, seed: int) -> list:
        title, body, queries = split_views(identifier, m)
        rng, out = _rng(seed, "unsupervised", _content(identifier)), []
        if not body:
            return out
        span = lambda: self._span(body, int(rng.integers(len(body))))  # noqa: E731
        if title:
            out.append((body, m.view_title, title + [m.title_end]))
            if rng.random() < 0.5:
                out.append((span(), m.view_title, title + [m.title_end]))
            else:
                out.append((title, m.view_body, span()))
        out += [(span(), m.view_body, span()) for _ in range(self.unsupervised_spans)]
        if len(queries) >= 2:
            a, b = rng.choice(len(queries), size=2, replace=False)
            out.append((queries[a], m.view_query, queries[b] + [m.title_end]))
        return out

    def _store(self, examples: list, lengths: dict, name: str) -> ExampleStore:
        inputs = pad_sequences([x for x, _, _ in examples], lengths["inputs"], add_eos=True, dtype=np.int32)
        inputs = np.stack([mark(inputs[i:i + 1], marker)[0] for i, (_, marker, _) in enumerate(examples)])
        cut = sum(len(t) > lengths["targets"] for _, _, t in examples)
        if cut:
            log.warning("%s: %d of %d targets are longer than TASK_FEATURE_LENGTHS['targets'] = %d and were cut",
                        name, cut, len(examples), lengths["targets"])
        targets = pad_sequences([t for _, _, t in examples], lengths["targets"], add_eos=False, dtype=np.int32)
        return ExampleStore({"inputs": inputs, "targets": targets})

    @staticmethod
    def _identifiers(table):
        if table is None or table.index_kind != "substrings":
            raise ValueError("SealPairs needs SEAL identifier texts: prepare.docid_scheme = @SealDocids()")
        where = {int(r): i for i, r in enumerate(table.doc_rows.tolist())}
        return markers_of(table), lambda row: table.sequence(where[int(row)])

    def _examples(self, pairs, table, vocab, lengths, seed: int) -> list:
        m, identifier = self._identifiers(table)
        if pairs.qids is None:  # document → itself
            return [x for row in sorted(set(pairs.rows.tolist())) for x in self.unsupervised(identifier(row), row, m,
                                                                                              seed)]
        qtok = tokenize(pairs.texts, vocab, lengths["inputs"], what=f"SEAL {pairs.name} queries")
        out = []
        for qid, row, toks in zip(pairs.qids, pairs.rows.tolist(), qtok):
            ids = [int(t) for t in toks if t not in (PAD_ID, EOS_ID)]
            out += self.supervised(qid, ids, identifier(row), row, m, seed)
        return out

    def examples(self, pairs, table, vocab, lengths: dict) -> ExampleStore:
        examples = self._examples(pairs, table, vocab, lengths, seed=0)
        if not examples:
            raise ValueError(f"SealPairs: the {pairs.name} pairs give no training example (empty documents?)")
        return self._store(examples, lengths, f"seal-{pairs.name}")

    def iterator(self, inp) -> MixtureIterator:
        table = inp.table
        self._identifiers(table)  # refuses a table without identifier texts before any work
        data = inp.dataset
        stores, rates, names = [], [], []
        if self.supervised_rate > 0:
            if inp.train_split not in data.queries:
                raise ValueError(f"the dataset has no query split {inp.train_split!r} (TRAIN_SPLIT); it has "
                                 f"{sorted(data.queries)}")
            pairs = dsi_pairs.query_pairs(data.queries[inp.train_split], data.qrels[inp.train_split], data.corpus,
                                          restrict_rows=table.doc_rows)
            examples = self._examples(pairs, table, inp.vocab, inp.lengths, inp.seed)
            if examples:
                stores.append(self._store(examples, inp.lengths, "seal-supervised"))
                rates.append(self.supervised_rate)
                names.append("seal-supervised")
        if self.unsupervised_rate > 0:
            pairs = dsi_pairs.indexing_pairs(data.corpus, np.unique(table.doc_rows))
            examples = self._examples(dataclasses.replace(pairs, qids=None), table, inp.vocab, inp.lengths, inp.seed)
            if examples:
                stores.append(self._store(examples, inp.lengths, "seal-unsupervised"))
                rates.append(self.unsupervised_rate)
                names.append("seal-unsupervised")
        if not stores:
            raise ValueError("SealPairs: no training pairs (both rates 0, or no queries and no documents)")
        log.info("training examples: %s", {n: len(s) for n, s in zip(names, stores)})
        return MixtureIterator(stores, inp.batch_size, seed=inp.seed, rates=rates, names=names)
