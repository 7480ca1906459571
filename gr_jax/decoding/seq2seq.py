"""Glue between the Flax T5 (`models/t5.py`) and the model-agnostic decoders: encode queries, build the
decode cache, and run constrained / unconstrained beam search or exhaustive scoring under one `jax.jit`."""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.decoding import beam_search as bs
from gr_jax.decoding import exhaustive
from gr_jax.index.device import DeviceTrie
from gr_jax.models import t5


def _share_encoder(cache: t5.DecodeCache, n: int) -> t5.DecodeCache:
    return cache.repeat(n, share_cross=True)


def _t5_step(model: t5.T5, params, cache, tokens):
    return model.apply({"params": params}, cache, tokens, method=t5.T5.decode_step)


def _t5_cache(model: t5.T5, params, query_tokens, max_length: int):
    mask = query_tokens != model.config.pad_token_id
    encoded = model.apply({"params": params}, query_tokens, mask, method=t5.T5.encode)
    return model.apply({"params": params}, encoded, mask, max_length, method=t5.T5.init_cache)


class T5Searcher:
    """Retrieval with a T5 network: `search(params, query_tokens, trie)` → `BeamResult`.

    Compiles once per (trie structure, batch shape); parameters and trie arrays are jit arguments.
    """

    def __init__(self, model: t5.T5, num_beams: int, score_mode: str = "log_softmax", length_penalty: float = 0.0,
                 bonus_fn: Optional[bs.BonusFn] = None):
        self.model = model
        self.num_beams = num_beams
        self.score_mode = score_mode
        self.length_penalty = length_penalty
        self.bonus_fn = bonus_fn
        self._step = functools.partial(_t5_step, model)  # one object: exhaustive scoring compiles once
        self._cache = jax.jit(functools.partial(_t5_cache, model), static_argnums=(2,))
        self._search = jax.jit(self._search_impl)
        self._unconstrained = jax.jit(self._unconstrained_impl, static_argnames=("max_length",))

    def _search_impl(self, params, query_tokens, trie: DeviceTrie, query_state):
        B = query_tokens.shape[0]
        cache = _t5_cache(self.model, params, query_tokens, trie.depth)
        step = functools.partial(_t5_step, self.model, params)
        return bs.beam_search(step, cache, trie, batch_size=B, num_beams=self.num_beams,
                              score_mode=self.score_mode, length_penalty=self.length_penalty,
                              bonus_fn=self.bonus_fn, query_state=query_state,
                              start_token=self.model.config.decoder_start_token_id, tile_fn=_share_encoder)

    def _unconstrained_impl(self, params, query_tokens, max_length: int):
        B = query_tokens.shape[0]
        c = self.model.config
        cache = _t5_cache(self.model, params, query_tokens, max_length)
        step = functools.partial(_t5_step, self.model, params)
        return bs.beam_search_unconstrained(step, cache, batch_size=B, num_beams=self.num_beams,
                                            max_length=max_length, eos_id=c.eos_token_id, vocab_size=c.vocab_size,
                                            score_mode=self.score_mode, length_penalty=self.length_penalty,
                                            start_token=c.decoder_start_token_id, tile_fn=_share_encoder)

    def search(self, params, query_tokens, trie: DeviceTrie, query_state=None) -> bs.BeamResult:
        return self._search(params, jnp.asarray(query_tokens), trie, query_state)

    def search_unconstrained(self, params, query_tokens, max_length: int) -> bs.BeamResult:
        return self._unconstrained(params, jnp.asarray(query_tokens), max_length=max_length)

    def exhaustive_scores(self, params, query_tokens, index, chunk_size: int = 512) -> np.ndarray:
        """Exact scores [B, num_docids] under the same score mode and length penalty."""
        query_tokens = jnp.asarray(query_tokens)
        cache = self._cache(params, query_tokens, index.depth)
        return exhaustive.exhaustive_scores(self._step, cache, index, batch_size=query_tokens.shape[0],
                                            score_mode=self.score_mode, length_penalty=self.length_penalty,
                                            start_token=self.model.config.decoder_start_token_id,
                                            chunk_size=chunk_size, step_params=params, tile_fn=_share_encoder)
