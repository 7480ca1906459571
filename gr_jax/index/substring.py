"""A substring index over the token ids of a corpus: any n-gram of any document is an identifier (SEAL, MINDER,
000 §5), answered on the device inside the jitted beam search.

Design: suffix arrays, one per *segment*. A segment holds documents as one token array, each document followed
by a separator (the value `vocab_size`, sorting after every token, never generated), so no n-gram crosses a
document boundary; its suffix array lists the start positions of every suffix that starts with a token, in
lexicographic order. The suffixes that start with an n-gram g form one range [lo, hi) of the suffix array, and
within it the tokens that follow g are sorted — so the children of g are consecutive sub-ranges. A beam's
state is that range (one per segment); a step finds, for every token v of the vocabulary at once, the
sub-range of suffixes continuing with v by binary search on the range's column (`_bounds`), which gives the
allowed next tokens (non-empty sub-ranges), their states and their corpus frequency F(n) (the range's width)
in one pass; the documents containing an n-gram are the documents of the positions in its range.

Why a suffix array rather than an FM-index (SEAL's): both find an n-gram's range by narrowing; the FM-index
extends a match to the *left* one symbol at a time with rank queries on a wavelet tree (SEAL reverses each
document so that this reads left to right), which needs rank support over a large alphabet — sequential
bit-level walks that vectorise poorly — while the suffix array's step is a binary search over plain int32
arrays, gathers only, batched over beams × vocabulary by XLA. The FM-index is smaller (SEAL's Table 7: 2.2 GB
for the NQ corpus); the suffix array here takes 8 bytes per token (text and suffix array, int32) plus 8 per
document (its start and row; a position's document is found by binary search over the starts), `nbytes`.

Documents are added at O(new) by `insert`: the new documents form a segment of their own, searched together
with the others (a state holds one range per segment). Segments are merged when a newer one grows to half of
the one before it (sizes stay geometric: O(log n) segments, each token rebuilt O(log n) times), and
`compact()` merges all. Builds use `pydivsufsort` (a C suffix sorter) when installed, otherwise a vectorised
numpy prefix doubling; both give the same array (tested).

On the device the segments are one text and one suffix array (each segment's suffixes in turn, as positions of
the whole text), padded to power-of-two capacities, with a fixed number of segment slots: `reserve(growth, slots)`
makes room for a known growth, so that inserts keep every shape and one compiled search serves every part of a
dynamic corpus (the protocol reserves for the whole corpus). Levels 1 .. depth − 2 of a search read the column at
a traced depth (`level_runs`), so the search compiles one body for them instead of one copy per level.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional, Sequence

import jax.numpy as jnp
import numpy as np

from gr_jax.runtime.errors import UserError
from gr_jax.index.substring_device import DeviceSubstrings  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)


def suffix_array_numpy(text: np.ndarray) -> np.ndarray:
    """The suffix array of an int array by prefix doubling (vectorised; O(n log² n)). Suffixes compare as
    sequences, a shorter one first when it is a prefix of the other."""
    n = len(text)
    if n == 0:
        return np.zeros(0, np.int64)
    _, rank = np.unique(text, return_inverse=True)
    rank = rank.astype(np.int64)
    k = 1
    while True:
        second = np.full(n, -1, np.int64)
        second[: n - k] = rank[k:] if k < n else second[:0]
        order = np.lexsort((second, rank))
        key_r, key_s = rank[order], second[order]
        new = np.zeros(n, np.int64)
        new[1:] = np.cumsum((key_r[1:] != key_r[:-1]) | (key_s[1:] != key_s[:-1]))
        rank = np.empty(n, np.int64)
        rank[order] = new
        if new[-1] == n - 1 or k >= n:
            return order
        k *= 2


def suffix_array(text: np.ndarray, builder: str = "auto") -> np.ndarray:
    """`builder`: "divsufsort" (pydivsufsort), "numpy", or "auto" (divsufsort when installed)."""
    if builder not in ("auto", "divsufsort", "numpy"):
        raise ValueError(f"suffix array builder must be 'auto', 'divsufsort' or 'numpy', got {builder!r}")
    if builder != "numpy" and len(text):
        try:
            import pydivsufsort
        except ImportError:
            if builder == "divsufsort":
                raise UserError("the suffix array builder 'divsufsort' needs `pip install pydivsufsort`") from None
        else:
            return np.asarray(pydivsufsort.divsufsort(np.ascontiguousarray(text, dtype=np.int32)), np.int64)
    return suffix_array_numpy(text)


@dataclasses.dataclass
class Segment:
    """Documents as one token array (each followed by the separator), the suffix array of the positions that
    hold a token, and each document's start position and row."""

    text: np.ndarray  # int32 [n]
    sa: np.ndarray  # int32 [m] suffix starts (no separator starts), lexicographic order
    starts: np.ndarray  # int32 [documents] first position of each document (increasing)
    rows: np.ndarray  # int32 [documents] corpus row of each document
    separator: int  # the vocabulary size: ends every document

    @classmethod
    def build(cls, documents: Sequence[Sequence[int]], rows: np.ndarray, vocab_size: int,
              builder: str = "auto") -> "Segment":
        lengths = np.array([len(d) for d in documents], np.int64)
        text = np.full(int(lengths.sum() + len(documents)), vocab_size, np.int32)
        starts = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]]).astype(np.int64)
        for s, d in zip(starts, documents):
            text[s: s + len(d)] = d
        if len(text) >= 2**31:
            raise UserError(f"substring index: a segment of {len(text)} positions is past int32; insert the "
                            f"documents in parts")
        sa = suffix_array(text, builder)
        sa = sa[text[sa] != vocab_size].astype(np.int32)
        return cls(text=text, sa=sa, starts=starts.astype(np.int32), rows=np.asarray(rows, np.int32),
                   separator=int(vocab_size))

    @property
    def num_tokens(self) -> int:
        return len(self.sa)

    def documents(self) -> tuple[list[list[int]], np.ndarray]:
        """The segment's documents (token lists) and rows, in their order."""
        ends = np.concatenate([self.starts[1:], [len(self.text)]]) - 1  # each document's separator
        return [self.text[s:e].tolist() for s, e in zip(self.starts, ends)], self.rows.astype(np.int64)

    def range(self, ngram: Sequence[int]) -> tuple[int, int]:
        """[lo, hi) of the suffixes starting with `ngram` (host; for tests, prefixes and tools)."""
        lo, hi = 0, len(self.sa)
        for d, v in enumerate(ngram):
            col = self.text[np.minimum(self.sa[lo:hi].astype(np.int64) + d, len(self.text) - 1)]
            lo, hi = lo + int(np.searchsorted(col, v, "left")), lo + int(np.searchsorted(col, v, "right"))
            if lo >= hi:
                return lo, lo
        return lo, hi


