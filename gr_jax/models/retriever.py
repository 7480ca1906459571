"""`GenerativeRetriever`: the model object of the library — a Flax T5 network plus a docid head, with
`loss_fn` (teacher-forced cross-entropy on docid tokens), `predict` (constrained beam search over a
`TrieIndex`) and `score` (log-likelihood of given docids).

The network is a plain Flax module; the retriever owns no state. Parameters are the tree
`{"network": T5 params, "head": head params}` (the text head's is empty).
"""

from __future__ import annotations

import functools
import logging


import gin
import jax
import jax.numpy as jnp

from gr_jax.decoding.beam_search import BeamResult
from gr_jax.models.search import Searcher, t5_cache
from gr_jax.models import t5
from gr_jax.models.heads import TextHead

log = logging.getLogger(__name__)


@gin.configurable
class GenerativeRetriever:
    def __init__(self, config: t5.T5Config, head=None, score_mode: str = "log_softmax",
                 length_penalty: float = 0.0):
        self.config = config
        self.network = t5.T5(config)
        self.head = head if head is not None else TextHead()
        self.score_mode = score_mode
        self.length_penalty = length_penalty
        self._searchers: dict[int, Searcher] = {}

    # -- parameters ---------------------------------------------------------------------------------------
    def init_params(self, seed: int = 0) -> dict:
        net_key, head_key = jax.random.split(jax.random.PRNGKey(seed))
        return {"network": t5.init_params(self.config, seed=seed),
                "head": self.head.init_params(self.config, head_key)}

    # -- training -----------------------------------------------------------------------------------------
    def _hidden(self, params, inputs_BxL, decoder_inputs_BxT, dropout_rng=None):
        deterministic = dropout_rng is None
        rngs = {} if deterministic else {"dropout": dropout_rng}
        mask = inputs_BxL != self.config.pad_token_id
        variables = {"params": params["network"]}
        encoded = self.network.apply(variables, inputs_BxL, mask, deterministic, method=t5.T5.encode, rngs=rngs)
        x = self.head.embed(self.network, params, decoder_inputs_BxT)
        return self.network.apply(variables, encoded, mask, x, deterministic,
                                  method=t5.T5.decode_hidden_embedded, rngs=rngs)

    def token_log_probs(self, params, inputs_BxL, targets_BxT, dropout_rng=None):
        """log p(target token) per position [B, T], and the argmax hit per position."""
        decoder_inputs = t5.shift_right(targets_BxT, self.config.decoder_start_token_id)
        hidden = self._hidden(params, inputs_BxL, decoder_inputs, dropout_rng)
        logits = self.head.logits(self.network, params, hidden)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        target_logp = jnp.take_along_axis(logp, targets_BxT[..., None].astype(jnp.int32), axis=-1)[..., 0]
        return target_logp, jnp.argmax(logits, axis=-1) == targets_BxT

    def loss_fn(self, params, batch, dropout_rng=None):
        """Mean token cross-entropy over docid positions; returns (loss, sums) with sums as (sum, count)
        pairs: loss_sum, tokens, correct_tokens, correct_docids, docids."""
        targets = batch["targets"]
        logp, hit = self.token_log_probs(params, batch["inputs"], targets, dropout_rng)
        mask = self.head.target_mask(targets).astype(jnp.float32)
        weights = batch.get("weights")
        row_w = jnp.ones(targets.shape[0], jnp.float32) if weights is None else weights.astype(jnp.float32)
        mask = mask * row_w[:, None]
        loss_sum = -(logp * mask).sum()
        tokens = mask.sum()
        seq_ok = (hit | (mask == 0)).all(axis=-1)
        sums = {"loss_sum": loss_sum, "tokens": tokens, "correct_tokens": (hit * mask).sum(),
                "correct_docids": (seq_ok * row_w).sum(), "docids": row_w.sum()}
        return loss_sum / jnp.maximum(tokens, 1.0), sums

    # -- inference ----------------------------------------------------------------------------------------
    def _step(self, params, cache, tokens):
        return self.head.step(self.network, params, cache, tokens)

    def _cache(self, params, query_tokens, max_length: int):
        return t5_cache(self.network, params["network"], query_tokens, max_length)

    def searcher(self, num_beams: int) -> Searcher:
        if num_beams not in self._searchers:
            self._searchers[num_beams] = Searcher(
                self._step, self._cache, start_token=self.config.decoder_start_token_id,
                eos_id=self.config.eos_token_id, vocab_size=self.head.output_size(self.config),
                num_beams=num_beams, score_mode=self.score_mode, length_penalty=self.length_penalty)
        return self._searchers[num_beams]

    def predict(self, params, query_tokens_BxL, index, num_beams: int = 10) -> BeamResult:
        """Constrained beam search over `index` (a TrieIndex); every returned docid is in the index."""
        return self.searcher(num_beams).search(params, query_tokens_BxL, index.device())

    def predict_beams(self, params, query_tokens_BxL, index, num_beams: int = 10):
        """Per query, the valid beams best first as (documents of the beam's docid, beam score)."""
        res = jax.device_get(self.predict(params, query_tokens_BxL, index, num_beams))
        return [[(index.documents(int(res.leaf_ids[b, n])).tolist(), float(res.scores[b, n]))
                 for n in range(res.leaf_ids.shape[1]) if res.valid[b, n]]
                for b in range(res.leaf_ids.shape[0])]

    def predict_documents(self, params, query_tokens_BxL, index, num_beams: int = 10, ranker: str = "first",
                          mdgr_lambda: float = 1.0, keys=None) -> list[list[tuple[int, float]]]:
        """Per query, (document row, score) best first (decoding/rankers.py). With the default ranker a docid
        shared by several documents (collision) yields each of them at that docid's score; ties are ordered
        by `keys[row]` descending (pass the document ids for trec_eval's order), else by row."""
        from gr_jax.decoding import rankers

        return [rankers.rank([docs for docs, _ in beams], [s for _, s in beams], ranker, mdgr_lambda, keys)
                for beams in self.predict_beams(params, query_tokens_BxL, index, num_beams)]

    @functools.partial(jax.jit, static_argnums=0)
    def score(self, params, query_tokens_BxL, docid_targets_BxT):
        """Sum of log-probabilities of each row's docid (teacher forcing; PAD positions ignored)."""
        logp, _ = self.token_log_probs(params, query_tokens_BxL, docid_targets_BxT)
        return (logp * self.head.target_mask(docid_targets_BxT)).sum(axis=-1)
