"""The device copy of a `TrieIndex`: arrays as a pytree (jit arguments, never baked-in constants) plus the
static shape facts of each level (branching K, dense or CSR, where leaves are) as pytree metadata.

`level_candidates(trie, d, node)` is the one place that turns beam states (node ids at depth d) into the K
child slots gathered per beam — shared by beam search and exhaustive scoring.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class LevelSpec:
    """Static facts about the children of depth-d nodes."""

    dense: bool  # children read from a dense [n_main, V] table
    max_children: int  # K: CSR child slots gathered per beam (0 when dense or no children)
    n_main: int  # nodes with a row at depth d (the main nodes; with inserted nodes, a power-of-two capacity)
    leaf_mode: str  # leaves among the children: "none" | "all" | "some" (main CSR) | "table" (leaf ids stored)
    leaf_base: int  # first leaf id at depth d+1 ("all" / "some")
    has_leaves: bool  # some child at depth d+1 is a leaf
    vocab_size: int

    @property
    def num_slots(self) -> int:
        return self.vocab_size if self.dense else self.max_children


@flax.struct.dataclass
class DeviceTrie:
    levels: tuple  # per depth d in [0, depth): dict of arrays
    specs: tuple = flax.struct.field(pytree_node=False)  # per depth: LevelSpec
    vocab_size: int = flax.struct.field(pytree_node=False)
    eos_id: Optional[int] = flax.struct.field(pytree_node=False)

    @property
    def depth(self) -> int:
        return len(self.specs)

    # the decoding-constraint interface (`index.constraint.Constraint`): a beam's state is its node id
    def root(self, shape: tuple) -> jax.Array:
        return jnp.zeros(shape, jnp.int32)

    def children(self, d: int, node: jax.Array):
        return level_candidates(self, d, node)

    def has_leaves(self, d: int) -> bool:
        return self.specs[d].has_leaves


def to_device(index) -> DeviceTrie:
    """Copies a TrieIndex to the default device.

    A level below which `insert()` added nodes is folded into one table of every child, main and inserted, in
    token order: a dense level's [rows, V] child table gains the inserted children at their tokens' slots, a CSR
    level's children are re-sorted by (parent, token) with their child and leaf ids stored; rows, children and
    the slots per beam K are padded to powers of two, at least twice the built trie's (room for the corpus to
    double, as it does over the dynamic protocol's steps). So the slots of a beam are the slots of the same trie
    rebuilt (`compact()`: the same tie order), and inserting more docids keeps the shapes and static facts (a
    search compiled before the insert is reused) until a capacity is crossed, a level receives its first inserted
    node, or a level its first leaf. The price, while inserted nodes are in a level: its child and leaf ids are
    stored (int32) at up to 4× the built level's size, and a beam gathers up to 2–4× its slots (`compact()` folds
    them back). The fold re-sorts the level's children at each `device()` after an insert (~0.15 s at 500k).
    A level without inserted nodes keeps its compact form (child id = CSR position, leaves by rule)."""
    levels, specs = [], []
    V = index.vocab_size
    for d in range(index.depth):
        arrays = {}
        dense = index.decode_dense[d]
        x = index.extras[d]
        leaf_mode = "all" if index.leaf_all[d + 1] else ("some" if index.leaf_rank[d + 1] is not None else "none")
        has_leaves = leaf_mode != "none" or bool(len(x) and (x.leaf >= 0).any())
        rows, K, leaf_base = index.main_nodes[d], (0 if dense else index.max_children[d]), index.leaf_base[d + 1]
        if len(x) or index.new_nodes[d]:
            parent, token, child, leaf = _children(index, d, leaf_mode, x)
            rows = _capacity(max(index.nodes_at(d), 2 * index.main_nodes[d]))
            if dense:
                arrays["dense"] = _scatter(rows, V, parent, token, child)
                if has_leaves:
                    arrays["leaf"] = _scatter(rows, V, parent, token, leaf)
            else:
                order = np.lexsort((token, parent))
                counts = np.bincount(parent, minlength=rows)
                K = _capacity(max(counts.max(), 2 * K)) if len(parent) else 0
                offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
                arrays["offsets"] = jnp.asarray(offsets.astype(np.int32 if offsets[-1] < 2**31 else np.int64))
                cap = _capacity(max(len(parent), 2 * len(index.tokens[d + 1])))
                for name, a in (("tokens", token), ("child", child), ("leaf", leaf)):
                    arrays[name] = jnp.asarray(np.pad(a[order], (0, cap - len(a)), constant_values=-1))
            leaf_mode, leaf_base = ("table" if has_leaves else "none"), 0
        elif dense:
            arrays["dense"] = jnp.asarray(index.dense[d])
        elif K > 0:
            arrays["offsets"] = jnp.asarray(index.offsets[d])
            arrays["tokens"] = jnp.asarray(index.tokens[d + 1])
        if leaf_mode == "some":
            arrays["leaf_rank"] = jnp.asarray(index.leaf_rank[d + 1])
        specs.append(LevelSpec(dense=dense, max_children=K, n_main=rows, leaf_mode=leaf_mode,
                               leaf_base=int(leaf_base), has_leaves=has_leaves, vocab_size=V))
        levels.append(arrays)
    return DeviceTrie(levels=tuple(levels), specs=tuple(specs), vocab_size=V, eos_id=index.eos_id)


def _children(index, d: int, leaf_mode: str, x) -> tuple[np.ndarray, ...]:
    """(parent, token, child id, leaf id) int32 of every child of a depth-d node, main then inserted."""
    offsets = np.asarray(index.offsets[d], np.int64)
    child = np.arange(offsets[-1], dtype=np.int64)  # a main child's id at depth d+1 is its CSR position
    parent = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    if leaf_mode == "all":
        leaf = index.leaf_base[d + 1] + child
    elif leaf_mode == "some":
        rank = np.asarray(index.leaf_rank[d + 1])[child]
        leaf = np.where(rank >= 0, index.leaf_base[d + 1] + rank, -1)
    else:
        leaf = np.full(len(child), -1)
    out = (np.concatenate([parent, x.parent]), np.concatenate([np.asarray(index.tokens[d + 1])[child], x.token]),
           np.concatenate([child, x.child]), np.concatenate([leaf, x.leaf]))
    return tuple(a.astype(np.int32) for a in out)


def _scatter(rows: int, V: int, parent, token, values) -> jax.Array:
    table = np.full((rows, V), -1, np.int32)
    table[parent, token] = values
    return jnp.asarray(table)


def level_candidates(trie: DeviceTrie, d: int, node: jax.Array):
    """Child slots of depth-d nodes.

    node: int32 [...] node ids at depth d (negative = no node).
    Returns (tokens [..., C] or None when the slots are exactly the vocabulary in order, child node ids
    [..., C] at depth d+1, leaf ids [..., C] (-1: not a leaf), valid [..., C]) with C = spec.num_slots.
    """
    spec, arr = trie.specs[d], trie.levels[d]
    on_main = (node >= 0) & (node < spec.n_main)
    safe = jnp.clip(node, 0, max(spec.n_main - 1, 0))
    tokens, leaf = None, None
    if spec.dense:
        child = arr["dense"][safe]
        valid = (child >= 0) & on_main[..., None]
        if spec.leaf_mode == "table":
            leaf = jnp.where(valid, arr["leaf"][safe], -1)
    elif spec.max_children > 0:
        start = arr["offsets"][safe]
        count = jnp.where(on_main, arr["offsets"][safe + 1] - start, 0)
        slot = jnp.arange(spec.max_children, dtype=start.dtype)
        valid = slot < count[..., None]
        pos = jnp.where(valid, start[..., None] + slot, 0)
        tokens = arr["tokens"][pos].astype(jnp.int32)
        child = arr["child"][pos] if "child" in arr else pos
        if spec.leaf_mode == "table":
            leaf = jnp.where(valid, arr["leaf"][pos], -1)
    else:
        child = jnp.zeros((*node.shape, 0), jnp.int32)
        valid = jnp.zeros((*node.shape, 0), bool)
        tokens = jnp.zeros((*node.shape, 0), jnp.int32)
    if spec.leaf_mode == "all":
        leaf = jnp.where(valid, spec.leaf_base + child, -1)
    elif spec.leaf_mode == "some":
        rank = arr["leaf_rank"][jnp.maximum(child, 0)]
        leaf = jnp.where(valid & (rank >= 0), spec.leaf_base + rank, -1)
    elif leaf is None:  # "none" ("table": read above)
        leaf = jnp.full(child.shape, -1, jnp.int32)
    return tokens, child.astype(jnp.int32), leaf.astype(jnp.int32), valid


@flax.struct.dataclass
class DevicePayload:
    """leaf → documents on the device: `docs[offsets[l]:offsets[l + 1]]` are leaf l's documents (corpus rows,
    sorted); `max_docs` (static) is the most documents any leaf holds, P in `leaf_documents`. Both arrays are
    padded to a power of two (leaves past the last hold nothing)."""

    offsets: jax.Array  # int32/int64 [num_leaves + 1]
    docs: jax.Array  # int32 [num_pairs] (int64 rows past 2**31 are kept as int64)
    max_docs: int = flax.struct.field(pytree_node=False)

    @classmethod
    def build(cls, offsets: np.ndarray, docs: np.ndarray) -> "DevicePayload":
        counts = np.diff(offsets)
        dtype = np.int32 if (not len(docs) or docs.max() < 2**31) and offsets[-1] < 2**31 else np.int64
        # padded to a power of two (leaves past the last one hold no document): a payload that grows by inserts
        # keeps its shapes for a while, and `leaf_documents` its compilation
        offsets = np.pad(offsets, (0, _capacity(len(offsets)) - len(offsets)), mode="edge")
        docs = np.pad(docs, (0, _capacity(len(docs)) - len(docs)), constant_values=-1)
        return cls(offsets=jnp.asarray(offsets.astype(dtype)), docs=jnp.asarray(docs.astype(dtype)),
                   max_docs=max(int(counts.max()) if len(counts) else 1, 1))


def _capacity(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


@jax.jit
def leaf_documents(payload: DevicePayload, leaf_ids: jax.Array):
    """Documents of each leaf: (docs [..., P], valid [..., P]) for leaf ids [...] (negative: none)."""
    has = leaf_ids >= 0
    safe = jnp.where(has, leaf_ids, 0)
    start = payload.offsets[safe]
    count = jnp.where(has, payload.offsets[safe + 1] - start, 0)
    slot = jnp.arange(payload.max_docs, dtype=start.dtype)
    valid = slot < count[..., None]
    docs = payload.docs[jnp.where(valid, start[..., None] + slot, 0)]
    return jnp.where(valid, docs, -1), valid
