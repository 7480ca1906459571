"""Jit-compiled beam search over a batch of queries, under a decoding constraint (or unconstrained).

The constraint is any `index.constraint.Constraint`: a prefix tree of docids (`index.device.DeviceTrie`), a
substring index (`index.substring.DeviceSubstrings`: any n-gram of any document), or a method's own. Each
beam carries the constraint's state; the search asks the constraint for a beam's allowed next tokens and the
states they lead to, so every constraint shares this one search.

The model is any step function `step_fn(cache, tokens_R) -> (logits_RxV, cache)` over R = B·N rows, whose
cache is a pytree with the row axis first (a toy scorer in tests), or holds objects that tile and reorder their
own rows (`tile_rows(n, rows)`, `gather_rows(index, rows)`: the T5 and Llama caches, whose keys/values have the
layer axis before the rows). Rows are tiled and reordered with `jnp.repeat`/`jnp.take` on every other leaf
whose leading axis has that many rows.

Per level the beams gather the K child slots of their trie node (CSR) or read a dense row, score them, and
keep the top N of N·K — never N·V on CSR levels. Beams that reach a leaf move to a *finished* pool of N;
the rest stay *alive*. The search runs every level of the trie (no early stop), so the result is the
canonical beam search: with N ≥ number of docids it equals the exhaustive ranking. With `keep_history` the
alive beams of every level are returned too (SEAL keeps every n-gram its beams generate: `History`).

Score modes (`score_mode`):
  "log_softmax"   log-softmax over the full vocabulary, then restricted to allowed children (what HF
                  `generate(prefix_allowed_tokens_fn=...)` computes);
  "renormalized"  log-softmax over the allowed children only;
  "raw"           raw logits, summed (PAG's additive score).
A finished docid of n tokens scores sum / n**length_penalty (HF's convention: n counts every generated
token, EOS included). `bonus_fn(level, child_node_ids, query_state) -> bonus` (child ids [B, n, C], −1 in a slot
that holds no child of a live beam) is added to the *pruning* score
only (PAG's look-ahead; −inf removes a child); `scores` stays the model's score and `prune_scores` carries the
sum with bonuses (all levels', or with `accumulate_bonus=False` the last token's only).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.index.constraint import Constraint

StepFn = Callable[[Any, jax.Array], tuple[jax.Array, Any]]
BonusFn = Callable[[int, jax.Array, Any], jax.Array]
# project_fn(hidden_BxNxD, tokens_BxNxC or None) -> logits of those tokens [B, N, C] (or of all V: [B, N, V])
ProjectFn = Callable[[jax.Array, Optional[jax.Array]], jax.Array]
SCORE_MODES = ("log_softmax", "renormalized", "raw")
# Candidate logits gather C rows of the output projection per beam (C · D values each) where the full projection
# reads the same V × D matrix for every beam, from cache when it is small: the gather wins only when C ≪ V.
# Tiny T5 (V 512, D 64), beam 100 on CPU: C 32 through the gather was slower than the full projection.
CANDIDATE_RATIO = 8
NEG_INF = -jnp.inf


@flax.struct.dataclass
class BeamResult:
    """Per query, the N best docids in decreasing `prune_scores` order (equal to `scores` without a bonus)."""

    tokens: jax.Array  # int32 [B, N, T], -1 after the end
    lengths: jax.Array  # int32 [B, N]
    scores: jax.Array  # float32 [B, N] model score, length-penalised; -inf where not valid
    prune_scores: jax.Array  # float32 [B, N] model score + bonuses, length-penalised
    leaf_ids: jax.Array  # int32 [B, N] leaf of the docid in the index (-1 where not valid)
    valid: jax.Array  # bool [B, N] False where fewer than N docids could be found
    states: Any = None  # the constraint's state of each finished docid, leaves [B, N] (a substring range)
    history: Optional["History"] = None  # with keep_history: the alive beams of every level


@flax.struct.dataclass
class History:
    """The alive beams after each level d (prefixes of d + 1 tokens), in decreasing pruning-score order; with a
    `history_width` W, the best W candidates of each level instead, finished ones (leaves) included (SEAL keeps
    the top 2N of every step as keys while N beams go on)."""

    tokens: jax.Array  # int32 [B, T, W, T], -1 after the prefix
    scores: jax.Array  # float32 [B, T, W] model score (not length-penalised); -inf where not valid
    states: Any  # the constraint's state of each prefix, leaves [B, T, W]
    valid: jax.Array  # bool [B, T, W]
    leaf: Any = None  # int32 [B, T, W] the leaf a candidate completes, -1 for an unfinished prefix


def _owns_rows(x) -> bool:
    """A cache object that tiles and reorders its own rows (its row axis is not first everywhere)."""
    return hasattr(x, "gather_rows") and hasattr(x, "tile_rows")


def tile_rows(tree, n: int, rows: int):
    """Repeats every leaf whose leading axis has `rows` rows n times (row r → rows r·n .. r·n+n-1); a cache
    object that owns its rows does it itself."""
    return jax.tree_util.tree_map(
        lambda x: x.tile_rows(n, rows) if _owns_rows(x) else
        (jnp.repeat(x, n, axis=0) if x.ndim and x.shape[0] == rows else x), tree, is_leaf=_owns_rows)


def gather_rows(tree, index: jax.Array, rows: int):
    """Selects rows `index` of every leaf whose leading axis has `rows` rows (and of every cache object that
    owns its rows)."""
    return jax.tree_util.tree_map(
        lambda x: x.gather_rows(index, rows) if _owns_rows(x) else
        (jnp.take(x, index, axis=0) if x.ndim and x.shape[0] == rows else x), tree, is_leaf=_owns_rows)


def _inverse_penalty(d: int, length_penalty: float) -> np.float32:
    """1 / (d + 1)**length_penalty as a float32 constant: every path multiplies by it (a division by a constant
    would be rewritten so by XLA in the unrolled levels, and not by a value read at a traced depth)."""
    return np.float32(1.0) / np.float32(float(d + 1) ** length_penalty)


def _token_scores(out, tokens, valid, score_mode: str, project_fn: Optional[ProjectFn] = None,
                  vocab_size: int = 0, candidates: Optional[bool] = None):
    """Per-slot step scores [B, N, C] (-inf where not valid); C candidate slots per beam.

    `out` is the step's logits [B, N, V], or with `project_fn` what it projects (hidden states [B, N, D]).
    Modes "renormalized" and "raw" need only the candidates' logits, so with `project_fn` a level of
    C ≤ V / CANDIDATE_RATIO slots computes C of them per beam instead of V; "log_softmax" needs the whole row
    for its normaliser."""
    if score_mode not in SCORE_MODES:
        raise ValueError(f"score_mode must be one of {SCORE_MODES}, got {score_mode!r}")
    if candidates is None:
        candidates = _candidates_only(project_fn, tokens is not None, score_mode,
                                      0 if tokens is None else tokens.shape[-1], vocab_size)
    if candidates:
        s = project_fn(out, tokens)
    else:
        logits = out if project_fn is None else project_fn(out, None)
        s = logits if tokens is None else jnp.take_along_axis(logits, tokens, axis=-1)
        if score_mode == "log_softmax":  # the normaliser once per row; the [B, N, V] log-softmax is never formed
            s = s - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    if score_mode == "renormalized":
        s = s - jax.nn.logsumexp(jnp.where(valid, s, NEG_INF), axis=-1, keepdims=True)
    return jnp.where(valid, s, NEG_INF)


def _candidates_only(project_fn, has_tokens: bool, score_mode: str, slots: int, vocab_size: int) -> bool:
    """Whether a level of `slots` candidate slots computes only their logits (`_token_scores`)."""
    return project_fn is not None and has_tokens and score_mode != "log_softmax" \
        and slots * CANDIDATE_RATIO <= vocab_size


@flax.struct.dataclass
class _State:
    tokens: jax.Array
    score: jax.Array
    prune: jax.Array
    node: Any  # the constraint's state of the prefix (a trie: node id at the current depth)
    leaf: jax.Array  # finished: leaf id of the docid
    length: jax.Array
    valid: jax.Array


def _empty(B, N, T, node_like) -> _State:
    """N dead beams; `node_like`: a constraint state whose structure and dtypes the dead states copy."""
    return _State(tokens=jnp.full((B, N, T), -1, jnp.int32), score=jnp.full((B, N), NEG_INF),
                  prune=jnp.full((B, N), NEG_INF),
                  node=jax.tree_util.tree_map(lambda x: jnp.full((B, N), -1, x.dtype), node_like),
                  leaf=jnp.full((B, N), -1, jnp.int32), length=jnp.zeros((B, N), jnp.int32),
                  valid=jnp.zeros((B, N), bool))


def _extend(alive: _State, flat_idx, C: int, d: int, tokens_BxNxC, score, prune, node, leaf, length: int) -> _State:
    """The states reached by taking slot flat_idx % C of beam flat_idx // C; flat_idx [B, k]. `node` (the
    constraint's states of the slots, leaves [B, n, C]) and `leaf` ([B, n, C]) may be None."""
    return _extend_from(alive, flat_idx // C, flat_idx, d, tokens_BxNxC, score, prune, node, leaf, length)


def _extend_from(alive: _State, parent, flat_idx, d: int, tokens, score, prune, node, leaf, length: int) -> _State:
    """`_extend` with the parent beam of each taken candidate given ([B, k]): candidates in any layout whose
    flattened positions per query are `flat_idx`."""
    take = lambda x: jnp.take_along_axis(x.reshape(x.shape[0], -1), flat_idx, axis=1)  # noqa: E731
    seq = jnp.take_along_axis(alive.tokens, parent[..., None], axis=1)
    seq = seq.at[:, :, d].set(take(tokens))
    s, p = take(score), take(prune)
    none = jnp.full(s.shape, -1, jnp.int32)
    node = jax.tree_util.tree_map(lambda _: none, alive.node) if node is None else jax.tree_util.tree_map(take, node)
    return _State(tokens=seq, score=s, prune=p, node=node, leaf=none if leaf is None else take(leaf),
                  length=jnp.full(s.shape, length, jnp.int32), valid=p > NEG_INF)


def _merge_finished(finished: _State, new: _State, N: int) -> _State:
    both = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b], axis=1), finished, new)
    _, idx = jax.lax.top_k(both.prune, N)
    return jax.tree_util.tree_map(
        lambda x: jnp.take_along_axis(x, idx[..., None] if x.ndim == 3 else idx, axis=1), both)


