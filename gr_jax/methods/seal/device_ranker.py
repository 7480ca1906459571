"""SEAL's intersective scoring (`ranker.rank_documents`, the oracle) as one jitted program over a batch of queries.

The same result as the host scorer (the same documents, scores within float32 rounding) from a different
computation: the candidates' texts are bit sets, one word per 32 positions of a row, and the greedy over keys is a
scan whose steps are word operations on every candidate at once.

Per query, on the host: each key's weight w (float64, `ranker.weight`), the greedy order of the live keys (w > 0;
by −w, then tokens), the candidates (the rows of the rare keys' occurrences) and which rare key each holds, and a
compact number for every token type of the keys. On the device:

1. First pass (SEAL's `fully_score`): a candidate's score from the rare keys it holds, discounted by `cover`; the
   best `fully_score` by (−score, row) go on.
2. Bit sets: B[t][c] has bit x set where candidate c's text holds type t at x; key i matches at x where
   B[k_0] & B[k_1] ≫ 1 & … & B[k_{L−1}] ≫ (L − 1) (≫ j: bit x reads position x + j), computed once per prefix
   of the keys (a scan over the keys' prefixes, parents first: one AND each; keys from beam histories share most).
3. Greedy (a scan over the keys in order): free = matches whose span [x, x + L) holds no used position; among
   free matches of one key that overlap each other, the leftmost of each chain is kept, then the next free one at
   least L further, … (`_left_first`: rounds, each deciding the first undecided match of every chain); the kept
   spans become used; the key counts for every candidate with a kept match.
4. Cover: with taken[i, c] from the scan, a second scan over the keys keeps which types each candidate's taken
   keys have: score[c] = Σ_i taken[i, c] · w_i · (1 − β + β · new / |types(i)|), in the host's order of terms.
   The first pass uses the same function with the rare keys each candidate holds.
5. Unigram bonus (`types` given): per candidate, the distinct types at positions no key used, each u(t), times
   1 − β where a taken key of the candidate has that type. Distinct types per row come from each row's positions
   sorted by token, computed once per table.

Scores are float32 (weights are computed in float64 on the host): the same documents as the host scorer with
scores within ~1e-6 relative, except where two candidates' first-pass sums are equal in exact arithmetic but not
in floating point (different keys, e.g. w(1 + .2 + .2) and w(1 + .4)): which of them the `fully_score` cut keeps is
then the rounding's choice, float64's on the host and float32's here. A weight below float32's smallest normal
(~1e-38: a log-odds below ~1e-19) counts as 0 here, where the host would rank its documents at that score.

Shapes are padded per call (keys, prefixes, candidates to powers of two; key lengths to multiples of 8) so a run
compiles a few programs; a row takes `ceil(W / 32)` words for the identifier table's width W. Memory per query
of a call: (prefixes + 1) × (words + 1) × kept candidates × 4 bytes, twice (type bit sets, prefix matches).
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.seal.ranker import Key, weight

BITS = 32


def _pow2(n: int, least: int = 1) -> int:
    return max(least, 1 << max(int(n) - 1, 0).bit_length())


def _shift_words(b, q: int):
    """result[k] = b[k + q] along the words axis (−2), zeros past either end; q static."""
    words = b.shape[-2]
    if q == 0:
        return b
    if abs(q) >= words:
        return jnp.zeros_like(b)
    pad = jnp.zeros((*b.shape[:-2], abs(q), b.shape[-1]), b.dtype)
    return jnp.concatenate([b[..., q:, :], pad], axis=-2) if q > 0 else jnp.concatenate([pad, b[..., :q, :]], axis=-2)


def _ahead(b, j: int):
    """Bit x of the result is bit x + j of `b` (bit sets [..., words, rows]: position x is bit x % 32 of word
    x // 32 of its row); j ≥ 0 static."""
    q, r = divmod(j, BITS)
    lo = _shift_words(b, q)
    if r == 0:
        return lo
    return (lo >> jnp.uint32(r)) | (_shift_words(b, q + 1) << jnp.uint32(BITS - r))


def _behind(b, j: int):
    """Bit x of the result is bit x − j of `b`."""
    q, r = divmod(j, BITS)
    lo = _shift_words(b, -q)
    if r == 0:
        return lo
    return (lo << jnp.uint32(r)) | (_shift_words(b, -q - 1) >> jnp.uint32(BITS - r))


def _window(b, length, longest: int, shift, first: int = 0):
    """OR of shift(b, j) for first ≤ j < length (length traced, at most `longest`)."""
    out = jnp.zeros_like(b)
    for j in range(first, longest):
        out = out | jnp.where(j < length, shift(b, j), jnp.uint32(0))
    return out


def _left_first(free, length, longest: int):
    """The matches the sequential greedy keeps among `free` ones of a key of `length` tokens: left to right, a
    match is kept when no kept one starts fewer than `length` positions before it."""
    earlier = functools.partial(_window, length=length, longest=longest, shift=_behind, first=1)
    kept = free & ~earlier(free)  # first of its chain: kept
    undecided = free & ~kept

    def more(state):
        return jnp.any(state[1] != 0)

    def round_(state):
        kept, undecided = state
        undecided = undecided & ~earlier(kept)  # a kept match starts within reach: out
        new = undecided & ~earlier(undecided)  # nothing undecided before it within reach: kept
        return kept | new, undecided & ~new

    return jax.lax.while_loop(more, round_, (kept, undecided))[0]


def _cover_scores(holds_KxC, weights_K, types_KxT, ntypes_K, num_types: int, beta: float):
    """Σ_i holds[i, c] · w_i · (1 − β + β · new(i, c) / |types(i)|), where new(i, c) counts the types of key i that
    no earlier key (lower i) held by c has; and [C, num_types] which types the keys held by c have. types_KxT:
    each key's distinct compact types, −1 padded."""
    C = holds_KxC.shape[1]

    def step(carry, xs):
        seen, score = carry
        holds, w, kinds, n = xs
        ok = kinds >= 0
        rows = jnp.where(ok, kinds, num_types)  # num_types: a row no key type uses
        had = seen[rows]  # [T, C]
        new = jnp.sum(ok[:, None] & ~had, axis=0)
        part = w * (1.0 - beta + beta * new.astype(jnp.float32) / jnp.maximum(n, 1).astype(jnp.float32))
        score = score + jnp.where(holds, part, 0.0)
        seen = seen.at[rows].set(had | (ok[:, None] & holds[None, :]))
        return (seen, score), None

    init = (jnp.zeros((num_types + 1, C), bool), jnp.zeros(C, jnp.float32))
    (seen, score), _ = jax.lax.scan(step, init, (holds_KxC, weights_K, types_KxT, ntypes_K))
    return score, seen[:num_types].T


def _ahead_by(padded, j, words: int):
    """`_ahead` by a traced j of bit sets whose words axis is padded with zero words past `words` (at least
    j // 32 + 1 of them)."""
    q, r = j // BITS, (j % BITS).astype(jnp.uint32)
    lo = jax.lax.dynamic_slice_in_dim(padded, q, words, axis=-2)
    hi = jax.lax.dynamic_slice_in_dim(padded, q + 1, words, axis=-2)
    return (lo >> r) | jnp.where(r == 0, jnp.uint32(0), hi << (jnp.uint32(BITS) - r))


def _score_one(texts_NxW, sorted_pos_NxW, run_start_NxW, cand_idx_C, cand_rows_C, holds_CxK, node_parent_M,
               node_type_M, node_depth_M, key_node_K, key_lengths_K, key_types_KxT, key_ntypes_K, weights_K,
               type_map_V, unigram_V, *, longest: int, keep: int, num_types: int, beta: float, bonus: bool):
    L = longest
    valid_C = cand_idx_C >= 0
    # 1. first pass: the rare keys each candidate holds; the best `keep` by (−score, row), then by row
    first, _ = _cover_scores(holds_CxK.T, weights_K, key_types_KxT, key_ntypes_K, num_types, beta)
    first = jnp.where(valid_C, first, -jnp.inf)
    big = jnp.iinfo(jnp.int32).max
    best = jnp.lexsort((jnp.where(valid_C, cand_rows_C, big), -first))[:keep]
    best = best[jnp.argsort(jnp.where(valid_C[best], cand_rows_C[best], big))]
    idx, rows = cand_idx_C[best], cand_rows_C[best]
    live_F = idx >= 0
    # 2. bit sets of the key types over the kept candidates' texts
    texts = jnp.where(live_F[:, None], texts_NxW[jnp.maximum(idx, 0)], -1)
    F, W = texts.shape
    words = -(-W // BITS)
    typ = jnp.where(texts >= 0, type_map_V[jnp.maximum(texts, 0)], num_types)  # num_types: no key's type
    pos = jnp.arange(W)
    bit = (jnp.uint32(1) << (pos % BITS).astype(jnp.uint32))[None, :]
    sets = jnp.zeros((num_types + 1, words + (L - 1) // BITS + 1, F), jnp.uint32)  # zero words for _ahead_by
    sets = sets.at[typ, (pos // BITS)[None, :], jnp.arange(F)[:, None]].add(jnp.broadcast_to(bit, (F, W)))
    # a key's matches from its prefix's (the keys' prefixes are nodes, parents first): one AND a node
    M = node_parent_M.shape[0]

    def node(table, xs):
        n, parent, kind, depth = xs
        base = jnp.where(parent >= 0, table[jnp.maximum(parent, 0)], jnp.uint32(0xFFFFFFFF))
        match = jnp.where(depth > 0, base & _ahead_by(sets[jnp.maximum(kind, 0)], depth - 1, words), jnp.uint32(0))
        return table.at[n].set(match), None

    table, _ = jax.lax.scan(node, jnp.zeros((M + 1, words, F), jnp.uint32),
                            (jnp.arange(M), node_parent_M, node_type_M, node_depth_M))

    # 3. the greedy over keys, in order (row M of the table is zeros: padded keys match nowhere)
    def step(used, xs):
        node, length = xs
        match = table[jnp.where((node >= 0) & (length > 0), node, M)]
        blocked = _window(used, length, L, _ahead)
        kept = _left_first(match & ~blocked, length, L)
        used = used | _window(kept, length, L, _behind)
        return used, jnp.any(kept != 0, axis=0)

    used, taken = jax.lax.scan(step, jnp.zeros((words, F), jnp.uint32), (key_node_K, key_lengths_K))
    # 4. cover
    score, held_types = _cover_scores(taken, weights_K, key_types_KxT, key_ntypes_K, num_types, beta)
    # 5. unigram bonus: distinct types at unused positions
    if bonus:
        free = ((used[pos // BITS, :].T >> (pos % BITS).astype(jnp.uint32)[None, :]) & 1) == 0  # [F, W]
        order = sorted_pos_NxW[jnp.maximum(idx, 0)]  # each row's positions by token
        starts = run_start_NxW[jnp.maximum(idx, 0)]  # the sorted index where its token's run begins
        tok = jnp.take_along_axis(texts, order, axis=1)
        open_ = jnp.take_along_axis(free, order, axis=1) & (tok >= 0)
        any_free = jnp.zeros((F, W), bool).at[jnp.arange(F)[:, None], starts].max(open_)
        head = starts == jnp.arange(W)[None, :]  # one entry per run
        u = jnp.where(tok >= 0, unigram_V[jnp.clip(tok, 0, unigram_V.shape[0] - 1)], 0.0)
        u = jnp.where(tok < unigram_V.shape[0], u, 0.0)
        col = jnp.where(tok >= 0, type_map_V[jnp.maximum(tok, 0)], num_types)
        held = (col < num_types) & held_types[jnp.arange(F)[:, None], jnp.minimum(col, num_types - 1)]
        add = jnp.where(head & any_free & (u > 0), u * jnp.where(held, 1.0 - beta, 1.0), 0.0)
        score = score + jnp.sum(add, axis=1)
    return rows, jnp.where(live_F, score, 0.0), taken


@functools.partial(jax.jit, static_argnames=("longest", "keep", "num_types", "beta", "bonus"))
def _score_batch(texts, sorted_pos, run_start, *per_query, longest: int, keep: int, num_types: int, beta: float,
                 bonus: bool):
    one = functools.partial(_score_one, texts, sorted_pos, run_start, longest=longest, keep=keep,
                            num_types=num_types, beta=beta, bonus=bonus)
    return jax.vmap(one)(*per_query)


class DeviceScorer:
    """`rank_documents` for a batch of queries on the device, over one identifier table.

    rows_to_table: corpus row → table row (−1: not in the table); table_NxW: identifier tokens, −1 past each end."""

    def __init__(self, rows_to_table: np.ndarray, table_NxW: np.ndarray):
        table = np.asarray(table_NxW, np.int32)
        if table.ndim != 2 or not table.size:
            raise ValueError(f"DeviceScorer: the identifier table must be a non-empty [N, W] array, got shape "
                             f"{table.shape}")
        self.rows_to_table = np.asarray(rows_to_table, np.int64)
        self.vocab = int(table.max()) + 1
        self.width = table.shape[1]
        self._table = table
        self._texts = jnp.asarray(table, jnp.int32)
        self._runs = None  # the unigram bonus's per-row token order, made at its first use

    def _by_token(self):
        """(each row's positions by token, ties by position, −1 last; where each one's run of equal tokens begins)
        on the device: what the unigram bonus reads; made once per table."""
        if self._runs is None:
            key = np.where(self._table >= 0, self._table, np.iinfo(np.int32).max).astype(np.int64)
            order = np.argsort(key, axis=1, kind="stable")
            sorted_tok = np.take_along_axis(key, order, axis=1)
            start = np.ones_like(sorted_tok, bool)
            start[:, 1:] = sorted_tok[:, 1:] != sorted_tok[:, :-1]
            run_start = np.maximum.accumulate(np.where(start, np.arange(self.width)[None, :], 0), axis=1)
            self._runs = (jnp.asarray(order, jnp.int32), jnp.asarray(run_start, jnp.int32))
        return self._runs

    def rank(self, queries: Sequence[tuple], positions: int, max_hits: int = 1500, smoothing: float = 5.0,
             exponent: float = 2.0, beta: float = 0.8, matched: bool = False,
             fully_score: Optional[int] = None, batch: int = 1) -> list[list[tuple]]:
        """Per query of `queries` — (keys, found, types), as `rank_documents` takes them — what `rank_documents`
        returns for it: [(row, score)] best first, ties by row; with `matched`, (row, score, the indices of the keys
        that counted for it, in the greedy order). `batch`: the queries are padded to at least this many (one batch
        size for every call of a run, its last one included; the other sizes follow the queries)."""
        packed, out = [], [[] for _ in queries]
        for q, (keys, found, types) in enumerate(queries):
            p = self._pack(keys, found, types, positions, max_hits, smoothing, exponent)
            if p is not None:
                packed.append((q, p))
        if not packed:
            return out
        bonus = any(p["types"] is not None for _, p in packed)
        if bonus and not all(p["types"] is not None for _, p in packed):
            raise ValueError("DeviceScorer.rank: give types (the unigram bonus) for every query of a batch or none")
        # few compiled shapes: nodes and types share one size (every type ends a node), lengths are rounded up to
        # 8, the rest to powers of two (the keys' own: the greedy takes a step per key)
        B = _pow2(max(len(packed), batch))
        K = _pow2(max(len(p["order"]) for _, p in packed), 64)
        M = V = _pow2(max(len(p["nodes"]) for _, p in packed), 64)
        L = T = -(-max(max(len(toks) for toks in p["tokens"]) for _, p in packed) // 8) * 8
        C = _pow2(max(len(p["candidates"]) for _, p in packed), 64)
        keep = C if fully_score is None else min(C, int(fully_score))
        cand_idx = np.full((B, C), -1, np.int32)
        cand_rows = np.full((B, C), -1, np.int32)
        holds = np.zeros((B, C, K), bool)
        node_parent = np.full((B, M), -1, np.int32)
        node_type = np.full((B, M), -1, np.int32)
        node_depth = np.zeros((B, M), np.int32)
        key_node = np.full((B, K), -1, np.int32)
        key_lengths = np.zeros((B, K), np.int32)
        key_types = np.full((B, K, T), -1, np.int32)
        key_ntypes = np.zeros((B, K), np.int32)
        weights = np.zeros((B, K), np.float32)
        type_map = np.full((B, self.vocab), V, np.int32)
        unigrams = np.zeros((B, self.vocab if bonus else 1), np.float32)
        for b, (_, p) in enumerate(packed):
            n = len(p["candidates"])
            cand_rows[b, :n] = p["candidates"]
            cand_idx[b, :n] = self.rows_to_table[p["candidates"]]
            holds[b, p["holds"][0], p["holds"][1]] = True
            nodes = p["nodes"]
            for n, prefix in enumerate(nodes):
                node_parent[b, n] = nodes[prefix[:-1]] if len(prefix) > 1 else -1
                node_type[b, n] = prefix[-1]
                node_depth[b, n] = len(prefix)
            for k, toks in enumerate(p["tokens"]):
                key_node[b, k] = nodes[tuple(toks)]
                key_lengths[b, k] = len(toks)
                kinds = sorted(set(toks))
                key_types[b, k, : len(kinds)] = kinds
                key_ntypes[b, k] = len(kinds)
            weights[b, : len(p["order"])] = p["weights"]
            inside = p["type_ids"] < self.vocab
            type_map[b, p["type_ids"][inside]] = np.arange(p["num_types"])[inside]
            if bonus:
                u = np.asarray(p["types"], np.float32)[: self.vocab]
                unigrams[b, : len(u)] = u
        if (cand_idx[cand_rows >= 0] < 0).any():
            raise ValueError("DeviceScorer.rank: a candidate row is not in the identifier table")
        # without the bonus its arrays go unread: the texts stand in for them
        runs = self._by_token() if bonus else (self._texts, self._texts)
        rows, scores, taken = _score_batch(self._texts, *runs, cand_idx, cand_rows, holds, node_parent, node_type,
                                           node_depth, key_node, key_lengths, key_types, key_ntypes, weights,
                                           type_map, unigrams, longest=L, keep=keep, num_types=V,
                                           beta=float(beta), bonus=bonus)
        rows, scores = np.asarray(rows), np.asarray(scores, np.float64)
        taken = np.asarray(taken) if matched else None
        for b, (q, p) in enumerate(packed):
            good = (rows[b] >= 0) & (scores[b] > 0)
            js = np.flatnonzero(good)
            js = js[np.lexsort((rows[b][js], -scores[b][js]))]
            if matched:
                out[q] = [(int(rows[b][j]), float(scores[b][j]),
                           [p["order"][k] for k in np.flatnonzero(taken[b][:, j])]) for j in js]
            else:
                out[q] = [(int(rows[b][j]), float(scores[b][j])) for j in js]
        return out

    def _pack(self, keys: Sequence[Key], found: Sequence, types, positions: int, max_hits: int, smoothing: float,
              exponent: float) -> Optional[dict]:
        """One query's host part: weights, the greedy order of the live keys, candidates, the rare keys each
        holds, compact type numbers. None when no candidate."""
        w = [weight(k.score, k.count, positions, smoothing, exponent) if k.weight is None else float(k.weight)
             for k in keys]
        live = [i for i in range(len(keys)) if w[i] > 0]
        order = sorted(live, key=lambda i: (-w[i], keys[i].tokens))
        rare = [i for i in order if keys[i].count <= max_hits]
        for i in rare:
            if found[i] is None or len(found[i][0]) != keys[i].count:
                got = None if found[i] is None else len(found[i][0])
                raise ValueError(f"SEAL scoring: key {keys[i].tokens} occurs {keys[i].count} times but {got} "
                                 f"occurrences were given")
        if not rare:
            return None
        candidates = np.unique(np.concatenate([np.asarray(found[i][0], np.int64) for i in rare]))
        if not len(candidates):
            return None
        slot = {i: k for k, i in enumerate(order)}
        cs, ks = [], []
        for i in rare:
            c = np.unique(np.searchsorted(candidates, np.asarray(found[i][0], np.int64)))
            cs.append(c)
            ks.append(np.full(len(c), slot[i]))
        type_ids = np.array(sorted({t for i in order for t in keys[i].tokens}), np.int64)
        number = {t: n for n, t in enumerate(type_ids.tolist())}
        tokens = [tuple(number[t] for t in keys[i].tokens) for i in order]
        prefixes = sorted({t[:j] for t in tokens for j in range(1, len(t) + 1)}, key=lambda t: (len(t), t))
        nodes = {t: n for n, t in enumerate(prefixes)}  # parents first
        return {"order": order, "weights": np.array([w[i] for i in order]), "candidates": candidates,
                "holds": (np.concatenate(cs), np.concatenate(ks)), "tokens": tokens, "nodes": nodes,
                "type_ids": type_ids, "num_types": len(type_ids), "types": types}