def child_lists(text: np.ndarray, sa: np.ndarray, segment_starts: Sequence[int], separator: int, columns: int,
                narrow: int) -> tuple[list[np.ndarray], int]:
    """Where the children of every wide range begin, for columns 1..`columns`: a range of the suffix array whose
    suffixes share their first c tokens (c ≥ 1, no separator among them) and that holds more than `narrow`
    suffixes has one child per distinct token at column c, and the children start exactly where two neighbouring
    suffixes first differ at column c or before. → ([sorted suffix-array indices of those starts, per column],
    the most children of one such range). `text`, `sa`: the device layout before padding (suffixes of each
    segment in turn, from `segment_starts`, as positions of the whole text; every document ends in the
    separator, so no comparison passes a document's end unnoticed)."""
    m, n = len(sa), len(text)
    if m == 0 or columns < 1:
        return [np.zeros(0, np.int32) for _ in range(max(columns, 0))], 0
    pos = sa.astype(np.int64)
    # agree[i]: how many of the first columns + 1 tokens suffix i shares with suffix i − 1 (0 at a segment start)
    agree = np.zeros(m, np.int64)
    alive = np.ones(m, bool)
    alive[0] = False
    alive[np.asarray(segment_starts, np.int64)[np.asarray(segment_starts) < m]] = False
    sep_before = np.zeros(m, bool)  # a separator among the first c tokens (updated as c grows)
    has_sep = []
    for j in range(columns + 1):
        here = text[np.minimum(pos + j, n - 1)]
        has_sep.append(sep_before.copy())
        same = np.zeros(m, bool)
        same[1:] = here[1:] == here[:-1]
        alive &= same
        agree += alive
        sep_before |= here == separator
    lists, most = [], 0
    for c in range(1, columns + 1):
        group = np.cumsum(agree < c) - 1  # depth-c ranges: runs of suffixes sharing c tokens
        width = np.bincount(group)
        starts = agree <= c  # where a child at column c begins (a range's own start included)
        keep = starts & (width[group] > narrow) & ~has_sep[c]
        lists.append(np.flatnonzero(keep).astype(np.int32))
        if keep.any():
            most = max(most, int(np.bincount(group[keep]).max()))
    return lists, most


