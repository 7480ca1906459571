"""The trie of a batch's planning sets, searched directly (`decoding.beam_search.beam_search_flat`).

PAG decodes only docids of planned documents (004 §3.2; nodes under no planned document are removed). Searching
the corpus trie with those nodes at −inf scores every child of every beam — at 1M documents a beam at the second
level has ~500 children, of which one or two are planned — and looks each up in the bonus tables. Here the search
reads the planning set itself: the n planned documents of a query sorted by docid (lexicographic, a corpus row's
precomputed rank), so that the documents under any prefix are consecutive places. A beam's state is the first
place of its prefix; at level d the candidates are the places where a prefix of d + 1 tokens begins (at most n
per query, whatever the beams), each extending the beam that holds its d-token prefix, with the max s_simul over
the documents of its prefix as the look-ahead bonus (004 Eq. 5) — the values `model.node_bonus` gives the same
nodes.

The candidates of a level are in docid order, so equal pruning scores are taken in that order (the smaller
prefix first), a documented key that depends on no beam's position. Dimension letters: B queries, n planning
set, M docid length (the trie's depth), D corpus rows.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.api import Candidates


def docid_order(tokens_DxM: np.ndarray) -> np.ndarray:
    """Each corpus row's place when the rows are sorted by docid (token by token; −1 past a docid's end sorts
    before every token, so a docid comes before the longer ones it begins; equal docids by row): int32 [D]."""
    tokens = np.asarray(tokens_DxM)
    order = np.lexsort((np.arange(len(tokens)),) + tuple(tokens[:, j] for j in range(tokens.shape[1] - 1, -1, -1)))
    rank = np.empty(len(tokens), np.int32)
    rank[order] = np.arange(len(tokens), dtype=np.int32)
    return rank


@flax.struct.dataclass
class PlanningTrie:
    """The planning sets of a batch as a decoding constraint with flat candidates (module docstring)."""

    tokens: jax.Array  # int32 [B, n, M] the planned docids in docid order, −1 past a docid's end (or no document)
    leaf: jax.Array  # int32 [B, n] each one's leaf in the corpus index
    new: jax.Array  # bool [B, n, M] place i begins a prefix of d + 1 tokens (its first d + 1 differ from i − 1's)
    scores: jax.Array  # float32 [B, n] s_simul of each
    depth: int = flax.struct.field(pytree_node=False)
    vocab_size: int = flax.struct.field(pytree_node=False)
    guided: bool = flax.struct.field(pytree_node=False)  # the look-ahead bonus (mode "pag"), else none
    leaf_levels: tuple = flax.struct.field(pytree_node=False)  # levels d at which some docid of the corpus ends

    def root(self, shape: tuple) -> jax.Array:
        return jnp.zeros(shape, jnp.int32)  # the empty prefix begins at place 0

    def has_leaves(self, d: int) -> bool:
        return d in self.leaf_levels

    def _prefix_max(self, d: int):
        """[B, n]: at every place, the max s_simul over the places that share its first d + 1 tokens."""
        B, n = self.scores.shape
        seg = jnp.cumsum(self.new[:, :, d], axis=1, dtype=jnp.int32) - 1
        best = jnp.full((B, n), -jnp.inf, jnp.float32).at[jnp.arange(B)[:, None], seg].max(self.scores)
        return jnp.take_along_axis(best, seg, axis=1)

    def docid_max(self):
        """[B, n]: at every place, the max s_simul over the planned documents with its whole docid — PAG's final
        bonus of the docid that a finished beam holding that place (its state) decoded."""
        return self._prefix_max(self.depth - 1)

    def candidates(self, d: int, state, valid) -> Candidates:
        """The prefixes of d + 1 tokens of the planned docids whose d-token prefix is a valid beam's (`state`: the
        first place of each beam's prefix)."""
        B, n = self.leaf.shape
        rows = jnp.arange(B)[:, None]
        place = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32)[None], (B, n))
        token = self.tokens[:, :, d]
        # the first place of each place's d-token prefix, and the beam holding that prefix (−1: none)
        up = jnp.zeros((B, n), jnp.int32) if d == 0 else jax.lax.cummax(
            jnp.where(self.new[:, :, d - 1], place, 0), axis=1)
        beams = jnp.broadcast_to(jnp.arange(state.shape[1], dtype=jnp.int32)[None], state.shape)
        beam_at = jnp.full((B, n), -1, jnp.int32).at[rows, jnp.where(valid, state, n)].set(beams, mode="drop")
        parent = jnp.take_along_axis(beam_at, up, axis=1)
        ok = self.new[:, :, d] & (token >= 0) & (parent >= 0)
        ends = token >= 0 if d + 1 == self.depth else (token >= 0) & (self.tokens[:, :, d + 1] < 0)
        # the look-ahead: the max s_simul over the documents of each prefix of d + 1 tokens
        bonus = self._prefix_max(d) if self.guided else None
        return Candidates(parent=parent, tokens=jnp.maximum(token, 0), state=place,
                          leaf=jnp.where(ok & ends, self.leaf, -1), valid=ok, bonus=bonus)


def planning_trie(doc_tokens_DxM, doc_order_D, doc_leaf_D, planned_BxN, planned_s_BxN, *, vocab_size: int,
                  guided: bool, leaf_levels: tuple) -> PlanningTrie:
    """The `PlanningTrie` of planned corpus rows [B, n] (distinct per query) with their s_simul (`docid_order`: the
    rows' places by docid; rows without a document have all tokens −1 and are never candidates)."""
    B, n = planned_BxN.shape
    order = doc_order_D[planned_BxN]
    # one sort of the places alone (XLA's CPU sort with payloads is ~8× slower), then each row finds its place
    ranked = jax.lax.sort(order, dimension=1)
    at = jax.vmap(jnp.searchsorted)(ranked, order)
    rows_b = jnp.arange(B)[:, None]
    rows = jnp.zeros((B, n), planned_BxN.dtype).at[rows_b, at].set(planned_BxN)
    scores = jnp.zeros((B, n), planned_s_BxN.dtype).at[rows_b, at].set(planned_s_BxN)
    tokens = doc_tokens_DxM[rows]  # [B, n, M]
    M = tokens.shape[2]
    differs = jnp.concatenate([jnp.ones((B, 1, M), bool), tokens[:, 1:] != tokens[:, :-1]], axis=1)
    new = jax.lax.cummax(differs.astype(jnp.int32), axis=2).astype(bool)  # a difference at j < d begins it too
    return PlanningTrie(tokens=tokens, leaf=doc_leaf_D[rows], new=new, scores=scores, depth=M, vocab_size=vocab_size,
                        guided=guided, leaf_levels=tuple(leaf_levels))
