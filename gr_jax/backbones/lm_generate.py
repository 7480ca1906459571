"""Free generation with a decoder-only LM (`models.llama`): batched prompts, left-padded, prefilled at once;
greedy or sampled continuations under one `jax.jit` with a `lax.while_loop` that stops when every row has
ended (EOS or a stop token). For n samples of one prompt the prompt is prefilled once and its keys/values
are shared by the n rows, read once per step (`LMCache.share_rows`); a shared prefix (a few-shot prompt) is
prefilled once for all rows (`prefix`).

Used by `tools/generate.py`, Few-Shot GR's docid bank and the pseudo-query generator.
"""

from __future__ import annotations

import functools
import math
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.backbones import llama

NEG = -1e30


def bucket_length(length: int, step: int = 16) -> int:
    """`length` rounded up to a multiple of `step`: few padded widths, so few compilations over many batches."""
    return -(-max(length, 1) // step) * step


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int, length: Optional[int] = None):
    """(ids [B, T] int32, mask [B, T] bool) with every row right-aligned (T = the longest rounded up by
    `bucket_length`, or `length`)."""
    T = bucket_length(max([len(s) for s in sequences] + [1])) if length is None else length
    ids = np.full((len(sequences), T), pad_id, np.int32)
    mask = np.zeros((len(sequences), T), bool)
    for i, s in enumerate(sequences):
        if len(s) > T:
            raise ValueError(f"prompt {i} has {len(s)} tokens, more than the {T} allowed")
        if len(s):
            ids[i, T - len(s):] = s
            mask[i, T - len(s):] = True
    return ids, mask


@functools.partial(jax.jit, static_argnames=("model", "num_samples", "max_new_tokens", "min_new_tokens", "greedy",
                                             "top_k", "tail_rows"))