class SubstringIndex:
    """Host side: segments of documents (rows: the corpus row of each document). `device(...)` is the
    decoding constraint.

    `slots`: the segments the device constraint holds room for (None: as many as there are). With slots set, an
    insert that would leave more segments merges the newest ones, so the device constraint keeps its shapes
    while the index grows; `reserve` sets both that and room for a known growth."""

    def __init__(self, vocab_size: int, segments: list[Segment], builder: str = "auto", slots: Optional[int] = None,
                 listed_columns: int = 3, narrow: int = 32):
        self.vocab_size = int(vocab_size)
        self.segments = segments
        self.builder = builder
        self.slots = slots
        # the device reads a range of ≤ `narrow` suffixes directly; the wider ranges of the first `listed_columns`
        # columns find their children in stored lists (`child_lists`), deeper ones by binary search
        self.listed_columns, self.narrow = int(listed_columns), int(narrow)
        self._room = (0, 0, 0, 0)  # positions, suffixes, documents, listed starts: device room (`reserve`)
        self._most = 1  # room for the children of one listed range (grows, never shrinks: shapes stay)
        self._device = {}

    @classmethod
    def build(cls, documents: Sequence[Sequence[int]], vocab_size: int, rows: Optional[Sequence[int]] = None,
              builder: str = "auto") -> "SubstringIndex":
        index = cls(vocab_size, [], builder)
        index.insert(documents, rows)
        return index

    def reserve(self, growth: float, slots: int = 3, margin: float = 1.25) -> None:
        """Room on the device for `growth` times today's documents and `slots` segments: until the index outgrows
        that room, every insert keeps the device constraint's shapes, so a search compiled once serves every
        part (the dynamic-corpora protocol reserves for the whole corpus it will add). Positions and suffixes get
        `margin` times more (new documents may be longer than today's on average), the child lists growth² times
        (more ranges pass `narrow` as the corpus grows). Capacities are powers of two; past the room they double."""
        if not growth >= 1:
            raise UserError(f"substring index: reserve growth must be ≥ 1, got {growth}")
        if int(slots) < 1:
            raise UserError(f"substring index: reserve slots must be ≥ 1, got {slots}")
        self.slots = int(slots)
        joined = self._joined()
        listed = sum(len(x) for x in joined["lists"])
        self._most = max(self._most, joined["most"])
        # the child lists grow faster than the corpus (more ranges pass `narrow`): growth², at most all suffixes
        listed = min(listed * growth, self.listed_columns * self.num_tokens)
        now = (self.num_positions * margin, self.num_tokens * margin, self.num_documents, listed * margin)
        self._room = tuple(max(r, int(np.ceil(growth * x))) for r, x in zip(self._room, now))
        # a range's children grow with the corpus too (never past the vocabulary and the separator)
        self._most = min(max(self._most, int(np.ceil(growth * margin * self._most))), self.vocab_size + 1)
        segments = len(self.segments)
        self._fit_slots()
        if len(self.segments) != segments:  # merged: everything is laid out again
            self._device.clear()
        for key in [k for k in self._device if k not in ("joined", "token_counts")]:
            del self._device[key]  # the device arrays take the new room

    def _check(self, documents, rows) -> np.ndarray:
        for k, d in enumerate(documents):
            if len(d) and (min(d) < 0 or max(d) >= self.vocab_size):
                raise UserError(f"substring index: document {k} has token ids outside [0, {self.vocab_size}): "
                                f"{min(d)}..{max(d)}")
        if rows is None:
            first = max((int(s.rows.max()) + 1 for s in self.segments if len(s.rows)), default=0)
            return np.arange(first, first + len(documents), dtype=np.int64)
        rows = np.asarray(rows, np.int64)
        if rows.shape != (len(documents),):
            raise UserError(f"substring index: {len(rows)} rows for {len(documents)} documents")
        if len(rows) and (rows.min() < 0 or rows.max() >= 2**31):
            raise UserError("substring index: document rows must be in [0, 2**31)")
        return rows

    def insert(self, documents: Sequence[Sequence[int]], rows: Optional[Sequence[int]] = None) -> dict:
        """Adds documents as a new segment (O(new)); merges segments while a newer one is at least half the
        size of the one before it, and the newest ones while there are more than `slots`. Returns what was
        added (the prefix tree's report keys where they apply)."""
        rows = self._check(documents, rows)
        report = {"pairs_added": len(documents), "docids_added": len(documents),
                  "tokens_added": int(sum(len(d) for d in documents))}
        if not len(documents):
            return report
        self.segments.append(Segment.build(documents, rows, self.vocab_size, self.builder))
        while len(self.segments) > 1 and 2 * len(self.segments[-1].text) >= len(self.segments[-2].text):
            self._merge(len(self.segments) - 2)
        self._fit_slots()
        self._device.clear()
        return report

    def _fit_slots(self) -> None:
        while self.slots is not None and len(self.segments) > self.slots:
            self._merge(len(self.segments) - 2)

    def _merge(self, i: int) -> None:
        """Segments i and i + 1 become one."""
        a, ra = self.segments[i].documents()
        b, rb = self.segments[i + 1].documents()
        self.segments[i: i + 2] = [Segment.build(a + b, np.concatenate([ra, rb]), self.vocab_size, self.builder)]

    def compact(self) -> None:
        while len(self.segments) > 1:
            self._merge(len(self.segments) - 2)
        self._device.clear()

    @property
    def num_documents(self) -> int:
        return sum(len(s.rows) for s in self.segments)

    @property
    def num_positions(self) -> int:
        """Tokens plus one end per document (SEAL's `len(index)`, the normaliser of n-gram probabilities)."""
        return sum(len(s.text) for s in self.segments)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.segments)

    @property
    def nbytes(self) -> int:
        return int(sum(s.text.nbytes + s.sa.nbytes + s.starts.nbytes + s.rows.nbytes for s in self.segments))

    def token_counts(self) -> np.ndarray:
        """Occurrences of every token id [vocab_size] (SEAL's unigram counts); cached until the next insert."""
        if "token_counts" not in self._device:
            counts = np.zeros(self.vocab_size, np.int64)
            for s in self.segments:
                counts += np.bincount(s.text[s.text < self.vocab_size], minlength=self.vocab_size)
            self._device["token_counts"] = counts
        return self._device["token_counts"]

    # host queries (tests, tools)
    def count(self, ngram: Sequence[int]) -> int:
        return sum(hi - lo for lo, hi in (s.range(ngram) for s in self.segments))

    def _joined(self) -> dict:
        """The segments' texts and suffix arrays laid end to end on the host, with the child lists (`child_lists`);
        cached until the next insert (the device layout and `reserve` both read it)."""
        if "joined" not in self._device:
            segs = self.segments
            text_at = np.concatenate([[0], np.cumsum([len(s.text) for s in segs])]).astype(np.int64)
            sa_at = np.concatenate([[0], np.cumsum([len(s.sa) for s in segs])]).astype(np.int64)
            text = np.concatenate([s.text for s in segs]) if segs else np.zeros(0, np.int32)
            sa = np.concatenate([s.sa.astype(np.int64) + t0 for s, t0 in zip(segs, text_at)]) if segs else \
                np.zeros(0, np.int64)
            lists, most = child_lists(text, sa, sa_at[:-1], self.vocab_size, self.listed_columns, self.narrow)
            self._device["joined"] = dict(text=text, sa=sa, text_at=text_at, sa_at=sa_at, lists=lists, most=most)
        return self._device["joined"]

    def _layout(self) -> dict:
        """The segments as the device holds them: texts one after another, then (once `reserve` was called) the
        separator up to a power-of-two capacity; each segment's suffix array in turn, as positions of that whole text; every document's start
        (padding: past every position) and row (padding: -1); where each segment's suffixes begin."""
        if "layout" not in self._device:
            segs = self.segments
            if self.slots is None:  # never reserved: the arrays as they are (a static index pays no padding)
                room = lambda used, reserved: max(used, 1)  # noqa: E731
            else:
                room = lambda used, reserved: 1 << max(max(used, reserved, 1) - 1, 0).bit_length()  # noqa: E731
            text, sa, text_at, sa_at, lists, most = (self._joined()[k] for k in
                                                     ("text", "sa", "text_at", "sa_at", "lists", "most"))
            n_text, n_sa = int(text_at[-1]), int(sa_at[-1])
            self._most = max(self._most, most)
            listed_at = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int32)
            n_pos, n_sa, n_doc, n_list = (room(u, r) for u, r in zip(
                (n_text, n_sa, self.num_documents, int(listed_at[-1])), self._room))
            shapes = (n_pos, n_sa, n_doc, n_list, room(self._most, 0), max(len(segs), self.slots or 0))
            if shapes != getattr(self, "_shapes", shapes):
                log.info("substring index: device arrays now hold %d positions, %d suffixes, %d documents, %d listed "
                         "children (%d a range), %d segments (were %s): the search compiles for these shapes",
                         *shapes, self._shapes)
            self._shapes = shapes
            if n_pos >= 2**31:
                raise UserError(f"substring index: {n_pos} positions on the device are past int32")
            pad = lambda x, size, value: np.concatenate(  # noqa: E731
                [np.asarray(x, np.int32), np.full(size - len(x), value, np.int32)])
            starts = np.concatenate([s.starts.astype(np.int64) + t0 for s, t0 in zip(segs, text_at)])
            rows = np.concatenate([s.rows for s in segs])
            listed = np.concatenate(lists) if lists else np.zeros(0, np.int32)
            # placed once, shared by every view's constraint; padding: the separator (text), 0 (suffix array),
            # past every position (starts), -1 (rows), past every suffix (listed starts, so searches stop there)
            self._device["layout"] = dict(
                text=jnp.asarray(pad(text, n_pos, self.vocab_size)), sa=jnp.asarray(pad(sa, n_sa, 0)),
                starts=jnp.asarray(pad(starts, n_doc, n_pos)), rows=jnp.asarray(pad(rows, n_doc, -1)),
                listed=jnp.asarray(pad(listed, n_list, n_sa)), listed_at=jnp.asarray(listed_at),
                listed_width=shapes[4], sa_at=sa_at)
        return self._device["layout"]

    def device(self, max_length: int, prefix: Sequence[int] = (), end_token: Optional[int] = None) \
            -> "DeviceSubstrings":
        """The decoding constraint: n-grams of up to `max_length` generated tokens that continue `prefix`; with
        `end_token`, a child whose token is end_token is a complete identifier (a leaf) and is not extended.
        Cached per arguments until the next insert. After `reserve` its arrays have power-of-two capacities and
        `slots` segment slots (empty ones never match), so an insert within the reserved room keeps every shape."""
        key = (int(max_length), tuple(int(t) for t in prefix), end_token)
        if key not in self._device:
            if not self.segments:
                raise UserError("substring index: no documents to search (build it from at least one document)")
            if max_length < 1:
                raise UserError(f"substring index: max_length must be ≥ 1, got {max_length}")
            lay = self._layout()
            K = max(len(self.segments), self.slots or 0)
            roots = np.zeros((K, 2), np.int32)
            first = np.zeros((K, self.vocab_size + 1), np.int32)  # the root's children: each token's sub-range start
            for k, (seg, at) in enumerate(zip(self.segments, lay["sa_at"])):
                lo, hi = seg.range(prefix)
                col = seg.text[np.minimum(seg.sa[lo:hi].astype(np.int64) + len(prefix), len(seg.text) - 1)]
                roots[k] = lo + at, hi + at
                first[k] = at + lo + np.searchsorted(col, np.arange(self.vocab_size + 1), "left")
            self._device[key] = DeviceSubstrings(
                text=lay["text"], sa=lay["sa"], starts=lay["starts"], rows=lay["rows"], roots=jnp.asarray(roots),
                root_bounds=jnp.asarray(first), listed=lay["listed"], listed_at=lay["listed_at"],
                depth=int(max_length), vocab_size=self.vocab_size, offset=len(prefix), end_token=end_token,
                narrow=self.narrow, listed_narrow=self.narrow, listed_columns=self.listed_columns,
                listed_width=lay["listed_width"])
        return self._device[key]