def _step(step_fn: StepFn, cache, last, alive: _State, tile_fn, d: int, B: int, N: int, start_token: int):
    """Runs the model one step. Step 0 runs once per query — every beam starts from the same prefix, and
    only the first is alive — so it returns logits and states for that one root beam, then tiles the cache.
    Returns (logits [B, n, V], cache, source states [B, n]) with n = 1 at step 0, else N."""
    if d == 0:
        logits, cache = step_fn(cache, jnp.full((B,), start_token, jnp.int32))
        cache = tile_rows(cache, N, B) if tile_fn is None else tile_fn(cache, N)
        return logits[:, None, :].astype(jnp.float32), cache, jax.tree_util.tree_map(lambda x: x[:, :1], alive)
    logits, cache = step_fn(cache, last)
    return logits.reshape(B, N, -1).astype(jnp.float32), cache, alive


def _root(B: int, N: int, T: int, root_state) -> _State:
    """Beam 0 alive at the root with score 0; the others dead, so no docid can be found twice."""
    first = jnp.arange(N) == 0
    zero_or_dead = jnp.where(first, 0.0, NEG_INF)[None].repeat(B, 0)
    return _empty(B, N, T, root_state).replace(score=zero_or_dead, prune=zero_or_dead, node=root_state,
                                               valid=first[None].repeat(B, 0))


