"""`TrieIndex`: the prefix tree of docids, laid out as flat arrays for decoding on an accelerator.

Layout (STATIC-style, extended):

* Nodes are numbered per depth in lexicographic order of their prefixes; depth 0 is the root. The trie
  state of a beam is a node id at a known depth — never a (position, previous token) pair, which would let
  the decoder cross from one docid into another.
* Children of a node at depth d are a contiguous range of depth-(d+1) nodes, sorted by token:
  `offsets[d][n] .. offsets[d][n+1]` (CSR), with `tokens[d+1]` the token on the edge into each node and
  `max_children[d]` the branching factor K gathered per beam at that depth.
* Where `n_d × V × 4` bytes fit `dense_budget_bytes`, depth d also gets a dense `[n_d, V]` child table (the top
  1–2 levels of a large numeric index): host lookups (insert, lookup) read one entry instead of a binary search,
  and where the nodes have at least V / 4 children at most (`DENSE_MAX_SLOTS_PER_CHILD`, `decode_dense`) the
  beam step reads one row instead of gathering K slots.
* Leaves (the end of a docid) may sit at any depth (ragged, EOS-terminated lexical docids). Leaf ids are
  numbered by (depth, node): `leaf_base[d] + rank`; a depth whose nodes are all leaves stores no rank array.
* Payload: leaf → documents in CSR (`doc_offsets`, `doc_ids`): several documents per docid (collisions) and
  several docids per document (multi-docid) are both legal.
* `insert()` adds docids without a rebuild: new nodes get ids after the existing ones at their depth and are
  recorded in a small per-depth *extras* table sorted by (parent, token), which decoding consults next to the
  main CSR; existing sequences only gain payload entries. `compact()` folds everything back into plain CSR.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from gr_jax.index.trie_build import _PAD, _Extras, _as_padded, _check_doc_ids, _levels, _sorted_distinct, _sorted_unique
from gr_jax.index.trie_insert import TrieInserts
from gr_jax.runtime.io_utils import atomic_dir, read_json

log = logging.getLogger(__name__)

FORMAT_TAG = "gr_jax.trie.v1"
# Decoding reads a depth's dense child table only if its rows are at most this many times the K CSR slots
# (V ≤ 4·K): the search ranks every slot of a beam's row, so a dense row of V slots over nodes of K ≪ V children
# costs V / K times the scoring and top-k work (tiny T5, 10k docids over V 512: level 1 had K 32, a 512-wide row).
DENSE_MAX_SLOTS_PER_CHILD = 4


class TrieIndex(TrieInserts):
    """Prefix tree over docid token sequences with a leaf → documents payload. Build with `TrieIndex.build`."""

    def __init__(self, *, vocab_size: int, eos_id: Optional[int], offsets: list, tokens: list, leaf_rank: list,
                 leaf_all: list, doc_offsets: np.ndarray, doc_ids: np.ndarray, dense_budget_bytes: int):
        self.vocab_size = int(vocab_size)
        self.eos_id = eos_id
        self.offsets = offsets  # per parent depth d in [0, D): int32/int64 [n_d + 1]
        self.tokens = tokens  # per depth d in [0, D]: int [n_d] (tokens[0] is empty: the root has no edge)
        self.leaf_rank = leaf_rank  # per depth: None, or int32 [n_d] rank among leaves at that depth (-1: none)
        self.leaf_all = leaf_all  # per depth: True when every main node at that depth is a leaf
        self.doc_offsets = doc_offsets  # int64 [n_main_leaves + 1]
        self.doc_ids = doc_ids  # int64 [pairs]
        self.dense_budget_bytes = int(dense_budget_bytes)
        self._init_derived()
        self.extras = [_Extras.empty() for _ in range(self.depth)]
        self.new_nodes = [0] * (self.depth + 1)  # nodes added by insert() per depth
        self.new_leaves = np.zeros(0, np.int64)  # depth of each leaf added by insert()
        self.extra_pairs = np.zeros((0, 2), np.int64)  # (leaf id, doc id) added by insert(), sorted
        self._device = None
        self._host = None
        self._device_payload = None

    # ------------------------------------------------------------------------------------------------------
    # construction
    # ------------------------------------------------------------------------------------------------------

    @classmethod
    def build(cls, sequences, doc_ids: Optional[Sequence[int]] = None, *, vocab_size: int,
              eos_id: Optional[int] = None, append_eos: bool = False, dense_budget_bytes: int = 64 << 20,
              source: str = "docids") -> "TrieIndex":
        """Builds the trie.

        sequences: int array [M, D] (fixed-length docids), or M token lists (ragged; with `eos_id`, each must
            end with EOS, or pass `append_eos=True`). Without EOS a docid that is a strict prefix of another is
            an error (a leaf cannot have children).
        doc_ids: the document of each sequence (default: 0..M-1). Repeated sequences with different documents
            are collisions; repeated (sequence, document) pairs are kept once.
        """
        arr, lengths = _as_padded(sequences, vocab_size, eos_id, append_eos, source)
        return cls._from_padded(arr, lengths, doc_ids, vocab_size=vocab_size, eos_id=eos_id,
                                dense_budget_bytes=dense_budget_bytes, source=source)

    @classmethod
    def _from_padded(cls, arr: np.ndarray, lengths: np.ndarray, doc_ids, *, vocab_size: int,
                     eos_id: Optional[int], dense_budget_bytes: int, source: str) -> "TrieIndex":
        M = len(arr)
        docs = np.arange(M, dtype=np.int64) if doc_ids is None else np.asarray(doc_ids, np.int64)
        if docs.shape != (M,):
            raise ValueError(f"{source}: {len(docs)} document ids for {M} sequences")
        _check_doc_ids(docs, source)
        if M == 0:
            raise ValueError(f"{source}: no docids to index")
        ragged = bool(lengths.min() != lengths.max())
        rows, docs, lengths, u_len, u_fd, uniq = _sorted_distinct(arr, lengths, docs, vocab_size, ragged, source)
        levels = _levels(rows, u_len, u_fd, arr.shape[1], vocab_size, ragged)
        leaf_count = levels["leaf_count"]
        # Payload in leaf order: pair p belongs to unique row (cumsum of uniq) - 1.
        collisions = not uniq.all()
        if not ragged:  # leaves are the rows in order
            leaf_of_pair = np.cumsum(uniq) - 1 if collisions else None
        else:
            leaf_of_row = levels["leaf_of_row"]
            leaf_of_pair = leaf_of_row[np.cumsum(uniq) - 1] if collisions else leaf_of_row
            if not np.all(leaf_of_pair[1:] >= leaf_of_pair[:-1]):
                o = np.argsort(leaf_of_pair, kind="stable")
                leaf_of_pair, docs = leaf_of_pair[o], docs[o]
        if len(docs) == leaf_count:  # one document per leaf
            doc_offsets = np.arange(leaf_count + 1, dtype=np.int64)
        else:
            doc_offsets = np.concatenate([[0], np.cumsum(np.bincount(leaf_of_pair, minlength=leaf_count))])
        index = cls(vocab_size=vocab_size, eos_id=eos_id, offsets=levels["offsets"], tokens=levels["tokens"],
                    leaf_rank=levels["leaf_rank"], leaf_all=levels["leaf_all"],
                    doc_offsets=doc_offsets.astype(np.int64), doc_ids=docs, dense_budget_bytes=dense_budget_bytes)
        log.info("built trie: %d docids, %d (docid, document) pairs, depth %d, %.1f MB", len(u_fd), len(docs),
                 arr.shape[1], index.nbytes / 2**20)
        return index

    def _init_derived(self):
        self.depth = len(self.offsets)
        self.main_nodes = [len(t) for t in self.tokens]
        self.main_nodes[0] = 1
        leaves_per_depth = [0] + [
            self.main_nodes[d] if self.leaf_all[d] else (0 if self.leaf_rank[d] is None
                                                         else int((self.leaf_rank[d] >= 0).sum()))
            for d in range(1, self.depth + 1)]
        self.leaf_base = np.concatenate([[0], np.cumsum(leaves_per_depth)]).astype(np.int64)[:-1].tolist()
        self.main_leaves = int(sum(leaves_per_depth))
        self.max_children = [int(np.max(np.diff(o))) if len(o) > 1 else 0 for o in self.offsets]
        self.dense = []
        for d, off in enumerate(self.offsets):
            n = len(off) - 1
            if n > 0 and n * self.vocab_size * 4 <= self.dense_budget_bytes:
                table = np.full((n, self.vocab_size), -1, np.int32)
                parent = np.repeat(np.arange(n), np.diff(off))
                table[parent, self.tokens[d + 1].astype(np.int64)] = np.arange(len(parent), dtype=np.int32)
                self.dense.append(table)
            else:
                self.dense.append(None)
        # a dense row makes every beam score V slots instead of K: decoding reads it only where K is near V
        self.decode_dense = [t is not None and k * DENSE_MAX_SLOTS_PER_CHILD >= self.vocab_size
                             for t, k in zip(self.dense, self.max_children)]

    # ------------------------------------------------------------------------------------------------------
    # sizes
    # ------------------------------------------------------------------------------------------------------

    @property
    def num_leaves(self) -> int:
        return self.main_leaves + len(self.new_leaves)

    @property
    def num_docids(self) -> int:
        return self.num_leaves

    @property
    def num_nodes(self) -> int:
        return sum(self.main_nodes) + sum(self.new_nodes)

    @property
    def nbytes(self) -> int:
        """Bytes of every array of the index (CSR, dense tables, leaf ranks, payload, extras)."""
        arrays = [*self.offsets, *self.tokens, *(r for r in self.leaf_rank if r is not None),
                  *(t for t in self.dense if t is not None), self.doc_offsets, self.doc_ids, self.extra_pairs]
        for x in self.extras:
            arrays += [x.parent, x.token, x.child, x.leaf]
        return int(sum(a.nbytes for a in arrays))

    def nodes_at(self, depth: int) -> int:
        return self.main_nodes[depth] + self.new_nodes[depth]

    def device(self, on_host: bool = False):
        """The arrays on the default device (`index.device.DeviceTrie`), cached until the next insert(); concrete
        arrays even when first asked for inside a trace (a caller's jit), so the cache never holds a tracer.
        `on_host`: the same trie as numpy arrays (cached too), for placing it block by block over devices
        (`DeviceTrie.split`) without a whole copy on one device."""
        if on_host:
            if self._host is None:
                from gr_jax.index.device import to_device

                self._host = to_device(self, on_host=True)
            return self._host
        if self._device is None:
            import jax

            from gr_jax.index.device import to_device

            with jax.ensure_compile_time_eval():
                self._device = to_device(self)
        return self._device

    def device_payload(self):
        """leaf → documents on the default device (`index.device.DevicePayload`: one CSR over every leaf,
        inserted pairs included), cached until the next insert(). Kept apart from `device()`: decoding
        needs the tree, the beam → documents tail needs this."""
        if self._device_payload is None:
            import jax

            from gr_jax.index.device import DevicePayload

            offsets, docs = self.payload()
            with jax.ensure_compile_time_eval():  # as `device`
                self._device_payload = DevicePayload.build(offsets, docs)
        return self._device_payload

    def payload(self) -> tuple[np.ndarray, np.ndarray]:
        """(offsets int64 [num_leaves + 1], documents [P]): every leaf's documents, sorted, main and inserted."""
        leaf = np.repeat(np.arange(self.main_leaves, dtype=np.int64), np.diff(self.doc_offsets))
        leaf = np.concatenate([leaf, self.extra_pairs[:, 0]])
        docs = np.concatenate([self.doc_ids, self.extra_pairs[:, 1]]).astype(np.int64)
        order = np.lexsort((docs, leaf))
        counts = np.bincount(leaf, minlength=self.num_leaves)
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), docs[order]

    # ------------------------------------------------------------------------------------------------------
    # lookups (host side)
    # ------------------------------------------------------------------------------------------------------

    @staticmethod
    def _find_in_ranges(values: np.ndarray, lo: np.ndarray, hi: np.ndarray, target: np.ndarray,
                        max_range: int) -> np.ndarray:
        """Position of `target` inside sorted `values[lo:hi]` per query (vectorised binary search), or -1."""
        lo, hi = lo.astype(np.int64), hi.astype(np.int64)
        end = hi.copy()
        if len(values) == 0:
            return np.full(len(lo), -1, np.int64)
        for _ in range(int(np.ceil(np.log2(max_range + 1))) + 1):
            mid = (lo + hi) // 2
            go_right = (mid < hi) & (values[np.minimum(mid, len(values) - 1)] < target)
            lo = np.where(go_right, mid + 1, lo)
            hi = np.where(go_right, hi, mid)
        found = (lo < end) & (values[np.minimum(lo, len(values) - 1)] == target)
        return np.where(found, lo, -1)

    def _main_child(self, d: int, parent: np.ndarray, token: np.ndarray) -> np.ndarray:
        """Child of main nodes at depth d with the given tokens, or -1 (vectorised binary search)."""
        out = np.full(len(parent), -1, np.int64)
        if d >= self.depth or len(self.tokens[d + 1]) == 0:
            return out
        ok = (parent >= 0) & (parent < self.main_nodes[d])
        p = parent[ok]
        if self.dense[d] is not None:
            out[ok] = self.dense[d][p, token[ok]]
        else:
            out[ok] = self._find_in_ranges(self.tokens[d + 1], self.offsets[d][p], self.offsets[d][p + 1], token[ok],
                                           self.max_children[d])
        return out

    def _extra_child(self, d: int, parent: np.ndarray, token: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = self.extras[d] if d < self.depth else _Extras.empty()
        child = np.full(len(parent), -1, np.int64)
        leaf = np.full(len(parent), -1, np.int64)
        if len(x) == 0:
            return child, leaf
        key = x.parent * (self.vocab_size + 1) + x.token
        q = parent.astype(np.int64) * (self.vocab_size + 1) + token
        j = np.searchsorted(key, q)
        found = (j < len(key)) & (key[np.minimum(j, len(key) - 1)] == q) & (parent >= 0)
        child[found] = x.child[j[found]]
        leaf[found] = x.leaf[j[found]]
        return child, leaf

    def _leaf_of_main(self, d: int, node: np.ndarray) -> np.ndarray:
        out = np.full(len(node), -1, np.int64)
        ok = (node >= 0) & (node < self.main_nodes[d]) if d <= self.depth else np.zeros(len(node), bool)
        if d == 0 or d > self.depth or not ok.any():
            return out
        if self.leaf_all[d]:
            out[ok] = self.leaf_base[d] + node[ok]
        elif self.leaf_rank[d] is not None:
            r = self.leaf_rank[d][node[ok]]
            out[ok] = np.where(r >= 0, self.leaf_base[d] + r, -1)
        return out

    def _has_children(self, d: int, node: np.ndarray) -> np.ndarray:
        has = np.zeros(len(node), bool)
        if d < self.depth:
            main = (node >= 0) & (node < self.main_nodes[d])
            off = self.offsets[d]
            nm = node[main]
            has[main] = off[nm + 1] > off[nm]
            x = self.extras[d]
            if len(x):
                has |= np.isin(node, x.parent)
        return has

    def path_nodes(self, arr: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Node ids along each padded sequence: column t is the node at depth t (0 = root), for t ≤ its
        length; -1 past the end or where the path leaves the trie. Shape [M, D + 1]."""
        M, D = arr.shape
        nodes = np.full((M, D + 1), -1, np.int64)
        node = np.zeros(M, np.int64)
        nodes[:, 0] = 0
        for d in range(D):
            active = (lengths > d) & (node >= 0)
            t = np.where(active, arr[:, d], 0).astype(np.int64)
            p = np.where(active, node, -1)
            main = self._main_child(d, p, t)
            extra, _ = self._extra_child(d, p, t)
            node = np.where(active, np.where(main >= 0, main, extra), -1)
            nodes[:, d + 1] = node
        return nodes

    def lookup(self, sequences) -> np.ndarray:
        """Leaf id of each sequence, or -1 when it is not a docid of the index."""
        arr, lengths = _as_padded(sequences, self.vocab_size, None, False, "lookup")
        node = self.path_nodes(arr, lengths)[np.arange(len(arr)), lengths]
        return self._leaf_at(lengths, node)

    def _leaf_at(self, lengths: np.ndarray, node: np.ndarray) -> np.ndarray:
        """Leaf id of (depth, node) pairs, -1 where that node is not a leaf or does not exist."""
        out = np.full(len(node), -1, np.int64)
        for d in _sorted_unique(lengths):
            sel = (lengths == d) & (node >= 0)
            if not sel.any():
                continue
            n = node[sel]
            leaf = self._leaf_of_main(int(d), n)
            new = n >= self.main_nodes[int(d)] if int(d) <= self.depth else np.ones(len(n), bool)
            if new.any() and int(d) >= 1:
                x = self.extras[int(d) - 1]
                if len(x):
                    o = np.argsort(x.child)
                    j = np.clip(np.searchsorted(x.child[o], n[new]), 0, len(o) - 1)
                    hit = x.child[o][j] == n[new]
                    leaf[new] = np.where(hit, x.leaf[o][j], -1)
            out[sel] = leaf
        return out

    def documents(self, leaf_id: int) -> np.ndarray:
        """Sorted document ids of a leaf (main payload plus pairs added by insert())."""
        leaf_id = int(leaf_id)
        if not 0 <= leaf_id < self.num_leaves:
            raise ValueError(f"leaf id {leaf_id} out of range [0, {self.num_leaves})")
        docs = self.doc_ids[self.doc_offsets[leaf_id]:self.doc_offsets[leaf_id + 1]] \
            if leaf_id < self.main_leaves else np.zeros(0, np.int64)
        if len(self.extra_pairs):
            lo, hi = np.searchsorted(self.extra_pairs[:, 0], [leaf_id, leaf_id + 1])
            docs = np.union1d(docs, self.extra_pairs[lo:hi, 1])
        return np.sort(docs)

    # ------------------------------------------------------------------------------------------------------
    # enumeration
    # ------------------------------------------------------------------------------------------------------

    def _parent_and_token(self, d: int, node: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Parent (at depth d-1) and edge token of depth-d nodes."""
        parent = np.zeros(len(node), np.int64)
        token = np.zeros(len(node), np.int64)
        main = node < self.main_nodes[d]
        parent[main] = np.searchsorted(self.offsets[d - 1], node[main], side="right") - 1
        token[main] = self.tokens[d][node[main]]
        if (~main).any():
            x = self.extras[d - 1]
            o = np.argsort(x.child)
            j = o[np.searchsorted(x.child[o], node[~main])]
            parent[~main] = x.parent[j]
            token[~main] = x.token[j]
        return parent, token

    def leaf_sequences(self) -> tuple[np.ndarray, np.ndarray]:
        """Every docid as (int32 [num_leaves, max_depth] padded with -1 in leaf-id order, lengths)."""
        n = self.num_leaves
        D = self.depth
        out = np.full((n, D), _PAD, np.int32)
        lengths = np.zeros(n, np.int64)
        for d in range(1, D + 1):
            nodes = np.arange(self.main_nodes[d])
            leaves = self._leaf_of_main(d, nodes)
            sel = leaves >= 0
            nodes, leaves = nodes[sel], leaves[sel]
            x = self.extras[d - 1]
            new = x.leaf >= 0
            nodes = np.concatenate([nodes, x.child[new].astype(np.int64)])
            leaves = np.concatenate([leaves, x.leaf[new].astype(np.int64)])
            lengths[leaves] = d
            cur = nodes
            for dd in range(d, 0, -1):
                cur, tok = self._parent_and_token(dd, cur)
                out[leaves, dd - 1] = tok
        return out, lengths

    def pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All (sequence, document) pairs: (int32 [P, D] padded with -1, lengths [P], doc ids [P])."""
        seqs, lengths = self.leaf_sequences()
        leaf = np.repeat(np.arange(self.main_leaves), np.diff(self.doc_offsets))
        leaf = np.concatenate([leaf, self.extra_pairs[:, 0]]).astype(np.int64)
        docs = np.concatenate([self.doc_ids, self.extra_pairs[:, 1]])
        return seqs[leaf], lengths[leaf], docs

    # ------------------------------------------------------------------------------------------------------
    # save / load
    # ------------------------------------------------------------------------------------------------------

    def _arrays(self) -> dict[str, np.ndarray]:
        a = {"doc_offsets": self.doc_offsets, "doc_ids": self.doc_ids, "extra_pairs": self.extra_pairs,
             "new_leaves": self.new_leaves, "new_nodes": np.asarray(self.new_nodes, np.int64)}
        for d in range(self.depth):
            a[f"offsets_{d}"] = self.offsets[d]
            x = self.extras[d]
            a[f"extras_{d}_parent"], a[f"extras_{d}_token"] = x.parent, x.token
            a[f"extras_{d}_child"], a[f"extras_{d}_leaf"] = x.child, x.leaf
        for d in range(1, self.depth + 1):
            a[f"tokens_{d}"] = self.tokens[d]
            if self.leaf_rank[d] is not None:
                a[f"leaf_rank_{d}"] = self.leaf_rank[d]
        return a

    def save(self, path: str | os.PathLike) -> None:
        """Writes `path/index.npz` and `path/index.json` (metadata + sha256 of the npz); atomic."""
        path = Path(path)
        buf = io.BytesIO()
        np.savez(buf, **self._arrays())
        data = buf.getvalue()
        meta = {"format": FORMAT_TAG, "vocab_size": self.vocab_size, "eos_id": self.eos_id, "depth": self.depth,
                "leaf_all": self.leaf_all, "dense_budget_bytes": self.dense_budget_bytes,
                "num_leaves": self.num_leaves, "sha256": hashlib.sha256(data).hexdigest()}
        with atomic_dir(path) as tmp:
            (tmp / "index.npz").write_bytes(data)
            (tmp / "index.json").write_text(json.dumps(meta, indent=2))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TrieIndex":
        path = Path(path)
        try:
            meta = read_json(path / "index.json")
            data = (path / "index.npz").read_bytes()
        except FileNotFoundError as e:
            raise ValueError(f"{path}: not a saved TrieIndex ({e.filename} missing)") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path / 'index.json'}: invalid JSON ({e})") from None
        if meta.get("format") != FORMAT_TAG:
            raise ValueError(f"{path / 'index.json'}: format {meta.get('format')!r}, expected {FORMAT_TAG!r}")
        if hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            raise ValueError(f"{path / 'index.npz'}: checksum mismatch (file corrupt or modified)")
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            a = {k: z[k] for k in z.files}
        D = int(meta["depth"])
        index = cls(vocab_size=meta["vocab_size"], eos_id=meta["eos_id"],
                    offsets=[a[f"offsets_{d}"] for d in range(D)],
                    tokens=[np.zeros(0, np.int32)] + [a[f"tokens_{d}"] for d in range(1, D + 1)],
                    leaf_rank=[None] + [a.get(f"leaf_rank_{d}") for d in range(1, D + 1)],
                    leaf_all=list(meta["leaf_all"]), doc_offsets=a["doc_offsets"], doc_ids=a["doc_ids"],
                    dense_budget_bytes=meta["dense_budget_bytes"])
        index.extras = [_Extras(a[f"extras_{d}_parent"], a[f"extras_{d}_token"], a[f"extras_{d}_child"],
                                a[f"extras_{d}_leaf"]) for d in range(D)]
        index.new_nodes = a["new_nodes"].astype(int).tolist()
        index.new_leaves = a["new_leaves"]
        index.extra_pairs = a["extra_pairs"].reshape(-1, 2)
        return index
