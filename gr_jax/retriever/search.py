"""Glue between a seq2seq network and the model-agnostic decoders: encode queries, build the decode cache,
and run constrained / unconstrained beam search or exhaustive scoring under one `jax.jit`. It lives with the
models so that `decoding/` imports no model code.

`Searcher` takes two functions, so any docid head plugs in:
    cache_fn(params, query_tokens, max_length) -> decode cache (batch axis first)
    step_fn(params, cache, tokens_B) -> (logits_BxV, cache)
and optionally a third, which lets the score modes "renormalized" and "raw" compute the logits of a beam's K
allowed children only (`decoding.beam_search._token_scores`):
    project_fn(params, hidden_BxNxD, tokens_BxNxC or None) -> logits [B, N, C] (or [B, N, V])
with `step_fn` then returning (hidden_BxD, cache). `T5Searcher(model, ...)` is the Searcher of a plain Flax T5
(docids in its text vocabulary).
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from gr_jax.decoding import beam_search as bs
from gr_jax.decoding import exhaustive
from gr_jax.index.constraint import Constraint
from gr_jax.index.device import SHARD_AXIS
from gr_jax.backbones import t5


def share_encoder(cache: t5.DecodeCache, n: int) -> t5.DecodeCache:
    """Beam tiling that keeps the encoder keys/values once per query."""
    return cache.repeat(n, share_cross=True)


def t5_step(model: t5.T5, params, cache, tokens):
    return model.apply({"params": params}, cache, tokens, method="decode_step")


def t5_step_hidden(model: t5.T5, params, cache, tokens):
    return model.apply({"params": params}, cache, tokens, method="decode_step_hidden")


def t5_project(model: t5.T5, params, hidden, tokens=None):
    return model.apply({"params": params}, hidden, tokens, method="token_logits")


def t5_cache(model: t5.T5, params, query_tokens, max_length: int):
    """The search's decode cache: a growing one (`DecodeCache.growing`: each level attends to and reorders only
    the positions decoded so far) for the levels the search unrolls; a run of levels in a `lax.scan` gives it room
    for the run's steps (`DecodeCache.to_fixed`) and lets it grow again after."""
    mask = query_tokens != model.config.pad_token_id
    encoded = model.apply({"params": params}, query_tokens, mask, method="encode")
    return model.apply({"params": params}, encoded, mask, max_length, True, method="init_cache")


def _int32(tokens):
    """Token ids as int32 for a jitted call: host arrays converted on the host (`jnp.asarray` of an int64 numpy
    array runs an eager device conversion first, about 0.1 ms a call on the CPU), device arrays as they are."""
    if isinstance(tokens, jax.Array):
        return tokens if tokens.dtype == jnp.int32 else tokens.astype(jnp.int32)
    return np.asarray(tokens, dtype=np.int32)


def local_mesh(devices=None, index_shards: int = 1) -> Optional[Mesh]:
    """The mesh a Searcher splits its work over (its "auto" mesh): the local devices (or the given ones) along
    "data" (the query batch) — None when there is only one —, or with `index_shards` S > 1 a data × index mesh
    whose "index" axis holds the trie split in S blocks (`DeviceTrie.split`: an index larger than a device)."""
    devices = list(jax.local_devices() if devices is None else devices)
    if index_shards > 1:
        if len(devices) % index_shards:
            raise ValueError(f"index_shards = {index_shards} (GenerativeRetriever.index_shards) does not divide the "
                             f"{len(devices)} devices")
        return Mesh(np.array(devices).reshape(-1, index_shards), ("data", SHARD_AXIS))
    return Mesh(np.array(devices), ("data",)) if len(devices) > 1 else None


