"""A Flax (linen) BART encoder-decoder, with the same methods, decode cache and search interface as `t5.T5`.

SEAL, MINDER and LTRGR are BART-large models trained with fairseq; this is their network. Numerics follow
fairseq's BART and HF's `BartForConditionalGeneration` (which the parity tests check, `bart_parity`):

* token embeddings shared by the encoder, the decoder and the output projection, times sqrt(d_model) when
  `scale_embedding` (bart-base / bart-large: off);
* learned absolute positions with fairseq's offset of 2 (a table of max_position_embeddings + 2 rows; position
  p reads row p + 2), then `layernorm_embedding`;
* post-LN blocks: x = LayerNorm(x + sublayer(x)) for self-attention, cross-attention and the feed-forward;
  LayerNorm with bias (epsilon 1e-5); attention with biases, queries scaled by head_dim^-0.5;
* logits = h · embeddingᵀ + `final_logits_bias` (no output scaling); no final LayerNorm after the stacks.

Token ids are the network's own: `pad_token_id`, `eos_token_id` and `decoder_start_token_id` are config fields
(HF/fairseq BART: pad 1, eos 2, decoder start 2). A model imported into the library has its vocabulary axis
permuted to the library's ids (pad 0, eos 1: `bart_convert.LIBRARY_ORDER`).

Parameter tree: `embedding` [V, D], `final_logits_bias` [V], and per stack `positions` [P + 2, D],
`layernorm_embedding`, `layers_<i>` (`self_attention` {q, k, v, o} with `kernel`/`bias`,
`self_attention_norm`, [decoder: `cross_attention`, `cross_attention_norm`], `fc1`, `fc2`, `final_norm`).
Dimension letters as in t5.py: B batch, L encoder length, T decoder length, S cache length, D d_model,
H heads, Q head dim, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from gr_jax.backbones import random_init
from gr_jax.backbones.encoder_decoder import ConfigMethods, DecodeCache, EncoderDecoder
from gr_jax.backbones.t5 import _ACTIVATIONS, Dense, attend
from gr_jax.data.vocab import EOS_ID, PAD_ID
from gr_jax.runtime.validation import Count, Fraction, Positive

Array = jax.Array

ARCHITECTURE = "bart"  # the tag `to_json` writes, which `backbones.seq2seq.config_from_dict` reads


@dataclasses.dataclass(frozen=True)
class BartConfig(ConfigMethods):
    """Hyper-parameters of a BART network; field names follow HF's `BartConfig`."""

    # embeddings: learned positions (offset 2, as HF's), scaled by √d_model where `scale_embedding`
    vocab_size: Count = 50265
    d_model: Count = 1024
    max_position_embeddings: Count = 1024
    scale_embedding: bool = False
    # the two stacks (post-norm layers; the decoder's heads and width are what the cache and heads read)
    encoder_layers: Count = 12
    encoder_attention_heads: Count = 16
    encoder_ffn_dim: Count = 4096
    decoder_layers: Count = 12
    decoder_attention_heads: Count = 16
    decoder_ffn_dim: Count = 4096
    activation_function: str = "gelu"
    layer_norm_epsilon: Positive = 1e-5
    # regularisation (HF `dropout` is `dropout_rate`, the name every network here reads)
    dropout_rate: Fraction = 0.1
    attention_dropout: Fraction = 0.0
    activation_dropout: Fraction = 0.0
    # compute dtype and the special ids (BART starts the decoder with its end-of-sequence token)
    dtype: str = "float32"
    pad_token_id: int = PAD_ID
    eos_token_id: int = EOS_ID
    decoder_start_token_id: int = EOS_ID

    JSON_EXTRA = {"architecture": ARCHITECTURE}
    DROPOUTS = ("dropout_rate", "attention_dropout", "activation_dropout")

    def __post_init__(self):
        if self.activation_function not in _ACTIVATIONS:
            raise ValueError(f"BartConfig.activation_function={self.activation_function!r}: expected one of "
                             f"{sorted(_ACTIVATIONS)}")
        for heads, name in ((self.encoder_attention_heads, "encoder"), (self.decoder_attention_heads, "decoder")):
            if self.d_model % heads:
                raise ValueError(f"BartConfig: d_model {self.d_model} is not a multiple of the {name}'s {heads} "
                                 f"attention heads")
        self._check()

    # the names the library's T5 callers read (retriever heads, searches, trainers)
    @property
    def num_layers(self) -> int:
        return self.encoder_layers

    @property
    def num_decoder_layers(self) -> int:
        return self.decoder_layers

    @property
    def num_heads(self) -> int:
        return self.decoder_attention_heads

    @property
    def d_kv(self) -> int:
        return self.d_model // self.decoder_attention_heads

    @property
    def d_ff(self) -> int:
        return self.decoder_ffn_dim

    @property
    def tie_word_embeddings(self) -> bool:
        return True

    @property
    def scale_decoder_outputs(self) -> bool:
        return False  # BART's logits are the plain projection (CodebookHead reads this)

    @property
    def embed_scale(self) -> float:
        return self.d_model ** 0.5 if self.scale_embedding else 1.0



