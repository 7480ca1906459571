"""What the shared beam search asks of a decoding constraint (`decoding.beam_search.beam_search`).

A constraint is a pytree (its arrays are jit arguments; its shape facts are static metadata) that says, per
beam, which tokens may come next. The search keeps one *state* per beam, a pytree of integer arrays with the beam
axes first (a trie's node id; a substring index's suffix-array range), and asks at decoding step d:

    root(shape)           the state of an empty prefix, every leaf shaped `shape` (e.g. [B, N]);
    children(d, state)    for states [...] at step d: (tokens [..., C] or None when the C slots are exactly the
                          vocabulary in order, next states [..., C], leaf ids [..., C] (-1: the extended prefix
                          is not a complete identifier), valid [..., C]);
    has_leaves(d)         (static) whether some child at step d can be a leaf;
    depth, vocab_size     (static) decoding steps and the model's vocabulary.

Optionally, for a search that runs several steps as one compiled body (`beam_search(scan_levels=True)`):

    level_runs()                 (static) (start, stop) of each run of consecutive steps served below;
    children_in_run(r, d, state) `children` at step d of run r, with d a traced int32 scalar and the same
                                 slot count C at every step of the run (slots past a step's own are invalid).

Instead of `children`, a constraint whose beams' candidates are few in all though one beam may have many (a
planning set's trie) may give them flat, for `decoding.beam_search.beam_search_flat`:

    candidates(d, state, valid)  for the states [B, n] of the beams (valid [B, n]) at step d: a `Candidates`
                                 (parent beam, token, next state, leaf id, valid, optional bonus; each [B, F]).

Optionally, for a constraint larger than one device (a `Searcher` over a mesh with an "index" axis):

    split(S)                     the constraint with its large arrays padded to S blocks, read inside a
                                 `shard_map` over that axis (each device holding one block);
    partition_specs()            its pytree with a `PartitionSpec` per array (the blocks' axis, or whole).

`index.device.DeviceTrie` (docids as root-to-leaf paths) and `index.substring.DeviceSubstrings` (any n-gram of
any document) implement it; a method may bring its own. A beam holding nothing carries -1 in every state
array (its `valid` is False, so the constraint never reads it as a prefix).
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import jax


class Constraint(Protocol):
    depth: int
    vocab_size: int

    def root(self, shape: tuple) -> Any: ...

    def children(self, d: int, state) -> tuple[Optional[jax.Array], Any, jax.Array, jax.Array]: ...

    def has_leaves(self, d: int) -> bool: ...
