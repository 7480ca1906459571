"""RIPOR's own layout (its `T5SeqAQEncoder`): a T5 whose decoder reads a learned start vector at position 0 and,
at position l ≥ 1, the input embedding of the code chosen at l − 1 (one table per position, RIPOR's
`list_decoder_embeds`); position l's K codes score the raw ⟨h_l, E_l[k]⟩ (`list_output_embeds`, untied from the
inputs, no d_model^-0.5). This is the core's `InputCodebookHead(start='learned', raw_logits=True)`.

Relevance-based docid initialisation (RIPOR's `assign_output_embeds`): both code tables start at the RQ centroids
of the docid table (`RiporDocids`), position l's table at level l's codebook, so the document vectors' width
must be the T5's d_model (RIPOR quantises its own T5's decoder start states). The start vector starts at the
network's embedding of the decoder start token.

Training: a batch with `negatives` and `margin` (`objectives.RiporRankData`) is the prefix-oriented ranking phase
(`model.rank_objective`: MarginMSE of the prefix scores S_L = Σ_{l<L} ⟨h_l, E_l[d_l]⟩, RIPOR's `lng_knp`); any
other batch is its seq2seq phase, the cross-entropy of each position's code over the raw logits (RIPOR's
`T5SeqAQEncoderForSeq2Seq`). Ranking: the core's constrained beam search, score mode 'raw' (the sum of raw
logits). Parity with RIPOR's code: `parity.py` (tools/ripor_fixtures.py writes the fixtures).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import gin
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.api import CodebookHead, GenerativeRetriever, InputCodebookHead, t5
from gr_jax.methods.ripor.dense import START_FILE
from gr_jax.methods.ripor.docids import unpack_codebooks
from gr_jax.methods.ripor.model import check_prefixes, rank_objective


@gin.configurable
class RiporT5Retriever(GenerativeRetriever):
    """`prefix_lengths` / `prefix_factors`: the ranking phase's prefix lengths below M and the factor of the
    teacher's margin at each (the full length has factor 1); RIPOR's M = 8 run: [4] and [0.5 / 0.75].
    `dense_checkpoint`: the dense phase's T5 directory (`dense.train_dense`; the run's INITIAL_CHECKPOINT_PATH),
    whose trained start vector the model starts from."""

    def __init__(self, config, head=None, score_mode: str = "raw", *, prefix_lengths: Sequence[int] = (4,),
                 prefix_factors: Sequence[float] = (0.5 / 0.75,), dense_checkpoint: Optional[str] = None,
                 **kwargs):
        if not isinstance(head, CodebookHead):
            raise ValueError("RiporT5Retriever needs codebook docids (prepare.docid_scheme = @RiporDocids())")
        if score_mode != "raw":
            raise ValueError(f"RiporT5Retriever scores a docid by the sum of its raw logits (score mode 'raw'), got "
                             f"{score_mode!r}")
        head = InputCodebookHead(length=head.length, codes=head.codes, init_std=head.init_std, start="learned",
                                 raw_logits=True)
        super().__init__(config, head, score_mode, **kwargs)
        self.prefix_lengths, self.prefix_factors = check_prefixes("RiporT5Retriever", prefix_lengths,
                                                                  prefix_factors)
        self._books = None
        self.dense_checkpoint = dense_checkpoint

    def describe(self) -> str:
        return (f"RiporT5Retriever(prefix_lengths={self.prefix_lengths}, prefix_factors={self.prefix_factors}, "
                f"score_mode={self.score_mode!r})")

    def use_docids(self, table) -> None:
        books = unpack_codebooks(table.constants)
        M, K, D = books.shape
        if (M, K) != (self.head.length, self.head.codes):
            raise ValueError(f"RiporT5Retriever: the docid table's codebooks are {M} × {K}, the head "
                             f"{self.head.length} × {self.head.codes}")
        if D != self.config.d_model:
            raise ValueError(f"RiporT5Retriever: the codebooks are {D}-d but the T5's d_model is "
                             f"{self.config.d_model}; quantise vectors of the T5's width (its decoder start "
                             f"states, as RIPOR does)")
        self._books = books

    def init_params(self, seed: int = 0) -> dict:
        """The network's random init (INITIAL_CHECKPOINT_PATH's replaces it), the start vector from
        `dense_checkpoint` (else at the start token's embedding), and both code tables at the RQ centroids (before
        `use_docids`: random tables)."""
        params = super().init_params(seed)
        head = dict(params["head"])
        if self.dense_checkpoint and (Path(self.dense_checkpoint) / START_FILE).is_file():
            start = np.load(Path(self.dense_checkpoint) / START_FILE, allow_pickle=False).reshape(-1)
            if start.shape != (self.config.d_model,):
                raise ValueError(f"{Path(self.dense_checkpoint) / START_FILE}: a start vector of {start.shape} for "
                                 f"a T5 of d_model {self.config.d_model}")
            head["start"] = jnp.asarray(start, jnp.float32)
        else:
            head["start"] = jnp.asarray(params["network"]["embedding"][self.config.decoder_start_token_id],
                                        jnp.float32)
        if self._books is not None:
            flat = np.ascontiguousarray(self._books.reshape(-1, self._books.shape[-1]))
            head["codebook"], head["code_inputs"] = jnp.array(flat), jnp.array(flat)
        return {**params, "head": head}

    def docid_logits(self, params, inputs_BxL, codes_BxM, dropout_rng=None):
        """Raw logits [B, M, K] of every position, the decoder reading `codes_BxM`'s prefixes."""
        decoder_inputs = t5.shift_right(codes_BxM, self.config.decoder_start_token_id)
        hidden = self._hidden(params, inputs_BxL, decoder_inputs, dropout_rng)
        return self.head.logits(self.network, params, hidden)

    def docid_scores(self, params, inputs_BxL, codes_BxM, dropout_rng=None):
        """[B, M]: column L − 1 is the prefix score Σ_{l<L} ⟨h_l, E_l[d_l]⟩ (the last, the docid's score)."""
        logits = self.docid_logits(params, inputs_BxL, codes_BxM, dropout_rng)
        chosen = jnp.take_along_axis(logits, codes_BxM[..., None].astype(jnp.int32), axis=-1)[..., 0]
        return jnp.cumsum(chosen, axis=1)

    def loss_fn(self, params, batch, dropout_rng=None):
        if self.objective is not None or "negatives" not in batch:
            return super().loss_fn(params, batch, dropout_rng)
        M = self.head.length
        pos = self.docid_scores(params, batch["inputs"], batch["targets"][:, :M].astype(jnp.int32), dropout_rng)
        neg = self.docid_scores(params, batch["inputs"], batch["negatives"][:, :M].astype(jnp.int32), dropout_rng)
        return rank_objective(pos, neg, batch, self.prefix_lengths, self.prefix_factors)
