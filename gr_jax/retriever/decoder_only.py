"""`DecoderOnlyRetriever`: the library's generative retriever on a decoder-only backbone (`models.llama`), so
every docid scheme and objective works with either backbone — a gin switch:

    prepare.model_fn = @DecoderOnlyRetriever
    prepare.network = @llama.get_config()
    llama.get_config.name = 'llama_tiny'

The query and the docid are one sequence: [query tokens (right-padded, padding masked out: it takes no
position and is never attended to), separator (the config's BOS), docid tokens]. Training is teacher forcing of
the docid part (the same objectives, heads and metrics as the seq2seq model: `docid_cross_entropy` reads
`token_log_probs`); retrieval prefills the query once, feeds the separator as the start token and runs the
shared constrained beam search with the LM's cache (`LMCache`, tiled per beam). Text docids use the model's
vocabulary and end with the library's EOS id; codebook docids use the `CodebookHead`, which reads the
generated position from `cache.step_index`.
"""

from __future__ import annotations

import gin
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from gr_jax.backbones import llama
from gr_jax.retriever.model import GenerativeRetriever
from gr_jax.data.vocab import PAD_ID
from gr_jax.runtime.validation import Signed


@gin.configurable
class DecoderOnlyRetriever(GenerativeRetriever):
    def __init__(self, config: llama.LlamaConfig, head=None, score_mode: str = "log_softmax",
                 length_penalty: Signed = 0.0, **kwargs):
        if not isinstance(config, llama.LlamaConfig):
            raise ValueError(f"DecoderOnlyRetriever needs a decoder-only config (prepare.network = "
                             f"@llama.get_config()), got {type(config).__name__}")
        super().__init__(config, head, score_mode, length_penalty, network=llama.Llama(config), **kwargs)

    def describe(self) -> str:
        return f"{type(self).__name__}(score_mode={self.score_mode!r}, layers={self.config.num_layers})"

    def param_axes(self, params) -> dict:
        head = jax.tree_util.tree_map(lambda x: P("vocab", "embed") if x.ndim == 2 else P(), params["head"])
        return {"network": llama.param_axes(self.config), "head": head}

    def init_params(self, seed: int = 0) -> dict:
        _, head_key = jax.random.split(jax.random.PRNGKey(seed))
        return {"network": llama.init_params(self.config, seed=seed),
                "head": self.head.init_params(self.config, head_key)}

    def _hidden(self, params, inputs_BxL, decoder_inputs_BxT, dropout_rng=None):
        variables = {"params": params["network"]}
        L = inputs_BxL.shape[1]
        query = self.network.apply(variables, inputs_BxL, method=llama.Llama.embed)
        docid = self.head.embed(self.network, params, decoder_inputs_BxT)
        x = jnp.concatenate([query, docid.astype(query.dtype)], axis=1)
        mask = jnp.concatenate([inputs_BxL != PAD_ID, jnp.ones(decoder_inputs_BxT.shape, bool)], axis=1)
        hidden = self.network.apply(variables, x, mask, method=llama.Llama.hidden_embedded)
        return hidden[:, L:]

    def _cache(self, params, query_tokens, max_length: int):
        variables = {"params": params["network"]}
        B, L = query_tokens.shape
        cache = self.network.apply(variables, B, L + max_length + 1, method=llama.Llama.init_cache)
        _, cache = self.network.apply(variables, cache, query_tokens, query_tokens != PAD_ID,
                                      method=llama.Llama.prefill_hidden)
        return cache.start_generation()

    @staticmethod
    def _tile(cache, n: int):
        return cache.repeat(n)

    def _search_params(self, params):
        if self.network.scan_layers:
            return {**params, "network": llama.with_stacked_layers(params["network"], self.config)}
        return params


def _get_config(name: str = "llama_tiny", **overrides) -> llama.LlamaConfig:
    return llama.get_config(name, **overrides)


_get_config.keyword_fields = llama.LlamaConfig  # the overrides' ranges, checked when gin binds them
gin.external_configurable(_get_config, name="get_config", module="llama")

