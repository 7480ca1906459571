"""GLEN's model (paper 002, §3.2–3.4): a T5 whose decoder is fed its own previous hidden state.

Step 0's decoder input is the embedding row of the start id (0); step t > 0's input is the decoder's output at
step t − 1 (the final-layer-norm output, unscaled, no projection); logits are the network's usual output
projection of that hidden state (for a tied T5 v1.0: `h · d_model^-0.5 @ Eᵀ`). The chosen token is never fed
back, so a query (or document) has ONE table of step logits [M, V] that every beam reads: decoding is a
constrained top-K over a fixed table. Special ids (`masked_ids`: UNK and the sentinels in GLEN's code) are
−inf before the argmax and the log-softmax; PAD and EOS are not masked.

* `step_table(...)` → raw logits [B, M, V] and hidden states [B, M, D] of M steps.
* `decode_docids(...)` → each document's docid (greedy argmax of the masked logits) and the raw logit of each
  chosen token (GLEN's makeid; the docid's token weights).
* `GlenRetriever` — the model object (`prepare.model_fn = @GlenRetriever`): constrained search with
  K = `beam_factor` · N beams, of which the first N are ranked; the ranker receives the query's raw logits at
  each beam's tokens and the docid table's token weights (`methods.glen.ranker.CollisionFree`: paper Eq. 9).
  `feed="tokens"` is the paper's ablation (token embeddings fed back: a plain seq2seq decoder).

Dimension letters as in docs/conventions.md: B batch, N beams, M docid length, V vocabulary, D d_model, R = B·N rows.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.api import (
    beam_search as bs,
    Capabilities,
    Count,
    GenerativeRetriever,
    initial,
    leaf_documents,
    map_padded,
    Searcher,
    Signed,
    t5,
    t5_convert,
)
from gr_jax.methods.glen.ranker import CollisionFree

FEEDS = ("hidden", "tokens")
PHASE1_KEY = "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"


def load_glen_hf(hf_dir) -> tuple[t5.T5Config, dict]:
    """GLEN's released (phase-2) model — a plain HF T5 directory — → (our config, network params). A phase-1
    checkpoint (GLEN's phase-1 T5 adds a relative position bias to decoder block 0's cross-attention) is an
    error: its decoder differs from the phase-2 model this library implements."""
    if PHASE1_KEY in t5_convert.hf_tensor_names(hf_dir):
        raise t5_convert.CheckpointError(
            f"{hf_dir}: a GLEN phase-1 checkpoint ({PHASE1_KEY} is a cross-attention relative position bias "
            f"that only GLEN's phase-1 model has); load the phase-2 (final) model, or train phase 1 here")
    return t5_convert.load_hf(hf_dir)


def _is_phase1_checkpoint(path: str) -> bool:
    return t5_convert.is_hf_dir(path) and PHASE1_KEY in t5_convert.hf_tensor_names(path)


# INITIAL_CHECKPOINT_PATH = a GLEN phase-1 HF checkpoint is refused with the reason (above plain HF T5 loading)
initial.register(initial.InitialLoader("GLEN phase-1 checkpoint (refused)", _is_phase1_checkpoint, load_glen_hf,
                                       priority=15))


@gin.configurable
def masked_special_ids(unk_id: int = 2, first_sentinel: int = 32000, sentinels: int = 100) -> tuple[int, ...]:
    """The ids GLEN never generates with a T5 tokenizer: UNK and the sentinels `<extra_id_*>` (the tokenizer's
    special ids other than PAD/EOS); for t5-base: 2 and 32000…32099 (`GlenRetriever.masked_ids =
    @masked_special_ids()`). The embedding's padding rows 32100…32127 are not masked, as in GLEN's code."""
    return (int(unk_id),) + tuple(range(int(first_sentinel), int(first_sentinel) + int(sentinels)))


def mask_logits(logits_xV, masked_ids: Sequence[int]):
    """−inf at the masked ids (UNK, sentinels): they can be neither chosen nor part of the normaliser."""
    if not len(masked_ids):
        return logits_xV
    return logits_xV.at[..., jnp.asarray(np.asarray(masked_ids, np.int32))].set(-jnp.inf)


def step_table(network: t5.T5, net_params, input_tokens_BxL, length: int, start_token: int = 0):
    """GLEN's M decoder steps with hidden-state feedback → (raw logits [B, M, V] float32, hidden [B, M, D])."""
    variables = {"params": net_params}
    mask = input_tokens_BxL != network.config.pad_token_id
    encoded = network.apply(variables, input_tokens_BxL, mask, method="encode")
    cache = network.apply(variables, encoded, mask, length, method="init_cache")
    B = input_tokens_BxL.shape[0]
    x = network.apply(variables, jnp.full((B,), start_token, jnp.int32), method="embed")
    hidden = []
    for _ in range(length):  # M is small (3 for NQ320k, 7 for MS MARCO): unrolled
        h, cache = network.apply(variables, cache, x, method="decode_step_embedded")
        hidden.append(h)
        x = h
    hidden_BxMxD = jnp.stack(hidden, axis=1)
    return network.apply(variables, hidden_BxMxD, method="logits"), hidden_BxMxD


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _greedy(network, net_params, tokens, length, masked):
    logits, _ = step_table(network, net_params, tokens, length)
    ids = jnp.argmax(mask_logits(logits, masked), axis=-1)
    return ids, jnp.take_along_axis(logits, ids[..., None], axis=-1)[..., 0]


