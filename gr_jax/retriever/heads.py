"""Docid heads: how docid tokens enter the decoder and how the decoder scores them.

* `TextHead` — docid tokens are rows of the network's vocabulary (naive strings, titles, keywords, and
  atomic ids grown above the text vocabulary). Variable length, EOS-terminated. No parameters of its own.
* `CodebookHead(length L, codes V)` — a separate table of L × V docid embeddings (NCI / PAG style): the
  decoder input at position t ≥ 1 is the embedding of the code chosen at position t − 1, and the logits at
  position t are the hidden state against position t's V embeddings (the same table, tied). Fixed length,
  no EOS; code 0 is a real code, so the target mask is "the first L positions".

A head is a small frozen dataclass of functions over `(network, params, ...)`; `params` is the retriever's
tree `{"network": network params, "head": head params}`. The network is a T5 or a decoder-only Llama: heads call
its methods by name (`embed`, `logits`, `token_logits`, `decode_step`, `decode_step_hidden`,
`decode_step_embedded`), which both define, and read the decoding position from `cache.step_index` (T5: the
decoder position; Llama: positions after the prompt).

`candidate_logits` declares whether the head can score a beam's allowed tokens alone (`step_hidden` +
`project`, used by the search in the score modes "renormalized" and "raw"): the text head can — a token's logit
is one column of the output projection —, the codebook head's step reads its position's table from the cache,
so it keeps full logits (its V is a codebook's size).

* `InputCodebookHead` — a `CodebookHead` whose fed-back codes have input tables of their own (`code_inputs`,
  untied from the output codebooks), with optionally a learned start vector and raw logits (GenRET's and
  RIPOR's released layouts: `methods/genret`, `methods/ripor`).
"""

from __future__ import annotations

import dataclasses

import gin
import jax
import jax.numpy as jnp

from gr_jax.backbones import t5
from gr_jax.data.vocab import PAD_ID
from gr_jax.runtime.validation import Count, Positive


def _apply(network, params, *args, method, **kwargs):
    return network.apply({"params": params["network"]}, *args, method=method, **kwargs)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TextHead:
    kind = "text"
    candidate_logits = True

    def init_params(self, config: t5.T5Config, key) -> dict:
        return {}

    def output_size(self, config: t5.T5Config) -> int:
        return config.vocab_size

    def target_mask(self, targets_BxT):
        return targets_BxT != PAD_ID

    def embed(self, network, params, decoder_input_tokens_BxT):
        return _apply(network, params, decoder_input_tokens_BxT, method="embed")

    def logits(self, network, params, hidden_BxTxD):
        return _apply(network, params, hidden_BxTxD, method="logits")

    def step(self, network, params, cache, tokens_B):
        return _apply(network, params, cache, tokens_B, method="decode_step")

    def step_hidden(self, network, params, cache, tokens_B):
        return _apply(network, params, cache, tokens_B, method="decode_step_hidden")

    def project(self, network, params, hidden, tokens=None):
        """Logits of the given tokens (or of all with None) from `step_hidden`'s states."""
        return _apply(network, params, hidden, tokens, method="token_logits")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class CodebookHead:
    length: Count = 8  # L docid positions
    codes: Count = 256  # V codes per position
    init_std: Positive = 1.0
    kind = "codebook"
    candidate_logits = False

    def init_params(self, config: t5.T5Config, key) -> dict:
        table = self.init_std * jax.random.normal(key, (self.length * self.codes, config.d_model), jnp.float32)
        return {"codebook": table}

    def output_size(self, config: t5.T5Config) -> int:
        return self.codes

    def target_mask(self, targets_BxT):
        T = targets_BxT.shape[-1]
        return jnp.broadcast_to(jnp.arange(T) < self.length, targets_BxT.shape)

    def _table(self, params):
        return params["head"]["codebook"].reshape(self.length, self.codes, -1)

    def embed(self, network, params, decoder_input_tokens_BxT):
        """[start, c_0, ..., c_{T-2}] → the start token's text embedding, then position-specific codes."""
        B, T = decoder_input_tokens_BxT.shape
        start = _apply(network, params, decoder_input_tokens_BxT[:, :1], method="embed")
        prev_pos = jnp.clip(jnp.arange(1, T) - 1, 0, self.length - 1)
        codes = jnp.clip(decoder_input_tokens_BxT[:, 1:], 0, self.codes - 1)
        rest = self._table(params)[prev_pos[None, :], codes]
        return jnp.concatenate([start, rest.astype(start.dtype)], axis=1)

    def _scale(self, network, hidden):
        c = network.config
        return hidden * (c.d_model ** -0.5) if c.scale_decoder_outputs else hidden

    def logits(self, network, params, hidden_BxTxD):
        T = hidden_BxTxD.shape[1]
        pos = jnp.clip(jnp.arange(T), 0, self.length - 1)
        table_TxVxD = self._table(params)[pos]
        h = self._scale(network, hidden_BxTxD).astype(jnp.float32)
        return jnp.einsum("btd,tvd->btv", h, table_TxVxD)

    def step(self, network, params, cache, tokens_B):
        table = self._table(params)
        index = cache.step_index
        start = _apply(network, params, tokens_B, method="embed")
        prev = table[jnp.clip(index - 1, 0, self.length - 1), jnp.clip(tokens_B, 0, self.codes - 1)]
        x_BxD = jnp.where(index == 0, start, prev.astype(start.dtype))
        hidden, cache = _apply(network, params, cache, x_BxD, method="decode_step_embedded")
        table_VxD = table[jnp.clip(index, 0, self.length - 1)]
        logits = jnp.dot(self._scale(network, hidden).astype(jnp.float32), table_VxD.T)
        return logits, cache