class _Placed:
    """The last tree placed on a mesh, kept while the same object is passed again for the same mesh (parameters
    and trie arrays do not change between the searches of an evaluation). `prepare(tree) -> (tree, specs)` gives
    the tree to place and its `PartitionSpec`s (default: the tree, replicated)."""

    def __init__(self):
        self._source = self._mesh = self._placed = None

    def __call__(self, tree, mesh: Mesh, prepare: Optional[Callable] = None):
        if tree is not self._source or mesh is not self._mesh:
            placed, specs = (tree, P()) if prepare is None else prepare(tree)
            shardings = jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec), specs,
                                               is_leaf=lambda x: isinstance(x, P))
            self._placed = jax.device_put(placed, shardings)
            self._source, self._mesh = tree, mesh  # references: the id of a live object is never reused
        return self._placed


def split_constraint(trie, shards: int):
    """(the constraint split in `shards` blocks, its partition specs) — a constraint that can be split offers
    `split(shards)` and `partition_specs()` (`index.constraint`); others are refused."""
    if not (callable(getattr(type(trie), "split", None)) and callable(getattr(type(trie), "partition_specs", None))):
        raise ValueError(f"a {type(trie).__name__} cannot be split over the mesh's {SHARD_AXIS!r} axis (it has no "
                         f"split/partition_specs); search it on a mesh without that axis (index_shards = 1)")
    trie = trie.split(shards)
    return trie, trie.partition_specs()


