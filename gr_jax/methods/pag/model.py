"""PAG (planning-ahead generative retrieval; spec: 004_pag_lost_in_decoding.txt §2–3): one T5 that plans with a
lexical head and decodes sequential docids under that plan.

* **Planner** — the decoder reads the query itself (decoder input = the query ids, causal, no decoder padding
  mask); rep[v] = max over the query's positions i of log(1 + ReLU(lm_head(h_i · d_model^-0.5)))[v] · mask_i
  (`lexical_rep`, vocabulary-sized, ≥ 0). A document's *set docid* t_d is m vocabulary ids (`methods.pag.docids`);
  s_simul(q, d) = Σ_{v ∈ t_d} rep_q[v]; the planning set is the top n documents by s_simul (`plan`), through the
  inverted index of the set docids when the batch fits its budgets, else the dense product — the same set and
  scores either way (`methods.pag.planner`).
* **Sequential docids** — M tokens in the vocabulary extended by M × K docid tokens (level i, code j →
  base + K·i + j). Step scores are *raw* logits lm_head(h) (no d_model^-0.5 scale, no log-softmax) with the
  decoder input [query ids, 0, c_1, …] (no decoder mask: padding inside the query is attended, so queries are
  always padded to the same TASK_FEATURE_LENGTHS['inputs'] here, in training and in inference alike).
* **Look-ahead** — per query, the bonus of a trie node is the max s_simul over the planned documents whose
  docid passes through it; beams are *selected* by raw score + bonus of their last token and *keep* the raw
  score (`accumulate_bonus=False`); nodes under no planned document are removed (PAG's trie holds only the
  planning set). The search runs over that trie itself (`methods.pag.planned`: the planned docids sorted, each
  level's candidates flat, `beam_search_flat`), not over the corpus trie: at most n candidates a level, however
  many children a beam's node has in the corpus. The corpus trie with the bonus as tables (`bonus_tables`,
  `node_bonus`: `searcher(...).search(query_state=query_state(...))`) finds the same docids and stays for
  comparison. The final score of a docid = raw sum + max s_simul of the planned documents with that docid,
  given to every document with that docid.

Query padding (`PagRetriever.query_padding`): "fixed" (default) keeps TASK_FEATURE_LENGTHS['inputs'] — a query's
scores never depend on the other queries of its batch, and training saw the same padding; "batch_longest" trims
each retrieval batch to its longest query, as PAG's own evaluation does (to reproduce its released numbers;
the sequential scores then depend on which queries share a batch: batches are formed in query-id order).

Modes (`PagRetriever.mode`): "pag" (all of the above), "pag_unguided" (planning-set trie and final lexical
score, beams selected without the bonus: PAG's `lexical_condition` decoding), "seq_only" (sequential
decoding over the whole corpus trie, raw scores, no planner) and "simul_only" (rank by s_simul; no decoding).

Ties at the n-th planning score are broken by the documents' order keys (`methods.pag.docids.order_keys`: a hash of
the document id), never by corpus row. Dimension letters: B queries, L query length, V vocabulary, D
documents (corpus rows), m set-docid size, n planning set, M docid length, N beams.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Callable, Optional

import gin
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.api import (
    beam_search as bs,
    Capabilities,
    Count,
    GenerativeRetriever,
    leaf_documents,
    Searcher,
    share_encoder,
    Signed,
    t5,
    t5_convert,
    TextHead,
)
from gr_jax.methods.pag.model_bonus import (  # noqa: F401  (the bonus's names, re-exported)
    DENSE_BONUS_NODES,
    _bonus,
    _dense_row,
    _final_at_places,
    _lookup,
    _placed_bonus,
    _segment_max_ordered,
    _segment_max_table,
    bonus_tables,
    leaf_bonus,
    node_bonus,
    paths_in_leaf_order,
    pruning_only,
)
from gr_jax.methods.pag.model_planned import docid_order, planning_trie
from gr_jax.methods.pag.model_planner import (  # noqa: F401  (the planner's names, re-exported)
    Postings, _top_k, budgets_for, plan_from_rep, simul_scores, top_n_by_key, top_n_exact, top_n_fast, top_set_ids)

log = logging.getLogger(__name__)

MODES = ("pag", "pag_unguided", "seq_only", "simul_only")
QUERY_PADDINGS = ("fixed", "batch_longest")


# ----------------------------------------------------------------------------------------------------------
# the network's two readings of a query
# ----------------------------------------------------------------------------------------------------------


def lexical_rep_from_hidden(network: t5.T5, net_params, hidden_BxLxD, mask_BxL, pooled: bool = False,
                            vocab_limit: Optional[int] = None):
    """rep [B, V] = max_i log(1 + ReLU(lm_head(h_i · d^-0.5))) · mask_i (float32, ≥ 0); with `vocab_limit` (static)
    the ids below it only, [B, vocab_limit] (the planner's: its set docids and query terms are below the docid
    tokens).

    `pooled`: the same bits with the max taken first, log(1 + ReLU(max_i over the unmasked logits)) — the map is
    non-decreasing and ≥ 0, so it commutes with the max, and V · L logarithms become V (the planner's query
    side: about 2× faster on a CPU at L 16). Not for training: where two logits round to one log, its gradient
    goes to the larger logit instead of being shared."""
    logits = network.apply({"params": net_params}, hidden_BxLxD, True, vocab_limit, method="logits")
    if pooled:
        return jnp.log1p(jax.nn.relu(jnp.where(mask_BxL[..., None], logits, -jnp.inf).max(axis=1)))
    act = jnp.log1p(jax.nn.relu(logits)) * mask_BxL[..., None].astype(jnp.float32)
    return act.max(axis=1)


def lexical_rep(network: t5.T5, net_params, tokens_BxL, dropout_rng=None, pooled: bool = False,
                vocab_limit: Optional[int] = None):
    """The planner's representation of queries (or documents) [B, V]: the decoder reads the text itself
    (`pooled`: see `lexical_rep_from_hidden`)."""
    deterministic = dropout_rng is None
    rngs = {} if deterministic else {"dropout": dropout_rng}
    variables = {"params": net_params}
    mask = tokens_BxL != network.config.pad_token_id
    encoded = network.apply(variables, tokens_BxL, mask, deterministic, method="encode", rngs=rngs)
    hidden = network.apply(variables, encoded, mask, tokens_BxL, deterministic, method="decode_hidden",
                           rngs=rngs)
    return lexical_rep_from_hidden(network, net_params, hidden, mask, pooled, vocab_limit)


def sequential_hidden(network: t5.T5, net_params, query_BxL, prefix_BxT, dropout_rng=None):
    """Teacher-forced decoder over [query ids, start, prefix] → (hidden [B, L + 1 + T, D], encoder mask)."""
    deterministic = dropout_rng is None
    rngs = {} if deterministic else {"dropout": dropout_rng}
    variables = {"params": net_params}
    c = network.config
    mask = query_BxL != c.pad_token_id
    encoded = network.apply(variables, query_BxL, mask, deterministic, method="encode", rngs=rngs)
    start = jnp.full((query_BxL.shape[0], 1), c.decoder_start_token_id, query_BxL.dtype)
    dec_in = jnp.concatenate([query_BxL, start, prefix_BxT.astype(query_BxL.dtype)], axis=1)
    return network.apply(variables, encoded, mask, dec_in, deterministic, method="decode_hidden",
                         rngs=rngs), mask


def raw_logits(network: t5.T5, net_params, hidden):
    """PAG's sequential step scores: lm_head(h), unscaled, float32."""
    return network.apply({"params": net_params}, hidden, False, method="logits")


