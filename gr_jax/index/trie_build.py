"""How a `TrieIndex`'s levels are built on the host from docid rows: padding ragged docids (`_as_padded`), rows
packed into int64 sort keys with one argsort (`_PackedRows`), the distinct prefixes of each length
(`_sorted_distinct`) and the CSR levels with their leaves and dense tables (`_levels`); `_Extras` is a depth's table of
inserted children (`trie_insert.py`). `index/trie.py` holds the index itself.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

import numpy as np

log = logging.getLogger(__name__)

_PAD = -1  # padding of ragged sequences inside the trie's modules (never a valid token)


@dataclasses.dataclass
class _Extras:
    """Nodes added by insert() below depth-d parents, sorted by (parent, token)."""

    parent: np.ndarray  # int64 [X] parent node id at depth d
    token: np.ndarray  # int32 [X]
    child: np.ndarray  # int32 [X] child node id at depth d+1 (>= number of main nodes there)
    leaf: np.ndarray  # int32 [X] leaf id of the child, or -1

    @classmethod
    def empty(cls) -> "_Extras":
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int32))

    def __len__(self) -> int:
        return len(self.parent)


def _as_padded(sequences, vocab_size: int, eos_id: Optional[int], append_eos: bool, source: str):
    """Validates docid token sequences and returns (int32 [M, D] padded with -1, lengths [M])."""
    if isinstance(sequences, np.ndarray) and sequences.ndim == 2:
        arr = sequences
        if append_eos:
            if eos_id is None:
                raise ValueError(f"{source}: append_eos needs eos_id")
            arr = np.concatenate([arr, np.full((len(arr), 1), eos_id, arr.dtype)], axis=1)
        lengths = np.full(len(arr), arr.shape[1], np.int64)
        if arr.shape[1] == 0 and len(arr):
            raise ValueError(f"{source}: empty docid sequences (length 0)")
        if arr.dtype.kind not in "iu":
            raise ValueError(f"{source}: docid tokens must be integers, got dtype {arr.dtype}")
        # two reductions instead of a mask over every token; the mask only when something is out of range
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= vocab_size):
            row, col = np.argwhere((arr < 0) | (arr >= vocab_size))[0]
            raise ValueError(f"{source}: token {arr[row, col]} at sequence {row}, position {col} is outside the "
                             f"vocabulary [0, {vocab_size})")
        if eos_id is not None and arr.shape[1] > 1 and (arr[:, :-1] == eos_id).any():
            row, col = np.argwhere(arr[:, :-1] == eos_id)[0]
            raise ValueError(f"{source}: EOS ({eos_id}) inside sequence {row} at position {col}")
        return arr.astype(np.int32, copy=False), lengths
    seqs = [list(map(int, s)) for s in sequences]
    if append_eos:
        if eos_id is None:
            raise ValueError(f"{source}: append_eos needs eos_id")
        seqs = [s if (s and s[-1] == eos_id) else s + [eos_id] for s in seqs]
    lengths = np.array([len(s) for s in seqs], np.int64)
    if len(seqs) and lengths.min() == 0:
        raise ValueError(f"{source}: sequence {int(np.argmin(lengths))} is empty")
    D = int(lengths.max()) if len(seqs) else 0
    arr = np.full((len(seqs), D), _PAD, np.int64)
    for i, s in enumerate(seqs):
        arr[i, : len(s)] = s
    valid = np.arange(D)[None, :] < lengths[:, None]
    bad = valid & ((arr < 0) | (arr >= vocab_size))
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise ValueError(f"{source}: token {arr[row, col]} at sequence {row}, position {col} is outside the "
                         f"vocabulary [0, {vocab_size})")
    if eos_id is not None:
        inner = valid & (np.arange(D)[None, :] < (lengths - 1)[:, None]) & (arr == eos_id)
        if inner.any():
            row, col = np.argwhere(inner)[0]
            raise ValueError(f"{source}: EOS ({eos_id}) inside sequence {row} at position {col}")
    return arr.astype(np.int32), lengths


def _sorted_unique(x: np.ndarray) -> np.ndarray:
    """np.unique for int arrays by a sort: numpy 2's np.unique hashes integers, which was 70× slower on 880k
    int64 keys here (0.37 s vs 5 ms)."""
    s = np.sort(x)
    return s[np.r_[True, s[1:] != s[:-1]]] if len(s) else s


def _check_doc_ids(docs: np.ndarray, source: str) -> None:
    if len(docs) and (int(docs.min()) < 0 or int(docs.max()) >= 1 << 32):
        i = int(np.argmax((docs < 0) | (docs >= 1 << 32)))
        raise ValueError(f"{source}: document id {docs[i]} (row {i}) must be in [0, 2**32)")


class _PackedRows:
    """Rows of a padded token array packed into int64 sort keys, most significant first: several tokens per
    key (each shifted by one, so the padding -1 is 0 and sorts first), `bits` bits each. Comparing the keys in
    order compares the rows lexicographically, so sorting the keys sorts the rows, and a column of the sorted
    rows is read back from the sorted keys — the [M, D] rows themselves are never gathered."""

    def __init__(self, arr: np.ndarray, vocab_size: int):
        self.D = arr.shape[1]
        self.bits = max(1, int(vocab_size).bit_length())  # token + 1 lies in [0, vocab_size]
        self.per_key = max(1, 62 // self.bits)
        self.keys = []
        for start in range(0, self.D, self.per_key):
            key = np.zeros(len(arr), np.int64)
            for j in range(start, min(start + self.per_key, self.D)):
                key <<= self.bits
                key |= arr[:, j] + 1
            self.keys.append(key)

    def _place(self, j: int) -> tuple[int, int]:
        q, r = divmod(j, self.per_key)
        width = min(self.per_key, self.D - q * self.per_key)
        return q, self.bits * (width - 1 - r)

    def column(self, j: int, rows: Optional[np.ndarray] = None) -> np.ndarray:
        """Token column j (int64, -1 for padding), of every row or of the given rows."""
        q, shift = self._place(j)
        key = self.keys[q] if rows is None else self.keys[q][rows]
        col = key >> shift  # a new array: the in-place steps below never touch the keys
        col &= (1 << self.bits) - 1
        col -= 1
        return col

    def argsort(self, minor: np.ndarray) -> np.ndarray:
        """Row order by (row, minor). One unstable argsort of the first key (most rows of a large index differ
        there), then a lexsort of only the rows that tie on it, by the remaining keys and `minor`: the result
        is the full order whatever the argsort did with ties, so it is deterministic."""
        order = np.argsort(self.keys[0])
        first = self.keys[0][order]
        eq = first[1:] == first[:-1]
        if eq.any():
            tie = np.zeros(len(order), bool)
            tie[1:] = eq
            tie[:-1] |= eq
            pos = np.flatnonzero(tie)
            sub = order[pos]
            # the tied rows stay at their positions: their first key is the primary (already sorted) key
            order[pos] = sub[np.lexsort([minor[sub], *(k[sub] for k in self.keys[:0:-1]), first[pos]])]
        return order

    def take(self, order: np.ndarray) -> None:
        self.keys = [k[order] for k in self.keys]

    def keep(self, mask: np.ndarray) -> None:
        self.keys = [k[mask] for k in self.keys]

    def first_difference(self) -> np.ndarray:
        """fd[i] = first column where row i differs from row i-1 (D if equal); fd[0] = 0."""
        M = len(self.keys[0]) if self.keys else 0
        fd = np.zeros(M, np.int64)
        if M > 1:
            fd[1:] = self.D
            for j in range(self.D - 1, -1, -1):  # column by column keeps memory at O(M)
                col = self.column(j)
                fd[1:][col[1:] != col[:-1]] = j
        return fd


def _sorted_distinct(arr: np.ndarray, lengths: np.ndarray, docs: np.ndarray, vocab_size: int, ragged: bool,
                     source: str):
    """Sorts the (row, document) pairs (`_PackedRows`), drops duplicate pairs, and keeps one packed row per
    distinct sequence → (packed distinct rows, documents [pairs], lengths [pairs], lengths [distinct],
    first difference from the previous distinct row [distinct], "pair starts a distinct sequence" [pairs]).
    A docid that is a strict prefix of another is an error (lexical docids end with EOS)."""
    D = arr.shape[1]
    rows = _PackedRows(arr, vocab_size)
    order = rows.argsort(docs)
    rows.take(order)
    docs = docs[order]
    if ragged:  # (fixed-length rows: every length is D, in any order)
        lengths = lengths[order]
    del order
    fd = rows.first_difference()
    same_seq = fd == D
    same_seq[0] = False
    dup = same_seq & np.r_[False, docs[1:] == docs[:-1]]  # duplicate (sequence, doc) pairs
    if dup.any():
        keep = ~dup
        rows.keep(keep)
        docs, lengths, fd, same_seq = docs[keep], lengths[keep], fd[keep], same_seq[keep]
    uniq = ~same_seq
    if not uniq.all():  # several documents share a sequence: the tree is built over the distinct sequences
        rows.keep(uniq)
        u_len, u_fd = lengths[uniq], fd[uniq]
    else:
        u_len, u_fd = lengths, fd
    if len(u_fd) > 1 and ragged:  # sorted order puts a docid's extensions right after it
        prefix = u_fd[1:] >= u_len[:-1]
        if prefix.any():
            i = int(np.argmax(prefix))

            def row(r):
                return [int(rows.column(j, np.array([r]))[0]) for j in range(int(u_len[r]))]

            raise ValueError(f"{source}: docid {row(i)} is a strict prefix of {row(i + 1)}; end lexical docids "
                             f"with EOS")
    return rows, docs, lengths, u_len, u_fd, uniq


def _levels(rows: "_PackedRows", u_len: np.ndarray, u_fd: np.ndarray, D: int, vocab_size: int,
            ragged: bool) -> dict:
    """The CSR levels of the sorted distinct rows: per depth d, the offsets of each depth-(d-1) node's children,
    the children's tokens, and where docids end (leaf ranks); plus the leaf of each distinct row (ragged)."""
    U = len(u_fd)
    offsets, tokens, leaf_rank, leaf_all = [], [np.zeros(0, np.int32)], [None], [False]
    tok_dtype = np.int16 if vocab_size <= np.iinfo(np.int16).max else np.int32
    count_dtype = np.int32 if U < np.iinfo(np.int32).max else np.int64
    first_prev = np.zeros(1, np.int64)  # first row of each depth-(d-1) node (depth 0: the root, row 0)
    leaf_count = 0
    leaf_of_row = None if not ragged else np.full(U, -1, np.int64)
    for d in range(1, D + 1):
        new = (u_fd < d) & (u_len >= d) if ragged else u_fd < d  # rows that start a depth-d node
        first = np.flatnonzero(new)
        n_d = len(first)
        upto = np.cumsum(new, dtype=count_dtype)  # depth-d nodes started at or before each row
        # children of the depth-(d-1) node p are the depth-d nodes started in [first_prev[p], first_prev[p+1])
        off_dtype = np.int32 if n_d < np.iinfo(np.int32).max else np.int64
        offsets.append(np.append(upto[first_prev] - new[first_prev], n_d).astype(off_dtype))
        tokens.append(rows.column(d - 1, None if n_d == U else first).astype(tok_dtype))
        if not ragged:  # every docid ends at depth D, where each row is its own node
            n_leaves_d = n_d if d == D else 0
            leaf_rank.append(None)
            leaf_all.append(d == D)
        else:
            ends = np.flatnonzero(u_len == d)
            n_leaves_d = len(ends)
            node_of_end = upto[ends] - 1
            if n_leaves_d == n_d and n_d > 0:
                leaf_rank.append(None)
                leaf_all.append(True)
                leaf_of_row[ends] = leaf_count + node_of_end
            elif n_leaves_d:
                rank = np.full(n_d, -1, np.int32)
                rank[node_of_end] = np.arange(n_leaves_d, dtype=np.int32)
                leaf_rank.append(rank)
                leaf_all.append(False)
                leaf_of_row[ends] = leaf_count + rank[node_of_end]
            else:
                leaf_rank.append(None)
                leaf_all.append(False)
        leaf_count += n_leaves_d
        first_prev = first
        del new, upto
    return {"offsets": offsets, "tokens": tokens, "leaf_rank": leaf_rank, "leaf_all": leaf_all,
            "leaf_count": leaf_count, "leaf_of_row": leaf_of_row}
