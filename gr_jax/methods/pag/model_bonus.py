"""PAG's look-ahead bonus as the search reads it: per query, the best s_simul of the planned documents under each
docid prefix (`bonus_tables`: sorted key/value tables, or rows placed where the corpus trie keeps a beam's children
consecutive), looked up for a beam's children (`node_bonus`, `pruning_only`) and for a finished docid
(`leaf_bonus`). `methods/pag/model.py` wires them into `PagRetriever`'s search and re-exports them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def _segment_max_table(keys_BxN, vals_BxN):
    """Per row, the keys ascending, repeats kept, the largest value of a key first among its repeats: the first
    position of a key (`_lookup`'s binary search, side left) holds its max. One sort; keys < 0 (no node) sort
    first and are never looked up."""
    k, negv = jax.lax.sort((keys_BxN, -vals_BxN), dimension=1, num_keys=2)
    return k, -negv


DENSE_BONUS_NODES = 65536  # levels (and leaves) with at most this many ids keep a dense per-query bonus row


def _dense_row(ids_BxN, vals_BxN, size: int):
    """[B, size]: the max value per id (−inf where none), by one scatter-max."""
    B = ids_BxN.shape[0]
    rows = jnp.broadcast_to(jnp.arange(B)[:, None], ids_BxN.shape)
    row = jnp.full((B, size), -jnp.inf, jnp.float32)
    return row.at[rows, jnp.where(ids_BxN >= 0, ids_BxN, size)].max(vals_BxN, mode="drop")


def paths_in_leaf_order(doc_paths_DxM: np.ndarray, doc_leaf_D: np.ndarray) -> bool:
    """Whether the corpus rows taken in leaf order (stable) have every level's node ids (those ≥ 0) ascending:
    then so has any subset of them, e.g. a planning set (`bonus_tables`). True for a trie built at once from
    docids of one length (nodes numbered level by level in token order); not for docids of several lengths
    (leaves numbered length by length) nor promised after documents were added."""
    order = np.argsort(doc_leaf_D, kind="stable")
    for col in np.asarray(doc_paths_DxM)[order].T:
        ids = col[col >= 0]
        if len(ids) > 1 and (ids[1:] < ids[:-1]).any():
            return False
    return True


def _segment_max_ordered(keys_BxN, vals_BxN):
    """Per row, keys that ascend where ≥ 0 (−1: no node, anywhere) → the distinct keys ascending with the max
    value of each, padded with INT32_MAX / −inf (`_lookup` reads them like `_segment_max_table`'s): no sort,
    one segment-max."""
    B, N = keys_BxN.shape
    k = jax.lax.cummax(keys_BxN, axis=1)  # a −1 takes the key before it (its value is left out below)
    first = jnp.concatenate([jnp.ones((B, 1), bool), k[:, 1:] != k[:, :-1]], axis=1)
    seg = jnp.cumsum(first, axis=1, dtype=jnp.int32) - 1
    rows = jnp.broadcast_to(jnp.arange(B)[:, None], (B, N))
    keys = jnp.full((B, N), np.iinfo(np.int32).max, jnp.int32).at[rows, seg].set(k)
    vals = jnp.full((B, N), -jnp.inf, jnp.float32).at[rows, seg].max(jnp.where(keys_BxN >= 0, vals_BxN, -jnp.inf))
    return keys, vals


def bonus_tables(doc_paths_DxM, doc_leaf_D, planned_BxN, planned_s_BxN, dense_sizes=(),
                 leaf_ordered: bool = False, placed=()):
    """The look-ahead state of a batch: for every level d, the nodes at depth d + 1 under the planned documents
    with the max s_simul under each, and the same per leaf. Stored per level either as a dense row over the
    level's node ids (`dense_sizes[d]` > 0, static; the last entry is for the leaves) — one gather per lookup,
    for the small top levels where every beam has many children — or as sorted ids with the max of each at its
    first place (looked up by binary search). `leaf_ordered` (static): the index numbers the nodes of every
    level in the order of the leaves under them (`paths_in_leaf_order`, checked by `PagRetriever._doc_paths`),
    so one sort of the planned documents by leaf orders every level and each takes a segment-max; otherwise one
    sort per level. `placed[d]` (static): the search's trie gives each beam consecutive child ids at level d
    (`DeviceTrie.consecutive_children`), so `node_bonus` may place the table's nodes among a search's child slots
    (`_placed_bonus`) instead of looking every slot up."""
    M = doc_paths_DxM.shape[1]
    state = {"planned": planned_BxN, "planned_scores": planned_s_BxN}
    leaf, scores = doc_leaf_D[planned_BxN], planned_s_BxN
    if leaf_ordered:
        at = jnp.broadcast_to(jnp.arange(leaf.shape[1], dtype=jnp.int32)[None], leaf.shape)
        leaf, scores, at = jax.lax.sort((leaf, scores, at), dimension=1, num_keys=1)
        planned_BxN = jnp.take_along_axis(planned_BxN, at, axis=1)
    paths = doc_paths_DxM[planned_BxN]  # [B, n, M]
    sizes = tuple(dense_sizes) + (0,) * (M + 1 - len(dense_sizes))
    by_slot = tuple(placed) + (False,) * (M + 1 - len(placed))
    ids = [paths[:, :, d] for d in range(M)] + [leaf]
    for name, x, size, slots in zip([f"level_{d}" for d in range(M)] + ["leaf"], ids, sizes, by_slot):
        if size:
            state[f"{name}_dense"] = _dense_row(x, scores, size)
            continue
        table = _segment_max_ordered(x, scores) if leaf_ordered else _segment_max_table(x, scores)
        kind = "placed" if slots and name != "leaf" else "sorted"
        state[f"{name}_{kind}_keys"], state[f"{name}_{kind}_vals"] = table
    return state


def _lookup(keys_BxN, vals_BxN, ids, miss: float):
    """The value at the first position of each id ≥ 0 in the sorted keys (`_segment_max_table`), else `miss`."""
    B = keys_BxN.shape[0]
    flat = ids.reshape(B, -1)
    pos = jax.vmap(functools.partial(jnp.searchsorted, side="left"))(keys_BxN, flat)
    pos = jnp.clip(pos, 0, keys_BxN.shape[1] - 1)
    hit = (jnp.take_along_axis(keys_BxN, pos, axis=1) == flat) & (flat >= 0)
    out = jnp.where(hit, jnp.take_along_axis(vals_BxN, pos, axis=1), miss)
    return out.reshape(ids.shape)


def _placed_bonus(keys_BxN, vals_BxN, child_BxnxC, miss: float):
    """`_lookup` for a search's child slots at a level of consecutive children (`DeviceTrie.consecutive_children`:
    slot s of a beam holds its first child's id + s; −1 where no child): each table entry finds its slot instead
    of each slot its entry. The children of distinct beams are disjoint runs of ids, so a node lies under the beam
    whose first child is the largest id ≤ its own (a binary search over the n beams per table entry, not one over
    the table per child slot: n · C ≫ N at the wide levels), at slot id − first, which must hold that id. The
    first place of an id holds its max (both table forms); the rest of the slots get `miss`."""
    B, n, C = child_BxnxC.shape
    first = child_BxnxC[:, :, 0]  # −1: the beam has no child (or is dead)
    beams = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32)[None], (B, n))
    first, beams = jax.lax.sort((first, beams), dimension=1, num_keys=1)
    at = jax.vmap(functools.partial(jnp.searchsorted, side="right"))(first, keys_BxN) - 1
    at = jnp.clip(at, 0, n - 1)
    start = jnp.take_along_axis(first, at, axis=1)
    slot = keys_BxN - start
    lead = jnp.concatenate([jnp.ones((B, 1), bool), keys_BxN[:, 1:] != keys_BxN[:, :-1]], axis=1)
    flat = jnp.take_along_axis(beams, at, axis=1) * C + jnp.clip(slot, 0, C - 1)
    slots = child_BxnxC.reshape(B, n * C)
    ok = lead & (keys_BxN >= 0) & (start >= 0) & (slot < C) & (jnp.take_along_axis(slots, flat, axis=1) == keys_BxN)
    rows = jnp.broadcast_to(jnp.arange(B)[:, None], keys_BxN.shape)
    out = jnp.full((B, n * C), miss, jnp.float32).at[rows, jnp.where(ok, flat, n * C)].set(vals_BxN, mode="drop")
    return out.reshape(B, n, C)


def _bonus(state, name: str, ids, miss: float):
    dense = state.get(f"{name}_dense")
    if dense is None:
        if f"{name}_placed_keys" in state:
            keys, vals = state[f"{name}_placed_keys"], state[f"{name}_placed_vals"]
            if ids.ndim == 3 and ids.shape[1] * ids.shape[2] > keys.shape[1]:  # static: the cheaper way
                return _placed_bonus(keys, vals, ids, miss)
            return _lookup(keys, vals, ids, miss)
        return _lookup(state[f"{name}_sorted_keys"], state[f"{name}_sorted_vals"], ids, miss)
    B, size = dense.shape
    flat = ids.reshape(B, -1)
    got = jnp.take_along_axis(dense, jnp.clip(flat, 0, size - 1), axis=1)
    return jnp.where((flat >= 0) & (flat < size) & jnp.isfinite(got), got, miss).reshape(ids.shape)


def node_bonus(level: int, child_ids, state, restrict: bool = True):
    """`bonus_fn` of the search: max s_simul over planned documents under each child node; a node under none
    gets −inf (removed: the trie of the planning set) or, with restrict False, 0. Where the tables were built
    `placed` at this level, `child_ids` must be a search's child slots [B, n, C] (`bonus_tables`)."""
    return _bonus(state, f"level_{level}", child_ids, -jnp.inf if restrict else 0.0)


def pruning_only(level: int, child_ids, state):
    """The planning-set trie without the bonus (mode "pag_unguided"): 0 under planned documents, else −inf."""
    return jnp.where(jnp.isfinite(node_bonus(level, child_ids, state)), 0.0, -jnp.inf)


@jax.jit
def _final_at_places(scores_BxN, valid_BxN, places_BxN, docid_max_BxP):
    """PAG's final scores of finished beams over a `PlanningTrie`: raw sum + the max s_simul read at each beam's
    place (its state)."""
    bonus = jnp.take_along_axis(docid_max_BxP, jnp.clip(places_BxN, 0, docid_max_BxP.shape[1] - 1), axis=1)
    return jnp.where(valid_BxN, scores_BxN + bonus, -jnp.inf)


def leaf_bonus(leaf_ids, state):
    """Max s_simul of the planned documents with each leaf's docid (0 when none)."""
    return _bonus(state, "leaf", leaf_ids, 0.0)
