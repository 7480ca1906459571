"""GenRET's model: one T5 is both the document tokeniser and the retriever.

Reading a text (a document or a query), the decoder's state h_t at position t — its inputs the start token, then
the codes of positions < t — is scored against position t's codebook E_t [K, D]: logits_t = h_t · E_tᵀ (the
core's `CodebookHead` projection, which for T5 v1.0 scales h_t by d_model^-0.5 first). The codes fed back as the
next position's input have embeddings of their own (`GenretHead.code_inputs`, one table per position), separate
from the codebooks, as in GenRET's released code.

A document's docid is its greedy decoding (`decode_docids`: the argmax code at each position, fed back); a
query's ranking is the constrained beam search over the documents' decoded docids (the core's search).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import gin
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.api import Capabilities, CodebookHead, GenerativeRetriever, map_padded, t5


def _apply(network, params, *args, method):
    return network.apply({"params": params["network"]}, *args, method=method)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class GenretHead(CodebookHead):
    """A codebook head whose input code embeddings (`code_inputs` [T·K, D]) are separate from the output
    codebooks (`codebook` [T·K, D], E_t = rows t·K … t·K + K − 1).

    `start`: what the decoder reads at position 0 — "text", the network's embedding of the start token (ours), or
    "learned", a vector of its own (`start` [D]: GenRET's released code reads row 0 of its first code-input
    table there). `raw_logits`: h_t · E_tᵀ without the T5 v1.0 head's d_model^-0.5 (as GenRET's code computes
    them; the default scales, as every codebook head here does)."""

    start: str = "text"
    raw_logits: bool = False

    def __post_init__(self):
        if self.start not in ("text", "learned"):
            raise ValueError(f"GenretHead.start = {self.start!r}: 'text' (the start token's embedding) or 'learned' "
                             f"(GenRET's released code)")

    def init_params(self, config: t5.T5Config, key) -> dict:
        out_key, in_key = jax.random.split(key)  # as before the start vector existed: the same tables from a seed
        shape = (self.length * self.codes, config.d_model)
        out = {"codebook": self.init_std * jax.random.normal(out_key, shape, jnp.float32),
               "code_inputs": self.init_std * jax.random.normal(in_key, shape, jnp.float32)}
        if self.start == "learned":
            out["start"] = self.init_std * jax.random.normal(jax.random.fold_in(key, 2), (config.d_model,),
                                                             jnp.float32)
        return out

    def _inputs(self, params):
        return params["head"]["code_inputs"].reshape(self.length, self.codes, -1)

    def _scale(self, network, hidden):
        return hidden if self.raw_logits else super()._scale(network, hidden)

    def _start(self, network, params, tokens):
        """The position-0 input [B, ..., D] for start tokens of shape [B, ...]."""
        text = _apply(network, params, tokens, method="embed")
        if self.start == "text":
            return text
        return jnp.broadcast_to(params["head"]["start"].astype(text.dtype), text.shape)

    def embed(self, network, params, decoder_input_tokens_BxT):
        """[start, c_0, …, c_{T-2}] → the start input (`start`), then each code's input embedding."""
        T = decoder_input_tokens_BxT.shape[1]
        start = self._start(network, params, decoder_input_tokens_BxT[:, :1])
        prev_pos = jnp.clip(jnp.arange(1, T) - 1, 0, self.length - 1)
        codes = jnp.clip(decoder_input_tokens_BxT[:, 1:], 0, self.codes - 1)
        rest = self._inputs(params)[prev_pos[None, :], codes]
        return jnp.concatenate([start, rest.astype(start.dtype)], axis=1)

    def step(self, network, params, cache, tokens_B):
        index = cache.step_index
        start = self._start(network, params, tokens_B)
        prev = self._inputs(params)[jnp.clip(index - 1, 0, self.length - 1), jnp.clip(tokens_B, 0, self.codes - 1)]
        x_BxD = jnp.where(index == 0, start, prev.astype(start.dtype))
        hidden, cache = _apply(network, params, cache, x_BxD, method="decode_step_embedded")
        table_VxD = self._table(params)[jnp.clip(index, 0, self.length - 1)]
        logits = jnp.dot(self._scale(network, hidden).astype(jnp.float32), table_VxD.T)
        return logits, cache


