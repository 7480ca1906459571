"""SEAL's and MINDER's retrieval: n-grams generated under the substring index, one search per view, documents
scored from them by SEAL's intersective scoring (`device_ranker` by default, `ranker.rank_documents` on the host).

Per batch of queries and per view, the model reads the query marked with the view (SEAL's ` || body`,
` || title`; MINDER adds ` || query`: `mark`) and the shared beam search runs under the view's constraint:

  body    any n-gram of an identifier text, up to `body_length` tokens;
  title   DOC_START, then up to `title_length` tokens ending in TITLE_END;
  query   QUERY_START, then up to `query_length` tokens ending in TITLE_END (MINDER's pseudo-query view).

The keys of a view are, as in SEAL's beam search, the best 2N candidates of every step while N beams go on
(`key_candidates` 2; SEAL's `keep_history`): n-grams of every length, and the finished titles among them.

A key's score is the sum of its tokens' log-probabilities (score mode log_softmax, no length penalty: SEAL
rescores its keys to exactly this). Its frequency and occurrences come from the index on the device; the keys
are gathered on the host, and the scoring of documents runs after the searches (on the device by default,
`SealSearch.scorer`; the host scorer is its oracle), with SEAL's unigram bonus (the first decoding step's
token probabilities under the body view) and first pass (`ranker`). A key found by two views is kept once, at its
best score. As SEAL's `add_query_to_keys`, the query's own spans of up to `query_keys` tokens that occur in the
index are keys too, scored by teacher forcing under the body view (SEAL: spans of 1–3 words and their
capitalisations). MINDER sums the views' keys in one pool (the identifier text holds every view); `query_view_boost`
adds MINDER's constant to pseudo-query keys (its code: +14, capped at −1; 0 here by default, since our
pseudo-query targets end with TITLE_END, which MINDER's did not score in training).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Optional

import gin
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.api import (
    one_of,
    Capabilities,
    Count,
    DecoderOnlyRetriever,
    DeviceSubstrings,
    EOS_ID,
    Fraction,
    GenerativeRetriever,
    PAD_ID,
    Positive,
    rankers,
    SubstringIndex,
)
from gr_jax.methods.seal.device_ranker import DeviceScorer
from gr_jax.methods.seal.docids import Markers, markers_of
from gr_jax.methods.seal.ranker import Key, best_unigrams, rank_documents, type_scores

log = logging.getLogger(__name__)

VIEWS = ("body", "title", "query")
DOCUMENT_SCORES = ("intersective", "best_key")
SCORERS = ("device", "host")
Scorer = one_of(*SCORERS)  # checked when gin binds it, before a command does any work


def mark(tokens_BxL: np.ndarray, marker) -> np.ndarray:
    """Each row with `marker` (an id, or a sequence of ids: a spelled view marker) before its EOS (the row's last
    tokens dropped where it is full)."""
    t = np.asarray(tokens_BxL)
    seq = (int(marker),) if np.ndim(marker) == 0 else tuple(int(x) for x in marker)
    B, L = t.shape
    out = np.full((B, L), PAD_ID, t.dtype if np.iinfo(t.dtype).max >= max(seq) else np.int32)
    for b in range(B):
        row = t[b]
        end = np.flatnonzero((row == EOS_ID) | (row == PAD_ID))
        n = min(int(end[0]) if len(end) else L, L - 1 - len(seq))
        out[b, :n] = row[:n]
        out[b, n: n + len(seq)] = seq
        out[b, n + len(seq)] = EOS_ID
    return out


@gin.configurable
@dataclasses.dataclass
class SealSearch:
    """What SEAL (and MINDER) search and how keys score; defaults are the authors' (SEAL's `SEALSearcher`)."""

    views: tuple = ("body", "title")  # MINDER: ("body", "title", "query")
    # generated tokens: SEAL's max_length 10 / 15 / 30 count the decoder's start token and the EOS that
    # transformers forces at max_length - 1 (MINDER's pseudo-query also its forced ` ||`)
    body_length: Count = 8
    title_length: Count = 13
    query_length: Count = 27
    # the keys of a step: its best key_candidates × beams candidates, finished titles among them (SEAL: the top 2N
    # of every step while N beams go on); 1: the alive beams of every level and the N best finished titles
    key_candidates: Count = 2
    max_hits: Count = 1500  # keys occurring more often make no candidates
    smoothing: Positive = 5.0
    score_exponent: Positive = 2.0
    repetition_penalty: Fraction = 0.8
    query_view_boost: float = 0.0
    query_keys: int = 3  # SEAL's add_query_to_keys: the query's own spans of 1..query_keys tokens (0: off)
    # 'intersective': SEAL's LM+FM scoring; 'best_key': a document ranks by the best log P(n | q) of the keys it
    # holds (000 Fig. 2's fixed-position units: a document ranks by its highest-ranked unit)
    document_score: str = "intersective"
    # SEAL's unigram bonus (`ranker` docstring): the types of the first decoding step under the body view score
    # the positions no key took, and the best of them join the keys; over the `top_k_unigrams` most probable
    unigram_bonus: bool = True
    best_unigrams: bool = True
    top_k_unigrams: Count = 5000
    fully_score: Count = 1500  # candidates of SEAL's first pass that are scored fully
    # where the intersective scoring runs: 'device' (`device_ranker`, a batch of queries in one program) or
    # 'host' (`ranker.rank_documents`, numpy, one query at a time; the oracle the device scoring is tested against)
    scorer: Scorer = "device"
    scorer_batch: Count = 16  # queries per device scoring call (its memory grows with it)

    def __post_init__(self):
        if self.scorer not in SCORERS:
            raise ValueError(f"SealSearch.scorer must be one of {SCORERS}, got {self.scorer!r}")
        if self.document_score not in DOCUMENT_SCORES:
            raise ValueError(f"SealSearch.document_score must be one of {DOCUMENT_SCORES}, got "
                             f"{self.document_score!r}")
        self.views = tuple(self.views)
        bad = [v for v in self.views if v not in VIEWS]
        if bad or not self.views:
            raise ValueError(f"SealSearch.views must be a non-empty subset of {VIEWS}, got {self.views}")


@functools.partial(jax.jit, static_argnums=2)
def _occurrences(dev: DeviceSubstrings, states, max_occurrences: int):
    return dev.occurrences(states, max_occurrences)


@jax.jit
def _counts(dev: DeviceSubstrings, states):
    return dev.counts(states)


@jax.jit
def _walk(dev: DeviceSubstrings, ngrams, lengths):
    return dev.walk(ngrams, lengths)


@dataclasses.dataclass(frozen=True)
class SealScoring:
    """The ranker a SEAL-family model ranks with, as result files record it (`"ranker"`): documents scored from
    the generated keys (SealSearch.scorer: `DeviceScorer` or `rank_documents`; or the best key), not from the
    beams. Not callable on beams: `GenerativeRetriever.ranker` bound for a SEAL model is refused (it would go
    unused)."""

    document_score: str
    smoothing: float
    score_exponent: float
    repetition_penalty: float
    max_hits: int
    unigram_bonus: bool = True
    best_unigrams: bool = True
    top_k_unigrams: int = 5000
    fully_score: int = 1500
    scorer: str = "device"  # SealSearch.scorer: where the intersective scoring ran

    def __call__(self, *args, **kwargs):
        raise ValueError("SealScoring scores documents from keys, not beams: use the model's rank")


def _pad_rows(a: np.ndarray, rows: int, value=0) -> np.ndarray:
    return np.concatenate([a, np.full((rows - len(a), *a.shape[1:]), value, a.dtype)]) if rows > len(a) else a


class _SealRanking:
    """`rank` by SEAL's keys and scoring; mixed into a backbone's retriever class."""

    def __init__(self, config, head=None, score_mode: str = "log_softmax", length_penalty: float = 0.0, *,
                 search: Optional[SealSearch] = None, **kwargs):
        super().__init__(config, head, score_mode, length_penalty, **kwargs)  # the backbone's retriever
        self.search = search
        self._check_seal()

    def _check_seal(self):
        if self.score_mode != "log_softmax" or self.length_penalty != 0.0:
            raise ValueError(f"{type(self).__name__}: SEAL's key scores are log P(n | q), which needs "
                             f"score_mode='log_softmax' and length_penalty=0 (got {self.score_mode!r}, "
                             f"{self.length_penalty})")
        self.search = self.search if self.search is not None else SealSearch()
        if type(self.ranker) is not rankers.FirstOccurrence:
            raise ValueError(f"{type(self).__name__} ranks documents by SEAL's scoring of its keys; the bound "
                             f"GenerativeRetriever.ranker ({type(self.ranker).__name__}) would go unused: remove it "
                             f"(SealSearch.document_score chooses the scoring)")
        s = self.search
        self.ranker = SealScoring(s.document_score, s.smoothing, s.score_exponent, s.repetition_penalty, s.max_hits,
                                  s.unigram_bonus, s.best_unigrams, s.top_k_unigrams, s.fully_score, s.scorer)
        self._markers: Optional[Markers] = None
        self._identifiers = None
        self._device_scorer: Optional[DeviceScorer] = None

    @property
    def capabilities(self) -> Capabilities:
        """The backbone's, without `traced_search`: SEAL's keys are gathered on the host between the searches and
        the scoring."""
        return dataclasses.replace(super().capabilities, traced_search=False)

    def beam_documents(self, params, query_tokens_BxL, index, num_beams: int = 15):
        raise ValueError(f"{type(self).__name__} gathers n-gram keys on the host between its searches and its "
                         f"scoring: its ranking is not one traceable search; use rank")

    def describe(self) -> str:
        s = self.search
        return (f"{type(self).__name__}(views={','.join(s.views)}, lengths={s.body_length}/{s.title_length}/"
                f"{s.query_length}, key_candidates={s.key_candidates}, query_keys={s.query_keys}, max_hits={s.max_hits}, exponent={s.score_exponent}, "
                f"repetition_penalty={s.repetition_penalty}, query_view_boost={s.query_view_boost}, "
                f"smoothing={s.smoothing}, document_score={s.document_score}, unigram_bonus={s.unigram_bonus}, "
                f"best_unigrams={s.best_unigrams}, top_k_unigrams={s.top_k_unigrams}, fully_score={s.fully_score}, "
                f"scorer={s.scorer})")

    def use_docids(self, table) -> None:
        if table.index_kind != "substrings":
            raise ValueError(f"{type(self).__name__} retrieves with a substring index; its docid scheme must make "
                             f"identifier texts (prepare.docid_scheme = @SealDocids())")
        self._markers = markers_of(table)
        where = np.full(int(table.doc_rows.max()) + 1 if len(table) else 0, -1, np.int64)
        where[table.doc_rows] = np.arange(len(table))
        seqs = table.sequences  # int32
        self._identifiers = (where, np.where(np.arange(seqs.shape[1]) < table.lengths[:, None], seqs, -1))
        self._device_scorer = None  # built at the first device scoring of this table
        self._warn_unreachable(self._identifiers[1])

    def _warn_unreachable(self, ids_NxW: np.ndarray) -> None:
        """A title (pseudo-query) that needs more tokens than the view generates cannot be found by that view:
        the documents it names are then found by body keys only. Said at index time, with the count and the
        length that reaches them all."""
        m, s = self._markers, self.search
        for view, start, limit in (("title", m.doc_start, s.title_length), ("query", m.query_start, s.query_length)):
            if view not in s.views:
                continue
            N, W = ids_NxW.shape
            flat = ids_NxW.reshape(-1)
            opens, ends = np.flatnonzero(flat == start), np.flatnonzero(flat == m.title_end)
            nxt = np.searchsorted(ends, opens)  # each segment's TITLE_END: the first after its start, in its row
            closed = nxt < len(ends)
            opens, close = opens[closed], ends[nxt[closed]]
            same = close // W == opens // W
            longest = np.zeros(N, np.int64)  # per document, its longest segment's tokens and TITLE_END
            np.maximum.at(longest, opens[same] // W, (close - opens)[same])
            over = int((longest > limit).sum())
            if over:
                log.warning("SEAL %s view: %d of %d documents have a %s longer than SealSearch.%s_length = %d "
                            "tokens (the longest needs %d): the %s view cannot generate it, so those documents are "
                            "found by body keys only; set SealSearch.%s_length = %d to reach them all", view, over,
                            len(ids_NxW), "title" if view == "title" else "pseudo-query", view, limit,
                            int(longest.max()), view, view, int(longest.max()))

    @property
    def markers(self) -> Markers:
        if self._markers is None:
            raise ValueError(f"{type(self).__name__}: no identifier table yet (use_docids)")
        return self._markers

    def _view(self, view: str):
        """(input marker, index.device arguments, keys from history?) of a view."""
        m, s = self.markers, self.search
        if view == "body":
            return m.view_body, dict(max_length=s.body_length), True
        if view == "title":
            return m.view_title, dict(max_length=s.title_length, prefix=(m.doc_start,), end_token=m.title_end), False
        return m.view_query, dict(max_length=s.query_length, prefix=(m.query_start,), end_token=m.title_end), False

    def keys(self, params, query_tokens_BxL, index: SubstringIndex, num_beams: int = 15):
        """Per query, {key tokens: (score, count, rows, starts, view)} over the configured views; rows/starts are
        None for keys occurring more than max_hits times; view: the view whose search gave the best score (the
        query's own spans: "body")."""
        B = len(query_tokens_BxL)
        out = [dict() for _ in range(B)]
        width = self.search.key_candidates * num_beams if self.search.key_candidates > 1 else 0
        for view in self.search.views:
            marker, args, history = self._view(view)
            dev = index.device(**args)
            prefix = tuple(args.get("prefix", ()))
            history = history or bool(width)  # SEAL: the top 2N of every step, finished titles too
            res = self.searcher(num_beams, keep_history=history, history_width=width).search(
                params, mark(query_tokens_BxL, marker), dev)
            if history:
                h = res.history
                T, N = h.scores.shape[1:]
                tokens = np.asarray(h.tokens).reshape(B, T * N, -1)
                lengths = np.broadcast_to(np.arange(1, T + 1)[:, None], (T, N)).reshape(-1)
                lengths = np.broadcast_to(lengths, (B, T * N))
                scores, valid = np.asarray(h.scores).reshape(B, -1), np.asarray(h.valid).reshape(B, -1)
                if view != "body":  # a title or pseudo-query key is a finished one (it ends in TITLE_END)
                    valid = valid & (np.asarray(h.leaf).reshape(B, -1) >= 0)
                states = jax.tree_util.tree_map(lambda x: x.reshape(B, T * N), h.states)
            else:
                tokens, lengths = np.asarray(res.tokens), np.asarray(res.lengths)
                scores, valid, states = np.asarray(res.scores), np.asarray(res.valid), res.states
            counts = np.asarray(_counts(dev, states))
            rare = valid & (counts <= self.search.max_hits)
            most = int(counts[rare].max()) if rare.any() else 1
            rows, starts, ok = (np.asarray(a) for a in
                                _occurrences(dev, states, 1 << max(most - 1, 0).bit_length()))
            boost = view == "query" and self.search.query_view_boost
            for b in range(B):
                for k in np.flatnonzero(valid[b]):
                    key = prefix + tuple(tokens[b, k, : lengths[b, k]].tolist())
                    score = float(scores[b, k])
                    if boost:
                        score = min(score + self.search.query_view_boost, -1.0)
                    if key in out[b] and out[b][key][0] >= score:
                        continue
                    found = (rows[b, k][ok[b, k]], starts[b, k][ok[b, k]]) if rare[b, k] else None
                    out[b][key] = (score, int(counts[b, k]), *(found or (None, None)), view)
        if self.search.query_keys:
            self._query_keys(params, np.asarray(query_tokens_BxL), index, out)
        return out

    def _query_keys(self, params, query_tokens_BxL, index: SubstringIndex, out: list) -> None:
        """Adds each query's own spans that occur in the index (SEAL's add_query_to_keys)."""
        K, m = self.search.query_keys, self.markers
        spans, owner = [], []
        for b, row in enumerate(query_tokens_BxL):
            ids = [int(t) for t in row if t not in (PAD_ID, EOS_ID)]
            grams = dict.fromkeys(tuple(ids[i:i + n]) for n in range(1, K + 1) for i in range(len(ids) - n + 1))
            spans += list(grams)
            owner += [b] * len(grams)
        if not spans:
            return
        rows = 1 << (len(spans) - 1).bit_length()  # few compiled shapes
        grams = _pad_rows(np.array([g + (0,) * (K - len(g)) for g in spans], np.int32), rows)
        lengths = _pad_rows(np.array([len(g) for g in spans], np.int32), rows)
        dev = index.device(K)
        states = _walk(dev, grams, lengths)
        counts = np.asarray(_counts(dev, states))[: len(spans)]
        found = np.flatnonzero(counts > 0)
        if not len(found):
            return
        pick = _pad_rows(found, 1 << (len(found) - 1).bit_length())
        inputs = mark(query_tokens_BxL, m.view_body)[np.asarray(owner)[pick]]
        targets = np.where(np.arange(K) < lengths[pick][:, None], grams[pick], PAD_ID).astype(np.int32)
        scores = np.asarray(self.score(params, inputs, targets))
        sub = jax.tree_util.tree_map(lambda x: x[pick], states)
        rare = counts[found] <= self.search.max_hits
        most = int(counts[found][rare].max()) if rare.any() else 1
        occ_rows, occ_starts, ok = (np.asarray(a) for a in _occurrences(dev, sub, 1 << max(most - 1, 0).bit_length()))
        for j, i in enumerate(found.tolist()):
            key, b = spans[i], owner[i]
            if key in out[b] and out[b][key][0] >= scores[j]:
                continue
            hit = (occ_rows[j][ok[j]], occ_starts[j][ok[j]]) if rare[j] else (None, None)
            out[b][key] = (float(scores[j]), int(counts[i]), *hit, "body")

    def ranked(self, params, query_tokens_BxL, index: SubstringIndex, num_beams: int = 15,
               with_keys: bool = True) -> list:
        """Per query, [(document row, score, [(key tokens, F(n), view), ...])] of every document with a positive
        SEAL score, best first; each document's keys are those that counted for it, in the greedy order (what
        LTRGR's rank data stores)."""
        s = self.search
        queries, all_items = self.scoring_inputs(params, query_tokens_BxL, index, num_beams)
        if s.document_score == "best_key":
            return [_best_key(items) for items in all_items]
        ranked_all = self.score_documents(queries, index.num_positions, with_keys, s.scorer)
        out = []
        for (ks, _, _), items, ranked in zip(queries, all_items, ranked_all):
            if not with_keys:
                out.append([(r, v, []) for r, v in ranked])
                continue
            out.append([(r, v, [(ks[i].tokens, ks[i].count, items[i][1][4]) for i in taken])
                        for r, v, taken in ranked])
        return out

    def scoring_inputs(self, params, query_tokens_BxL, index: SubstringIndex, num_beams: int = 15):
        """(per query (keys, found, types) as `rank_documents` takes them — empty for 'best_key' —, per query its
        sorted {key tokens: (score, count, rows, starts, view)} items, SEAL's best unigrams added)."""
        s = self.search
        unigrams = None
        if s.unigram_bonus and s.document_score == "intersective":
            unigrams = np.asarray(self._first_step(params, mark(query_tokens_BxL, self.markers.view_body)))
        queries, all_items = [], []
        for b, keys in enumerate(self.keys(params, query_tokens_BxL, index, num_beams)):
            items = sorted(keys.items())  # key order never changes a score (ties broken by tokens)
            all_items.append(items)
            if s.document_score == "best_key":
                continue
            ks = [Key(t, v[0], v[1]) for t, v in items]
            found = [None if v[2] is None else (v[2], v[3]) for _, v in items]
            types = None if unigrams is None else self._types(unigrams[b], ks, index)
            if types is not None and s.best_unigrams:
                extra = self._unigram_keys(types, len(ks), index)
                ks += [k for k, _ in extra]
                found += [f for _, f in extra]
                # a body key to LTRGR
                items += [((k.tokens[0],), (k.weight, k.count, None, None, "body")) for k, _ in extra]
            queries.append((ks, found, types))
        return queries, all_items

    def score_documents(self, queries: list, positions: int, with_keys: bool, scorer: str) -> list:
        """SEAL's intersective scoring of `scoring_inputs`' queries by `scorer` ('device': `DeviceScorer`, batches
        of SealSearch.scorer_batch queries; 'host': `rank_documents` query by query)."""
        s = self.search
        if scorer not in SCORERS:
            raise ValueError(f"score_documents: scorer must be one of {SCORERS}, got {scorer!r}")
        if self._identifiers is None:
            raise ValueError(f"{type(self).__name__}: no identifier table yet (use_docids)")
        options = dict(max_hits=s.max_hits, smoothing=s.smoothing, exponent=s.score_exponent,
                       beta=s.repetition_penalty, matched=with_keys, fully_score=s.fully_score)
        if scorer == "host":
            return [rank_documents(ks, found, self._documents, positions, types=types, **options)
                    for ks, found, types in queries]
        if self._device_scorer is None:
            self._device_scorer = DeviceScorer(*self._identifiers)
        out = []
        for start in range(0, len(queries), s.scorer_batch):
            out += self._device_scorer.rank(queries[start: start + s.scorer_batch], positions, batch=s.scorer_batch,
                                            **options)
        return out

    def _first_step(self, params, inputs_BxL):
        """log P(t | q) of every token at the first decoding step [B, V] (SEAL's unigram scores: the body view)."""
        start = np.full((len(inputs_BxL), 1), self.config.decoder_start_token_id, np.int32)
        return _first_step_log_probs(self, params, np.asarray(inputs_BxL, np.int32), start)

    def _types(self, log_probs: np.ndarray, keys: list, index: SubstringIndex) -> np.ndarray:
        m = self.markers
        excluded = {PAD_ID, EOS_ID, *m.special}
        excluded |= {k.tokens[0] for k in keys if len(k.tokens) == 1}
        s = self.search
        return type_scores(log_probs[: index.vocab_size], index.token_counts(), index.num_positions, excluded,
                           s.top_k_unigrams, s.smoothing)

    def _unigram_keys(self, types: np.ndarray, n: int, index: SubstringIndex) -> list:
        """SEAL's best unigrams as keys of weight u(t), with their occurrences where rare (positive u only)."""
        best = [t for t in best_unigrams(types, n) if types[t] > 0]
        if not best:
            return []
        dev = index.device(1)
        grams = np.asarray(best, np.int32)[:, None]
        states = _walk(dev, _pad_rows(grams, 1 << (len(best) - 1).bit_length()),
                       _pad_rows(np.ones(len(best), np.int32), 1 << (len(best) - 1).bit_length()))
        counts = np.asarray(_counts(dev, states))[: len(best)]
        rare = counts <= self.search.max_hits
        most = int(counts[rare].max()) if rare.any() else 1
        rows, starts, ok = (np.asarray(a) for a in _occurrences(dev, states, 1 << max(most - 1, 0).bit_length()))
        return [(Key((t,), 0.0, int(c), weight=float(types[t])), (rows[j][ok[j]], starts[j][ok[j]]) if r else None)
                for j, (t, c, r) in enumerate(zip(best, counts.tolist(), rare.tolist()))]

    def rank(self, params, query_tokens_BxL, index: SubstringIndex, num_beams: int = 15):
        """(query, document row, score) arrays: every document with a positive SEAL score (with 'best_key': every
        document holding a key that occurs at most max_hits times)."""
        q, d, sc = [], [], []
        for b, ranked in enumerate(self.ranked(params, query_tokens_BxL, index, num_beams, with_keys=False)):
            q += [b] * len(ranked)
            d += [r for r, _, _ in ranked]
            sc += [v for _, v, _ in ranked]
        return np.asarray(q, np.int64), np.asarray(d, np.int64), np.asarray(sc, np.float32)

    def _documents(self, rows: np.ndarray) -> np.ndarray:
        """Identifier tokens of corpus rows [len(rows), W], −1 past each one's end."""
        where, seqs = self._identifiers
        rows = np.asarray(rows, np.int64)
        at = where[np.minimum(rows, len(where) - 1)] if len(where) else np.full(len(rows), -1)
        missing = rows[(rows >= len(where)) | (at < 0)]
        if len(missing):
            raise ValueError(f"{type(self).__name__}: corpus rows {missing[:5].tolist()} have no identifier text in "
                             f"the docid table given to use_docids (the index and the table are of different "
                             f"corpora); build both from one")
        return seqs[at]


@functools.partial(jax.jit, static_argnums=0)
def _first_step_log_probs(model, params, inputs_BxL, start_Bx1):
    hidden = model._hidden(params, inputs_BxL, start_Bx1)
    return jax.nn.log_softmax(model.head.logits(model.network, params, hidden)[:, 0].astype(jnp.float32), axis=-1)


def _best_key(items) -> list:
    """[(row, score, [(the best key, F(n), view)])]: each document at the best score of the keys it holds (keys
    with their occurrences: F(n) ≤ max_hits), best first, ties by row; keys in token order, so a tie between
    two keys of one document keeps the first in that order."""
    best = {}
    for tokens, (score, count, rows, _, view) in items:
        if rows is None:
            continue
        for r in np.unique(rows).tolist():
            if r not in best or score > best[r][0]:
                best[r] = (score, [(tokens, count, view)])
    return sorted(((r, v, k) for r, (v, k) in best.items()), key=lambda x: (-x[1], x[0]))


@gin.configurable
class SealRetriever(_SealRanking, GenerativeRetriever):
    """SEAL / MINDER on a T5 (from scratch or imported from HF)."""


@gin.configurable
class SealDecoderOnly(_SealRanking, DecoderOnlyRetriever):
    """SEAL / MINDER on a decoder-only LM (SmolLM2): [query + view marker, BOS, n-gram] as one sequence."""