def _select(src: _State, idx, C: int, d: int, tokens, score, prune, node, N: int) -> tuple[_State, jax.Array]:
    """The new alive states at the selected slots (padded to N beams) and the padded selection."""
    return _pad_beams(_extend(src, idx, C, d, tokens, score, prune, node, None, d + 1), idx, N)


def _reorder(nxt: _State, idx, C: int, d: int, cache, N: int, start_token: int):
    """The cache reordered to the selected beams and the next input tokens."""
    B = idx.shape[0]
    if d > 0:  # after step 0 every row of a query holds the same state: nothing to reorder
        rows = (jnp.arange(B)[:, None] * N + idx // C).reshape(-1)
        cache = gather_rows(cache, rows, B * N)
    last = jnp.where(nxt.valid, nxt.tokens[:, :, d], start_token).reshape(-1)
    return cache, last


def _result(finished: _State, history=None) -> BeamResult:
    return BeamResult(tokens=finished.tokens, lengths=finished.length,
                      scores=jnp.where(finished.valid, finished.score, NEG_INF),
                      prune_scores=jnp.where(finished.valid, finished.prune, NEG_INF),
                      leaf_ids=jnp.where(finished.valid, finished.leaf, -1), valid=finished.valid,
                      states=finished.node, history=history)


def _history(levels: list) -> History:
    """The alive beams of each level stacked on axis 1."""
    stack = lambda *xs: jnp.stack(xs, axis=1)  # noqa: E731
    return History(tokens=stack(*(s.tokens for s in levels)),
                   scores=stack(*(jnp.where(s.valid, s.score, NEG_INF) for s in levels)),
                   states=jax.tree_util.tree_map(stack, *(s.node for s in levels)),
                   valid=stack(*(s.valid for s in levels)),
                   leaf=stack(*(jnp.where(s.valid, s.leaf, -1) for s in levels)))


def _best_candidates(src: _State, C: int, d: int, tokens, score, prune, child, leaf, width: int) -> _State:
    """The `width` best candidates of a level by pruning score, finished and unfinished together (a history of
    SEAL's top 2N), padded with dead ones."""
    B, n = prune.shape[0], prune.shape[1]
    _, idx = jax.lax.top_k(prune.reshape(B, n * C), min(width, n * C))
    state = _extend(src, idx, C, d, tokens, score, prune, child, leaf, d + 1)
    return _pad_beams(state, idx, width)[0]


def _pad_beams(state: _State, idx, N: int):
    """Pads a selection of fewer than N states (a level with fewer slots than beams) with dead beams."""
    k = idx.shape[1]
    if k == N:
        return state, idx
    B, _, T = state.tokens.shape
    pad = _empty(B, N - k, T, state.node)
    state = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b], axis=1), state, pad)
    return state, jnp.concatenate([idx, jnp.zeros((B, N - k), idx.dtype)], axis=1)