def pag_prefill(network: t5.T5, net_params, query_BxL, max_length: int):
    """The query read once: (decode cache with the query ids fed to the decoder at positions 0 … L − 1, the
    decoder's hidden states there [B, L, D], the query mask). The hidden states are the planner's (the decoder
    reads the query causally, no decoder mask), so one encoder and one decoder pass serve both readings."""
    variables = {"params": net_params}
    mask = query_BxL != network.config.pad_token_id
    encoded = network.apply(variables, query_BxL, mask, method="encode")
    L = query_BxL.shape[1]
    cache = network.apply(variables, encoded, mask, L + max_length, method="init_cache")
    hidden, cache = network.apply(variables, cache, query_BxL, method="prefill_hidden")
    return cache, hidden, mask


def pag_cache(network: t5.T5, net_params, query_BxL, max_length: int):
    """Decode cache with the query ids already fed to the decoder; the search then feeds the start id and the
    docid tokens."""
    return pag_prefill(network, net_params, query_BxL, max_length)[0]


def pag_step(network: t5.T5, net_params, cache, tokens_R):
    hidden, cache = pag_step_hidden(network, net_params, cache, tokens_R)
    return raw_logits(network, net_params, hidden), cache


def pag_step_hidden(network: t5.T5, net_params, cache, tokens_R):
    return network.apply({"params": net_params}, cache, tokens_R, method="decode_step_hidden")


