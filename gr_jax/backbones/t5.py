"""A Flax (linen) T5 encoder-decoder: v1.0 and v1.1, with a key/value cache for incremental decoding.

Numerics follow the T5 reference (and so HF `T5ForConditionalGeneration`, which parity tests check):

* RMS layer norm without mean subtraction or bias, computed in float32;
* attention logits are *not* scaled by 1/sqrt(d_kv) (the scale is folded into the initialisation);
* one relative-position bias table per stack (bidirectional buckets in the encoder, causal ones in the
  decoder), owned by the stack and added in every layer; cross-attention has no position bias (unless
  `cross_attention_bias`: transformers 3.x's T5, bidirectional buckets, owned by the decoder);
* v1.0: ReLU FFN, logits through the shared embedding with the d_model**-0.5 output scaling;
  v1.1: gated-GELU (tanh approximation) FFN, a separate `lm_head`, no output scaling.

Dimension letters used in array names (the project-wide list is in docs/conventions.md):
B batch, L encoder length, T decoder length, S decoder cache length, D d_model, H heads, Q d_kv (per-head
dim), F d_ff, V vocabulary.

The layers of each stack run as one `jax.lax.scan` over their stacked parameters (`layer_stack`: the
parameters stay one subtree per layer, `layers_<i>`), so a search that unrolls its docid levels compiles one
layer body per stack. `T5(config, scan_layers=True)` turns it on (off by default: see `T5.scan_layers`).

Parameters carry logical axis names (`nn.with_logical_partitioning`); `param_axes(config)` returns them as a
tree of `PartitionSpec`s of logical names, which `training/partitioning.py` maps onto a mesh.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.backbones import bert, layer_stack, random_init
from gr_jax.backbones.encoder_decoder import DecodeCache, EncoderDecoder  # noqa: F401  (t5.DecodeCache)
from gr_jax.backbones.t5_blocks import (  # noqa: F401  (re-exported: t5.Dense, t5.attend, ...)
    _ACTIVATIONS,
    _DTYPES,
    T5Config,
    Attention,
    DecoderLayer,
    Dense,
    EncoderLayer,
    FeedForward,
    LORA_A,
    LORA_B,
    LORA_SCALE,
    RMSNorm,
    RelativePositionBias,
    _attend_one,
    _attend_weighted,
    _normal,
    _pairwise_sum_last,
    attend,
    gathered_logits,
    merged_kernel,
    relative_position_bucket,
)
from gr_jax.data.vocab import PAD_ID, WordPieceVocabulary

Array = jax.Array


def _v1_0(d_model, d_ff, heads, layers, **kw) -> T5Config:
    return T5Config(d_model=d_model, d_ff=d_ff, num_heads=heads, num_layers=layers,
                    num_decoder_layers=layers, **kw)


def _v1_1(d_model, d_ff, heads, layers, **kw) -> T5Config:
    return T5Config(d_model=d_model, d_ff=d_ff, num_heads=heads, num_layers=layers, num_decoder_layers=layers,
                    feed_forward_proj="gated-gelu", tie_word_embeddings=False, scale_decoder_outputs=False, **kw)


# Named sizes. "tiny" is for tests and CPU benchmarks (d_model 64, 2+2 layers, V = 512).
CONFIGS: dict[str, T5Config] = {
    "tiny": _v1_0(64, 256, 4, 2, d_kv=16, vocab_size=512),
    "t5_small": _v1_0(512, 2048, 8, 6),
    "t5_base": _v1_0(768, 3072, 12, 12),
    "t5_large": _v1_0(1024, 4096, 16, 24),
    "t5_1_1_tiny": _v1_1(64, 128, 4, 2, d_kv=16, vocab_size=512),
    "t5_1_1_small": _v1_1(512, 1024, 6, 8),
    "t5_1_1_base": _v1_1(768, 2048, 12, 12),
    "t5_1_1_large": _v1_1(1024, 2816, 16, 24),
    "t5_1_1_xl": _v1_1(2048, 5120, 32, 24),
    "t5_1_1_xxl": _v1_1(4096, 10240, 64, 24),
}


def get_config(name: str, **overrides) -> T5Config:
    """A named configuration with `overrides` of its fields (checked against the fields' ranges, also when gin
    binds them: `keyword_fields`)."""
    if name not in CONFIGS:
        raise ValueError(f"unknown T5 config {name!r}; known: {sorted(CONFIGS)}")
    return CONFIGS[name].replace(**overrides)


get_config.keyword_fields = T5Config




# ----------------------------------------------------------------------------------------------------------
# Stacks and the full network
# ----------------------------------------------------------------------------------------------------------


def _dropout_rngs(module: nn.Module, deterministic: bool) -> Optional[dict]:
    """The scanned layers' dropout key (folded with each layer's index), or None without dropout."""
    if deterministic or module.config.dropout_rate == 0:
        return None
    return {"dropout": module.make_rng("dropout")}


class PretrainedEncoder(nn.Module):
    """`T5Config.pretrained_encoder`'s BERT over the input tokens (ids of its WordPiece vocabulary, padding 0),
    read as it was trained — [CLS] tokens [SEP] —, its states at the tokens' positions projected to d_model
    (dropout after the projection). Parameters: {"bert": the BERT's, "project": {"kernel"}}."""

    config: T5Config

    @nn.compact
    def __call__(self, tokens_BxL: Array, mask_BxL: Array, deterministic: bool) -> Array:
        c = self.config
        bc = bert.encoder_config(c.pretrained_encoder)
        B, L = tokens_BxL.shape
        if L + 2 > bc.max_position:
            raise ValueError(f"TASK_FEATURE_LENGTHS: {L} input tokens do not fit {c.pretrained_encoder}'s "
                             f"{bc.max_position} positions with [CLS] and [SEP]")
        cls_id, sep_id = _special_ids(c.pretrained_encoder)
        lengths = mask_BxL.sum(axis=1)
        ids = jnp.concatenate([jnp.full((B, 1), cls_id, tokens_BxL.dtype), jnp.where(mask_BxL, tokens_BxL, 0),
                               jnp.zeros((B, 1), tokens_BxL.dtype)], axis=1)
        ids = jnp.where(jnp.arange(L + 2)[None] == lengths[:, None] + 1, sep_id, ids)
        mask = jnp.arange(L + 2)[None] <= lengths[:, None] + 1
        hidden = bert.Bert(bc, name="bert")(ids, mask)[:, 1:L + 1]
        x = Dense(c.d_model, ("mlp", "embed"), bc.hidden_size ** -0.5, c.compute_dtype, name="project")(hidden)
        x = nn.Dropout(c.dropout_rate)(x, deterministic=deterministic)
        return nn.with_logical_constraint(x, ("batch", "length", "embed"))


@functools.lru_cache(maxsize=8)
def _special_ids(spec: str) -> tuple[int, int]:
    """[CLS] and [SEP] of a sentence encoder's WordPiece vocabulary."""
    vocab = WordPieceVocabulary(bert.sentence_encoder_path(spec) / "tokenizer.json")
    return vocab.cls_id, vocab.sep_id


class Encoder(nn.Module):
    config: T5Config
    scan_layers: bool = True

    @nn.compact
    def __call__(self, x_BxLxD: Array, mask_BxL: Array, deterministic: bool) -> Array:
        c = self.config
        L = x_BxLxD.shape[1]
        positions = jnp.arange(L)
        bias = RelativePositionBias(c.relative_attention_num_buckets, c.relative_attention_max_distance,
                                    c.num_heads, bidirectional=True, std=c.d_model ** -0.5,
                                    name="relpos_bias")(positions, positions)
        mask = mask_BxL[:, None, None, :]
        x = nn.Dropout(c.dropout_rate)(x_BxLxD, deterministic=deterministic)
        if self.scan_layers and not self.is_initializing():
            layer = EncoderLayer(c, parent=None)

            def body(params, x, _, rngs):
                return layer.apply({"params": params}, x, bias, mask, deterministic, rngs=rngs), None

            stacked = layer_stack.stacked_params(self.variables["params"], layer_stack.layer_names(c.num_layers))
            x, _ = layer_stack.scan(body, stacked, x, rngs=_dropout_rngs(self, deterministic))
        else:
            for i in range(c.num_layers):
                x = EncoderLayer(c, name=f"layers_{i}")(x, bias, mask, deterministic)
        x = RMSNorm(c.layer_norm_epsilon, c.compute_dtype, name="final_norm")(x)
        return nn.Dropout(c.dropout_rate)(x, deterministic=deterministic)


class Decoder(nn.Module):
    config: T5Config
    scan_layers: bool = True

    def setup(self):
        c = self.config
        self.relpos_bias = RelativePositionBias(c.relative_attention_num_buckets, c.relative_attention_max_distance,
                                                c.num_heads, bidirectional=False, std=c.d_model ** -0.5)
        if c.cross_attention_bias:
            self.cross_relpos_bias = RelativePositionBias(
                c.relative_attention_num_buckets, c.relative_attention_max_distance, c.num_heads, bidirectional=True,
                std=c.d_model ** -0.5)
        self.layers = [DecoderLayer(c) for _ in range(c.num_decoder_layers)]
        self.final_norm = RMSNorm(c.layer_norm_epsilon, c.compute_dtype)
        self.dropout = nn.Dropout(c.dropout_rate)

    def _scanned(self) -> bool:
        return self.scan_layers and not self.is_initializing()

    def _stacked(self):
        names = layer_stack.layer_names(self.config.num_decoder_layers)
        return DecoderLayer(self.config, parent=None), layer_stack.stacked_params(self.variables["params"], names)

    def cross_kv(self, encoded_BxLxD: Array) -> tuple[Array, Array]:
        """Every layer's cross-attention keys and values, [N, B, L, H, Q] each."""
        if self._scanned():
            layer, stacked = self._stacked()

            def body(params, carry, _, rngs):
                return carry, layer.apply({"params": params}, encoded_BxLxD, method=DecoderLayer.cross_kv)

            return layer_stack.scan(body, stacked, 0)[1]
        kvs = [layer.cross_kv(encoded_BxLxD) for layer in self.layers]
        return jnp.stack([k for k, _ in kvs]), jnp.stack([v for _, v in kvs])

    def _cross_bias(self, positions: Array, memory_length: int) -> Optional[Array]:
        if not self.config.cross_attention_bias:
            return None
        return self.cross_relpos_bias(positions, jnp.arange(memory_length))

    def __call__(self, x_BxTxD: Array, encoded_BxLxD: Array, encoder_mask_BxL: Array, deterministic: bool,
                 decoder_mask_BxT: Optional[Array] = None) -> Array:
        """Teacher-forced pass over the whole decoder input (causal self-attention). `decoder_mask_BxT`: the keys
        a position may read besides the causal rule (HF's `decoder_attention_mask`: False hides a key, e.g. a padded
        target position, from every query; None: every earlier position)."""
        T = x_BxTxD.shape[1]
        positions = jnp.arange(T)
        bias = self.relpos_bias(positions, positions)
        cross_bias = self._cross_bias(positions, encoded_BxLxD.shape[1])
        causal = (positions[None, :] <= positions[:, None])[None, None]
        if decoder_mask_BxT is not None:
            causal = causal & decoder_mask_BxT.astype(bool)[:, None, None, :]
        cross_mask = encoder_mask_BxL[:, None, None, :]
        x = self.dropout(x_BxTxD, deterministic=deterministic)
        if self._scanned():
            layer, stacked = self._stacked()

            def body(params, x, _, rngs):
                def run(m: DecoderLayer):
                    return m(x, None, bias, causal, m.cross_kv(encoded_BxLxD), cross_mask, deterministic,
                             cross_bias=cross_bias)[0]

                return nn.apply(run, layer)({"params": params}, rngs=rngs), None

            x, _ = layer_stack.scan(body, stacked, x, rngs=_dropout_rngs(self, deterministic))
        else:
            ck, cv = self.cross_kv(encoded_BxLxD)
            for i, layer in enumerate(self.layers):
                x, _ = layer(x, None, bias, causal, (ck[i], cv[i]), cross_mask, deterministic, cross_bias=cross_bias)
        return self.dropout(self.final_norm(x), deterministic=deterministic)

    def step(self, x_Bx1xD: Array, cache: DecodeCache) -> tuple[Array, DecodeCache]:
        """One incremental step at position cache.index; returns hidden [B, 1, D] and the updated cache."""
        return self.prefill(x_Bx1xD, cache)

    def prefill(self, x_BxTxD: Array, cache: DecodeCache) -> tuple[Array, DecodeCache]:
        """T positions at once from cache.index (causal among themselves and over what the cache holds): a
        decoder input longer than one token before incremental steps (PAG feeds the query); returns hidden
        [B, T, D] and the cache with index advanced by T (T = 1: one incremental step)."""
        S, T = cache.max_length, x_BxTxD.shape[1]
        index = cache.index
        if cache.growing:  # the cache holds exactly the S positions fed so far: the new ones follow
            positions, keys, write = S + jnp.arange(T), jnp.arange(S + T), "append"
        else:
            positions, keys, write = index + jnp.arange(T), jnp.arange(S), index
        bias = self.relpos_bias(positions, keys)
        cross_bias = self._cross_bias(positions, cache.cross_k.shape[2])
        self_mask = (keys[None, :] <= positions[:, None])[None, None]
        cross_mask = cache.encoder_mask[:, None, None, :]
        x = x_BxTxD
        if self._scanned():
            layer, stacked = self._stacked()

            def body(params, x, kv, _):
                sk, sv, ck, cv = kv
                return layer.apply({"params": params}, x, (sk, sv), bias, self_mask, (ck, cv), cross_mask, True,
                                   write_index=write, cross_bias=cross_bias)

            x, (new_k, new_v) = layer_stack.scan(body, stacked, x, (cache.self_k, cache.self_v, cache.cross_k,
                                                                      cache.cross_v))
        else:
            new_k, new_v = [], []
            for i, layer in enumerate(self.layers):
                x, (k, v) = layer(x, (cache.self_k[i], cache.self_v[i]), bias, self_mask,
                                  (cache.cross_k[i], cache.cross_v[i]), cross_mask, True, write_index=write,
                                  cross_bias=cross_bias)
                new_k.append(k)
                new_v.append(v)
            new_k, new_v = jnp.stack(new_k), jnp.stack(new_v)
        x = self.final_norm(x)
        return x, cache.replace(index=index + T, self_k=new_k, self_v=new_v)


class T5(EncoderDecoder, nn.Module):
    """The T5 network. Methods (call with `model.apply(params, ..., method=...)`):

    `encode`, `decode` (teacher forcing → logits), `__call__` (both), `decode_hidden` and `logits`
    (for custom docid heads), `init_cache` and `decode_step` (incremental decoding).
    """

    config: T5Config
    # Off by default: on CPU a scanned t5_small decodes ~1.2× slower (each level reads every layer's weights
    # through a dynamic slice) for a compile that the short T5 stacks barely need; Llama scans by default.
    scan_layers: bool = False

    def setup(self):
        c = self.config
        self.embedding = self.param("embedding", nn.with_logical_partitioning(_normal(1.0), ("vocab", "embed")),
                                    (c.vocab_size, c.d_model), jnp.float32)
        self.encoder = PretrainedEncoder(c) if c.pretrained_encoder else Encoder(c, self.scan_layers)
        self.decoder = Decoder(c, self.scan_layers)
        if not c.tie_word_embeddings:
            self.lm_head = Dense(c.vocab_size, ("embed", "vocab"), 1.0, c.compute_dtype)

    def encode(self, encoder_input_tokens: Array, encoder_mask: Optional[Array] = None,
               deterministic: bool = True) -> Array:
        if encoder_mask is None:
            encoder_mask = encoder_input_tokens != self.config.pad_token_id
        if self.config.pretrained_encoder:  # a BERT with its own token embeddings
            return self.encoder(encoder_input_tokens, encoder_mask.astype(bool), deterministic)
        return self.encoder(self.embed(encoder_input_tokens), encoder_mask.astype(bool), deterministic)

    def logits(self, hidden_BxTxD: Array, scale: Optional[bool] = None, vocab_limit: Optional[int] = None) -> Array:
        """Output projection in float32 (decoder hidden states → vocabulary logits). `scale`: multiply by
        d_model^-0.5 first (default: the config's `scale_decoder_outputs`; PAG's sequential scores are
        the unscaled projection of a v1.0 model). `vocab_limit` (static): the logits of ids below it only
        (a reader of a sub-vocabulary: PAG's planner), [..., vocab_limit]."""
        c = self.config
        h = hidden_BxTxD
        if c.scale_decoder_outputs if scale is None else scale:
            h = h * (c.d_model ** -0.5)
        if c.tie_word_embeddings:
            rows = self.embedding if vocab_limit is None else self.embedding[:vocab_limit]
            out = jnp.dot(h.astype(c.compute_dtype), rows.T.astype(c.compute_dtype),
                          preferred_element_type=jnp.float32)
        elif vocab_limit is None:
            out = self.lm_head(h)
        else:
            kernel = self.lm_head.variables["params"]["kernel"][:, :vocab_limit]  # as `Dense` computes it
            out = jnp.dot(h.astype(c.compute_dtype), kernel.astype(c.compute_dtype))
        return out.astype(jnp.float32)

    def token_logits(self, hidden_BxNxD: Array, tokens_BxNxC: Optional[Array] = None,
                     scale: Optional[bool] = None) -> Array:
        """The logits of the given tokens only, [B, N, C] float32: the output projection's columns of those
        tokens against each row's hidden state (what `logits` computes for them, C · D multiply-adds per row
        instead of V · D). `tokens` None: every token (`logits`)."""
        if tokens_BxNxC is None:
            return self.logits(hidden_BxNxD, scale)
        c = self.config
        h = hidden_BxNxD
        if c.scale_decoder_outputs if scale is None else scale:
            h = h * (c.d_model ** -0.5)
        if c.tie_word_embeddings:
            rows_BxNxCxD = jnp.take(self.embedding, tokens_BxNxC, axis=0)
        else:
            rows_BxNxCxD = jnp.take(self.lm_head.variables["params"]["kernel"].T, tokens_BxNxC, axis=0)
        dt = c.compute_dtype
        return jnp.einsum("bnd,bncd->bnc", h.astype(dt), rows_BxNxCxD.astype(dt),
                          preferred_element_type=jnp.float32).astype(jnp.float32)

    def decode_hidden_embedded(self, encoded: Array, encoder_mask: Array, x_BxTxD: Array,
                               deterministic: bool = True, decoder_mask: Optional[Array] = None) -> Array:
        """Decoder over given input embeddings (docid heads with their own token tables); `decoder_mask` [B, T]:
        keys hidden besides the causal rule (`Decoder.__call__`)."""
        return self.decoder(x_BxTxD.astype(self.config.compute_dtype), encoded, encoder_mask.astype(bool),
                            deterministic, decoder_mask)




# ----------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------


def init_params(config: T5Config, seed: int = 0, encoder_length: int = 8, decoder_length: int = 4) -> dict:
    """Random parameters (plain arrays, logical-axis boxes removed)."""
    enc = jnp.ones((1, encoder_length), jnp.int32)
    dec = jnp.ones((1, decoder_length), jnp.int32)
    params = random_init.random_params(T5(config), seed, enc, dec)
    if config.pretrained_encoder:  # the sentence encoder's own weights; the rest random
        pretrained = jax.tree_util.tree_map(jnp.asarray, bert.load_sentence_encoder(config.pretrained_encoder).params)
        if jax.tree_util.tree_structure(pretrained) != jax.tree_util.tree_structure(params["encoder"]["bert"]):
            raise ValueError(f"T5Config.pretrained_encoder {config.pretrained_encoder}: its parameters do not match "
                             f"its config.json's BERT")
        params = {**params, "encoder": {**params["encoder"], "bert": pretrained}}
    return params


def with_stacked_layers(params: dict, config: T5Config) -> dict:
    """Parameters whose encoder and decoder layers are stacked once (`layer_stack.with_stacked_layers`), for a
    scanning `T5` called many times inside one jitted program (a search: one call per docid level)."""
    return {**params, "encoder": layer_stack.with_stacked_layers(params["encoder"], config.num_layers),
            "decoder": layer_stack.with_stacked_layers(params["decoder"], config.num_decoder_layers)}


def param_axes(config: T5Config) -> Any:
    """A tree matching the params whose leaves are `PartitionSpec`s of logical axis names."""
    model = T5(config)
    enc = jnp.ones((1, 4), jnp.int32)
    abstract = jax.eval_shape(model.init, jax.random.PRNGKey(0), enc, enc)
    return nn.get_partition_spec(abstract["params"])


def shift_right(targets: Array, start_id: int = PAD_ID) -> Array:
    """Decoder inputs for teacher forcing: [start, t0, t1, ...]."""
    start = jnp.full((*targets.shape[:-1], 1), start_id, targets.dtype)
    return jnp.concatenate([start, targets[..., :-1]], axis=-1)


def param_count(params) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))


gin.external_configurable(get_config, module="t5")  # `@t5.get_config()` in gin files; `get_config` stays plain
