"""What T5 and BART share as encoder-decoder networks: their configs' methods (`ConfigMethods`), the decode cache
(`DecodeCache`) and the methods every
retriever, head and search calls on either (`EncoderDecoder`: embed, decode, the cache and the incremental steps,
the beam search's row hooks through the cache). A network mixes `EncoderDecoder` into its flax module and keeps
only what differs: its encoder (T5 may read a pretrained BERT), positions, norms, its output projection (`logits`,
`token_logits`: T5's tying and scaling, BART's logits bias) and what its decoder accepts (T5's key mask).

The network provides `config` (vocab_size, pad_token_id, num_decoder_layers, num_heads, d_kv, compute_dtype),
`embedding`, `encoder` (`encoder(x, mask, deterministic)`), `decoder` (`decoder(x, encoded, mask,
deterministic)`, `cross_kv`, `prefill`) and `logits`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

import flax.struct
import jax
import jax.numpy as jnp

from gr_jax.runtime.validation import check_fields

Array = jax.Array
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class ConfigMethods:
    """What a network's frozen config dataclass shares: the compute dtype, `replace`, JSON both ways and the checks
    every field gets (`_check`: the dtype's name, the declared ranges, dropout rates below 1). `JSON_EXTRA`: keys
    `to_json` adds and `from_dict` takes off (BART's architecture tag)."""

    JSON_EXTRA: dict = {}
    DROPOUTS: tuple = ("dropout_rate",)

    def _check(self) -> None:
        name = type(self).__name__
        if self.dtype not in DTYPES:
            raise ValueError(f"{name}.dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        check_fields(self)  # the declared ranges, however the config was made (gin override, config.json)
        for field in self.DROPOUTS:
            if getattr(self, field) >= 1:  # 1 would zero every activation
                raise ValueError(f"{name}.{field} must be < 1, got {getattr(self, field)}")

    @property
    def compute_dtype(self):
        return DTYPES[self.dtype]

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps({**self.JSON_EXTRA, **dataclasses.asdict(self)}, indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        d = {k: v for k, v in d.items() if k not in cls.JSON_EXTRA}
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields: {unknown}")
        return cls(**d)


@flax.struct.dataclass
class DecodeCache:
    """Everything incremental decoding needs. Keys/values have the layer axis first (the scan over layers
    reads them in place), then the rows; the beam search tiles and reorders rows through `tile_rows` /
    `gather_rows`.

    self_k/self_v: [N, B, S, H, Q] (N decoder layers); cross_k/cross_v: [N, B, L, H, Q] (the projected
    encoder states, computed once); encoder_mask: [B, L]; index: the next position to write (scalar).

    `growing` (static): S is the number of positions fed so far and every step appends its keys/values (a
    new shape per step: for loops unrolled per position, as the constrained search's). A step then attends
    to the positions that exist and beam reordering copies only those, instead of the whole [B, S_max, H, Q]
    buffer of a fixed cache — at step d, d + 1 slots instead of the docid length.
    """

    index: Array
    self_k: Array
    self_v: Array
    cross_k: Array
    cross_v: Array
    encoder_mask: Array
    growing: bool = flax.struct.field(pytree_node=False, default=False)
    regrow: bool = flax.struct.field(pytree_node=False, default=False)  # padded by `to_fixed`: see `to_growing`

    @property
    def max_length(self) -> int:
        return self.self_k.shape[2]

    @property
    def step_index(self) -> Array:
        """The decoding position (docid heads read it): here the decoder position itself."""
        return self.index

    def _map_batch(self, fn, rows: Optional[int] = None) -> "DecodeCache":
        """fn(array, row_axis) on every per-row array (with `rows`: on those that have that many rows)."""
        def on(a, axis):
            return fn(a, axis) if rows is None or a.shape[axis] == rows else a

        return self.replace(self_k=on(self.self_k, 1), self_v=on(self.self_v, 1), cross_k=on(self.cross_k, 1),
                            cross_v=on(self.cross_v, 1), encoder_mask=on(self.encoder_mask, 0))

    def repeat(self, n: int, share_cross: bool = False) -> "DecodeCache":
        """Repeats every batch row n times (row b becomes rows b*n .. b*n+n-1), e.g. for beams.

        With share_cross, the encoder side (cross keys/values, encoder mask) keeps one row per query and the
        decoder attends to it from all n rows of that query: less memory, and nothing to reorder per step.
        """
        if share_cross:
            return self.replace(self_k=jnp.repeat(self.self_k, n, axis=1), self_v=jnp.repeat(self.self_v, n, axis=1))
        return self._map_batch(lambda a, axis: jnp.repeat(a, n, axis=axis))

    def to_fixed(self, steps: int) -> "DecodeCache":
        """A growing cache as a fixed one with room for `steps` more positions (the fed ones, then empty slots),
        so that those steps keep its shapes (a search's run of levels in a `lax.scan`, which then calls
        `to_growing`); a fixed cache as it is."""
        if not self.growing:
            return self
        pad = ((0, 0), (0, 0), (0, steps), (0, 0), (0, 0))
        return self.replace(self_k=jnp.pad(self.self_k, pad), self_v=jnp.pad(self.self_v, pad), growing=False,
                            regrow=True)

    def to_growing(self) -> "DecodeCache":
        """A cache that `to_fixed` padded, growing again once the run that padded it has written every slot."""
        return self.replace(growing=True, regrow=False) if self.regrow else self

    def gather(self, rows: Array) -> "DecodeCache":
        """Selects batch rows (beam search's reordering after pruning)."""
        return self._map_batch(lambda a, axis: jnp.take(a, rows, axis=axis))

    # the beam search's row hooks (`decoding.beam_search.tile_rows` / `gather_rows`): the arrays with `rows` rows
    def tile_rows(self, n: int, rows: int) -> "DecodeCache":
        return self._map_batch(lambda a, axis: jnp.repeat(a, n, axis=axis), rows)

    def gather_rows(self, index: Array, rows: int) -> "DecodeCache":
        return self._map_batch(lambda a, axis: jnp.take(a, index, axis=axis), rows)


class EncoderDecoder:
    """The methods of an encoder-decoder network (module docstring); call them with
    `model.apply(params, ..., method=...)`."""

    def embed(self, tokens: Array) -> Array:
        return jnp.take(self.embedding, tokens, axis=0).astype(self.config.compute_dtype)

    def encode(self, encoder_input_tokens: Array, encoder_mask: Optional[Array] = None,
               deterministic: bool = True) -> Array:
        if encoder_mask is None:
            encoder_mask = encoder_input_tokens != self.config.pad_token_id
        return self.encoder(self.embed(encoder_input_tokens), encoder_mask.astype(bool), deterministic)

    def decode_hidden(self, encoded: Array, encoder_mask: Array, decoder_input_tokens: Array,
                      deterministic: bool = True) -> Array:
        return self.decoder(self.embed(decoder_input_tokens), encoded, encoder_mask.astype(bool), deterministic)

    def decode(self, encoded: Array, encoder_mask: Array, decoder_input_tokens: Array,
               deterministic: bool = True) -> Array:
        """Teacher forcing → logits [B, T, V] float32."""
        return self.logits(self.decode_hidden(encoded, encoder_mask, decoder_input_tokens, deterministic))

    def __call__(self, encoder_input_tokens: Array, decoder_input_tokens: Array,
                 encoder_mask: Optional[Array] = None, deterministic: bool = True) -> Array:
        if encoder_mask is None:
            encoder_mask = encoder_input_tokens != self.config.pad_token_id
        encoded = self.encode(encoder_input_tokens, encoder_mask, deterministic)
        return self.decode(encoded, encoder_mask, decoder_input_tokens, deterministic)

    def init_cache(self, encoded: Array, encoder_mask: Array, max_decode_length: int,
                   growing: bool = False) -> DecodeCache:
        """A cache of `max_decode_length` positions, or with `growing` an empty one that each step extends
        (`DecodeCache.growing`; `max_decode_length` is then not needed)."""
        c = self.config
        ck, cv = self.decoder.cross_kv(encoded)
        zeros = jnp.zeros((c.num_decoder_layers, encoded.shape[0], 0 if growing else max_decode_length, c.num_heads,
                           c.d_kv), c.compute_dtype)
        return DecodeCache(index=jnp.zeros((), jnp.int32), self_k=zeros, self_v=zeros, cross_k=ck, cross_v=cv,
                           encoder_mask=encoder_mask.astype(bool), growing=growing)

    def decode_step_hidden(self, cache: DecodeCache, tokens_B: Array) -> tuple[Array, DecodeCache]:
        hidden, cache = self.decoder.prefill(self.embed(tokens_B[:, None]), cache)
        return hidden[:, 0], cache

    def prefill_hidden(self, cache: DecodeCache, tokens_BxT: Array) -> tuple[Array, DecodeCache]:
        """Feeds T tokens per row at positions cache.index … + T − 1 (the decoder's `prefill`)."""
        return self.decoder.prefill(self.embed(tokens_BxT), cache)

    def decode_step_embedded(self, cache: DecodeCache, x_BxD: Array) -> tuple[Array, DecodeCache]:
        hidden, cache = self.decoder.prefill(x_BxD[:, None].astype(self.config.compute_dtype), cache)
        return hidden[:, 0], cache

    def decode_step(self, cache: DecodeCache, tokens_B: Array) -> tuple[Array, DecodeCache]:
        """Feeds one token per row at position cache.index; returns logits [B, V] (float32) and the cache."""
        hidden, cache = self.decode_step_hidden(cache, tokens_B)
        return self.logits(hidden), cache