def _generate(model: llama.Llama, params, ids, mask, packing, prefix, stop_ids, key, temperature, top_p, *,
              num_samples: int, max_new_tokens: int, min_new_tokens: int, greedy: bool, top_k: int,
              tail_rows: tuple):
    variables = {"params": params}
    B, T = ids.shape
    # n samples of a prompt share its keys/values (`share_rows`): the prompt is prefilled into exactly its width
    width = T if num_samples > 1 else T + max_new_tokens
    cache = model.apply(variables, B, width, prefix, method=llama.Llama.init_cache)
    hidden, cache = model.apply(variables, cache, ids, mask, packing, method=llama.Llama.prefill_hidden)
    last = model.apply(variables, hidden[:, -1], method=llama.Llama.logits)  # the prompt's last position only
    if num_samples > 1:
        cache = cache.share_rows(num_samples, max_new_tokens)
        last = jnp.repeat(last, num_samples, axis=0)
    R = B * num_samples
    is_stop = jnp.zeros((last.shape[-1],), bool).at[stop_ids].set(True)

    def choose(logits_RxV, step, key):
        logits_RxV = jnp.where(is_stop[None] & (step < min_new_tokens), NEG, logits_RxV)
        if greedy:
            return jnp.argmax(logits_RxV, axis=-1).astype(jnp.int32)
        # sampling among the top_k tokens (a full sort of the vocabulary per row and step costs more than the
        # network's step on a CPU), then nucleus: the smallest set of them whose probability reaches top_p
        z, order = jax.lax.top_k(logits_RxV / temperature, top_k)
        probs = jax.nn.softmax(z, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs
        z = jnp.where(before < top_p, z, NEG)
        pick = jax.random.categorical(key, z, axis=-1)
        return jnp.take_along_axis(order, pick[:, None], axis=-1)[:, 0].astype(jnp.int32)

    out = jnp.full((R, max_new_tokens), -1, jnp.int32)
    done = jnp.zeros((R,), bool)

    def cond(state, rows_left: int = 0):
        step, _, _, _, done, _ = state
        # the last token needs no network step after it (`finish` chooses it): max_new_tokens − 1 steps at most
        return (step < max_new_tokens - 1) & (jnp.sum(~done) > rows_left)

    def body(state):
        step, cache, last, out, done, key = state
        key, sub = jax.random.split(key)
        token = choose(last, step, sub)
        token = jnp.where(done, -1, token)
        out = out.at[:, step].set(token)
        done = done | is_stop[jnp.maximum(token, 0)]
        logits, cache = model.apply(variables, cache, jnp.maximum(token, 0), method=llama.Llama.decode_step)
        return step + 1, cache, logits, out, done, key

    def finish(state):
        """At the last step, its token from the logits so far (the random draw `body` would make), and every
        row done; otherwise the state as it is."""
        step, cache, last, out, done, key = state
        final = step == max_new_tokens - 1
        drawn_key, sub = jax.random.split(key)
        token = jnp.where(done, -1, choose(last, step, sub))
        out = jnp.where(final, out.at[:, jnp.minimum(step, max_new_tokens - 1)].set(token), out)
        return (step + final, cache, last, out, done | final, jnp.where(final, drawn_key, key))

    state = (jnp.zeros((), jnp.int32), cache, last, out, done, key)
    return _tail_loop(state, tail_rows, cond, body, finish)


def _tail_loop(state, tail_rows: tuple, cond, body, finish):
    """Steps all rows until at most `tail_rows[0]` still run; those go on as a batch of that many rows (the
    running ones first, then ended ones, each in row order), and so on: rows that have ended stop costing a
    step. `finish` takes the last step, which needs no network step after it. Returns the rows' tokens."""
    if not tail_rows:
        return finish(jax.lax.while_loop(cond, body, state))[3]
    step, cache, last, out, done, key = finish(
        jax.lax.while_loop(functools.partial(cond, rows_left=tail_rows[0]), body, state))
    rows = jnp.argsort(done, stable=True)[:tail_rows[0]]
    tail = (step, cache.select_rows(rows), last[rows], out[rows], done[rows], key)
    return out.at[rows].set(_tail_loop(tail, tail_rows[1:], cond, body, finish))


def generate(model: llama.Llama, params, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
             stop_ids: Sequence[int], num_samples: int = 1, min_new_tokens: int = 0, greedy: bool = True,
             temperature: float = 1.0, top_k: int = 50, top_p: float = 1.0, seed: int = 0,
             prefix: Optional[llama.LMCache] = None, pad_length: Optional[int] = None,
             tail_fraction: float = 0.25, packed: bool = True) -> list[list[int]]:
    """Continuations of token-id prompts, each cut before its stop token: a list of B · num_samples token lists
    (the samples of prompt b at rows b·n … b·n + n − 1). Sampling (greedy=False) draws from the `top_k` most
    likely tokens at `temperature`, cut to the nucleus `top_p`. With `prefix`, every prompt continues it.
    `pad_length` fixes the padded prompt length (default: the longest, rounded up by `bucket_length`). Once at
    most `tail_fraction` of the rows still run, they go on as a batch that much smaller, and so on (`_tail_rows`;
    1: never): greedy rows come out the same up to float rounding, a sample's random draws change (as they
    change with the batch). `packed`: the prompts' prefill runs its projections and MLPs on the real tokens
    only, not on the left padding (`packed_size`; the same tokens up to float rounding)."""
    if not 0 < tail_fraction <= 1:
        raise ValueError(f"generate: tail_fraction must be in (0, 1], got {tail_fraction}")
    if not stop_ids:
        raise ValueError("generate needs at least one stop id (e.g. the tokenizer's EOS)")
    ids, mask = left_pad(prompts, model.config.pad_token_id, pad_length)
    if prefix is None:
        prefix = model.apply({"params": params}, 1, 0, method=llama.Llama.init_cache)
    size = packed_size(int(mask.sum()), mask.size)
    packing = llama.Packing.of(mask, size) if packed and size < mask.size else None
    out = _generate(model, params, jnp.asarray(ids), jnp.asarray(mask), packing, prefix,
                    jnp.asarray(list(stop_ids), jnp.int32), jax.random.PRNGKey(seed), jnp.float32(temperature),
                    jnp.float32(top_p), num_samples=num_samples, max_new_tokens=max_new_tokens,
                    min_new_tokens=min_new_tokens, greedy=greedy, top_k=min(top_k, model.config.vocab_size),
                    tail_rows=_tail_rows(len(prompts) * num_samples, tail_fraction))
    stops = set(int(s) for s in stop_ids)
    result = []
    for row in np.asarray(out).tolist():
        toks = []
        for t in row:
            if t < 0 or t in stops:
                break
            toks.append(t)
        result.append(toks)
    return result


def packed_size(tokens: int, places: int) -> int:
    """The places a packed prefill of `tokens` real tokens out of `places` takes: rounded up to a sixteenth of
    `places` (at least 8), so a batch shape compiles for a few sizes only."""
    step = max(8, -(-places // 16))
    return min(places, -(-max(tokens, 1) // step) * step)


def _tail_rows(rows: int, fraction: float) -> tuple:
    """The batch sizes the running rows move to: rows · fraction (rounded up, at least 1), then · fraction again
    while that is under the previous size and at least 8 rows."""
    out = []
    size = rows
    while fraction < 1:
        nxt = max(1, math.ceil(size * fraction))
        if nxt >= size or (out and nxt < 8):
            break
        out.append(nxt)
        size = nxt
    return tuple(out)


@functools.partial(jax.jit, static_argnames=("model",))
def _sequence_log_probs(model: llama.Llama, params, ids, mask, scored):
    logits = model.apply({"params": params}, ids, mask)
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    target = jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(scored[:, 1:], target, 0.0), axis=-1)


def sequence_log_probs(model: llama.Llama, params, sequences: Sequence[Sequence[int]], context: Sequence[int],
                       batch_size: int = 64) -> np.ndarray:
    """log P_LM(sequence | context) of each token sequence (summed over its tokens), float64 [N]. Sequences are
    right-padded in batches of `batch_size` to a few bucketed lengths."""
    context = [int(t) for t in context]
    if not context:
        raise ValueError("sequence_log_probs needs a context of at least one token (e.g. BOS)")
    out = np.zeros(len(sequences), np.float64)
    for start in range(0, len(sequences), batch_size):
        part = [context + [int(t) for t in s] for s in sequences[start:start + batch_size]]
        T = bucket_length(max(len(p) for p in part))
        ids = np.full((batch_size, T), model.config.pad_token_id, np.int32)
        mask = np.zeros((batch_size, T), bool)
        scored = np.zeros((batch_size, T), bool)
        for i, p in enumerate(part):
            ids[i, :len(p)] = p
            mask[i, :len(p)] = True
            scored[i, len(context):len(p)] = True
        got = _sequence_log_probs(model, params, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(scored))
        out[start:start + len(part)] = np.asarray(got, np.float64)[:len(part)]
    return out