@gin.configurable
@dataclasses.dataclass(frozen=True)
class InputCodebookHead(CodebookHead):
    """A codebook head whose input code embeddings (`code_inputs` [T·K, D]: table t − 1 embeds the code chosen
    at position t − 1, read at position t) are separate from the output codebooks (`codebook` [T·K, D],
    E_t = rows t·K … t·K + K − 1).

    `start`: what the decoder reads at position 0 — "text", the network's embedding of the start token, or
    "learned", a vector of its own (`start` [D]). `raw_logits`: h_t · E_tᵀ without the T5 v1.0 head's
    d_model^-0.5 (the default scales, as every codebook head here does)."""

    start: str = "text"
    raw_logits: bool = False

    def __post_init__(self):
        if self.start not in ("text", "learned"):
            raise ValueError(f"{type(self).__name__}.start = {self.start!r}: 'text' (the start token's embedding) "
                             f"or 'learned' (a vector of its own)")

    def init_params(self, config: t5.T5Config, key) -> dict:
        out_key, in_key = jax.random.split(key)
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


def head_for_space(space, head=None, scheme: str = "the docid scheme"):
    """The docid head a token space needs: `TextHead` for "text", `CodebookHead(space.length, space.size)`
    for "codebook" (other settings, e.g. `CodebookHead.init_std`, from gin). A given `head` is checked against
    the space instead, so a docid scheme's size (e.g. `PQDocids.k`) is set in one place only."""
    if head is None:
        return TextHead() if space.kind == "text" else CodebookHead(length=space.length, codes=space.size)
    if head.kind != space.kind:
        raise ValueError(f"{scheme} makes {space.kind} docids but the model has a {head.kind} head; remove the "
                         f"prepare.head binding (the head follows from the docids)")
    if head.kind == "codebook" and (head.length, head.codes) != (space.length, space.size):
        raise ValueError(f"{scheme} makes docids of {space.length} positions × {space.size} codes but the "
                         f"CodebookHead has {head.length} × {head.codes}; remove CodebookHead.length / .codes "
                         f"from the gin files (the head follows from the docids)")
    return head
