"""The device copy of a `TrieIndex`: arrays as a pytree (jit arguments, never baked-in constants) plus the
static shape facts of each level (branching K, dense or CSR, where leaves are) as pytree metadata.

`level_candidates(trie, d, node)` is the one place that turns beam states (node ids at depth d) into the K
child slots gathered per beam — shared by beam search and exhaustive scoring.

**Split over devices** (`DeviceTrie.split(S)`): a trie larger than a device keeps every CSR level and run table
split into S contiguous blocks along its first axis, one per device of a mesh axis ("index"), inside a
`shard_map` (the `Searcher` over a mesh with an "index" axis). Nodes are numbered in prefix order, so a block
is a range of docid prefixes. Each read of such an array (`_take`) looks the index up in the device's own block,
contributes 0 where the index lies in another block, and sums over the axis: exactly one device holds each
entry, so every device gets the replicated trie's values bit for bit, and the search — run alike on every device
of the axis — gives the replicated search's docids and scores. A device holds 1/S of those arrays; dense levels
(bounded by the trie's byte budget) stay whole on every device. Each level read costs one integer all-reduce of
the beams' child slots.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P


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
    run: int = -1  # the level's arrays sit in `DeviceTrie.runs[run]` at position `run_pos` (-1: in `levels[d]`)
    run_pos: int = 0
    consecutive: bool = False  # a node's children are ids first, first + 1, ... in slot order (CSR, none inserted)

    @property
    def num_slots(self) -> int:
        return self.vocab_size if self.dense else self.max_children


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Static facts of a run: consecutive CSR levels [start, stop) whose arrays are stored together, so that a
    search reads any of them with the depth as a traced value (`DeviceTrie.children_in_run`)."""

    start: int
    stop: int
    slots: int  # C: child slots per beam at every level of the run (≥ each level's own K, a power of two)


