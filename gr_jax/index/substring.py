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

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from gr_jax.runtime.errors import UserError
from gr_jax.index.device import SHARD_AXIS, _taker, check_split

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


def _bounds(text, sa, lo, hi, column: int, targets, shards: int = 1):
    """For each target value t ([..., K]), the first i in [lo, hi) with text[sa[i] + column] ≥ t (hi if none):
    a binary search on the range's sorted column, all targets at once. lo, hi [...]. With `shards` > 1 each
    device holds one block of `text` and `sa` (`DeviceSubstrings.split`): every read goes through the index's
    split read, so all devices take the same steps."""
    take = _taker(shards)
    n = text.shape[0] * shards  # the whole text's positions (its padding repeats the separator)
    l = jnp.broadcast_to(lo[..., None], (*lo.shape, targets.shape[-1]))
    h = jnp.broadcast_to(hi[..., None], l.shape)

    def body(_, lh):
        l, h = lh
        active = l < h
        mid = l + (h - l) // 2  # never l + h: past 2**30 positions that overflows int32
        pos = jnp.clip(take(sa, jnp.clip(mid, 0, sa.shape[0] * shards - 1)) + column, 0, n - 1)
        right = take(text, pos) < targets
        return jnp.where(active & right, mid + 1, l), jnp.where(active & ~right, mid, h)

    # until every search has converged: a deep level's ranges are narrow, so it takes few rounds (at most the
    # bits of the largest range, plus one)
    l, _ = jax.lax.while_loop(lambda lh: jnp.any(lh[0] < lh[1]), lambda lh: body(0, lh), (l, h))
    return l


def _token_ranges(bounds, V: int):
    """`_bounds` over tokens 0..V (the separator last) → each token's sub-range (c_lo, c_hi) [..., V], -1 where
    the token does not follow."""
    c_lo, c_hi = bounds[..., :V], bounds[..., 1:]
    ok = c_lo < c_hi
    return jnp.where(ok, c_lo, -1), jnp.where(ok, c_hi, -1)


def _lower_bound(arr, base, end, x):
    """The first index i in [base, end) with arr[i] ≥ x (end if none), for every x; arr sorted there."""
    def halve(_, lh):
        l, h = lh
        mid = l + (h - l) // 2
        right = arr[jnp.clip(mid, 0, arr.shape[0] - 1)] < x
        active = l < h
        return jnp.where(active & right, mid + 1, l), jnp.where(active & ~right, mid, h)

    # a loop, not unrolled: unrolled, XLA took minutes to compile a scatter indexed through it at a traced column
    lh = (jnp.broadcast_to(base, x.shape).astype(jnp.int32), jnp.broadcast_to(end, x.shape).astype(jnp.int32))
    return jax.lax.fori_loop(0, max(arr.shape[0], 1).bit_length(), halve, lh)[0]


def _read_narrow(text, sa, lo, width, column, V: int, narrow: int, rows_ok):
    """Children of the ranges of ≤ `narrow` suffixes, read from their sorted column (each run of equal tokens is
    one child), for the rows `rows_ok`: (lo, hi) [M, V], -1 elsewhere."""
    M, n = lo.shape[0], text.shape[0]
    j = jnp.arange(narrow, dtype=jnp.int32)
    inside = (j[None, :] < width[:, None]) & rows_ok[:, None]
    pos = jnp.clip(sa[jnp.clip(lo[:, None] + j, 0, sa.shape[0] - 1)] + column, 0, n - 1)
    col = jnp.where(inside, text[pos], V)
    first = jnp.concatenate([jnp.ones((M, 1), bool), col[:, 1:] != col[:, :-1]], axis=1)
    start = inside & first & (col < V)
    # a run's end: the next run's start (past the width the column reads the separator, whose run starts there)
    later = jax.lax.cummin(jnp.where(first, j, narrow), axis=1, reverse=True)
    end = jnp.concatenate([later[:, 1:], jnp.full((M, 1), narrow, jnp.int32)], axis=1)
    slot = jnp.where(start, col, V)  # non-starts write past the last column: dropped
    rows = jnp.broadcast_to(jnp.arange(M)[:, None], slot.shape)
    blank = jnp.full((M, V), -1, jnp.int32)
    return (blank.at[rows, slot].set(lo[:, None] + j, mode="drop"),
            blank.at[rows, slot].set(lo[:, None] + end.astype(jnp.int32), mode="drop"))


