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


class SubstringIndex:
    """Host side: segments of documents (rows: the corpus row of each document). `device(...)` is the
    decoding constraint."""

    def __init__(self, vocab_size: int, segments: list[Segment], builder: str = "auto"):
        self.vocab_size = int(vocab_size)
        self.segments = segments
        self.builder = builder
        self._device = {}

    @classmethod
    def build(cls, documents: Sequence[Sequence[int]], vocab_size: int, rows: Optional[Sequence[int]] = None,
              builder: str = "auto") -> "SubstringIndex":
        index = cls(vocab_size, [], builder)
        index.insert(documents, rows)
        return index

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
        size of the one before it. Returns what was added (the prefix tree's report keys where they apply)."""
        rows = self._check(documents, rows)
        report = {"pairs_added": len(documents), "docids_added": len(documents),
                  "tokens_added": int(sum(len(d) for d in documents))}
        if not len(documents):
            return report
        self.segments.append(Segment.build(documents, rows, self.vocab_size, self.builder))
        while len(self.segments) > 1 and 2 * len(self.segments[-1].text) >= len(self.segments[-2].text):
            self._merge(len(self.segments) - 2)
        self._device.clear()
        return report

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

    def device(self, max_length: int, prefix: Sequence[int] = (), end_token: Optional[int] = None) \
            -> "DeviceSubstrings":
        """The decoding constraint: n-grams of up to `max_length` generated tokens that continue `prefix`; with
        `end_token`, a child whose token is end_token is a complete identifier (a leaf) and is not extended.
        Cached per arguments until the next insert."""
        key = (int(max_length), tuple(int(t) for t in prefix), end_token)
        if key not in self._device:
            if not self.segments:
                raise UserError("substring index: no documents to search (build it from at least one document)")
            if max_length < 1:
                raise UserError(f"substring index: max_length must be ≥ 1, got {max_length}")
            roots = [s.range(prefix) for s in self.segments]
            first = []  # the root's children: bounds of every token in the column after the prefix (host, once)
            for seg, (lo, hi) in zip(self.segments, roots):
                col = seg.text[np.minimum(seg.sa[lo:hi].astype(np.int64) + len(prefix), len(seg.text) - 1)]
                first.append(jnp.asarray(lo + np.searchsorted(col, np.arange(self.vocab_size + 1), "left"),
                                         jnp.int32))
            self._device[key] = DeviceSubstrings(
                texts=tuple(jnp.asarray(s.text) for s in self.segments),
                # a segment of empty documents has no suffix: one entry keeps the gathers in bounds (ranges empty)
                sas=tuple(jnp.asarray(s.sa if len(s.sa) else np.zeros(1, np.int32)) for s in self.segments),
                starts=tuple(jnp.asarray(s.starts) for s in self.segments),
                rows=tuple(jnp.asarray(s.rows) for s in self.segments),
                roots=tuple(jnp.asarray(r, jnp.int32) for r in roots), root_bounds=tuple(first),
                depth=int(max_length), vocab_size=self.vocab_size, offset=len(prefix), end_token=end_token)
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


def _child_ranges(text, sa, lo, hi, column: int, vocab_size: int, narrow: int, wide_share: int):
    """The children of ranges [lo, hi) (flat [M]; dead ones empty) at `column`: (c_lo, c_hi) [M, V], -1 where token v
    does not follow. Equal to `_bounds` over every token (which is what runs when more than M // wide_share ranges
    are wider than `narrow`); otherwise a range of at most `narrow` suffixes is read directly — its column is
    sorted, so each run of equal tokens is one child — and only the wide ones, compacted, are binary-searched for
    every token."""
    V = vocab_size
    M = lo.shape[0]
    n = text.shape[0]
    targets = jnp.arange(V + 1, dtype=jnp.int32)
    width = jnp.maximum(hi - lo, 0)
    wide = width > narrow

    def searched(l, h):
        return _token_ranges(_bounds(text, sa, l, h, column, targets), V)

    cap = max(1, M // wide_share)
    if cap >= M:
        return searched(lo, hi)

    def compacted(_):
        # narrow: the first `narrow` entries of each range's column (past its width: the separator, no child)
        j = jnp.arange(narrow, dtype=jnp.int32)
        inside = j[None, :] < width[:, None]
        pos = jnp.clip(sa[jnp.clip(lo[:, None] + j, 0, sa.shape[0] - 1)] + column, 0, n - 1)
        col = jnp.where(inside, text[pos], V)
        first = jnp.concatenate([jnp.ones((M, 1), bool), col[:, 1:] != col[:, :-1]], axis=1)
        start = inside & first & (col < V)
        end = jnp.sum(col[:, None, :] <= col[:, :, None], axis=-1)  # a run's end: entries ≤ its token (sorted)
        slot = jnp.where(start, col, V)  # non-starts write to the dropped column V
        rows = jnp.broadcast_to(jnp.arange(M)[:, None], slot.shape)
        blank = jnp.full((M + 1, V + 1), -1, jnp.int32)  # row M and column V are dropped
        out_lo = blank.at[rows, slot].set(lo[:, None] + j)
        out_hi = blank.at[rows, slot].set(lo[:, None] + end.astype(jnp.int32))
        # wide: at most `cap` of them, searched for every token, written over their rows
        pick = jnp.argsort(~wide, stable=True)[:cap]  # the wide ranges first
        ok = wide[pick]
        c_lo, c_hi = searched(jnp.where(ok, lo[pick], 0), jnp.where(ok, hi[pick], 0))
        into = jnp.where(ok, pick, M)
        out_lo = out_lo.at[into, :V].set(c_lo)
        out_hi = out_hi.at[into, :V].set(c_hi)
        return out_lo[:M, :V], out_hi[:M, :V]

    return jax.lax.cond(jnp.sum(wide) <= cap, compacted, lambda _: searched(lo, hi), None)


@flax.struct.dataclass
class DeviceSubstrings:
    """A `SubstringIndex` on the device, as a decoding constraint (`index.constraint.Constraint`). A beam's
    state is a tuple of (lo, hi) suffix-array ranges, one per segment; an empty range in every segment means
    the n-gram does not occur."""

    texts: tuple
    sas: tuple
    starts: tuple  # per segment: int32 [documents] start positions
    rows: tuple  # per segment: int32 [documents] corpus rows
    roots: tuple  # per segment: int32 [2], the range of the prefix
    root_bounds: tuple  # per segment: int32 [V + 1], where each token's sub-range of the root range starts
    depth: int = flax.struct.field(pytree_node=False)
    vocab_size: int = flax.struct.field(pytree_node=False)
    offset: int = flax.struct.field(pytree_node=False)  # length of the forced prefix
    end_token: Optional[int] = flax.struct.field(pytree_node=False)
    shards: int = flax.struct.field(pytree_node=False, default=1)  # texts and suffix arrays in S blocks
    # a range of ≤ `narrow` suffixes gives its children by reading them (0: every range searched for all V
    # tokens); at most 1 / `wide_share` of the ranges are searched, else all (`_child_ranges`)
    narrow: int = flax.struct.field(pytree_node=False, default=32)
    wide_share: int = flax.struct.field(pytree_node=False, default=2)

    def root(self, shape: tuple):
        return tuple((jnp.full(shape, r[0], jnp.int32), jnp.full(shape, r[1], jnp.int32)) for r in self.roots)

    def has_leaves(self, d: int) -> bool:
        return self.end_token is not None

    def children(self, d: int, state):
        """Every token of the vocabulary is a slot (tokens None); its state is its sub-range in each segment.
        At d = 0 a state is the root's (the search and `walk` start there) or dead."""
        V = self.vocab_size
        targets = jnp.arange(V + 1, dtype=jnp.int32)
        nxt, valid = [], None
        for text, sa, (lo, hi), first in zip(self.texts, self.sas, state, self.root_bounds):
            live = (lo >= 0) & (lo < hi)
            if d == 0 or self.shards > 1 or not self.narrow:
                if d == 0:  # every state is the root (or dead): its children were found once, on the host
                    b = jnp.where(live[..., None], first, 0)
                else:
                    b = _bounds(text, sa, jnp.where(live, lo, 0), jnp.where(live, hi, 0), d + self.offset, targets,
                                self.shards)
                c_lo, c_hi = _token_ranges(b, V)
            else:  # ranges read directly where they are narrow (`_child_ranges`)
                shape = lo.shape
                c_lo, c_hi = _child_ranges(text, sa, jnp.where(live, lo, 0).reshape(-1),
                                           jnp.where(live, hi, 0).reshape(-1), d + self.offset, V, self.narrow,
                                           self.wide_share)
                c_lo, c_hi = c_lo.reshape(*shape, V), c_hi.reshape(*shape, V)
            c_valid = c_lo >= 0
            nxt.append((c_lo, c_hi))
            valid = c_valid if valid is None else valid | c_valid
        if self.end_token is None:
            leaf = jnp.full(valid.shape, -1, jnp.int32)
        else:
            leaf = jnp.where(valid & (jnp.arange(V) == self.end_token), 0, -1).astype(jnp.int32)
        return None, tuple(nxt), leaf, valid

    # split over the devices of a mesh axis (`Searcher` with an "index" axis), as `DeviceTrie.split`
    def split(self, shards: int) -> "DeviceSubstrings":
        """The texts and suffix arrays padded to a multiple of `shards` positions — the text with the separator,
        so that a position clipped to the end reads what it read before; the suffix array's padding is never
        read — to be placed block by block over SHARD_AXIS (`partition_specs`). Every binary-search step then
        reads them through one integer all-reduce, and the search gives the whole index's n-grams and ranges.
        The document starts and rows (for `occurrences`, after the search) stay whole."""
        if not check_split(shards, self.shards, "substring index"):
            return self
        pad = lambda x, value: jnp.pad(x, (0, -x.shape[0] % shards), constant_values=value)  # noqa: E731
        return self.replace(texts=tuple(pad(t, self.vocab_size) for t in self.texts),
                            sas=tuple(pad(a, 0) for a in self.sas), shards=shards)

    def partition_specs(self) -> "DeviceSubstrings":
        block = P(SHARD_AXIS) if self.shards > 1 else P()
        whole = lambda xs: jax.tree_util.tree_map(lambda _: P(), xs)  # noqa: E731
        return self.replace(texts=tuple(block for _ in self.texts), sas=tuple(block for _ in self.sas),
                            starts=whole(self.starts), rows=whole(self.rows), roots=whole(self.roots),
                            root_bounds=whole(self.root_bounds))

    def nbytes_per_device(self) -> int:
        split = sum(x.nbytes for x in (*self.texts, *self.sas)) // self.shards
        return split + sum(x.nbytes for x in jax.tree_util.tree_leaves((self.starts, self.rows, self.roots,
                                                                         self.root_bounds)))

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
        P = segments · max_occurrences: the first max_occurrences occurrences of each segment in suffix-array
        order (all of them where F(n) ≤ max_occurrences). On the whole index (not a `split` one)."""
        if self.shards > 1:
            raise ValueError("occurrences read the whole suffix arrays: call them on the index before split()")
        rows, local, valid = [], [], []
        slot = jnp.arange(max_occurrences, dtype=jnp.int32)
        for sa, starts, doc_rows, (lo, hi) in zip(self.sas, self.starts, self.rows, state):
            ok = (lo[..., None] >= 0) & (lo[..., None] + slot < hi[..., None])
            pos = sa[jnp.where(ok, lo[..., None] + slot, 0)]
            d = jnp.clip(jnp.searchsorted(starts, pos, side="right") - 1, 0, starts.shape[0] - 1)
            rows.append(jnp.where(ok, doc_rows[d], -1))
            local.append(jnp.where(ok, pos - starts[d], -1))
            valid.append(ok)
        cat = lambda xs: jnp.concatenate(xs, axis=-1)  # noqa: E731
        return cat(rows), cat(local), cat(valid)

    def documents(self, state, max_occurrences: int):
        """Distinct document rows containing each n-gram: (rows [..., P], valid [..., P]), P = segments ·
        max_occurrences; exact where max_occurrences ≥ F(n), else from the occurrences `occurrences` gives."""
        r, _, ok = self.occurrences(state, max_occurrences)
        big = jnp.iinfo(jnp.int32).max
        r = jnp.sort(jnp.where(ok, r, big), axis=-1)
        first = jnp.concatenate([jnp.ones_like(r[..., :1], bool), r[..., 1:] != r[..., :-1]], axis=-1)
        ok = first & (r != big)
        return jnp.where(ok, r, -1), ok
