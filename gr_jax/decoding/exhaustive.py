"""Exact scoring of every docid of an index by teacher forcing, and the *search error* of a beam.

`exhaustive_scores` feeds each docid token by token through the same `step_fn` beam search uses, and scores
it with the same `score_mode` and length penalty, so with N ≥ number of docids beam search must return exactly
this ranking; with a smaller beam the difference is prefix pruning, measured by `search_error`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.decoding.beam_search import _token_scores, tile_rows
from gr_jax.index.device import DeviceTrie, level_candidates


@functools.lru_cache(maxsize=None)
def _without_params(fn):
    return None if fn is None else (lambda params, *args: fn(*args))


@functools.partial(jax.jit, static_argnames=("step_fn", "batch_size", "score_mode", "length_penalty", "start_token",
                                             "tile_fn", "project_fn"))
def _score_chunk(step_fn, step_params, cache, trie: DeviceTrie, seqs_MxT, lengths_M, nodes_MxT, *,
                 batch_size: int, score_mode: str, length_penalty: float, start_token: int, tile_fn, project_fn):
    B = batch_size
    M, T = seqs_MxT.shape
    # row b*M + m: query b, docid m
    cache = tile_rows(cache, M, B) if tile_fn is None else tile_fn(cache, M)
    total = jnp.zeros((B, M), jnp.float32)
    last = jnp.full((B * M,), start_token, jnp.int32)
    for t in range(T):
        logits, cache = step_fn(step_params, cache, last)
        logits = logits.reshape(B, M, -1).astype(jnp.float32)
        tokens, _, _, valid = level_candidates(trie, t, jnp.asarray(nodes_MxT[:, t]))
        if tokens is None:
            tokens = jnp.broadcast_to(jnp.arange(valid.shape[-1], dtype=jnp.int32), valid.shape)
        target = seqs_MxT[:, t]
        active = t < lengths_M
        slot_is_target = valid & (tokens == target[:, None])
        step = _token_scores(logits, jnp.broadcast_to(tokens, (B, *tokens.shape)),
                             jnp.broadcast_to(valid, (B, *valid.shape)), score_mode,
                             None if project_fn is None else functools.partial(project_fn, step_params),
                             trie.vocab_size)
        s = jnp.max(jnp.where(slot_is_target[None], step, -jnp.inf), axis=-1)
        total = total + jnp.where(active[None], s, 0.0)
        last = jnp.broadcast_to(jnp.where(active, target, start_token), (B, M)).reshape(-1)
    return total / (lengths_M.astype(jnp.float32)[None] ** length_penalty)


def exhaustive_scores(step_fn, cache, index, *, batch_size: int, score_mode: str = "log_softmax",
                      length_penalty: float = 0.0, start_token: int = 0, chunk_size: int = 512,
                      step_params=None, tile_fn=None, project_fn=None) -> np.ndarray:
    """Scores [B, num_leaves] of every docid (column = leaf id) for each query; `cache` has B rows.

    `step_fn(cache, tokens)`, or `step_fn(step_params, cache, tokens)` when `step_params` is given (model
    parameters then travel as jit arguments rather than constants). `step_fn` is a static jit argument:
    pass the same object across calls so each chunk shape compiles once. With `project_fn(hidden, tokens)` (or
    `project_fn(step_params, hidden, tokens)`), `step_fn` returns hidden states, as in `beam_search`.
    """
    fn = _without_params(step_fn) if step_params is None else step_fn
    project = _without_params(project_fn) if step_params is None else project_fn
    seqs, lengths = index.leaf_sequences()
    nodes = index.path_nodes(seqs, lengths)[:, :-1]  # the node each position chooses a child of
    trie = index.device()
    out = []
    for lo in range(0, len(seqs), chunk_size):
        hi = min(lo + chunk_size, len(seqs))
        pad = chunk_size - (hi - lo) if len(seqs) > chunk_size else 0
        s = np.pad(seqs[lo:hi], ((0, pad), (0, 0)), constant_values=0)
        ln = np.pad(lengths[lo:hi], (0, pad), constant_values=1)
        nd = np.pad(nodes[lo:hi], ((0, pad), (0, 0)))
        s = np.where(s < 0, 0, s)
        scores = _score_chunk(fn, step_params, cache, trie, jnp.asarray(s, jnp.int32), jnp.asarray(ln, jnp.int32),
                              jnp.asarray(nd, jnp.int32), batch_size=batch_size, score_mode=score_mode,
                              length_penalty=float(length_penalty), start_token=start_token, tile_fn=tile_fn,
                              project_fn=project)
        out.append(np.asarray(scores)[:, : hi - lo])
    return np.concatenate(out, axis=1)


def exhaustive_ranking(scores_BxM: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k leaf ids and scores per query from `exhaustive_scores` (stable on ties: lower leaf id first)."""
    order = np.argsort(-scores_BxM, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(scores_BxM, order, axis=1)


def search_error(beam_leaf_ids_BxN: np.ndarray, exact_scores_BxM: np.ndarray) -> float:
    """Fraction of queries whose exactly best docid is missing from the beam's results."""
    best = np.argmax(exact_scores_BxM, axis=1)
    hit = (np.asarray(beam_leaf_ids_BxN) == best[:, None]).any(axis=1)
    return float(1.0 - hit.mean()) if len(hit) else 0.0