def pag_project(network: t5.T5, net_params, hidden, tokens=None):
    """`raw_logits` of the given tokens only (the search's candidate slots), or of all with None."""
    return network.apply({"params": net_params}, hidden, tokens, False, method="token_logits")


# ----------------------------------------------------------------------------------------------------------
# the model object
# ----------------------------------------------------------------------------------------------------------


def load_pag_hf(hf_dir) -> tuple[t5.T5Config, dict]:
    """PAG's released model (an HF T5 v1.0 directory with the docid tokens in its vocabulary) → (config,
    network params)."""
    tensors = t5_convert.read_hf_tensors(hf_dir)
    config = t5_convert.config_from_hf(t5_convert.read_hf_config(hf_dir), tensors, source=str(hf_dir))
    return config, t5_convert.params_from_hf(tensors, config, source=str(hf_dir))


@gin.configurable
class PagRetriever(GenerativeRetriever):
    """PAG as a model object (module docstring). `planning_size` n; `mode` one of MODES; `simul_chunk`
    documents per block of the dense product; `planner_postings` the postings the inverted planner reads per query
    (`methods.pag.planner`: same planning set as the dense product, which a batch over budget takes; 0: the dense
    product only); `planner_query_terms` T > 0 keeps the query weights ≥ the T-th largest of the planning vocabulary
    (query-term pruning, an approximation of sparse retrieval: it changes the plan; 0, the default, keeps PAG's).
    The docid table must carry set docids (`methods.pag.docids.PagDocids`) except in mode "seq_only"."""

    def __init__(self, config: t5.T5Config, head=None, score_mode: str = "raw", length_penalty: Signed = 0.0, *,
                 mode: str = "pag", planning_size: Count = 1000, simul_chunk: Count = 8192,
                 planner_postings: int = 1 << 17, planner_query_terms: int = 0, query_padding: str = "fixed",
                 objective: Optional[Callable] = None, ranker: Optional[Callable] = None, network=None, bonus_fn=None,
                 query_state_fn=None):
        if mode not in MODES:
            raise ValueError(f"PagRetriever.mode must be one of {MODES}, got {mode!r}")
        if query_padding not in QUERY_PADDINGS:
            raise ValueError(f"PagRetriever.query_padding must be one of {QUERY_PADDINGS}, got {query_padding!r}")
        if score_mode != "raw":
            raise ValueError(f"PAG sums raw logits (004 §2); score_mode {score_mode!r} is not PAG: set "
                             f"prepare.score_mode = 'raw'")
        if head is not None and not isinstance(head, TextHead):
            raise ValueError("PAG's docid tokens are rows of the extended vocabulary (a text head); use "
                             "PagDocids, whose tokens sit above the text vocabulary")
        if bonus_fn is not None or query_state_fn is not None:
            raise ValueError("PagRetriever computes its own look-ahead bonus; do not bind bonus_fn / query_state_fn")
        super().__init__(config, head, "raw", length_penalty, objective=objective, ranker=ranker,
                         network=network)
        if length_penalty != 0.0:
            raise ValueError("PAG's docids all have M tokens: its scores are raw sums (length_penalty 0)")
        self.mode = mode
        self.planning_size = int(planning_size)
        self.simul_chunk = int(simul_chunk)
        self.planner_postings = int(planner_postings)
        self.planner_query_terms = int(planner_query_terms)
        self._postings = None  # host Postings of the set docids, or None (dense product only)
        self._postings_of = None  # (set ids, keys, planning vocabulary) the postings are built from
        self.query_padding = query_padding
        self._table = None
        self._set_ids = None  # device [rows, m]
        self._keys = None  # device [rows] order keys
        self._paths_for = None  # (index, num_nodes, num_leaves) the paths were computed from
        self._paths = None
        # static facts of the index: bonus_tables' (dense_sizes, leaf_ordered, placed), then planning_trie's leaf levels
        self._tables_layout: tuple = ((), False, (), ())
        self._jits: dict = {}

    # the model contract's Planner (retriever/contract.py): the modes by role
    planned_mode, planning_only_mode, unplanned_mode = "pag", "simul_only", "seq_only"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(planner=True, decoding_bonus=self.mode == "pag",
                            traced_search=self.mode != "simul_only" and self.query_padding == "fixed")

    @contextlib.contextmanager
    def in_mode(self, mode: str):
        """Retrieve in `mode` inside the block (one of MODES), then go back."""
        if mode not in MODES:
            raise ValueError(f"PagRetriever mode must be one of {MODES}, got {mode!r}")
        previous, self.mode = self.mode, mode
        try:
            yield
        finally:
            self.mode = previous

    def aligned_params(self, directory, params, teacher: dict):
        """The parameters with the planner aligned to another language (`methods.pag.align`), checked against
        the teacher checkpoint they were aligned from."""
        from gr_jax.methods.pag.model_aligned import load_aligned

        return load_aligned(directory, params, teacher)

    def describe(self) -> str:
        return (f"PagRetriever(mode={self.mode!r}, planning_size={self.planning_size}, "
                f"query_padding={self.query_padding!r})")

    # -- docids -----------------------------------------------------------------------------------------
    def use_docids(self, table) -> None:
        """The sequential docids (one per document: the primary) and the set docids, by corpus row."""
        space = table.space
        if space.kind != "text" or not space.length or space.size % space.length:
            raise ValueError("PagRetriever: sequential docids must be M × K tokens of the extended vocabulary "
                             "(PagDocids)")
        if space.end > self.config.vocab_size:
            raise ValueError(f"PagRetriever: docid tokens reach id {space.end - 1} but the network's vocabulary "
                             f"has {self.config.vocab_size} rows")
        self.docid_length, self.docid_base, self.codes = space.length, space.offset, space.size // space.length
        self._table = table
        self._paths_for = None
        self._set_ids = self._keys = self._postings = self._postings_of = None  # nothing of a previous table
        set_ids = None if table.extras is None else table.extras.get("set_ids")
        if set_ids is None:
            if self.mode != "seq_only":
                raise ValueError(f"PagRetriever mode {self.mode!r} plans with set docids, but the docid table has "
                                 f"none: use prepare.docid_scheme = @PagDocids() (or mode 'seq_only')")
            return
        rows = int(table.doc_rows.max()) + 1 if len(table.doc_rows) else 0
        first = np.unique(table.doc_rows, return_index=True)[1]
        ids = np.full((rows, set_ids.shape[1]), -1, np.int32)
        keys = np.full(rows, -1, np.int32)  # order keys are ≥ 0 (methods.pag.docids.order_keys)
        ids[table.doc_rows[first]] = set_ids[first]
        keys[table.doc_rows[first]] = table.extras["order_key"][first]
        self._set_ids = jnp.asarray(ids)
        self._keys = jnp.asarray(keys)
        self._postings = None  # built at the first plan (`_planner_arrays`): training never needs it
        self._postings_of = (ids, keys, int(self.docid_base))

    @property
    def set_ids(self):
        if self._set_ids is None:
            raise ValueError("PagRetriever: no set docids yet (use_docids with a PagDocids table)")
        return self._set_ids

    def _doc_paths(self, index):
        """Per corpus row: the node at depth d + 1 of its primary docid (d < M) and its leaf, on the device;
        recomputed when the index changed."""
        stamp = (id(index), index.num_nodes, index.num_leaves)
        if self._paths_for != stamp:
            t = self._table
            first = np.unique(t.doc_rows, return_index=True)[1]
            seqs, lengths, rows = t.sequences[first], t.lengths[first], t.doc_rows[first]
            nodes = index.path_nodes(seqs, lengths)[:, 1:]
            leaf = index.lookup([s[:n].tolist() for s, n in zip(seqs, lengths)])
            if (leaf < 0).any():
                raise ValueError("PagRetriever: a document's docid is not in the index it searches")
            R = int(rows.max()) + 1
            paths = np.full((R, nodes.shape[1]), -1, np.int64)
            paths[rows] = nodes
            leaves = np.full(R, -1, np.int64)
            leaves[rows] = leaf
            depth = index.device().depth
            tokens = np.full((R, depth), -1, np.int32)  # the docids by row (−1 past the end), for `planning_trie`
            width = min(seqs.shape[1], depth)
            tokens[rows, :width] = np.where(np.arange(width)[None] < lengths[:, None], seqs[:, :width], -1)
            with jax.ensure_compile_time_eval():  # concrete even when first asked for inside a caller's trace
                self._paths = (jnp.asarray(paths.astype(np.int32)), jnp.asarray(leaves.astype(np.int32)))
                self._docids = (jnp.asarray(tokens), jnp.asarray(docid_order(tokens)))
            sizes = np.append(paths.max(axis=0), leaves.max()) + 1 if len(paths) else np.zeros(1, np.int64)
            dense = tuple(int(x) if 0 < x <= DENSE_BONUS_NODES else 0 for x in sizes)
            trie = index.device()
            placed = tuple(d < trie.depth and trie.consecutive_children(d) for d in range(paths.shape[1]))
            leaf_levels = tuple(sorted({int(x) - 1 for x in lengths}))  # where a docid ends (`planning_trie`)
            self._tables_layout = (dense, paths_in_leaf_order(paths, leaves), placed, leaf_levels)
            self._paths_for = stamp
        return self._paths

    # -- planner ----------------------------------------------------------------------------------------
    def lexical_rep(self, params, tokens_BxL, dropout_rng=None):
        """The planner's representation [B, V] of queries or documents (compiled once per shape)."""
        if dropout_rng is not None:
            return lexical_rep(self.network, params["network"], tokens_BxL, dropout_rng)
        fn = self._jits.setdefault("rep", jax.jit(lambda p, t: lexical_rep(self.network, p["network"], t,
                                                                             pooled=True)))
        return fn(params, jnp.asarray(tokens_BxL))

    def query_rep(self, rep_BxV):
        """The query weights the planner reads: all of rep, or with `planner_query_terms` T those ≥ the T-th largest
        of the planning vocabulary (below the docid tokens; ties at the T-th all kept: no position decides)."""
        T = self.planner_query_terms
        limit = int(getattr(self, "docid_base", rep_BxV.shape[1]))  # the planning vocabulary: below the docid tokens
        if not T or T >= limit:
            return rep_BxV
        kth = _top_k(rep_BxV[:, :limit], T)[0][:, T - 1:]  # behind the barrier: a full sort otherwise
        return jnp.where(rep_BxV >= kth, rep_BxV, 0.0)

    def _planning_vocab(self) -> int:
        """The planning vocabulary: the ids below the docid tokens (set docids and query terms live there)."""
        return int(self.docid_base)

    def _planner_settings(self) -> tuple:
        """What a compiled planner reads from the model besides its arguments (part of its cache key)."""
        return self.planner_query_terms, self.planner_postings, self.simul_chunk, self._planning_vocab()

    def _planner_arrays(self):
        """(set ids, keys, postings on the device or None): the arrays a planning call reads. The inverted index is
        built from the set docids at the first call after `use_docids` (none when `planner_postings` is 0 or the
        planning set is the whole corpus)."""
        ids, keys, vocab = self._postings_of if self._postings_of is not None else (None, None, 0)
        if self._postings is None and self.planner_postings and ids is not None and len(ids) > self.planning_size:
            self._postings = Postings(ids, vocab, keys)
        return self.set_ids, self._keys, None if self._postings is None else self._postings.device()

    def _plan_rep(self, rep, arrays, n: int, exact: bool):
        set_ids, keys, postings = arrays
        budgets = None if postings is None else budgets_for(self.planner_postings, int(postings[1].shape[0]) - 1)
        return plan_from_rep(self.query_rep(rep), set_ids, keys, n, self.simul_chunk, postings, budgets, exact)

    def plan(self, params, query_tokens_BxL, n: Optional[int] = None):
        """The planning set: (corpus rows [B, n], s_simul [B, n]), ties at the n-th place by document key
        (`methods.pag.planner.plan_from_rep`)."""
        n = min(int(n or self.planning_size), int(self.set_ids.shape[0]))
        fn = self._jits.setdefault(("plan", *self._planner_settings()), jax.jit(
            lambda p, q, arrays, n: self._plan_rep(lexical_rep(
                self.network, p["network"], q, pooled=True, vocab_limit=self._planning_vocab()), arrays, n, True)[:2],
            static_argnums=3))
        return fn(params, jnp.asarray(query_tokens_BxL), self._planner_arrays(), n)

    # -- search -----------------------------------------------------------------------------------------
    def _queries(self, query_tokens_BxL):
        """The batch as the model reads it (`query_padding`)."""
        q = np.asarray(query_tokens_BxL)
        if self.query_padding == "batch_longest":
            used = np.nonzero((q != self.config.pad_token_id).any(axis=0))[0]
            q = q[:, : (int(used[-1]) + 1 if len(used) else 1)]
        return jnp.asarray(q)

    def _cache(self, params, query_tokens, max_length: int):
        return pag_cache(self.network, params["network"], query_tokens, max_length)

    def _step(self, params, cache, tokens):
        return pag_step(self.network, params["network"], cache, tokens)

    def _step_hidden(self, params, cache, tokens):
        return pag_step_hidden(self.network, params["network"], cache, tokens)

    def _project(self, params, hidden, tokens=None):
        return pag_project(self.network, params["network"], hidden, tokens)

    def searcher(self, num_beams: int, guided: Optional[bool] = None) -> Searcher:
        """mode "seq_only": plain raw-score search; otherwise the planning-set search, selected with the bonus
        (`guided`, default: mode "pag") or without."""
        guided = (self.mode == "pag") if guided is None else guided
        plan = self.mode != "seq_only"
        key = (num_beams, plan, guided)
        if key not in self._searchers:
            bonus = (node_bonus if guided else pruning_only) if plan else None
            self._searchers[key] = Searcher(
                self._step_hidden, self._cache, start_token=self.config.decoder_start_token_id,
                eos_id=self.config.eos_token_id, vocab_size=self.config.vocab_size, num_beams=num_beams,
                score_mode="raw", bonus_fn=bonus, tile_fn=share_encoder, accumulate_bonus=False,
                project_fn=self._project)
        return self._searchers[key]

    def query_state(self, params, query_tokens_BxL, index, n: Optional[int] = None):
        rows, s = self.plan(params, query_tokens_BxL, n)
        paths, leaves = self._doc_paths(index)
        fn = self._jits.setdefault("tables", jax.jit(bonus_tables, static_argnums=(4, 5, 6)))
        return fn(paths, leaves, rows, s, *self._tables_layout[:3])

    def predict(self, params, query_tokens_BxL, index, num_beams: int = 10, guided: Optional[bool] = None):
        if self.mode == "simul_only":
            raise ValueError("PagRetriever mode 'simul_only' ranks by s_simul and decodes nothing")
        return self.beams_and_state(params, query_tokens_BxL, index, num_beams, guided)[0]

    def _planned_search(self, params, q, arrays, docids, leaves, trie, n: int, num_beams: int, guided: bool,
                        layout: tuple, exact: bool = False):
        """Planner and guided search under one jit, the query read once (`pag_prefill`): → (BeamResult, state,
        whether a tie crossed the n-th planning place). With `exact`, a tie at the n-th place is planned exactly
        here (`top_n_exact`, chosen on the device), for a caller that cannot come back to the host
        (`beam_documents`); without, the caller redoes such a batch (`beams_and_state`)."""
        net = params["network"]
        cache, hidden, mask = pag_prefill(self.network, net, q, trie.depth)
        rep = lexical_rep_from_hidden(self.network, net, hidden, mask, pooled=True, vocab_limit=self._planning_vocab())
        rows, scores, tie = self._plan_rep(rep, arrays, n, exact)
        res, state = self._search_plan(net, cache, q.shape[0], rows, scores, docids, leaves, trie.vocab_size,
                                       num_beams, guided, layout)
        return res, state, tie

    def _search_plan(self, net, cache, B: int, rows, scores, docids, leaves, vocab_size: int, num_beams: int,
                     guided: bool, layout: tuple):
        """The search over the planning sets' trie (`methods.pag.planned`) from a prefilled cache → (BeamResult,
        the final scores' state: the planning set and, per place of the trie, the max s_simul of its docid)."""
        leaf_levels = layout[3]
        plan = planning_trie(*docids, leaves, rows, scores, vocab_size=vocab_size, guided=guided,
                             leaf_levels=leaf_levels)
        res = bs.beam_search_flat(functools.partial(pag_step_hidden, self.network, net), cache, plan,
                                  batch_size=B, num_beams=num_beams, score_mode="raw",
                                  start_token=self.config.decoder_start_token_id, tile_fn=share_encoder,
                                  accumulate_bonus=False, project_fn=functools.partial(pag_project, self.network, net))
        return res, {"planned": rows, "planned_scores": scores, "docid_max": plan.docid_max()}

    def _swapped_search(self, params, q, rows, scores, docids, leaves, trie, num_beams: int, layout: tuple):
        """The guided search of queries q under given planning sets (`rank_with_plan`)."""
        net = params["network"]
        cache = pag_cache(self.network, net, q, trie.depth)
        return self._search_plan(net, cache, q.shape[0], rows, scores, docids, leaves, trie.vocab_size, num_beams,
                                 True, layout)

    def beams_and_state(self, params, query_tokens_BxL, index, num_beams: int, guided: Optional[bool] = None):
        """(BeamResult, look-ahead state or None in mode "seq_only")."""
        q = self._queries(query_tokens_BxL)
        if self.mode == "seq_only":
            return self.searcher(num_beams).search(params, q, index.device()), None
        guided = (self.mode == "pag") if guided is None else guided
        n = min(self.planning_size, int(self.set_ids.shape[0]))
        leaves = self._doc_paths(index)[1]
        fused = self._jits.setdefault(("search", *self._planner_settings()),
                                      jax.jit(self._planned_search, static_argnums=(6, 7, 8, 9, 10)))
        args = (params, q, self._planner_arrays(), self._docids, leaves, index.device(), n, num_beams, guided,
                self._tables_layout)
        res, state, tie = fused(*args, False)
        if bool(tie):  # the planning set needs the tie rule: plan it exactly (on the device), search with that plan
            res, state, _ = fused(*args, True)
        return res, state

    def beam_documents(self, params, query_tokens_BxL, index, num_beams: int = 10):
        """`rank`'s beams and final scores as one traceable function (capability `traced_search`): a tie at the
        planning boundary is planned exactly on the device (`_planned_search` with `exact`). Fixed query padding
        only: "batch_longest" trims the batch to its data, a shape a trace cannot take."""
        if self.mode == "simul_only":
            raise ValueError("PagRetriever mode 'simul_only' ranks by s_simul alone: use rank")
        if self.query_padding != "fixed":
            raise ValueError(f"PagRetriever.query_padding = {self.query_padding!r} gives each batch the length of "
                             f"its longest query, which a traced search cannot; set 'fixed' (TASK_FEATURE_LENGTHS)")
        q = query_tokens_BxL
        if self.mode == "seq_only":
            res, state = self.searcher(num_beams).search_traced(params, q, index.device()), None
        else:
            leaves = self._doc_paths(index)[1]
            n = min(self.planning_size, int(self.set_ids.shape[0]))
            res, state, _ = self._planned_search(params, q, self._planner_arrays(), self._docids, leaves,
                                                 index.device(), n, num_beams, self.mode == "pag",
                                                 self._tables_layout, exact=True)
        final = self.final_scores(res, state)
        docs, valid = leaf_documents(index.device_payload(), jnp.where(res.valid, res.leaf_ids, -1))
        return docs, valid, final

    def final_scores(self, res, state):
        """PAG's final score of each returned docid: raw sum + max s_simul of the planned documents with it."""
        if state is None:
            return res.scores
        if "docid_max" in state:  # a search over the planning sets' trie: a finished beam's state is its place
            return _final_at_places(res.scores, res.valid, res.states, state["docid_max"])
        return jnp.where(res.valid, res.scores + leaf_bonus(jnp.where(res.valid, res.leaf_ids, -1), state), -jnp.inf)

    def rank(self, params, query_tokens_BxL, index, num_beams: int = 10):
        if self.mode == "simul_only":
            rows, s = jax.device_get(self.plan(params, query_tokens_BxL))
            B, n = rows.shape
            return np.repeat(np.arange(B), n), rows.reshape(-1).astype(np.int64), s.reshape(-1).astype(np.float64)
        res, state = self.beams_and_state(params, query_tokens_BxL, index, num_beams)
        final = self.final_scores(res, state)
        docs, valid = leaf_documents(index.device_payload(), jnp.where(res.valid, res.leaf_ids, -1))
        docs, valid, final = jax.device_get((docs, valid, final))
        return self.ranker(docs, valid, final)

    # -- diagnostics (the robustness protocol's plan probes) ------------------------------------------------
    def planner_tokens(self, params, query_tokens_BxL, ell: int) -> list[list[int]]:
        """P_ℓ(q) of 004 Eq. 8: per query, its top-ℓ planning-vocabulary ids (below the docid tokens) by the
        planner's weight rep_q[v], heaviest first, ties by smaller id; only ids with positive weight (a query
        that fires fewer than ℓ tokens has a smaller set, so unrelated zero-weight ids never count as shared)."""
        rep = self.lexical_rep(params, self._queries(query_tokens_BxL))
        limit = getattr(self, "docid_base", rep.shape[1])
        fn = self._jits.setdefault(("tokens", ell, limit), jax.jit(lambda r: jax.lax.top_k(r[:, :limit], ell)))
        vals, ids = jax.device_get(fn(rep))
        return [[int(i) for i, v in zip(ri, rv) if v > 0] for ri, rv in zip(ids, vals)]

    def rank_with_plan(self, params, query_tokens_BxL, plan_tokens_BxL, index, num_beams: int = 10):
        """Guided search of each query under the plan of another query (row by row): the counterfactual plan
        swap of 004 Eq. 10 (PlanSwapDrop decodes q̃ with the clean query's plan). The final scores add the
        look-ahead of that plan, as `rank` adds the query's own."""
        q, pq = self._queries(query_tokens_BxL), self._queries(plan_tokens_BxL)
        rows, s = self.plan(params, pq)
        leaves = self._doc_paths(index)[1]
        fn = self._jits.setdefault("swap", jax.jit(self._swapped_search, static_argnums=(7, 8)))
        res, state = fn(params, q, rows, s, self._docids, leaves, index.device(), num_beams, self._tables_layout)
        final = self.final_scores(res, state)
        docs, valid = leaf_documents(index.device_payload(), jnp.where(res.valid, res.leaf_ids, -1))
        docs, valid, final = jax.device_get((docs, valid, final))
        return self.ranker(docs, valid, final)

    # -- training ---------------------------------------------------------------------------------------
    def token_log_probs(self, params, inputs_BxL, targets_BxT, dropout_rng=None):
        """log-softmax of the raw step logits at the docid tokens (decoder input [query, start, prefix]) —
        `score` and the default cross-entropy read it; PAG's own objectives are in `methods.pag.training`."""
        prefix = targets_BxT[:, :-1]
        hidden, _ = sequential_hidden(self.network, params["network"], inputs_BxL, prefix, dropout_rng)
        L = inputs_BxL.shape[1]
        logits = raw_logits(self.network, params["network"], hidden[:, L:])
        logp = jax.nn.log_softmax(logits, axis=-1)
        t = targets_BxT.astype(jnp.int32)
        return jnp.take_along_axis(logp, t[..., None], axis=-1)[..., 0], jnp.argmax(logits, axis=-1) == t

    @functools.partial(jax.jit, static_argnums=0)
    def raw_docid_scores(self, params, query_BxL, docids_BxM):
        """Σ of raw step logits along each row's docid (teacher forcing): PAG's sequential score."""
        hidden, _ = sequential_hidden(self.network, params["network"], query_BxL, docids_BxM[:, :-1])
        L = query_BxL.shape[1]
        logits = raw_logits(self.network, params["network"], hidden[:, L:])
        return jnp.take_along_axis(logits, docids_BxM[..., None].astype(jnp.int32), axis=-1)[..., 0].sum(-1)


@functools.partial(jax.jit, static_argnums=0)
def step_logits_along(network: t5.T5, net_params, query_1xL, prefixes_PxT, lengths_P) -> jax.Array:
    """Raw step logits [P, V] after each prefix (its first lengths[p] tokens) for one query, through the cached
    decoder (what the search computes)."""
    P, T = prefixes_PxT.shape
    q = jnp.repeat(query_1xL, P, axis=0)
    cache = pag_cache(network, net_params, q, T + 1)
    logits, cache = pag_step(network, net_params, cache, jnp.full((P,), network.config.decoder_start_token_id,
                                                                  jnp.int32))
    out = logits
    for t in range(T):
        logits, cache = pag_step(network, net_params, cache, jnp.maximum(prefixes_PxT[:, t], 0).astype(jnp.int32))
        out = jnp.where((lengths_P == t + 1)[:, None], logits, out)
    return out