def _bart(d_model, ffn, heads, layers, **kw) -> BartConfig:
    return BartConfig(d_model=d_model, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads,
                      decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, **kw)


# Named sizes: the released shapes, and "tiny" for tests and CPU demos (d_model 64, 2+2 layers).
CONFIGS: dict[str, BartConfig] = {
    "tiny": _bart(64, 256, 4, 2, vocab_size=512, max_position_embeddings=128),
    "bart_base": _bart(768, 3072, 12, 6),
    "bart_large": _bart(1024, 4096, 16, 12),
}


def get_config(name: str, **overrides) -> BartConfig:
    """A named configuration with `overrides` of its fields (checked against the fields' ranges)."""
    if name not in CONFIGS:
        raise ValueError(f"unknown BART config {name!r}; known: {sorted(CONFIGS)}")
    return CONFIGS[name].replace(**overrides)


get_config.keyword_fields = BartConfig


# ----------------------------------------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------------------------------------


def Linear(features: int, axes: tuple[str, str], std: float, dtype: Any, name: Optional[str] = None) -> Dense:
    """x · kernel + bias (kernel [in, out], as HF's weight transposed): T5's `Dense` with its bias."""
    return Dense(features, axes, std, dtype, use_bias=True, name=name)


class LayerNorm(nn.Module):
    """LayerNorm with scale and bias, computed in float32."""

    epsilon: float
    dtype: Any

    @nn.compact
    def __call__(self, x: Array) -> Array:
        d = x.shape[-1]
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (d,), jnp.float32)
        bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)), (d,), jnp.float32)
        x32 = x.astype(jnp.float32)
        mean = x32.mean(-1, keepdims=True)
        var = jnp.square(x32 - mean).mean(-1, keepdims=True)
        return ((x32 - mean) * jax.lax.rsqrt(var + self.epsilon) * scale + bias).astype(self.dtype)