def _child_ranges(text, sa, lo, hi, column, vocab_size: int, narrow: int, cap: int, lists=None):
    """The children of ranges [lo, hi) (flat [M]; dead ones empty) at `column`: (c_lo, c_hi) [M, V], -1 where token v
    does not follow. Equal to `_bounds` over every token. A range of at most `narrow` suffixes is read directly —
    its column is sorted, so each run of equal tokens is one child. A wider one, at a column that has child lists
    (`lists`: (listed starts, where each column's begin, the columns, the most children of a range);
    `child_lists`), reads where its children begin from the list; elsewhere the wide ones, compacted to `cap` rows,
    are binary-searched for every token — or all ranges are, when more than `cap` are wide."""
    V = vocab_size
    M = lo.shape[0]
    n = text.shape[0]
    targets = jnp.arange(V + 1, dtype=jnp.int32)
    width = jnp.maximum(hi - lo, 0)
    wide = width > narrow

    def searched(l, h):
        return _token_ranges(_bounds(text, sa, l, h, column, targets), V)

    def narrow_only(_):
        return _read_narrow(text, sa, lo, width, column, V, narrow, ~wide)

    def compacted(_):
        out_lo, out_hi = narrow_only(None)
        # wide: at most `cap` of them, searched for every token, written over their rows
        pick = jnp.argsort(~wide, stable=True)[:cap]  # the wide ranges first
        ok = wide[pick]
        c_lo, c_hi = searched(jnp.where(ok, lo[pick], 0), jnp.where(ok, hi[pick], 0))
        into = jnp.where(ok, pick, M)  # past the last row: dropped
        return out_lo.at[into].set(c_lo, mode="drop"), out_hi.at[into].set(c_hi, mode="drop")

    def listed(rows):
        """The wide ranges among `rows` ([R] row numbers) read their children from the lists."""
        starts, at, _, most = lists
        out_lo, out_hi = narrow_only(None)
        l, h = lo[rows], hi[rows]
        first = _lower_bound(starts, at[column - 1], at[column], l)  # the range's first child …
        last = _lower_bound(starts, at[column - 1], at[column], h)  # … and the next range's
        k = first[:, None] + jnp.arange(most, dtype=jnp.int32)
        ok = wide[rows][:, None] & (k < last[:, None])
        c_lo = starts[jnp.clip(k, 0, starts.shape[0] - 1)]
        c_hi = jnp.where(k + 1 < last[:, None], starts[jnp.clip(k + 1, 0, starts.shape[0] - 1)], h[:, None])
        token = text[jnp.clip(sa[jnp.clip(c_lo, 0, sa.shape[0] - 1)] + column, 0, n - 1)]
        slot = jnp.where(ok & (token < V), token, V)  # the separator's run is no child; column V is dropped
        into = jnp.broadcast_to(rows[:, None], slot.shape)
        return out_lo.at[into, slot].set(c_lo, mode="drop"), out_hi.at[into, slot].set(c_hi, mode="drop")

    few = max(1, M // 8)  # at most this many wide ranges: only they are read from the lists

    cap = max(1, cap)
    if cap >= M:
        return searched(lo, hi)
    # 0: every range narrow; 1: at most `few` wide ones, listed; 2: the wide ones listed; 3: at most `cap` wide
    # ones, searched; 4: every range searched
    branches = (narrow_only, lambda _: listed(jnp.argsort(~wide, stable=True)[:few]),
                lambda _: listed(jnp.arange(M)), compacted, lambda _: searched(lo, hi))
    if lists is not None and isinstance(column, (int, np.integer)) and not 1 <= column <= lists[2]:
        lists = None  # an unrolled level past the listed columns
    n_wide = jnp.sum(wide)
    has_lists = lists is not None and column <= lists[2]
    which = jnp.where(n_wide == 0, 0, jnp.where(has_lists, jnp.where(n_wide <= few, 1, 2),
                                                jnp.where(n_wide <= cap, 3, 4)))
    if lists is None:  # no listed branch to compile
        return jax.lax.switch(jnp.maximum(which - 2, 0), (narrow_only, compacted, branches[4]), None)
    return jax.lax.switch(which, branches, None)


@flax.struct.dataclass
class DeviceSubstrings:
    """A `SubstringIndex` on the device, as a decoding constraint (`index.constraint.Constraint`). Its segments are
    one text and one suffix array (each segment's suffixes in turn), padded to power-of-two capacities; a beam's
    state is a tuple of (lo, hi) suffix-array ranges, one per segment slot; an empty range in every slot means the
    n-gram does not occur. Levels 1 .. depth − 2 are one run (`level_runs`): a search compiles one body for them."""

    text: jax.Array  # int32 [positions]: the segments' texts, then the separator
    sa: jax.Array  # int32 [suffixes]: each segment's suffix array in turn (positions of `text`), then 0
    starts: jax.Array  # int32 [documents]: each document's first position (increasing), then past every position
    rows: jax.Array  # int32 [documents]: corpus rows, then -1
    roots: jax.Array  # int32 [slots, 2]: the range of the prefix in each segment ([0, 0] in an empty slot)
    root_bounds: jax.Array  # int32 [slots, V + 1]: where each token's sub-range of the root range starts
    depth: int = flax.struct.field(pytree_node=False)
    vocab_size: int = flax.struct.field(pytree_node=False)
    offset: int = flax.struct.field(pytree_node=False)  # length of the forced prefix
    end_token: Optional[int] = flax.struct.field(pytree_node=False)
    shards: int = flax.struct.field(pytree_node=False, default=1)  # text and suffix array in S blocks
    # a range of ≤ `narrow` suffixes gives its children by reading them (0: every range searched for all V
    # tokens); when at most 1 / `wide_share` of the beams' ranges are wide, only those are searched, else all
    # (`_child_ranges`)
    narrow: int = flax.struct.field(pytree_node=False, default=32)
    wide_share: int = flax.struct.field(pytree_node=False, default=2)
    # child lists (`child_lists`): where the children of every range of more than `listed_narrow` suffixes begin,
    # for columns 1..listed_columns (`listed_at[c - 1]:listed_at[c]` of `listed`); `listed_width`: the most
    # children of one listed range (a power of two). Used while `narrow` ≥ `listed_narrow` (every wide range listed)
    listed: Optional[jax.Array] = None  # int32 [capacity], padded past every suffix
    listed_at: Optional[jax.Array] = None  # int32 [listed_columns + 1]
    listed_narrow: int = flax.struct.field(pytree_node=False, default=32)
    listed_columns: int = flax.struct.field(pytree_node=False, default=0)
    listed_width: int = flax.struct.field(pytree_node=False, default=1)

    def _lists(self):
        if self.listed_columns and self.narrow and self.narrow >= self.listed_narrow and self.listed is not None:
            return self.listed, self.listed_at, self.listed_columns, self.listed_width
        return None

    @property
    def slots(self) -> int:
        return self.roots.shape[0]

    def root(self, shape: tuple):
        return tuple((jnp.full(shape, self.roots[k, 0], jnp.int32), jnp.full(shape, self.roots[k, 1], jnp.int32))
                     for k in range(self.slots))

    def has_leaves(self, d: int) -> bool:
        return self.end_token is not None

    def level_runs(self) -> tuple:
        """Levels 1 .. depth − 2 read the column d + offset with a traced d (`children_in_run`); level 0 reads the
        root's children found on the host, and the search's last level is its own."""
        return ((1, self.depth - 1),) if self.depth >= 4 else ()

    def children_in_run(self, run: int, d, state):
        return self._children(d, state)

    def children(self, d: int, state):
        """Every token of the vocabulary is a slot (tokens None); its state is its sub-range in each segment.
        At d = 0 a state is the root's (the search and `walk` start there) or dead."""
        return self._children(d, state, at_root=d == 0)

    def _children(self, d, state, at_root: bool = False):
        V, K = self.vocab_size, self.slots
        lo = jnp.stack([s[0] for s in state], axis=-1)  # [..., K]
        hi = jnp.stack([s[1] for s in state], axis=-1)
        live = (lo >= 0) & (lo < hi)
        lo, hi = jnp.where(live, lo, 0), jnp.where(live, hi, 0)
        if at_root:  # every state is the root (or dead): its children were found once, on the host
            c_lo, c_hi = _token_ranges(jnp.where(live[..., None], self.root_bounds, 0), V)
        elif self.shards > 1 or not self.narrow:
            targets = jnp.arange(V + 1, dtype=jnp.int32)
            c_lo, c_hi = _token_ranges(_bounds(self.text, self.sa, lo, hi, d + self.offset, targets, self.shards), V)
        else:  # ranges read directly where they are narrow (`_child_ranges`); the wide budget counts beams
            beams = int(np.prod(lo.shape[:-1]))
            c_lo, c_hi = _child_ranges(self.text, self.sa, lo.reshape(-1), hi.reshape(-1), d + self.offset, V,
                                       self.narrow, beams // self.wide_share, self._lists())
            c_lo, c_hi = c_lo.reshape(*lo.shape, V), c_hi.reshape(*lo.shape, V)
        valid = jnp.any(c_lo >= 0, axis=-2)
        nxt = tuple((c_lo[..., k, :], c_hi[..., k, :]) for k in range(K))
        if self.end_token is None:
            leaf = jnp.full(valid.shape, -1, jnp.int32)
        else:
            leaf = jnp.where(valid & (jnp.arange(V) == self.end_token), 0, -1).astype(jnp.int32)
        return None, nxt, leaf, valid

    # split over the devices of a mesh axis (`Searcher` with an "index" axis), as `DeviceTrie.split`
    def split(self, shards: int) -> "DeviceSubstrings":
        """The text and suffix array padded to a multiple of `shards` positions — the text with the separator,
        so that a position clipped to the end reads what it read before; the suffix array's padding is never
        read — to be placed block by block over SHARD_AXIS (`partition_specs`). Every binary-search step then
        reads them through one integer all-reduce, and the search gives the whole index's n-grams and ranges.
        The document starts and rows (for `occurrences`, after the search) stay whole."""
        if not check_split(shards, self.shards, "substring index"):
            return self
        pad = lambda x, value: jnp.pad(x, (0, -x.shape[0] % shards), constant_values=value)  # noqa: E731
        return self.replace(text=pad(self.text, self.vocab_size), sa=pad(self.sa, 0), shards=shards)

    def partition_specs(self) -> "DeviceSubstrings":
        block = P(SHARD_AXIS) if self.shards > 1 else P()
        whole = None if self.listed is None else P()
        return self.replace(text=block, sa=block, starts=P(), rows=P(), roots=P(), root_bounds=P(), listed=whole,
                            listed_at=whole)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays on the device (capacities included)."""
        return int(sum(x.nbytes for x in (self.text, self.sa, *self._whole())))

    def _whole(self) -> list:
        """The arrays every device holds whole."""
        return [x for x in (self.starts, self.rows, self.roots, self.root_bounds, self.listed, self.listed_at)
                if x is not None]

    def nbytes_per_device(self) -> int:
        split = (self.text.nbytes + self.sa.nbytes) // self.shards
        return int(split + sum(x.nbytes for x in self._whole()))

    def walk(self, ngrams, lengths):
        """The states of given n-grams (after the prefix): ngrams int [..., L], lengths int [...] (tokens past a
        row's length are ignored). An n-gram that does not occur ends in an empty range (count 0)."""
        state = self.root(lengths.shape)
        for d in range(ngrams.shape[-1]):
            _, nxt, _, valid = self.children(d, state)
            t = jnp.clip(ngrams[..., d], 0, self.vocab_size - 1)[..., None]
            ok = jnp.take_along_axis(valid, t, axis=-1)[..., 0]
            go = d < lengths
            state = jax.tree_util.tree_map(
                lambda new, old: jnp.where(go, jnp.where(ok, jnp.take_along_axis(new, t, axis=-1)[..., 0], -1), old),
                nxt, state)
        return state

    def counts(self, state) -> jax.Array:
        """F(n): occurrences of each state's n-gram in the corpus (int32 [...])."""
        return sum(jnp.where(lo >= 0, jnp.maximum(hi - lo, 0), 0) for lo, hi in state)

    def occurrences(self, state, max_occurrences: int):
        """Where each n-gram occurs: (rows [..., P], start within the document [..., P], valid [..., P]) with
        P = max_occurrences: the first P occurrences in segment order, then suffix-array order (all of them where
        F(n) ≤ P). On the whole index (not a `split` one)."""
        if self.shards > 1:
            raise ValueError("occurrences read the whole suffix arrays: call them on the index before split()")
        lo = jnp.stack([s[0] for s in state], axis=-1)  # [..., K]
        hi = jnp.stack([s[1] for s in state], axis=-1)
        width = jnp.where(lo >= 0, jnp.maximum(hi - lo, 0), 0)
        end = jnp.cumsum(width, axis=-1)  # the occurrences up to each segment's
        j = jnp.arange(max_occurrences, dtype=jnp.int32)
        k = jnp.sum(j[:, None] >= end[..., None, :], axis=-1)  # [..., P] the segment holding occurrence j
        ok = k < self.slots
        k = jnp.minimum(k, self.slots - 1)
        pick = lambda x: jnp.take_along_axis(x, k, axis=-1)  # noqa: E731
        at = pick(lo) + j - (pick(end) - pick(width))  # its suffix-array entry
        pos = self.sa[jnp.where(ok, at, 0)]
        doc = jnp.clip(jnp.searchsorted(self.starts, pos, side="right") - 1, 0, self.starts.shape[0] - 1)
        return jnp.where(ok, self.rows[doc], -1), jnp.where(ok, pos - self.starts[doc], -1), ok

    def documents(self, state, max_occurrences: int):
        """Distinct document rows containing each n-gram: (rows [..., P], valid [..., P]), P = max_occurrences;
        exact where max_occurrences ≥ F(n), else from the occurrences `occurrences` gives."""
        r, _, ok = self.occurrences(state, max_occurrences)
        big = jnp.iinfo(jnp.int32).max
        r = jnp.sort(jnp.where(ok, r, big), axis=-1)
        first = jnp.concatenate([jnp.ones_like(r[..., :1], bool), r[..., 1:] != r[..., :-1]], axis=-1)
        ok = first & (r != big)
        return jnp.where(ok, r, -1), ok