@flax.struct.dataclass
class DeviceTrie:
    levels: tuple  # per depth d in [0, depth): dict of arrays ({} for a level stored in a run)
    specs: tuple = flax.struct.field(pytree_node=False)  # per depth: LevelSpec
    vocab_size: int = flax.struct.field(pytree_node=False)
    eos_id: Optional[int] = flax.struct.field(pytree_node=False)
    runs: tuple = ()  # per run: dict of arrays (`_run_arrays`)
    run_specs: tuple = flax.struct.field(pytree_node=False, default=())  # per run: RunSpec
    shards: int = flax.struct.field(pytree_node=False, default=1)  # S: CSR and run arrays split in S blocks

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

    def consecutive_children(self, d: int) -> bool:
        """Whether at depth d a beam's valid child slots hold consecutive node ids in slot order (the compact CSR
        form, where a child's id is its CSR position: a level in which no node was inserted), so slot s of a beam
        holds its first child's id + s. Static: lets a bonus place a depth-(d + 1) node by arithmetic."""
        return self.specs[d].consecutive

    def level_runs(self) -> tuple:
        """(start, stop) of each run of levels that `children_in_run` serves with a traced depth."""
        return tuple((r.start, r.stop) for r in self.run_specs)

    def children_in_run(self, run: int, d, node: jax.Array):
        """`children` at a depth d (a traced int32 scalar, start ≤ d < stop) of run `run` (static): the run's C
        slots per beam at every one of its levels."""
        spec = self.run_specs[run]
        return _run_candidates(self.runs[run], d - spec.start, node, spec.slots, _taker(self.shards))

    # split over the devices of a mesh axis (module docstring)
    def split(self, shards: int) -> "DeviceTrie":
        """This trie with its CSR level and run arrays padded to a multiple of `shards` rows (never read), to be
        placed block by block over a mesh axis named SHARD_AXIS (`partition_specs`) and searched inside a
        `shard_map` over it. `split(1)` is the whole trie. Split a host copy (`TrieIndex.device(on_host=True)`)
        for a trie larger than a device: a device copy is whole on one device first."""
        if not check_split(shards, self.shards, "trie"):
            return self

        def pad(x):  # numpy stays numpy (`to_device(on_host=True)`): placed block by block, never whole
            widths = [(0, -x.shape[0] % shards)] + [(0, 0)] * (x.ndim - 1)
            return np.pad(x, widths) if isinstance(x, np.ndarray) else jnp.pad(x, widths)

        levels = tuple(arrays if spec.dense else {k: pad(v) for k, v in arrays.items()}
                       for spec, arrays in zip(self.specs, self.levels))
        runs = tuple({k: pad(v) for k, v in arrays.items()} for arrays in self.runs)
        return self.replace(levels=levels, runs=runs, shards=shards)

    def partition_specs(self) -> "DeviceTrie":
        """This trie's pytree with a `PartitionSpec` per array: its blocks over SHARD_AXIS where it is split."""
        split = self.shards > 1
        block, whole = P(SHARD_AXIS) if split else P(), P()
        levels = tuple({k: whole if spec.dense else block for k in arrays}
                       for spec, arrays in zip(self.specs, self.levels))
        return self.replace(levels=levels, runs=tuple({k: block for k in arrays} for arrays in self.runs))

    def nbytes_per_device(self) -> int:
        """Bytes of this trie's arrays on one device (a split trie: one block of each split array)."""
        total = 0
        for spec, arrays in zip(self.specs, self.levels):
            total += sum(v.nbytes // (1 if spec.dense else self.shards) for v in arrays.values())
        return total + sum(v.nbytes // self.shards for arrays in self.runs for v in arrays.values())


SHARD_AXIS = "index"  # the mesh axis a split trie's blocks lie along


def check_split(shards: int, current: int, what: str) -> bool:
    """Whether an index now in `current` blocks must be split into `shards` (False: it already is); a bad count
    or a second split is an error."""
    if shards < 1:
        raise ValueError(f"a {what} splits into ≥ 1 blocks, got {shards}")
    if current not in (1, shards):
        raise ValueError(f"this {what} is already split into {current} blocks; split the whole {what}")
    return shards != current


def _taker(shards: int):
    """`take(array, index)`: `array[index]` of the whole array, also when each device holds one block of it."""
    return (lambda a, i: a[i]) if shards == 1 else _take_split


def _take_split(block: jax.Array, index: jax.Array) -> jax.Array:
    """`array[index]` where this device holds rows [s·n, (s+1)·n) of the array (s: its position on SHARD_AXIS, n:
    the block's rows): its own rows read, the others' 0, summed over the axis — one device holds each row."""
    n, index = block.shape[0], jnp.asarray(index)
    local = index - jax.lax.axis_index(SHARD_AXIS).astype(index.dtype) * n
    mine = (local >= 0) & (local < n)
    value = block[jnp.where(mine, local, 0)]
    mine = mine.reshape(mine.shape + (1,) * (value.ndim - mine.ndim))
    return jax.lax.psum(jnp.where(mine, value, jnp.zeros((), value.dtype)), SHARD_AXIS)


class _Level(NamedTuple):
    """What `to_device` decides per depth before it stores the arrays."""

    dense: bool
    K: int  # slots per beam (0: dense or no children)
    rows: int
    leaf_mode: str
    has_leaves: bool
    inserted: bool  # nodes were inserted below this depth (the table form, padded capacities)


def to_device(index, on_host: bool = False) -> DeviceTrie:
    """Copies a TrieIndex to the default device (`on_host`: the same arrays as numpy, for a caller that places
    them itself, e.g. block by block over devices: `DeviceTrie.split`, never whole on one device).

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
    A level without inserted nodes keeps its compact form (child id = CSR position, leaves by rule).

    **Runs** (`_plan_runs`): consecutive CSR levels between the first and the last (1 ≤ d < depth − 1) with
    similar K (a slot budget C per run, a power of two) are stored together in the table form (`_run_arrays`:
    child and leaf ids stored, one int32 each per child), so that a search runs them as one compiled body over a
    traced depth (`children_in_run`; `decoding.beam_search`'s `scan_levels`). A run has ≥ RUN_MIN_LEVELS levels."""
    levels, specs, facts, kids = [], [], [], {}
    V = index.vocab_size
    put = _placer(on_host)
    for d in range(index.depth):
        dense = index.decode_dense[d]
        x = index.extras[d]
        leaf_mode = "all" if index.leaf_all[d + 1] else ("some" if index.leaf_rank[d + 1] is not None else "none")
        has_leaves = leaf_mode != "none" or bool(len(x) and (x.leaf >= 0).any())
        rows, K = index.main_nodes[d], (0 if dense else index.max_children[d])
        inserted = bool(len(x) or index.new_nodes[d])
        if inserted:
            rows = _capacity(max(index.nodes_at(d), 2 * index.main_nodes[d]))
            kids[d] = _children(index, d, leaf_mode, x)
            if not dense:
                parent = kids[d][0]
                K = _capacity(max(np.bincount(parent, minlength=rows).max(), 2 * K)) if len(parent) else 0
        facts.append(_Level(dense, K, rows, leaf_mode, has_leaves, inserted))
    runs = _plan_runs([(f.dense, f.K) for f in facts])
    in_run = {d: (r, d - a) for r, (a, b) in enumerate(runs) for d in range(a, b)}
    for d, (dense, K, rows, leaf_mode, has_leaves, inserted) in enumerate(facts):
        arrays, leaf_base = {}, index.leaf_base[d + 1]
        if d in in_run:
            leaf_mode, leaf_base = "run", 0
        elif inserted:
            parent, token, child, leaf = kids[d]
            if dense:
                arrays["dense"] = put(_scatter(rows, V, parent, token, child))
                if has_leaves:
                    arrays["leaf"] = put(_scatter(rows, V, parent, token, leaf))
            else:
                order = np.lexsort((token, parent))
                counts = np.bincount(parent, minlength=rows)
                offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
                arrays["offsets"] = put(offsets.astype(np.int32 if offsets[-1] < 2**31 else np.int64))
                cap = _capacity(max(len(parent), 2 * len(index.tokens[d + 1])))
                for name, a in (("tokens", token), ("child", child), ("leaf", leaf)):
                    arrays[name] = put(np.pad(a[order], (0, cap - len(a)), constant_values=-1))
            leaf_mode, leaf_base = ("table" if has_leaves else "none"), 0
        elif dense:
            arrays["dense"] = put(index.dense[d])
        elif K > 0:
            arrays["offsets"] = put(index.offsets[d])
            arrays["tokens"] = put(index.tokens[d + 1])
        if leaf_mode == "some":
            arrays["leaf_rank"] = put(index.leaf_rank[d + 1])
        run, pos = in_run.get(d, (-1, 0))
        specs.append(LevelSpec(dense=dense, max_children=K, n_main=rows, leaf_mode=leaf_mode,
                               leaf_base=int(leaf_base), has_leaves=has_leaves, vocab_size=V, run=run, run_pos=pos,
                               consecutive=not dense and K > 0 and not inserted))
        levels.append(arrays)
    run_arrays = tuple(_run_arrays(index, a, b, [facts[d] for d in range(a, b)], kids, put) for a, b in runs)
    run_specs = tuple(RunSpec(start=a, stop=b, slots=max(_capacity(facts[d].K) for d in range(a, b)))
                      for a, b in runs)
    return DeviceTrie(levels=tuple(levels), specs=tuple(specs), vocab_size=V, eos_id=index.eos_id,
                      runs=run_arrays, run_specs=run_specs)


RUN_PADDING = 16  # a run's slot budget C is at most this many times a level's own (power-of-two) K
# Fewer levels save less compile time than a scan costs each search: tiny T5 over a depth-4 trie (2 levels scanned)
# searched 1.15–1.35× slower (the cache padded for the run, the loop's carried copies), deep tries ~1.1×.
RUN_MIN_LEVELS = 3


def _plan_runs(levels: list[tuple[bool, int]], min_levels: int = RUN_MIN_LEVELS) -> list[tuple[int, int]]:
    """Runs [start, stop) of ≥ `min_levels` consecutive CSR levels with children (K > 0), 1 ≤ d < depth − 1, built
    greedily from the top: a level joins the run while the run's C (its largest K rounded up to a power of two)
    stays at most RUN_PADDING times every member's own (a few runs cover a docid trie's middle levels; no level
    gathers more than RUN_PADDING× its slots, a small cost beside the model's step). `levels`: (dense, K) per
    depth."""
    runs, start, lo, hi = [], None, 0, 0
    cap = lambda d: None if levels[d][0] or levels[d][1] == 0 else _capacity(levels[d][1])  # noqa: E731
    for d in range(1, len(levels)):
        last = d == len(levels) - 1  # the last level ends every run (it selects no next beams)
        c = cap(d)
        if start is not None and (last or c is None or max(hi, c) > RUN_PADDING * min(lo, c)):
            if d - start >= max(min_levels, 2):
                runs.append((start, d))
            start = None
        if start is None:
            if not last and c is not None:
                start, lo, hi = d, c, c
        else:
            lo, hi = min(lo, c), max(hi, c)
    return runs


def _run_arrays(index, start: int, stop: int, facts: list, kids: dict, put=None) -> dict:
    """The levels [start, stop) in one table: per level its (parent, token)-sorted children with their child ids
    (at depth d + 1) and leaf ids, concatenated; `offsets` holds each level's CSR offsets shifted to the level's
    first child, from `node_base[i]` on, and `rows[i]` its rows. With inserted nodes in a level the arrays are
    padded to a power of two, at least twice the built trie's sizes (the shapes survive further inserts)."""
    offsets, tokens, child, leaf, node_base, rows_of = [], [], [], [], [], []
    n_offsets = n_children = built = 0
    for i, d in enumerate(range(start, stop)):
        rows = facts[i].rows
        parent, tok, ch, lf = kids[d] if d in kids else _children(index, d, facts[i].leaf_mode, index.extras[d])
        # a built level's children are in (parent, token) order already; inserted ones follow their level's
        order = np.lexsort((tok, parent)) if d in kids else slice(None)
        counts = np.bincount(parent, minlength=rows)
        offsets.append(n_children + np.concatenate([[0], np.cumsum(counts)]))
        for out, a in ((tokens, tok), (child, ch), (leaf, lf)):
            out.append(a[order])
        node_base.append(n_offsets)
        rows_of.append(rows)
        n_offsets += rows + 1
        n_children += len(parent)
        built += len(index.tokens[d + 1]) + index.main_nodes[d] + 1
    put = put or _placer(False)
    grown = any(f.inserted for f in facts)
    offsets, tokens, child, leaf = (np.concatenate(a) for a in (offsets, tokens, child, leaf))
    cap_o = _capacity(max(len(offsets), 2 * built)) if grown else len(offsets)
    cap_c = _capacity(max(len(tokens), 2 * built)) if grown else len(tokens)
    wide = max(n_offsets, n_children) >= 2**31  # positions in the offsets or the children past int32
    return {"offsets": put(np.pad(offsets, (0, cap_o - len(offsets)), mode="edge")
                                   .astype(np.int64 if wide else np.int32)),
            "tokens": put(np.pad(tokens, (0, cap_c - len(tokens)), constant_values=-1).astype(np.int32)),
            "child": put(np.pad(child, (0, cap_c - len(child)), constant_values=-1)),
            "leaf": put(np.pad(leaf, (0, cap_c - len(leaf)), constant_values=-1)),
            "node_base": put(np.asarray(node_base, np.int64 if wide else np.int32)),
            "rows": put(np.asarray(rows_of, np.int32))}


def _run_candidates(arr: dict, i, node: jax.Array, slots: int, take=_taker(1)):
    """Child slots of nodes at the i-th level of a run (i: a Python int or a traced scalar): `level_candidates`'
    outputs with `slots` slots per node. `take(array, index)` reads an array (`_taker`)."""
    rows = take(arr["rows"], i)
    on_main = (node >= 0) & (node < rows)
    base = take(arr["node_base"], i)
    safe = base + jnp.clip(node, 0, jnp.maximum(rows - 1, 0)).astype(base.dtype)
    start = take(arr["offsets"], safe)
    count = jnp.where(on_main, take(arr["offsets"], safe + 1) - start, 0)
    slot = jnp.arange(slots, dtype=start.dtype)
    valid = slot < count[..., None]
    pos = jnp.where(valid, start[..., None] + slot, 0)
    return (take(arr["tokens"], pos), jnp.where(valid, take(arr["child"], pos), -1),
            jnp.where(valid, take(arr["leaf"], pos), -1), valid)


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


def _scatter(rows: int, V: int, parent, token, values) -> np.ndarray:
    table = np.full((rows, V), -1, np.int32)
    table[parent, token] = values
    return table


def _placer(on_host: bool):
    """`put(array)`: a numpy array as the device trie stores it — on the default device, or on the host
    (`on_host`) with the dtypes the device copy would have: int64 arrays are int32 unless JAX runs with 64-bit
    integers, and positions past 2^31 without them are an error (they would wrap)."""
    x64 = bool(jax.config.jax_enable_x64)

    def put(a):
        a = np.asarray(a)
        if a.dtype == np.int64 and not x64:
            if a.size and (int(a.max()) >= 2**31 or int(a.min()) < -(2**31)):
                raise ValueError("the trie's positions pass 2^31 (over ~2 billion children): JAX needs 64-bit "
                                 "integers for it; set JAX_ENABLE_X64=1 (or jax.config.update('jax_enable_x64', "
                                 "True)) before the first computation")
            a = a.astype(np.int32)
        return a if on_host else jnp.asarray(a)

    return put


def level_candidates(trie: DeviceTrie, d: int, node: jax.Array):
    """Child slots of depth-d nodes.

    node: int32 [...] node ids at depth d (negative = no node).
    Returns (tokens [..., C] or None when the slots are exactly the vocabulary in order, child node ids
    [..., C] at depth d+1, leaf ids [..., C] (-1: not a leaf), valid [..., C]) with C = spec.num_slots.
    """
    spec, arr = trie.specs[d], trie.levels[d]
    take = _taker(trie.shards)
    if spec.run >= 0:
        return _run_candidates(trie.runs[spec.run], spec.run_pos, node, spec.max_children, take)
    on_main = (node >= 0) & (node < spec.n_main)
    safe = jnp.clip(node, 0, max(spec.n_main - 1, 0))
    tokens, leaf = None, None
    if spec.dense:
        child = arr["dense"][safe]
        valid = (child >= 0) & on_main[..., None]
        if spec.leaf_mode == "table":
            leaf = jnp.where(valid, arr["leaf"][safe], -1)
    elif spec.max_children > 0:
        start = take(arr["offsets"], safe)
        count = jnp.where(on_main, take(arr["offsets"], safe + 1) - start, 0)
        slot = jnp.arange(spec.max_children, dtype=start.dtype)
        valid = slot < count[..., None]
        pos = jnp.where(valid, start[..., None] + slot, 0)
        tokens = take(arr["tokens"], pos).astype(jnp.int32)
        child = take(arr["child"], pos) if "child" in arr else pos
        if spec.leaf_mode == "table":
            leaf = jnp.where(valid, take(arr["leaf"], pos), -1)
    else:
        child = jnp.zeros((*node.shape, 0), jnp.int32)
        valid = jnp.zeros((*node.shape, 0), bool)
        tokens = jnp.zeros((*node.shape, 0), jnp.int32)
    if spec.leaf_mode == "all":
        leaf = jnp.where(valid, spec.leaf_base + child, -1)
    elif spec.leaf_mode == "some":
        rank = (arr["leaf_rank"][jnp.maximum(child, 0)] if spec.dense
                else take(arr["leaf_rank"], jnp.maximum(child, 0)))
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