@gin.configurable
class GenretRetriever(GenerativeRetriever):
    """A `GenerativeRetriever` with a `GenretHead` (made from the docid space's codebook head) that decodes the
    documents' docids itself (capability `decodes_docids`)."""

    def __init__(self, config, head=None, score_mode: str = "log_softmax", genret_head: Optional[GenretHead] = None,
                 **kwargs):
        if not isinstance(head, CodebookHead):
            raise ValueError("GenRET needs codebook docids (prepare.docid_scheme = @GenretDocids()); this docid "
                             "scheme gives a text head")
        if genret_head is not None:  # its settings (`GenretRetriever.genret_head = @GenretHead()`), the scheme's sizes
            head = dataclasses.replace(genret_head, length=head.length, codes=head.codes, init_std=head.init_std)
        elif not isinstance(head, GenretHead):
            head = GenretHead(length=head.length, codes=head.codes, init_std=head.init_std)
        super().__init__(config, head, score_mode, **kwargs)
        self._greedy = jax.jit(self._greedy_impl)
        self._states = jax.jit(lambda params, tokens, codes: self.positions(params, tokens, codes)[0])

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(decodes_docids=True, decoding_bonus=self.bonus_fn is not None)

    def describe(self) -> str:
        return f"GenretRetriever(score_mode={self.score_mode!r})"

    def positions(self, params, inputs_BxL, codes_BxT, dropout_rng=None):
        """Teacher forcing over the codes `codes_BxT` (the decoder reads start, c_0, …, c_{T-2}) →
        (h [B, T, D] float32, the decoder's output states; logits [B, T, K], the head's projection of them)."""
        decoder_inputs = t5.shift_right(codes_BxT, self.config.decoder_start_token_id)
        hidden = self._hidden(params, inputs_BxL, decoder_inputs, dropout_rng)
        logits = self.head.logits(self.network, params, hidden)
        return hidden.astype(jnp.float32), logits

    def _greedy_impl(self, params, tokens_BxL):
        B, T = tokens_BxL.shape[0], self.head.length
        codes = jnp.zeros((B, T), jnp.int32)
        for t in range(T):  # position t reads the argmax codes of positions < t
            _, logits = self.positions(params, tokens_BxL, codes)
            codes = codes.at[:, t].set(jnp.argmax(logits[:, t], axis=-1).astype(jnp.int32))
        _, logits = self.positions(params, tokens_BxL, codes)
        return codes, jnp.take_along_axis(logits, codes[..., None], axis=-1)[..., 0]

    def decode_docids(self, params, doc_tokens, batch_size: int = 64):
        """Every document's greedy code sequence and the raw logit of each code: ([n, T] int32, [n, T] float32).
        Batches are padded to one shape (one compile); padding rows are dropped."""
        doc_tokens = np.asarray(doc_tokens, np.int32)
        if not len(doc_tokens):
            return np.zeros((0, self.head.length), np.int32), np.zeros((0, self.head.length), np.float32)
        codes, logits = map_padded(functools.partial(self._greedy, params), [doc_tokens], batch_size)
        return codes.astype(np.int32), logits.astype(np.float32)

    def document_states(self, params, doc_tokens, codes, position: int, batch_size: int = 64) -> np.ndarray:
        """The decoder's states at `position` [n, D] of every document, teacher-forced over its `codes` [n, T]."""
        (h,) = map_padded(lambda tokens, c: self._states(params, tokens, c)[:, position],
                          [np.asarray(doc_tokens, np.int32), np.asarray(codes, np.int32)], batch_size)
        return h.astype(np.float32)