def _fixed(cache, steps: int):
    """The cache with a fixed number of positions, so that a step keeps its shapes: a cache object with
    `to_fixed(steps)` (a growing T5 cache) makes room for `steps` more positions; other leaves as they are."""
    has = lambda x: hasattr(x, "to_fixed")  # noqa: E731
    return jax.tree_util.tree_map(lambda x: x.to_fixed(steps) if has(x) else x, cache, is_leaf=has)


def _growing(cache):
    """The cache after a run, growing again where it was padded (`to_growing`: every slot is now written)."""
    has = lambda x: hasattr(x, "to_growing")  # noqa: E731
    return jax.tree_util.tree_map(lambda x: x.to_growing() if has(x) else x, cache, is_leaf=has)


def _scan_run(run: int, start: int, stop: int, has_leaves: bool, candidates: bool, step_fn: StepFn, cache, last,
              alive: _State, finished: _State, constraint, *, N: int, score_mode: str, length_penalty: float,
              start_token: int, accumulate_bonus: bool, project_fn, keep_history: bool, history_width: int = 0):
    """Levels start .. stop − 1 (1 ≤ start, stop < T) as one `lax.scan` over the depth: the body is the loop's
    level with d traced (the constraint's `children_in_run`), the cache reordered after every level; `candidates`:
    the scoring path every level of the run takes unrolled (`_candidates_only`). Returns (cache, last, alive,
    finished, the alive beams of every level stacked on axis 0 or None)."""
    B, T = alive.tokens.shape[0], alive.tokens.shape[2]
    inverse_penalties = jnp.asarray([_inverse_penalty(d, length_penalty) for d in range(T)], jnp.float32)

    def level(carry, d):
        cache, last, src, finished = carry
        logits, cache = step_fn(cache, last)
        logits = logits.reshape(B, N, -1).astype(jnp.float32)
        tokens, child, leaf, valid = constraint.children_in_run(run, d, src.node)
        valid = valid & src.valid[..., None]
        step = _token_scores(logits, tokens, valid, score_mode, project_fn, constraint.vocab_size, candidates)
        score = src.score[..., None] + step
        prune = (src.prune if accumulate_bonus else src.score)[..., None] + step
        C = step.shape[-1]
        if tokens is None:  # the slots are the vocabulary in order (a substring index)
            tokens = jnp.broadcast_to(jnp.arange(C, dtype=jnp.int32), step.shape)
        is_leaf = leaf >= 0
        if has_leaves:
            inv = inverse_penalties[d]
            leaf_prune = jnp.where(is_leaf, prune, NEG_INF).reshape(B, N * C)
            _, idx = jax.lax.top_k(leaf_prune, min(N, N * C))
            new = _extend(src, idx, C, d, tokens, score * inv, jnp.where(is_leaf, prune, NEG_INF) * inv,
                          child, leaf, d + 1)
            finished = _merge_finished(finished, new, N)
        _, idx = jax.lax.top_k(jnp.where(is_leaf, NEG_INF, prune).reshape(B, N * C), min(N, N * C))
        kept = None
        if keep_history and history_width:
            kept = _best_candidates(src, C, d, tokens, score, prune, child, leaf, history_width)
        alive, idx = _select(src, idx, C, d, tokens, score, jnp.where(is_leaf, NEG_INF, prune), child, N)
        rows = (jnp.arange(B)[:, None] * N + idx // C).reshape(-1)
        cache = gather_rows(cache, rows, B * N)
        last = jnp.where(alive.valid, jnp.take_along_axis(alive.tokens, jnp.full((B, N, 1), d), axis=2)[..., 0],
                         start_token).reshape(-1)
        return (cache, last, alive, finished), ((kept or alive) if keep_history else None)

    # room for the run's stop − start steps: the padded cache is full after them
    (cache, last, alive, finished), levels = jax.lax.scan(
        level, (_fixed(cache, stop - start), last, alive, finished), jnp.arange(start, stop, dtype=jnp.int32))
    return _growing(cache), last, alive, finished, levels


def beam_search(step_fn: StepFn, cache, constraint: Constraint, *, batch_size: int, num_beams: int,
                score_mode: str = "log_softmax", length_penalty: float = 0.0, bonus_fn: Optional[BonusFn] = None,
                query_state=None, start_token: int = 0, tile_fn=None, accumulate_bonus: bool = True,
                project_fn: Optional[ProjectFn] = None, keep_history: bool = False,
                scan_levels: bool = False, history_width: int = 0) -> BeamResult:
    """Constrained beam search (pure; call it under `jax.jit`). `cache` has `batch_size` rows; `constraint`
    follows `index.constraint.Constraint` (a `DeviceTrie`, a substring index, ...) and sets the number of steps.

    `accumulate_bonus`: a beam's pruning score carries the bonuses of all its levels (True), or only the
    bonus of its last token on top of the model score (False: PAG's look-ahead, which selects beams by
    score + bonus(prefix) and never keeps the bonus; a finished docid's `prune_scores` is then its model
    score + the bonus of its leaf). `bonus_fn` receives the children's constraint states (a trie: node ids).

    `tile_fn(cache, n)` makes n rows per query after the first step (default: repeat every leaf with
    `batch_size` leading rows); the T5 searcher passes one that keeps encoder states shared per query.

    `project_fn`: `step_fn` then returns the step's hidden states instead of logits, and `project_fn(hidden,
    tokens)` gives the logits of the candidate tokens only (`tokens` None: the whole vocabulary); see
    `_token_scores` for where that saves work.

    `keep_history`: also return the alive beams of every level (`BeamResult.history`), the last level's
    selection included; with `history_width` W > 0, the best W candidates of every level instead, finished ones
    included (`History.leaf`): SEAL's keys are the top 2N candidates of every step while N beams go on.

    `scan_levels`: each run of levels the constraint serves with a traced depth (`level_runs()` /
    `children_in_run`: a `DeviceTrie`'s runs of CSR levels of one slot budget) is one compiled body in a
    `lax.scan` instead of one copy per level, so compile time grows with the runs, not the depth. The step
    function is then traced with a cache of fixed shapes (a growing T5 cache gets room for the run's steps,
    `to_fixed`, and grows again after them, `to_growing`); every level scores, selects and breaks ties as the
    unrolled loop does (a run's levels pad their slots to the run's C with invalid slots, which keeps the
    (beam, slot) order; a run whose levels would take different scoring paths, `_candidates_only`, stays
    unrolled). Without a bonus only: `bonus_fn` takes its level as a Python int (PAG's per-level tables), so
    a search with one runs unrolled.
    """
    B, N, T = batch_size, num_beams, constraint.depth  # T decoding steps
    alive = _root(B, N, T, constraint.root((B, N)))
    finished = _empty(B, N, T, alive.node)
    last, levels = None, []
    runs = {}
    if scan_levels and bonus_fn is None and hasattr(constraint, "level_runs"):
        for r, (a, b) in enumerate(constraint.level_runs()):
            # each level's own slots (shapes only: the traced reads are dead code) decide its scoring path
            paths = {_candidates_only(project_fn, tokens is not None, score_mode,
                                      0 if tokens is None else tokens.shape[-1], constraint.vocab_size)
                     for tokens in (constraint.children(d, alive.node)[0] for d in range(a, b))}
            if 1 <= a and b < T and b - a >= 2 and len(paths) == 1:  # else unrolled, each level its own path
                runs[a] = (r, b, any(constraint.has_leaves(d) for d in range(a, b)), paths.pop())
    d = 0
    while d < T:
        if d in runs:
            r, stop, run_leaves, candidates = runs[d]
            cache, last, alive, finished, run_levels = _scan_run(
                r, d, stop, run_leaves, candidates, step_fn, cache, last, alive, finished, constraint, N=N,
                score_mode=score_mode, length_penalty=length_penalty, start_token=start_token,
                accumulate_bonus=accumulate_bonus, project_fn=project_fn, keep_history=keep_history,
                history_width=history_width)
            if keep_history:
                levels += [jax.tree_util.tree_map(lambda x, i=i: x[i], run_levels) for i in range(stop - d)]
            d = stop
            continue
        logits, cache, src = _step(step_fn, cache, last, alive, tile_fn, d, B, N, start_token)
        n = src.score.shape[1]
        tokens, child, leaf, valid = constraint.children(d, src.node)
        valid = valid & src.valid[..., None]
        step = _token_scores(logits, tokens, valid, score_mode, project_fn, constraint.vocab_size)
        score = src.score[..., None] + step
        prune = (src.prune if accumulate_bonus else src.score)[..., None] + step
        if bonus_fn is not None:
            prune = prune + jnp.where(valid, bonus_fn(d, jnp.where(valid, child, -1), query_state), 0.0)
        C = step.shape[-1]
        if tokens is None:
            tokens = jnp.broadcast_to(jnp.arange(C, dtype=jnp.int32), step.shape)
        is_leaf = leaf >= 0
        if constraint.has_leaves(d):
            inv = _inverse_penalty(d, length_penalty)
            leaf_prune = jnp.where(is_leaf, prune, NEG_INF).reshape(B, n * C)
            _, idx = jax.lax.top_k(leaf_prune, min(N, n * C))
            new = _extend(src, idx, C, d, tokens, score * inv, jnp.where(is_leaf, prune, NEG_INF) * inv,
                          child, leaf, d + 1)
            finished = _merge_finished(finished, new, N)
        if d + 1 < T or keep_history:
            go_prune = jnp.where(is_leaf, NEG_INF, prune).reshape(B, n * C)
            _, idx = jax.lax.top_k(go_prune, min(N, n * C))
            if keep_history and history_width:
                levels.append(_best_candidates(src, C, d, tokens, score, prune, child, leaf, history_width))
            alive, idx = _select(src, idx, C, d, tokens, score, jnp.where(is_leaf, NEG_INF, prune), child, N)
            if not (keep_history and history_width):
                levels.append(alive)
            if d + 1 < T:
                cache, last = _reorder(alive, idx, C, d, cache, N, start_token)
        d += 1
    return _result(finished, _history(levels) if keep_history else None)


@flax.struct.dataclass
class Candidates:
    """One level's candidates of all the alive beams of each query, flat: F places per query, each naming the beam
    it extends (`beam_search_flat`). For a constraint with few candidates in all though one beam may have many (a
    planning set's trie: n documents under N beams), where [B, N, C] slots would pad every beam to the largest C."""

    parent: jax.Array  # int32 [B, F] the beam a candidate extends (any value where not valid)
    tokens: jax.Array  # int32 [B, F] its token
    state: Any  # the constraint's state after it, leaves [B, F]
    leaf: jax.Array  # int32 [B, F] leaf id where it completes an identifier, else -1
    valid: jax.Array  # bool [B, F]
    bonus: Optional[jax.Array] = None  # float32 [B, F] added to the pruning score only (as `bonus_fn`'s)


def _flat_scores(out, parent, tokens, valid, score_mode: str, project_fn: Optional[ProjectFn]):
    """Step scores [B, F] of flat candidates (-inf where not valid): `out` is the step's logits [B, n, V] or, with
    `project_fn`, its hidden states [B, n, D]; each candidate reads its parent's row."""
    if score_mode == "renormalized":
        raise ValueError("beam_search_flat: score_mode 'renormalized' normalises over a beam's candidates, "
                         "which the flat layout does not group; use 'raw' or 'log_softmax'")
    if score_mode not in SCORE_MODES:
        raise ValueError(f"score_mode must be one of {SCORE_MODES}, got {score_mode!r}")
    row = lambda x: jnp.take_along_axis(x, parent[..., None], axis=1)  # noqa: E731  [B, F, ·]
    if project_fn is not None and score_mode == "raw":
        s = project_fn(row(out), tokens[..., None])[..., 0]
    else:
        logits = out if project_fn is None else project_fn(out, None)
        s = jnp.take_along_axis(row(logits), tokens[..., None], axis=-1)[..., 0]
        if score_mode == "log_softmax":
            s = s - row(jax.nn.logsumexp(logits, axis=-1, keepdims=True))[..., 0]
    return jnp.where(valid, s, NEG_INF)


def beam_search_flat(step_fn: StepFn, cache, constraint, *, batch_size: int, num_beams: int,
                     score_mode: str = "raw", length_penalty: float = 0.0, start_token: int = 0, tile_fn=None,
                     accumulate_bonus: bool = True, project_fn: Optional[ProjectFn] = None) -> BeamResult:
    """`beam_search` over a constraint that gives each level's candidates flat (`Candidates`), through
    `constraint.candidates(d, state [B, n], valid [B, n])` (n = 1 at step 0, the root beam; then N), besides
    `root`, `has_leaves`, `depth`: per level the beams' F candidates are scored, the N best (by pruning score)
    that complete an identifier join the finished pool and the N best of the others stay alive, as in
    `beam_search`. Equal pruning scores are taken in the candidates' order (the constraint documents it).
    Score modes "raw" and "log_softmax"; `project_fn` as in `beam_search` (with "raw" only the candidates'
    logits are computed: F per query, whatever the beams)."""
    B, N, T = batch_size, num_beams, constraint.depth
    alive = _root(B, N, T, constraint.root((B, N)))
    finished = _empty(B, N, T, alive.node)
    last = None
    for d in range(T):
        out, cache, src = _step(step_fn, cache, last, alive, tile_fn, d, B, N, start_token)
        c = constraint.candidates(d, src.node, src.valid)
        parent = jnp.clip(c.parent, 0, src.score.shape[1] - 1)
        beam = lambda x: jnp.take_along_axis(x, parent, axis=1)  # noqa: E731
        valid = c.valid & beam(src.valid)
        step = _flat_scores(out, parent, c.tokens, valid, score_mode, project_fn)
        score = beam(src.score) + step
        prune = beam(src.prune if accumulate_bonus else src.score) + step
        if c.bonus is not None:
            prune = prune + jnp.where(valid, c.bonus, 0.0)
        F = step.shape[1]
        is_leaf = c.leaf >= 0
        if constraint.has_leaves(d):
            inv = _inverse_penalty(d, length_penalty)
            _, idx = jax.lax.top_k(jnp.where(is_leaf, prune, NEG_INF), min(N, F))
            new = _extend_from(src, beam_of(parent, idx), idx, d, c.tokens, score * inv,
                               jnp.where(is_leaf, prune, NEG_INF) * inv, c.state, c.leaf, d + 1)
            finished = _merge_finished(finished, new, N)
        if d + 1 < T:
            _, idx = jax.lax.top_k(jnp.where(is_leaf, NEG_INF, prune), min(N, F))
            chosen = beam_of(parent, idx)
            alive = _extend_from(src, chosen, idx, d, c.tokens, score, jnp.where(is_leaf, NEG_INF, prune), c.state,
                                 None, d + 1)
            alive, chosen = _pad_beams(alive, chosen, N)
            if d > 0:  # after step 0 every row of a query holds the same state: nothing to reorder
                cache = gather_rows(cache, (jnp.arange(B)[:, None] * N + chosen).reshape(-1), B * N)
            last = jnp.where(alive.valid, alive.tokens[:, :, d], start_token).reshape(-1)
    return _result(finished)


def beam_of(parent, idx):
    """The parent beams [B, k] of the candidates at flat places idx [B, k]."""
    return jnp.take_along_axis(parent, idx, axis=1)


def beam_search_unconstrained(step_fn: StepFn, cache, *, batch_size: int, num_beams: int, max_length: int,
                              eos_id: int, vocab_size: int, score_mode: str = "log_softmax",
                              length_penalty: float = 0.0, start_token: int = 0, tile_fn=None) -> BeamResult:
    """The same search over the whole vocabulary (EOS ends a sequence), for comparison; `leaf_ids` is -1."""
    B, N, T, V = batch_size, num_beams, max_length, vocab_size
    alive = _root(B, N, T, jnp.zeros((B, N), jnp.int32))
    finished = _empty(B, N, T, alive.node)
    last = None
    for d in range(T):
        logits, cache, src = _step(step_fn, cache, last, alive, tile_fn, d, B, N, start_token)
        n = src.score.shape[1]
        vocab = jnp.broadcast_to(jnp.arange(V, dtype=jnp.int32), (B, n, V))
        valid = jnp.broadcast_to(src.valid[..., None], logits.shape)
        step = _token_scores(logits, None, valid, score_mode)
        score = src.score[..., None] + step
        # finishing: the EOS slot of each beam (n candidates, not n·V)
        inv = _inverse_penalty(d, length_penalty)
        eos_idx = jnp.broadcast_to(jnp.arange(n)[None, :] * V + eos_id, (B, n))
        new = _extend(src, eos_idx, V, d, vocab, score * inv, score * inv, None, None, d + 1)
        finished = _merge_finished(finished, new, N)
        if d + 1 < T:
            go = jnp.where(jnp.arange(V) == eos_id, NEG_INF, score).reshape(B, n * V)
            _, idx = jax.lax.top_k(go, min(N, n * V))
            alive, idx = _select(src, idx, V, d, vocab, score, score, None, N)
            cache, last = _reorder(alive, idx, V, d, cache, N, start_token)
    return _result(finished)
