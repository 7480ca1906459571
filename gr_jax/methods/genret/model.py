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

from gr_jax.methods.api import (Capabilities, CodebookHead, GenerativeRetriever, InputCodebookHead,
                                map_padded, t5)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class GenretHead(InputCodebookHead):
    """GenRET's head: a codebook head with input code embeddings of their own (the core's `InputCodebookHead`).
    GenRET's released code reads row 0 of its first code-input table at position 0 (`start = 'learned'`) and
    scores raw h_t · E_tᵀ (`raw_logits = True`); the defaults are ours (the start token's embedding, the scaled
    projection)."""


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