class Searcher:
    """Retrieval: `search(params, query_tokens, trie)` → `BeamResult`.

    Compiles once per (trie structure, batch shape); parameters and trie arrays are jit arguments.

    Across devices: with a `mesh` (default "auto": every local device, when there are several) the query batch
    is split over the mesh's "data" axis and each device searches its own queries with the parameters and the
    trie replicated (`jax.shard_map` under `jax.jit`: one program per device, no communication — every query's
    search is independent). A batch is padded to a multiple of the devices with copies of its first query,
    whose results are dropped. Each device runs the one-device program on its slice of the batch: the docids,
    leaves and their order are those of one device, and the scores are bit for bit those of one device searching
    the same slices (a whole batch on one device may round its matrix products differently: float32 ulps);
    tested on 8 host devices.

    With a mesh that also has an "index" axis (`index_shards` S > 1 with the "auto" mesh: `local_mesh`; gin
    `GenerativeRetriever.index_shards`) the trie is split into S blocks
    over it (`DeviceTrie.split`: each device holds 1/S of its large arrays) and every device of that axis runs
    its data slice's search, reading the trie through one integer all-reduce per level: the docids and scores of
    the replicated trie, bit for bit (tests/index/test_split_trie.py).
    """

    def __init__(self, step_fn: Callable, cache_fn: Callable, *, start_token: int, eos_id: int, vocab_size: int,
                 num_beams: int, score_mode: str = "log_softmax", length_penalty: float = 0.0,
                 bonus_fn: Optional[bs.BonusFn] = None, tile_fn: Callable = share_encoder,
                 accumulate_bonus: bool = True, project_fn: Optional[Callable] = None, mesh="auto",
                 keep_history: bool = False, params_fn: Optional[Callable] = None, scan_levels: bool = False,
                 index_shards: int = 1, history_width: int = 0):
        self.params_fn = params_fn  # params → the form the steps read, once per search (stacked layers)
        self.step_fn = step_fn  # one object: exhaustive scoring compiles once
        self._mesh_arg = mesh
        self.index_shards = index_shards  # the "auto" mesh's index axis (`local_mesh`)
        self._sharded: dict = {}
        self._params_on_mesh, self._trie_on_mesh = _Placed(), _Placed()
        self.project_fn = project_fn
        self.cache_fn = cache_fn
        self.start_token = start_token
        self.eos_id = eos_id
        self.vocab_size = vocab_size
        self.num_beams = num_beams
        self.score_mode = score_mode
        self.length_penalty = length_penalty
        self.bonus_fn = bonus_fn
        self.tile_fn = tile_fn
        self.accumulate_bonus = accumulate_bonus
        self.keep_history = keep_history  # BeamResult.history: the alive beams of every level (SEAL's n-grams)
        self.history_width = history_width  # > 0: the best that many candidates of every level instead
        # a constraint's runs of levels as one compiled body each (`beam_search`'s scan_levels): the step function
        # must then keep its cache's shapes from step to step (a fixed cache; a growing T5 cache is made fixed)
        self.scan_levels = scan_levels
        self._cache = jax.jit(cache_fn, static_argnums=(2,))
        self._search = jax.jit(self._search_impl)
        self._unconstrained = jax.jit(self._unconstrained_impl, static_argnames=("max_length",))

    def _prepared(self, params):
        return params if self.params_fn is None else self.params_fn(params)

    def _search_impl(self, params, query_tokens, trie: Constraint, query_state):
        params = self._prepared(params)
        cache = self.cache_fn(params, query_tokens, trie.depth)
        return bs.beam_search(functools.partial(self.step_fn, params), cache, trie,
                              batch_size=query_tokens.shape[0], num_beams=self.num_beams,
                              score_mode=self.score_mode, length_penalty=self.length_penalty,
                              bonus_fn=self.bonus_fn, query_state=query_state, start_token=self.start_token,
                              tile_fn=self.tile_fn, accumulate_bonus=self.accumulate_bonus,
                              project_fn=None if self.project_fn is None
                              else functools.partial(self.project_fn, params), keep_history=self.keep_history,
                              scan_levels=self.scan_levels, history_width=self.history_width)

    def _full_step(self, params, cache, tokens):
        """(logits over the whole vocabulary, cache), whether `step_fn` returns logits or hidden states."""
        out, cache = self.step_fn(params, cache, tokens)
        return (out if self.project_fn is None else self.project_fn(params, out, None)), cache

    def _unconstrained_impl(self, params, query_tokens, max_length: int):
        params = self._prepared(params)
        cache = self.cache_fn(params, query_tokens, max_length)
        return bs.beam_search_unconstrained(functools.partial(self._full_step, params), cache,
                                            batch_size=query_tokens.shape[0], num_beams=self.num_beams,
                                            max_length=max_length, eos_id=self.eos_id, vocab_size=self.vocab_size,
                                            score_mode=self.score_mode, length_penalty=self.length_penalty,
                                            start_token=self.start_token, tile_fn=self.tile_fn)

    def use_mesh(self, mesh) -> "Searcher":
        """Searches over `mesh` from now on: "auto" (the local devices), None (one device) or a jax Mesh with a
        "data" axis."""
        self._mesh_arg = mesh
        self._sharded.clear()
        _ = self.mesh  # validates
        return self

    @property
    def mesh(self) -> Optional[Mesh]:
        """The mesh the query batch is split over (None: one device)."""
        if isinstance(self._mesh_arg, str):
            if self._mesh_arg != "auto":
                raise ValueError(f"Searcher mesh must be 'auto', None or a jax Mesh, got {self._mesh_arg!r}")
            self._mesh_arg = local_mesh(index_shards=self.index_shards)
        if self._mesh_arg is not None and "data" not in self._mesh_arg.axis_names:
            raise ValueError(f"the Searcher's mesh has axes {self._mesh_arg.axis_names}; it needs a 'data' axis")
        return self._mesh_arg

    def _on_mesh(self, key, impl, params, query_tokens, trie, query_state):
        """`impl(params, query_tokens, trie, query_state)` with the batch split over the mesh's data axis;
        `query_state` (per-query data: every leaf has one row per query) is split with it."""
        mesh = self.mesh
        B, pad = query_tokens.shape[0], -query_tokens.shape[0] % mesh.shape["data"]
        per_query = jax.tree_util.tree_map(lambda x: bool(getattr(x, "ndim", 0)) and x.shape[0] == B, query_state)
        if not all(jax.tree_util.tree_leaves(per_query)):
            shapes = [getattr(x, "shape", type(x).__name__) for x in jax.tree_util.tree_leaves(query_state)]
            raise ValueError(f"decoding across {mesh.shape['data']} devices splits the query state by query, but "
                             f"not every leaf has {B} rows (shapes {shapes}); make query_state_fn return per-query "
                             f"arrays, or search on one device (Searcher mesh=None)")

        def grow(x, rows):  # copies of the first query fill the batch up to a multiple of the devices
            return jnp.concatenate([x, jnp.repeat(x[:1], pad, axis=0)]) if rows and pad else x

        query_tokens = grow(jnp.asarray(query_tokens), True)
        query_state = jax.tree_util.tree_map(grow, query_state, per_query)
        state_specs = jax.tree_util.tree_map(lambda rows: P("data") if rows else P(), per_query)
        shards = dict(mesh.shape).get(SHARD_AXIS, 1)
        prepare = None if trie is None or shards == 1 else functools.partial(split_constraint, shards=shards)
        placed = None if trie is None else self._trie_on_mesh(trie, mesh, prepare)
        trie_specs = P() if prepare is None else placed.partition_specs()
        spec_key = (key, jax.tree_util.tree_structure(query_state), tuple(jax.tree_util.tree_leaves(per_query)),
                    None if prepare is None else jax.tree_util.tree_structure(placed))
        if spec_key not in self._sharded:
            self._sharded[spec_key] = jax.jit(jax.shard_map(
                impl, mesh=mesh, in_specs=(P(), P("data"), trie_specs, state_specs), out_specs=P("data"),
                check_vma=False))
        out = self._sharded[spec_key](self._params_on_mesh(params, mesh),
                                      jax.device_put(query_tokens, NamedSharding(mesh, P("data"))),
                                      placed, query_state)
        return jax.tree_util.tree_map(lambda x: x[:B], out) if pad else out

    def search_traced(self, params, query_tokens, trie: Constraint, query_state=None) -> bs.BeamResult:
        """The search as a plain function of its arrays, for a caller that traces it inside its own `jit`/`pjit`
        and places the batch itself (t5x's partitioned infer step): no jit, no mesh of this Searcher's."""
        return self._search_impl(params, query_tokens, trie, query_state)

    def search(self, params, query_tokens, trie: Constraint, query_state=None) -> bs.BeamResult:
        if self.mesh is None:
            return self._search(params, _int32(query_tokens), trie, query_state)
        return self._on_mesh("search", self._search_impl, params, _int32(query_tokens), trie, query_state)

    def search_unconstrained(self, params, query_tokens, max_length: int) -> bs.BeamResult:
        if self.mesh is None:
            return self._unconstrained(params, _int32(query_tokens), max_length=max_length)
        impl = lambda p, q, _, __: self._unconstrained_impl(p, q, max_length)  # noqa: E731
        return self._on_mesh(("unconstrained", max_length), impl, params, _int32(query_tokens), None, None)

    def exhaustive_scores(self, params, query_tokens, index, chunk_size: int = 512) -> np.ndarray:
        """Exact scores [B, num_docids] under the same score mode and length penalty."""
        query_tokens = jnp.asarray(query_tokens)
        params = self._prepared(params)  # once for every chunk's steps, as a search does
        cache = self._cache(params, query_tokens, index.depth)
        return exhaustive.exhaustive_scores(self.step_fn, cache, index, batch_size=query_tokens.shape[0],
                                            score_mode=self.score_mode, length_penalty=self.length_penalty,
                                            start_token=self.start_token, chunk_size=chunk_size,
                                            step_params=params, tile_fn=self.tile_fn, project_fn=self.project_fn)


class T5Searcher(Searcher):
    """The Searcher of a plain Flax T5 whose docids are in its text vocabulary."""

    def __init__(self, model: t5.T5, num_beams: int, score_mode: str = "log_softmax", length_penalty: float = 0.0,
                 bonus_fn: Optional[bs.BonusFn] = None, mesh="auto", scan_levels: bool = True):
        c = model.config
        super().__init__(functools.partial(t5_step_hidden, model), functools.partial(t5_cache, model),
                         start_token=c.decoder_start_token_id, eos_id=c.eos_token_id, vocab_size=c.vocab_size,
                         num_beams=num_beams, score_mode=score_mode, length_penalty=length_penalty,
                         bonus_fn=bonus_fn, project_fn=functools.partial(t5_project, model), mesh=mesh,
                         params_fn=functools.partial(t5.with_stacked_layers, config=c) if model.scan_layers else None,
                         scan_levels=scan_levels)
        self.model = model