def decode_docids(network: t5.T5, net_params, doc_tokens: np.ndarray, length: int, masked_ids: Sequence[int],
                  batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Every document's docid by greedy decoding (argmax of the masked step logits) and the raw logit of each
    chosen token: (tokens [num_docs, M] int32, logits [num_docs, M] float32). Batches are padded to one shape
    (one compile); padding rows are dropped."""
    masked = tuple(int(i) for i in masked_ids)
    doc_tokens = np.asarray(doc_tokens, np.int32)
    if not len(doc_tokens):
        return np.zeros((0, length), np.int32), np.zeros((0, length), np.float32)
    ids, logits = map_padded(lambda part: _greedy(network, net_params, part, length, masked), [doc_tokens],
                             batch_size)
    return ids.astype(np.int32), logits.astype(np.float32)


def _table_cache(logits_BxMxV, masked_ids):
    """The search's cache: the masked step log-probabilities of each query, computed once per query (every
    beam reads the same rows, so the search sums them as they are: score mode "raw")."""
    logp = jax.nn.log_softmax(mask_logits(logits_BxMxV, masked_ids), axis=-1)
    return {"table": logp, "t": jnp.zeros((), jnp.int32)}


def _table_step(cache, tokens_R):
    """One level of the search: every beam of a query reads the query's row of the table at level t."""
    table = cache["table"]
    rows_per_query = tokens_R.shape[0] // table.shape[0]
    logits = table[jnp.arange(tokens_R.shape[0]) // rows_per_query, cache["t"]]
    return logits, {"table": table, "t": cache["t"] + 1}


def _keep_per_query(cache, n):
    return cache  # the table stays one row per query; `_table_step` maps beams to their query


@gin.configurable
class GlenRetriever(GenerativeRetriever):
    """GLEN as a model object. `docid_length` M must equal the docid table's fixed length; `masked_ids` are
    the ids never generated (default: UNK = 2; GLEN's code masks UNK and the sentinel ids of its tokenizer)."""

    def __init__(self, config: t5.T5Config, head=None, score_mode: str = "log_softmax",
                 length_penalty: Signed = 0.0, *, docid_length: Count = 3, masked_ids: Sequence[int] = (2,),
                 beam_factor: Count = 2, feed: str = "hidden", ranker: Optional[Callable] = None, **kwargs):
        if feed not in FEEDS:
            raise ValueError(f"GlenRetriever.feed must be one of {FEEDS}, got {feed!r}")
        if score_mode != "log_softmax":
            raise ValueError("GlenRetriever scores docids by the log-softmax of the step logits (paper §3.4); "
                             f"score_mode {score_mode!r} is not GLEN")
        super().__init__(config, head, score_mode, length_penalty,
                         ranker=ranker if ranker is not None else CollisionFree(), **kwargs)
        self.docid_length = int(docid_length)
        self.masked_ids = tuple(int(i) for i in masked_ids)
        self.beam_factor = int(beam_factor)
        self.feed = feed
        self._doc_weights = None
        self._search_jit = None

    @property
    def capabilities(self) -> Capabilities:
        """Decodes every document's docid itself (hidden-state feedback); the collision-free ranker reads the
        docids' token weights."""
        return Capabilities(decodes_docids=self.feed == "hidden", docid_weights=True,
                            decoding_bonus=self.bonus_fn is not None)

    # -- docids -----------------------------------------------------------------------------------------
    def use_docids(self, table) -> None:
        """Keeps the docid table's token weights by corpus row (what the collision-free ranker compares)."""
        if table.space.length != self.docid_length:
            raise ValueError(f"GLEN docids of {table.space.length or 'variable'} tokens, but "
                             f"GlenRetriever.docid_length = {self.docid_length}; set it to the docids' length")
        if table.weights is None:
            self._doc_weights = None
            return
        weights = np.zeros((int(table.doc_rows.max()) + 1, self.docid_length), np.float32)
        weights[table.doc_rows] = table.weights[:, : self.docid_length]
        self._doc_weights = weights

    @property
    def doc_weights(self) -> Optional[np.ndarray]:
        """The docids' token weights by corpus row [rows, M] (None: the docid table has none)."""
        return self._doc_weights

    def step_table(self, params, tokens_BxL):
        """(raw logits [B, M, V], hidden [B, M, D]) of the query or document tokens."""
        return step_table(self.network, params["network"], tokens_BxL, self.docid_length,
                          self.config.decoder_start_token_id)

    def _hidden_only(self, what: str) -> None:
        if self.feed != "hidden":
            raise ValueError(f"{what} is written for GLEN's hidden-state feedback; GlenRetriever.feed = "
                             f"{self.feed!r} (the token-fed ablation) trains with phase 1's L_key and keyword "
                             f"docids only")

    def decode_docids(self, params, doc_tokens, batch_size: int = 64):
        self._hidden_only("decoding docids from documents (GlenDocids)")
        return decode_docids(self.network, params["network"], doc_tokens, self.docid_length, self.masked_ids,
                             batch_size)

    # -- training ---------------------------------------------------------------------------------------
    def hidden_fed(self, params, inputs_BxL, dropout_rng=None):
        """`step_table` for training: the M steps recomputed over the growing input [E(start), h_0, …] (no
        cache, so dropout applies); without `dropout_rng` it equals `step_table`. → (logits, hidden)."""
        self._hidden_only("phase 2's objective (glen_objective)")
        deterministic = dropout_rng is None
        rngs = {} if deterministic else {"dropout": dropout_rng}
        variables = {"params": params["network"]}
        mask = inputs_BxL != self.config.pad_token_id
        encoded = self.network.apply(variables, inputs_BxL, mask, deterministic, method="encode", rngs=rngs)
        start = jnp.full((inputs_BxL.shape[0], 1), self.config.decoder_start_token_id, jnp.int32)
        x = self.network.apply(variables, start, method="embed")
        for _ in range(self.docid_length):
            h = self.network.apply(variables, encoded, mask, x, deterministic, method="decode_hidden_embedded",
                                   rngs=rngs)
            x = jnp.concatenate([x, h[:, -1:].astype(x.dtype)], axis=1)
        hidden = x[:, 1:]
        return self.network.apply(variables, hidden, method="logits"), hidden

    def token_log_probs(self, params, inputs_BxL, targets_BxT, dropout_rng=None):
        """log P(target token) [B, T] under the masked step distributions (targets past M get 0), and the
        argmax hits — what `docid_cross_entropy` (GLEN's L_key, Eq. 4) reads."""
        if self.feed == "tokens":
            return super().token_log_probs(params, inputs_BxL, targets_BxT, dropout_rng)
        M, T = self.docid_length, targets_BxT.shape[1]
        if T < M:
            raise ValueError(f"targets of {T} tokens, shorter than GLEN's docid length {M}")
        logits, _ = self.hidden_fed(params, inputs_BxL, dropout_rng)
        masked = mask_logits(logits, self.masked_ids)
        first = targets_BxT[:, :M].astype(jnp.int32)
        logp = jnp.take_along_axis(jax.nn.log_softmax(masked, axis=-1), first[..., None], axis=-1)[..., 0]
        hit = jnp.argmax(masked, axis=-1) == first
        pad = ((0, 0), (0, T - M))
        return jnp.pad(logp, pad), jnp.pad(hit, pad)

    # -- search -----------------------------------------------------------------------------------------
    def _cache(self, params, query_tokens, max_length: int):
        if self.feed == "tokens":
            return super()._cache(params, query_tokens, max_length)
        logits, _ = self.step_table(params, query_tokens)
        return _table_cache(logits, self.masked_ids)

    def searcher(self, num_beams: int) -> Searcher:
        if self.feed == "tokens":
            return super().searcher(num_beams)
        if num_beams not in self._searchers:
            self._searchers[num_beams] = Searcher(
                lambda params, cache, tokens: _table_step(cache, tokens), self._cache,
                start_token=self.config.decoder_start_token_id, eos_id=self.config.eos_token_id,
                vocab_size=self.config.vocab_size, num_beams=num_beams, score_mode="raw",
                length_penalty=self.length_penalty, bonus_fn=self.bonus_fn, tile_fn=_keep_per_query)
        return self._searchers[num_beams]

    def _search_impl(self, params, query_tokens, trie, query_state, num_beams: int):
        logits, _ = self.step_table(params, query_tokens)
        res = bs.beam_search(_table_step, _table_cache(logits, self.masked_ids), trie,
                             batch_size=query_tokens.shape[0], num_beams=self.beam_factor * num_beams,
                             score_mode="raw", length_penalty=self.length_penalty,
                             bonus_fn=self.bonus_fn, query_state=query_state,
                             start_token=self.config.decoder_start_token_id, tile_fn=_keep_per_query)
        res = jax.tree_util.tree_map(lambda x: x[:, :num_beams], res)  # GLEN ranks the first N of K beams
        tokens = jnp.clip(res.tokens[:, :, : self.docid_length], 0, None)
        w_q = jnp.take_along_axis(logits[:, None], tokens[..., None], axis=-1)[..., 0]  # [B, N, M]
        return res, w_q

    def beams(self, params, query_tokens_BxL, index, num_beams: int):
        """GLEN's constrained top-K with K = beam_factor · N; the first N beams (BeamResult [B, N]) and the
        query's raw logits at each beam's tokens [B, N, M] (w^q of paper Eq. 9)."""
        if self.feed == "tokens":
            raise ValueError("GlenRetriever.beams: feed='tokens' decodes like a plain seq2seq model (predict)")
        if self._search_jit is None:
            self._search_jit = jax.jit(self._search_impl, static_argnums=(4,))
        state = None if self.query_state_fn is None else self.query_state_fn(self, params, query_tokens_BxL)
        return self._search_jit(params, jnp.asarray(query_tokens_BxL), index.device(), state, num_beams)

    def rank(self, params, query_tokens_BxL, index, num_beams: int = 10):
        if self.feed == "tokens":
            return super().rank(params, query_tokens_BxL, index, num_beams)
        res, w_q = self.beams(params, query_tokens_BxL, index, num_beams)
        docs, valid = leaf_documents(index.device_payload(), jnp.where(res.valid, res.leaf_ids, -1))
        docs, valid, scores, w_q = jax.device_get((docs, valid, res.scores, w_q))
        if getattr(self.ranker, "uses_token_weights", False):  # declared by the ranker (methods/glen/ranker.py)
            return self.ranker(docs, valid, scores, beam_weights=w_q, doc_weights=self._doc_weights)
        return self.ranker(docs, valid, scores)
