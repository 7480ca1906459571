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
    max_children: int  # K: CSR child slots gathered per beam (0 when dense or no main children)
    max_extra_children: int  # Kx: slots for children added by insert()
    n_main: int  # main (CSR) nodes at depth d
    leaf_mode: str  # leaves among depth-(d+1) main nodes: "none" | "all" | "some"
    leaf_base: int  # first leaf id at depth d+1
    has_leaves: bool  # some child at depth d+1 (main or inserted) is a leaf
    vocab_size: int

    @property
    def num_slots(self) -> int:
        return (self.vocab_size if self.dense else self.max_children) + self.max_extra_children


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
    """Copies a TrieIndex to the default device."""
    levels, specs = [], []
    V = index.vocab_size
    for d in range(index.depth):
        arrays = {}
        dense = index.decode_dense[d]
        if dense:
            arrays["dense"] = jnp.asarray(index.dense[d])
        elif index.max_children[d] > 0:
            arrays["offsets"] = jnp.asarray(index.offsets[d])
            arrays["tokens"] = jnp.asarray(index.tokens[d + 1])
        if index.leaf_rank[d + 1] is not None:
            arrays["leaf_rank"] = jnp.asarray(index.leaf_rank[d + 1])
        x = index.extras[d]
        kx = 0
        if len(x):
            parents, first, counts = np.unique(x.parent, return_index=True, return_counts=True)
            kx = int(counts.max())
            arrays["x_parents"] = jnp.asarray(parents.astype(np.int32))
            arrays["x_off"] = jnp.asarray(np.concatenate([first, [len(x)]]).astype(np.int32))
            arrays["x_tokens"] = jnp.asarray(x.token.astype(np.int32))
            arrays["x_child"] = jnp.asarray(x.child.astype(np.int32))
            arrays["x_leaf"] = jnp.asarray(x.leaf.astype(np.int32))
        leaf_mode = "all" if index.leaf_all[d + 1] else ("some" if index.leaf_rank[d + 1] is not None else "none")
        specs.append(LevelSpec(
            dense=dense, max_children=0 if dense else index.max_children[d], max_extra_children=kx,
            n_main=index.main_nodes[d], leaf_mode=leaf_mode, leaf_base=int(index.leaf_base[d + 1]),
            has_leaves=leaf_mode != "none" or bool(len(x) and (x.leaf >= 0).any()), vocab_size=V))
        levels.append(arrays)
    return DeviceTrie(levels=tuple(levels), specs=tuple(specs), vocab_size=V, eos_id=index.eos_id)


def level_candidates(trie: DeviceTrie, d: int, node: jax.Array):
    """Child slots of depth-d nodes.

    node: int32 [...] node ids at depth d (negative = no node).
    Returns (tokens [..., C] or None when the slots are exactly the vocabulary in order, child node ids
    [..., C] at depth d+1, leaf ids [..., C] (-1: not a leaf), valid [..., C]) with C = spec.num_slots.
    """
    spec, arr = trie.specs[d], trie.levels[d]
    on_main = (node >= 0) & (node < spec.n_main)
    safe = jnp.clip(node, 0, max(spec.n_main - 1, 0))
    tokens = None
    if spec.dense:
        child = arr["dense"][safe]
        valid = (child >= 0) & on_main[..., None]
    elif spec.max_children > 0:
        start = arr["offsets"][safe]
        count = jnp.where(on_main, arr["offsets"][safe + 1] - start, 0)
        slot = jnp.arange(spec.max_children, dtype=jnp.int32)
        valid = slot < count[..., None]
        child = jnp.where(valid, start[..., None] + slot, 0)
        tokens = arr["tokens"][child].astype(jnp.int32)
    else:
        child = jnp.zeros((*node.shape, 0), jnp.int32)
        valid = jnp.zeros((*node.shape, 0), bool)
        tokens = jnp.zeros((*node.shape, 0), jnp.int32)
    if spec.leaf_mode == "all":
        leaf = jnp.where(valid, spec.leaf_base + child, -1)
    elif spec.leaf_mode == "some":
        rank = arr["leaf_rank"][jnp.maximum(child, 0)]
        leaf = jnp.where(valid & (rank >= 0), spec.leaf_base + rank, -1)
    else:
        leaf = jnp.full(child.shape, -1, jnp.int32)
    if spec.max_extra_children > 0:
        xp = arr["x_parents"]
        j = jnp.clip(jnp.searchsorted(xp, node), 0, xp.shape[0] - 1)
        has = (xp[j] == node) & (node >= 0)
        xs = arr["x_off"][j]
        xcount = jnp.where(has, arr["x_off"][j + 1] - xs, 0)
        slot = jnp.arange(spec.max_extra_children, dtype=jnp.int32)
        xvalid = slot < xcount[..., None]
        xi = jnp.where(xvalid, xs[..., None] + slot, 0)
        if tokens is None:
            tokens = jnp.broadcast_to(jnp.arange(spec.vocab_size, dtype=jnp.int32), child.shape)
        tokens = jnp.concatenate([tokens, arr["x_tokens"][xi]], axis=-1)
        child = jnp.concatenate([child, arr["x_child"][xi]], axis=-1)
        leaf = jnp.concatenate([leaf, jnp.where(xvalid, arr["x_leaf"][xi], -1)], axis=-1)
        valid = jnp.concatenate([valid, xvalid], axis=-1)
    return tokens, child.astype(jnp.int32), leaf.astype(jnp.int32), valid


@flax.struct.dataclass
class DevicePayload:
    """leaf → documents on the device: `docs[offsets[l]:offsets[l + 1]]` are leaf l's documents (corpus rows,
    sorted); `max_docs` (static) is the most documents any leaf holds, P in `leaf_documents`."""

    offsets: jax.Array  # int32/int64 [num_leaves + 1]
    docs: jax.Array  # int32 [num_pairs] (int64 rows past 2**31 are kept as int64)
    max_docs: int = flax.struct.field(pytree_node=False)

    @classmethod
    def build(cls, offsets: np.ndarray, docs: np.ndarray) -> "DevicePayload":
        counts = np.diff(offsets)
        dtype = np.int32 if (not len(docs) or docs.max() < 2**31) and offsets[-1] < 2**31 else np.int64
        return cls(offsets=jnp.asarray(offsets.astype(dtype)), docs=jnp.asarray(docs.astype(dtype)),
                   max_docs=max(int(counts.max()) if len(counts) else 1, 1))


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
