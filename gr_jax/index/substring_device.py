"""The substring index on the device (`DeviceSubstrings`), a decoding constraint: each segment's text and suffix
array padded to powers of two, a beam's state one suffix-array range per segment slot, and a range's children found
by binary search (`_bounds`, `_lower_bound`), from its sorted column where it is narrow (`_read_narrow`), or from
the child lists stored at build (`_child_ranges`); counts, occurrences and documents of a state for SEAL's keys.
`index/substring.py` builds it (`SubstringIndex.device`) and re-exports it.
"""

from __future__ import annotations

from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from gr_jax.index.device import SHARD_AXIS, _taker, check_split


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