class Attention(nn.Module):
    config: BartConfig
    num_heads: int

    def setup(self):
        c = self.config
        std, dt = 0.02, c.compute_dtype
        self.q = Linear(c.d_model, ("embed", "joined_kv"), std, dt)
        self.k = Linear(c.d_model, ("embed", "joined_kv"), std, dt)
        self.v = Linear(c.d_model, ("embed", "joined_kv"), std, dt)
        self.o = Linear(c.d_model, ("joined_kv", "embed"), std, dt)
        self.dropout = nn.Dropout(c.attention_dropout)

    def _heads(self, x: Array) -> Array:
        return x.reshape(*x.shape[:-1], self.num_heads, self.config.d_model // self.num_heads)

    def project_kv(self, x_BxSxD: Array) -> tuple[Array, Array]:
        return self._heads(self.k(x_BxSxD)), self._heads(self.v(x_BxSxD))

    def __call__(self, x_BxTxD: Array, k_BxSxHxQ: Array, v_BxSxHxQ: Array, mask: Array, deterministic: bool):
        head_dim = self.config.d_model // self.num_heads
        q = self._heads(self.q(x_BxTxD) * head_dim ** -0.5)
        out = attend(q, k_BxSxHxQ, v_BxSxHxQ, None, mask, lambda p: self.dropout(p, deterministic=deterministic),
                     self.config.compute_dtype, no_dropout=deterministic or self.config.attention_dropout == 0)
        return self.o(out.reshape(*out.shape[:2], -1))


class FeedForward(nn.Module):
    config: BartConfig
    ffn_dim: int

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        c = self.config
        h = _ACTIVATIONS[c.activation_function](Linear(self.ffn_dim, ("embed", "mlp"), 0.02, c.compute_dtype,
                                                       name="fc1")(x))
        h = nn.Dropout(c.activation_dropout)(h, deterministic=deterministic)
        return Linear(c.d_model, ("mlp", "embed"), 0.02, c.compute_dtype, name="fc2")(h)


class EncoderLayer(nn.Module):
    config: BartConfig

    @nn.compact
    def __call__(self, x: Array, mask: Array, deterministic: bool) -> Array:
        c = self.config
        drop = nn.Dropout(c.dropout_rate)
        attn = Attention(c, c.encoder_attention_heads, name="self_attention")
        k, v = attn.project_kv(x)
        x = x + drop(attn(x, k, v, mask, deterministic), deterministic=deterministic)
        x = LayerNorm(c.layer_norm_epsilon, c.compute_dtype, name="self_attention_norm")(x)
        x = x + drop(FeedForward(c, c.encoder_ffn_dim, name="mlp")(x, deterministic), deterministic=deterministic)
        x = LayerNorm(c.layer_norm_epsilon, c.compute_dtype, name="final_norm")(x)
        return nn.with_logical_constraint(x, ("batch", "length", "embed"))


class DecoderLayer(nn.Module):
    config: BartConfig

    def setup(self):
        c = self.config
        self.self_attention = Attention(c, c.decoder_attention_heads)
        self.self_attention_norm = LayerNorm(c.layer_norm_epsilon, c.compute_dtype)
        self.cross_attention = Attention(c, c.decoder_attention_heads)
        self.cross_attention_norm = LayerNorm(c.layer_norm_epsilon, c.compute_dtype)
        self.mlp = FeedForward(c, c.decoder_ffn_dim)
        self.final_norm = LayerNorm(c.layer_norm_epsilon, c.compute_dtype)
        self.drop = nn.Dropout(c.dropout_rate)

    def cross_kv(self, encoded_BxLxD: Array) -> tuple[Array, Array]:
        return self.cross_attention.project_kv(encoded_BxLxD)

    def __call__(self, x: Array, self_kv: Optional[tuple[Array, Array]], self_mask: Array,
                 cross_kv: tuple[Array, Array], cross_mask: Array, deterministic: bool,
                 write_index: Optional[Array] = None):
        """One decoder layer; the cache conventions of `t5.DecoderLayer` (`write_index`: None, a position, or
        "append")."""
        k_new, v_new = self.self_attention.project_kv(x)
        if write_index is None:
            k, v = k_new, v_new
        elif isinstance(write_index, str):
            k = jnp.concatenate([self_kv[0], k_new.astype(self_kv[0].dtype)], axis=1)
            v = jnp.concatenate([self_kv[1], v_new.astype(self_kv[1].dtype)], axis=1)
        else:
            start = (0, write_index, 0, 0)
            k = jax.lax.dynamic_update_slice(self_kv[0], k_new.astype(self_kv[0].dtype), start)
            v = jax.lax.dynamic_update_slice(self_kv[1], v_new.astype(self_kv[1].dtype), start)
        x = self.self_attention_norm(x + self.drop(self.self_attention(x, k, v, self_mask, deterministic),
                                                   deterministic=deterministic))
        rows, queries = x.shape[0], cross_kv[0].shape[0]
        h = x.reshape(queries, (rows // queries) * x.shape[1], x.shape[2]) if rows != queries else x
        out = self.cross_attention(h, *cross_kv, cross_mask, deterministic).reshape(x.shape)
        x = self.cross_attention_norm(x + self.drop(out, deterministic=deterministic))
        x = self.final_norm(x + self.drop(self.mlp(x, deterministic), deterministic=deterministic))
        return nn.with_logical_constraint(x, ("batch", "length", "embed")), (k, v)


class Embedder(nn.Module):
    """Token embedding (shared, passed in) plus the stack's learned positions, then `layernorm_embedding`."""

    config: BartConfig

    @nn.compact
    def __call__(self, tok_BxTxD: Array, start: Array, deterministic: bool) -> Array:
        c = self.config
        table = self.param("positions", nn.with_logical_partitioning(nn.initializers.normal(0.02), (None, "embed")),
                           (c.max_position_embeddings + 2, c.d_model), jnp.float32)
        positions = start + jnp.arange(tok_BxTxD.shape[1]) + 2  # fairseq's offset (padding_idx + 1)
        x = tok_BxTxD.astype(jnp.float32) * c.embed_scale + jnp.take(table, positions, axis=0)
        x = LayerNorm(c.layer_norm_epsilon, c.compute_dtype, name="layernorm_embedding")(x)
        return nn.Dropout(c.dropout_rate)(x, deterministic=deterministic)


class Encoder(nn.Module):
    config: BartConfig

    @nn.compact
    def __call__(self, tok_BxLxD: Array, mask_BxL: Array, deterministic: bool) -> Array:
        c = self.config
        x = Embedder(c, name="embed")(tok_BxLxD, 0, deterministic)
        mask = mask_BxL[:, None, None, :]
        for i in range(c.encoder_layers):
            x = EncoderLayer(c, name=f"layers_{i}")(x, mask, deterministic)
        return x


class Decoder(nn.Module):
    config: BartConfig

    def setup(self):
        c = self.config
        self.embed = Embedder(c)
        self.layers = [DecoderLayer(c) for _ in range(c.decoder_layers)]

    def cross_kv(self, encoded_BxLxD: Array) -> tuple[Array, Array]:
        """Every layer's cross-attention keys and values, [N, B, L, H, Q] each."""
        kvs = [layer.cross_kv(encoded_BxLxD) for layer in self.layers]
        return jnp.stack([k for k, _ in kvs]), jnp.stack([v for _, v in kvs])

    def __call__(self, tok_BxTxD: Array, encoded_BxLxD: Array, encoder_mask_BxL: Array, deterministic: bool):
        """Teacher-forced pass over the whole decoder input (causal self-attention)."""
        T = tok_BxTxD.shape[1]
        positions = jnp.arange(T)
        causal = (positions[None, :] <= positions[:, None])[None, None]
        cross_mask = encoder_mask_BxL[:, None, None, :]
        x = self.embed(tok_BxTxD, 0, deterministic)
        ck, cv = self.cross_kv(encoded_BxLxD)
        for i, layer in enumerate(self.layers):
            x, _ = layer(x, None, causal, (ck[i], cv[i]), cross_mask, deterministic)
        return x

    def prefill(self, tok_BxTxD: Array, cache: DecodeCache) -> tuple[Array, DecodeCache]:
        """T positions from cache.index (the conventions of `t5.Decoder.prefill`)."""
        S, T = cache.max_length, tok_BxTxD.shape[1]
        if cache.growing:
            start, keys, write = S, jnp.arange(S + T), "append"
        else:
            start, keys, write = cache.index, jnp.arange(S), cache.index
        positions = start + jnp.arange(T)
        self_mask = (keys[None, :] <= positions[:, None])[None, None]
        cross_mask = cache.encoder_mask[:, None, None, :]
        x = self.embed(tok_BxTxD, start, True)
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            x, (k, v) = layer(x, (cache.self_k[i], cache.self_v[i]), self_mask, (cache.cross_k[i], cache.cross_v[i]),
                              cross_mask, True, write_index=write)
            new_k.append(k)
            new_v.append(v)
        return x, cache.replace(index=cache.index + T, self_k=jnp.stack(new_k), self_v=jnp.stack(new_v))


class Bart(EncoderDecoder, nn.Module):
    """The BART network; the methods of `t5.T5` (`encode`, `decode`, `logits`, `token_logits`, `init_cache`,
    `decode_step`, …), so every retriever, head and search that runs a T5 runs it."""

    config: BartConfig
    scan_layers: bool = False  # the stacks run unrolled (accepted for the T5 interface)

    def setup(self):
        c = self.config
        self.embedding = self.param("embedding", nn.with_logical_partitioning(nn.initializers.normal(0.02),
                                                                              ("vocab", "embed")),
                                    (c.vocab_size, c.d_model), jnp.float32)
        self.final_logits_bias = self.param("final_logits_bias",
                                            nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
                                            (c.vocab_size,), jnp.float32)
        self.encoder = Encoder(c)
        self.decoder = Decoder(c)

    def logits(self, hidden_BxTxD: Array, scale: Optional[bool] = None, vocab_limit: Optional[int] = None) -> Array:
        """hidden · embeddingᵀ + final_logits_bias in float32 (`scale` is accepted for T5's interface: BART's
        projection is never scaled; `vocab_limit`: the first ids only)."""
        rows = self.embedding if vocab_limit is None else self.embedding[:vocab_limit]
        bias = self.final_logits_bias if vocab_limit is None else self.final_logits_bias[:vocab_limit]
        dt = self.config.compute_dtype
        if scale:
            hidden_BxTxD = hidden_BxTxD * (self.config.d_model ** -0.5)
        out = jnp.dot(hidden_BxTxD.astype(dt), rows.T.astype(dt), preferred_element_type=jnp.float32)
        return out.astype(jnp.float32) + bias

    def token_logits(self, hidden_BxNxD: Array, tokens_BxNxC: Optional[Array] = None,
                     scale: Optional[bool] = None) -> Array:
        """The logits of the given tokens only, [B, N, C] float32 (`logits` of those columns)."""
        if tokens_BxNxC is None:
            return self.logits(hidden_BxNxD, scale)
        dt = self.config.compute_dtype
        rows_BxNxCxD = jnp.take(self.embedding, tokens_BxNxC, axis=0)
        out = jnp.einsum("bnd,bncd->bnc", hidden_BxNxD.astype(dt), rows_BxNxCxD.astype(dt),
                         preferred_element_type=jnp.float32).astype(jnp.float32)
        return out + jnp.take(self.final_logits_bias, tokens_BxNxC)

    def decode_hidden_embedded(self, encoded: Array, encoder_mask: Array, x_BxTxD: Array,
                               deterministic: bool = True) -> Array:
        """Decoder over given token embeddings (before positions; docid heads with their own token tables)."""
        return self.decoder(x_BxTxD.astype(self.config.compute_dtype), encoded, encoder_mask.astype(bool),
                            deterministic)




def init_params(config: BartConfig, seed: int = 0, encoder_length: int = 8, decoder_length: int = 4) -> dict:
    """Random parameters (plain arrays, logical-axis boxes removed)."""
    enc = jnp.ones((1, encoder_length), jnp.int32)
    dec = jnp.ones((1, decoder_length), jnp.int32)
    return random_init.random_params(Bart(config), seed, enc, dec)


def param_axes(config: BartConfig) -> Any:
    """A tree matching the params whose leaves are `PartitionSpec`s of logical axis names."""
    enc = jnp.ones((1, 4), jnp.int32)
    abstract = jax.eval_shape(Bart(config).init, jax.random.PRNGKey(0), enc, enc)
    return nn.get_partition_spec(abstract["params"])


gin.external_configurable(get_config, module="bart")  # `@bart.get_config()` in gin files
