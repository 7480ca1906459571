"""`TrieIndex.insert` and what it needs: new (docid, document) pairs walked down the existing levels, the new
nodes recorded in each depth's extras table (sorted by parent and token; decoding reads it beside the main CSR),
payload entries added, a failed insert rolled back whole, and `compact` folding everything back into plain CSR.
A mixin of `TrieIndex` (`index/trie.py`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from gr_jax.index.trie_build import _Extras, _as_padded, _check_doc_ids, _sorted_unique


class TrieInserts:
    """The insertion methods of `TrieIndex` (module docstring)."""


    def insert(self, sequences, doc_ids: Sequence[int], append_eos: bool = False,
               source: str = "inserted docids") -> dict:
        """Adds (docid, document) pairs; cost grows with the number of new pairs, not with the index.

        Existing pairs are ignored; an existing docid with a new document only extends its payload.
        Returns counts: {"pairs_added", "docids_added", "nodes_added"}.
        """
        arr, lengths = _as_padded(sequences, self.vocab_size, self.eos_id, append_eos, source)
        docs = np.asarray(doc_ids, np.int64)
        if docs.shape != (len(arr),):
            raise ValueError(f"{source}: {len(docs)} document ids for {len(arr)} sequences")
        _check_doc_ids(docs, source)
        if len(arr) == 0:
            return {"pairs_added": 0, "docids_added": 0, "nodes_added": 0}
        if arr.shape[1] > self.depth:
            self._grow_depth(arr.shape[1])
        pending: list[tuple[int, _Extras]] = []  # the extras added so far, undone if a docid is refused
        node, exists, nodes_added = self._walk_inserted(arr, lengths, pending, source)
        # End nodes: existing ones must be leaves; new ones become leaves and must not have children.
        leaf = self._leaf_at(lengths, np.where(exists, node, -1))
        interior = exists & (leaf < 0)
        if interior.any():
            i = int(np.argmax(interior))
            self._rollback(pending)
            raise ValueError(f"{source}: sequence {arr[i, :lengths[i]].tolist()} is a strict prefix of an existing "
                             f"docid; end lexical docids with EOS")
        n_new_leaves = self._add_leaves(arr, lengths, node, ~exists, leaf, pending, source) if not exists.all() else 0
        added = self._add_pairs(leaf, docs)
        self._device = self._host = self._device_payload = None
        return {"pairs_added": added, "docids_added": int(n_new_leaves), "nodes_added": int(nodes_added)}

    def _walk_inserted(self, arr: np.ndarray, lengths: np.ndarray, pending: list, source: str):
        """Follows every inserted sequence down the tree, creating the missing nodes level by level (as extras
        of their depth) → (end node of each sequence, whether it existed before this call, nodes added)."""
        node = np.zeros(len(arr), np.int64)
        exists = np.ones(len(arr), bool)  # still on nodes that existed before this call
        nodes_added = 0
        for d in range(arr.shape[1]):
            active = lengths > d
            t = arr[:, d].astype(np.int64)
            p = np.where(active, node, -1)
            # a docid cannot continue below an existing leaf
            if d > 0:
                leaf_here = self._leaf_at(np.full(len(p), d), np.where(active & exists, p, -1)) >= 0
                if leaf_here.any():
                    i = int(np.argmax(leaf_here))
                    self._rollback(pending)
                    raise ValueError(f"{source}: sequence {arr[i, :lengths[i]].tolist()} extends an existing "
                                     f"docid (a leaf cannot have children)")
            main = self._main_child(d, np.where(exists, p, -1), t)
            extra, _ = self._extra_child(d, np.where(exists, p, -1), t)
            found = active & exists & ((main >= 0) | (extra >= 0))
            nxt = np.where(main >= 0, main, extra)
            make = active & ~found
            if make.any():
                key = p[make] * (self.vocab_size + 1) + t[make]
                uniq_key, inverse = np.unique(key, return_inverse=True)
                new_ids = self.nodes_at(d + 1) + np.arange(len(uniq_key))
                nxt[np.flatnonzero(make)] = new_ids[inverse]
                self.new_nodes[d + 1] += len(uniq_key)
                nodes_added += len(uniq_key)
                pending.append((d, _Extras(uniq_key // (self.vocab_size + 1), (uniq_key % (self.vocab_size + 1))
                                           .astype(np.int32), new_ids.astype(np.int32),
                                           np.full(len(uniq_key), -1, np.int32))))
                self._merge_extras(d, pending[-1][1])
            node = np.where(active, nxt, node)
            exists = exists & found | ~active & exists
        return node, exists, nodes_added

    def _add_leaves(self, arr: np.ndarray, lengths: np.ndarray, node: np.ndarray, new_end: np.ndarray,
                    leaf: np.ndarray, pending: list, source: str) -> int:
        """Makes the new end nodes leaves (numbered after the existing ones) and writes their ids into `leaf`;
        a new end node that has children is an error (a strict prefix). Returns the number of new leaves."""
        key = lengths[new_end] * (1 << 40) + node[new_end]
        uniq_key, inverse = np.unique(key, return_inverse=True)
        end_depth, end_node = uniq_key >> 40, uniq_key & ((1 << 40) - 1)
        has_kids = np.zeros(len(uniq_key), bool)
        for dd in np.unique(end_depth):
            sel = end_depth == dd
            has_kids[sel] = self._has_children(int(dd), end_node[sel])
        if has_kids.any():
            self._rollback(pending)
            j = int(np.flatnonzero(new_end)[np.flatnonzero(inverse == int(np.argmax(has_kids)))[0]])
            raise ValueError(f"{source}: sequence {arr[j, :lengths[j]].tolist()} is a strict prefix of another "
                             f"inserted docid; end lexical docids with EOS")
        new_leaf_ids = self.num_leaves + np.arange(len(uniq_key))
        for dd in np.unique(end_depth):
            x = self.extras[int(dd) - 1]
            sel = end_depth == dd
            o = np.argsort(x.child)
            x.leaf[o[np.searchsorted(x.child[o], end_node[sel])]] = new_leaf_ids[sel]
        self.new_leaves = np.concatenate([self.new_leaves, end_depth])
        leaf[np.flatnonzero(new_end)] = new_leaf_ids[inverse]
        return len(uniq_key)

    def _add_pairs(self, leaf: np.ndarray, docs: np.ndarray) -> int:
        """Adds the (leaf, document) pairs not in the payload yet; returns how many."""
        key = _sorted_unique(leaf * (1 << 32) + docs)
        pairs = np.stack([key >> 32, key & ((1 << 32) - 1)], 1)
        add = pairs[~self._pairs_present(pairs)]
        if len(add):  # both sorted by (leaf, doc): merged by position, O(existing + new)
            old = self.extra_pairs
            at = np.searchsorted(old[:, 0] * (1 << 32) + old[:, 1], add[:, 0] * (1 << 32) + add[:, 1])
            self.extra_pairs = np.insert(old, at, add, axis=0)
        return int(len(add))

    def _pairs_present(self, pairs: np.ndarray) -> np.ndarray:
        """Which (leaf, doc) rows are already in the payload (main CSR, sorted per leaf, or inserted pairs)."""
        leaf, doc = pairs[:, 0], pairs[:, 1]
        present = np.zeros(len(pairs), bool)
        main = leaf < self.main_leaves
        if main.any():
            lf = leaf[main]
            lo, hi = self.doc_offsets[lf], self.doc_offsets[lf + 1]
            max_range = int((hi - lo).max()) if len(lo) else 0
            present[main] = self._find_in_ranges(self.doc_ids, lo, hi, doc[main], max_range) >= 0
        if len(self.extra_pairs):
            key = self.extra_pairs[:, 0] * (1 << 32) + self.extra_pairs[:, 1]
            q = leaf * (1 << 32) + doc
            j = np.clip(np.searchsorted(key, q), 0, len(key) - 1)
            present |= key[j] == q
        return present

    def _merge_extras(self, d: int, add: _Extras) -> None:
        """Merges entries already sorted by (parent, token) into depth d's extras: O(existing + new)."""
        x = self.extras[d]
        if len(x) == 0:
            self.extras[d] = add
            return
        base = self.vocab_size + 1
        at = np.searchsorted(x.parent * base + x.token, add.parent * base + add.token)
        self.extras[d] = _Extras(np.insert(x.parent, at, add.parent), np.insert(x.token, at, add.token),
                                 np.insert(x.child, at, add.child), np.insert(x.leaf, at, add.leaf))

    def _rollback(self, pending) -> None:
        for d, add in pending:
            x = self.extras[d]
            keep = ~np.isin(x.child, add.child)
            self.extras[d] = _Extras(x.parent[keep], x.token[keep], x.child[keep], x.leaf[keep])
            self.new_nodes[d + 1] -= len(add)

    def _grow_depth(self, D: int) -> None:
        """Adds empty main levels so docids longer than the current depth can be inserted."""
        while self.depth < D:
            n = self.main_nodes[self.depth]
            self.offsets.append(np.zeros(n + 1, np.int32))
            self.tokens.append(np.zeros(0, self.tokens[-1].dtype))
            self.leaf_rank.append(None)
            self.leaf_all.append(False)
            self.depth += 1
            self.main_nodes.append(0)
            self.new_nodes.append(0)
            self.max_children.append(0)
            self.dense.append(None)
            self.decode_dense.append(False)
            self.extras.append(_Extras.empty())
            self.leaf_base.append(self.main_leaves)

    def compact(self):
        """A new index with everything in plain CSR (the result of building from all pairs at once)."""
        seqs, lengths, docs = self.pairs()
        return type(self)._from_padded(seqs, lengths, docs, vocab_size=self.vocab_size, eos_id=self.eos_id,
                                       dense_budget_bytes=self.dense_budget_bytes, source="compact")
