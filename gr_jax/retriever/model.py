"""`GenerativeRetriever`: the model object of the library — a Flax network (T5 or BART, `backbones/seq2seq`) plus a docid head, with
`loss_fn` (the objective), `predict` (constrained beam search over a `TrieIndex`), `predict_documents`
(beams → documents by the ranker) and `score` (log-likelihood of given docids).

Injectable pieces (gin binds them; a method is a combination of these, not a new model class):
  objective(model, params, batch, rng) -> (loss, {name: (sum, count)})   default: docid token cross-entropy
  ranker(docs_BxNxP, valid_BxNxP, beam_scores_BxN) -> (query, document row, score) arrays   default: first
                                                                          occurrence (decoding/rankers.py)
  bonus_fn(level, child_node_ids, query_state) -> bonus                  added to the pruning score only
  query_state_fn(model, params, query_tokens) -> query_state             per-query data the bonus reads

`scan_levels` (default True; gin `GenerativeRetriever.scan_levels`): the search runs the trie's runs of similar
levels as one compiled `lax.scan` body each (`decoding.beam_search`): a new trie shape compiles in about a third
of the time, and a search runs 1.05–1.25× longer on this CPU (bench_compile's "levels", bench_decoding's (a)); False
unrolls every level (a long evaluation on one trie, where the compile is paid once).

The network is a plain Flax module (built by the caller, or from `config`); the retriever owns no state.
Parameters are the tree `{"network": network params, "head": head params}` (the text head's is empty).
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, Optional

import gin
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from gr_jax.decoding import rankers
from gr_jax.decoding.beam_search import BeamResult
from gr_jax.index.device import leaf_documents
from gr_jax.index.trie import TrieIndex
from gr_jax.retriever.search import Searcher, share_encoder, t5_cache
from gr_jax.backbones import seq2seq, t5
from gr_jax.retriever.contract import Capabilities
from gr_jax.retriever.heads import TextHead
from gr_jax.runtime.validation import Count, Signed

log = logging.getLogger(__name__)


@gin.configurable
class GenerativeRetriever:
    def __init__(self, config: seq2seq.Config, head=None, score_mode: str = "log_softmax",
                 length_penalty: Signed = 0.0, *, network=None, objective: Optional[Callable] = None,
                 ranker: Optional[Callable] = None, bonus_fn: Optional[Callable] = None,
                 query_state_fn: Optional[Callable] = None, scan_levels: bool = True, index_shards: Count = 1):
        if not seq2seq.is_config(config) and network is None:
            raise ValueError(f"{type(self).__name__} builds a T5 or a BART from its config, got a "
                             f"{type(config).__name__}; for a decoder-only LM set prepare.model_fn = "
                             f"@DecoderOnlyRetriever (e.g. experiments/demo/dsi_url_smollm2.gin)")
        self.config = config
        self.network = network if network is not None else seq2seq.network(config)
        self.head = head if head is not None else TextHead()
        self.score_mode = score_mode
        self.length_penalty = length_penalty
        self.objective = objective
        self.ranker = ranker if ranker is not None else rankers.FirstOccurrence()
        self.bonus_fn = bonus_fn
        self.query_state_fn = query_state_fn
        self.scan_levels = scan_levels  # the trie's runs of levels in one compiled body (Searcher's scan_levels)
        self.index_shards = index_shards  # the trie split over this many local devices (Searcher's index_shards)
        self._searchers: dict[int, Searcher] = {}

    @property
    def capabilities(self) -> Capabilities:
        """What this model can do beyond the contract's core (retriever/contract.py)."""
        return Capabilities(decoding_bonus=self.bonus_fn is not None, traced_search=True)

    def describe(self) -> str:
        """What retrieves (written next to a run: several settings of one checkpoint stay apart)."""
        return f"{type(self).__name__}(score_mode={self.score_mode!r})"

    def decode_docids(self, params, doc_tokens):
        raise ValueError(f"{type(self).__name__} does not decode docids from documents (its capabilities do not "
                         f"declare decodes_docids); use a docid scheme that assigns them")

    def param_axes(self, params) -> dict:
        """Logical sharding axes of the parameter tree (training/partitioning maps them to the mesh)."""
        head = jax.tree_util.tree_map(lambda x: P("vocab", "embed") if x.ndim == 2 else P(), params["head"])
        return {"network": seq2seq.param_axes(self.config), "head": head}

    def use_docids(self, table) -> None:
        """The composition hands over the docid table the index holds (again whenever documents are added). A
        model whose ranker reads the docids' token weights keeps them (`methods.glen.model`); default: nothing."""

    # -- parameters ---------------------------------------------------------------------------------------
    def init_params(self, seed: int = 0) -> dict:
        net_key, head_key = jax.random.split(jax.random.PRNGKey(seed))
        return {"network": seq2seq.init_params(self.config, seed=seed),
                "head": self.head.init_params(self.config, head_key)}

    # -- training -----------------------------------------------------------------------------------------
    def _hidden(self, params, inputs_BxL, decoder_inputs_BxT, dropout_rng=None, decoder_mask_BxT=None):
        """Decoder states of teacher forcing; `decoder_mask_BxT` (T5): decoder keys hidden besides the causal rule
        (a method that trains as HF's `decoder_attention_mask` does, e.g. NCI's padded targets)."""
        deterministic = dropout_rng is None
        rngs = {} if deterministic else {"dropout": dropout_rng}
        mask = inputs_BxL != self.config.pad_token_id
        variables = {"params": params["network"]}
        encoded = self.network.apply(variables, inputs_BxL, mask, deterministic, method="encode", rngs=rngs)
        x = self.head.embed(self.network, params, decoder_inputs_BxT)
        extra = {} if decoder_mask_BxT is None else {"decoder_mask": decoder_mask_BxT}
        return self.network.apply(variables, encoded, mask, x, deterministic,
                                  method="decode_hidden_embedded", rngs=rngs, **extra)

    def token_log_probs(self, params, inputs_BxL, targets_BxT, dropout_rng=None):
        """log p(target token) per position [B, T], and the argmax hit per position."""
        decoder_inputs = t5.shift_right(targets_BxT, self.config.decoder_start_token_id)
        hidden = self._hidden(params, inputs_BxL, decoder_inputs, dropout_rng)
        logits = self.head.logits(self.network, params, hidden)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        target_logp = jnp.take_along_axis(logp, targets_BxT[..., None].astype(jnp.int32), axis=-1)[..., 0]
        return target_logp, jnp.argmax(logits, axis=-1) == targets_BxT

    def loss_fn(self, params, batch, dropout_rng=None):
        """(loss, {name: (sum, count)}) of the injected objective, or of `docid_cross_entropy`."""
        if self.objective is not None:
            return self.objective(self, params, batch, dropout_rng)
        return self.docid_cross_entropy(params, batch, dropout_rng)

    def docid_cross_entropy(self, params, batch, dropout_rng=None):
        """Mean token cross-entropy over docid positions (optional per-row `weights`); metrics as (sum, count)
        pairs: loss (per token), token_accuracy, docid_accuracy (every docid token right)."""
        targets = batch["targets"]
        logp, hit = self.token_log_probs(params, batch["inputs"], targets, dropout_rng)
        mask = self.head.target_mask(targets).astype(jnp.float32)
        weights = batch.get("weights")
        row_w = jnp.ones(targets.shape[0], jnp.float32) if weights is None else weights.astype(jnp.float32)
        mask = mask * row_w[:, None]
        loss_sum = -(logp * mask).sum()
        tokens = mask.sum()
        seq_ok = (hit | (mask == 0)).all(axis=-1)
        metrics = {"loss": (loss_sum, tokens), "token_accuracy": ((hit * mask).sum(), tokens),
                   "docid_accuracy": ((seq_ok * row_w).sum(), row_w.sum())}
        return loss_sum / jnp.maximum(tokens, 1.0), metrics

    # -- inference ----------------------------------------------------------------------------------------
    def _step(self, params, cache, tokens):
        return self.head.step(self.network, params, cache, tokens)

    def _cache(self, params, query_tokens, max_length: int):
        return t5_cache(self.network, params["network"], query_tokens, max_length)

    def _step_hidden(self, params, cache, tokens):
        return self.head.step_hidden(self.network, params, cache, tokens)

    def _project(self, params, hidden, tokens=None):
        return self.head.project(self.network, params, hidden, tokens)

    def searcher(self, num_beams: int, keep_history: bool = False, history_width: int = 0) -> Searcher:
        """The model's searcher with `num_beams` beams (with `keep_history`: one that also returns the alive
        beams of every level, `BeamResult.history`, or with `history_width` the best that many candidates of every
        level)."""
        key = (num_beams, True, history_width) if keep_history else num_beams
        if key not in self._searchers:
            # a head that scores candidate tokens alone lets "renormalized" / "raw" skip the full projection
            split = self.head.candidate_logits
            self._searchers[key] = Searcher(
                self._step_hidden if split else self._step, self._cache,
                start_token=self.config.decoder_start_token_id, eos_id=self.config.eos_token_id,
                vocab_size=self.head.output_size(self.config), num_beams=num_beams, score_mode=self.score_mode,
                length_penalty=self.length_penalty, bonus_fn=self.bonus_fn, tile_fn=self._tile,
                project_fn=self._project if split else None, keep_history=keep_history,
                params_fn=self._search_params, scan_levels=self.scan_levels, index_shards=self.index_shards,
                history_width=history_width if keep_history else 0)
        return self._searchers[key]

    def _search_params(self, params):
        """The parameters as the search's steps read them, made once per search (a scanning network's stacked
        layers)."""
        return {**params, "network": seq2seq.search_params(self.network, params["network"])}

    @staticmethod
    def _tile(cache, n: int):
        """Beam tiling of the decode cache (T5: the encoder's keys/values stay once per query)."""
        return share_encoder(cache, n)

    def predict(self, params, query_tokens_BxL, index, num_beams: int = 10) -> BeamResult:
        """Constrained beam search over `index` (a TrieIndex); every returned docid is in the index. With a
        `bonus_fn`, `query_state_fn` gives it the per-query state."""
        state = None if self.query_state_fn is None else self.query_state_fn(self, params, query_tokens_BxL)
        # a trie split over devices is placed block by block from the host copy, never whole on one device
        trie = index.device(on_host=True) if self.index_shards > 1 and isinstance(index, TrieIndex) else index.device()
        return self.searcher(num_beams).search(params, query_tokens_BxL, trie, query_state=state)

    def predict_arrays(self, params, query_tokens_BxL, index, num_beams: int = 10):
        """The beams' documents as arrays, gathered on the device from the index's leaf → documents payload:
        (docs [B, N, P] corpus rows, valid [B, N, P], beam scores [B, N]) on the host."""
        res = self.predict(params, query_tokens_BxL, index, num_beams)
        docs, valid = leaf_documents(index.device_payload(), jnp.where(res.valid, res.leaf_ids, -1))
        return jax.device_get((docs, valid, res.scores))

    def beam_documents(self, params, query_tokens_BxL, index, num_beams: int = 10):
        """`predict_arrays` as a traceable function (capability `traced_search`): the one-device search and the
        leaf → documents gather, on the device, for a caller's own jit (t5x's partitioned infer step)."""
        state = None if self.query_state_fn is None else self.query_state_fn(self, params, query_tokens_BxL)
        res = self.searcher(num_beams).search_traced(params, query_tokens_BxL, index.device(), state)
        docs, valid = leaf_documents(index.device_payload(), jnp.where(res.valid, res.leaf_ids, -1))
        return docs, valid, res.scores

    def rank(self, params, query_tokens_BxL, index, num_beams: int = 10):
        """The ranker's flat output: (query [R], document row [R], score [R]), each pair once."""
        docs, valid, scores = self.predict_arrays(params, query_tokens_BxL, index, num_beams)
        return self.ranker(docs, valid, scores)

    def predict_documents(self, params, query_tokens_BxL, index, num_beams: int = 10,
                          keys=None) -> list[list[tuple[int, float]]]:
        """Per query, (document row, score) best first, by the ranker (decoding/rankers.py). With the default
        ranker a docid shared by several documents (collision) yields each of them at that docid's score;
        ties are ordered by `keys[row]` descending (pass the document ids for trec_eval's order), else by row."""
        q, d, s = self.rank(params, query_tokens_BxL, index, num_beams)
        return rankers.per_query(q, d, s, len(query_tokens_BxL), keys)

    @functools.partial(jax.jit, static_argnums=0)
    def score(self, params, query_tokens_BxL, docid_targets_BxT):
        """Sum of log-probabilities of each row's docid (teacher forcing; PAD positions ignored)."""
        logp, _ = self.token_log_probs(params, query_tokens_BxL, docid_targets_BxT)
        return (logp * self.head.target_mask(docid_targets_BxT)).sum(axis=-1)
