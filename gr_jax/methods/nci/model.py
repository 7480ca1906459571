"""NCI's prefix-aware weight-adaptive (PAWA) decoder and its consistency-regularised objective.

Docid tokens are position-specific (the core's `CodebookHead`: one table E_t of V code embeddings per
position t, which is NCI's "position-aware" vocabulary). PAWA makes the output projection depend on the prefix
too, as NCI's released code computes it:

    x_0..x_{t}  = the decoder's input embeddings (start, then the codes chosen so far, position-specific)
    g_t         = Adaptor(x_0..x_t)            a small causal transformer decoder over the prefix whose
                                               cross-attention reads one learned vector (NCI: 4 layers, 8 heads)
    W_t         = E_t^T + reshape(A g_t)       A: [D → D·V] (no bias), reshaped to [D, V]
    logits_t    = s_t W_t                      s_t: the T5 decoder's state at t (scaled as the head scales it)

computed without building W_t: s_t E_t^T + Σ_ij s_t[i] A[j, i, v] g_t[j].

In decoding the prefix's embeddings are kept in the decode cache (`PawaCache`, a row per beam: the search
reorders it with the network's cache) and the adaptor reads them at each step, so a beam's logits are the ones
teacher forcing gives for its prefix (tested).

`nci_objective`: the docid cross-entropy of two forward passes with independent dropout, plus `alpha` times
the symmetric KL between their output distributions at every docid position (½(KL(p‖q) + KL(q‖p)), summed over
the codes, averaged over positions; rows weighted by `batch["weights"]` when given) — the consistency regularisation of NCI's paper. NCI's released code runs a
contrastive loss between the two passes' decoder states instead (an override of its R-Drop setting):
`nci_objective.consistency = "contrast"` (`released.py`).

Differences from NCI's released code (solidsea98/Neural-Corpus-Indexer-NCI @ a607ed3), on purpose; `released.py`
reproduces it (`NciReleasedRetriever`, `NciFlatHead`, `NciDocids`, checked against their code by `parity.py`):
* docids: here L positions × V codes of any codebook scheme, fixed length, no end token, softmax over V; theirs a
  flat vocabulary of V·T + 2 tokens (start/padding 0, end 1), variable-length k-means paths ended by the end token,
  softmax over position t's codes and the end token;
* the adapted weight: here one A [D, D, V] shared by the positions; theirs one column per (position, code), and
  the start input is a row of their docid table (here the start token's text embedding);
* the adaptor: here no dropout and Flax's norm epsilon 1e-6; theirs PyTorch's dropout 0.1 and 1e-5;
* the T5: theirs (transformers 3.4) has a position bias in the decoder's cross-attention (`T5Config.
  cross_attention_bias`);
* the consistency term (above); their second pass reads a corrupted copy of the query (the batch's
  "augmented_inputs" when given) and half their batches drop 10% of the input tokens (not built);
* search: theirs a length penalty of 0.8 over the end-token-terminated docids (`NciReleasedRetriever`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import flax
import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from gr_jax.methods.api import CodebookHead, Count, GenerativeRetriever, share_encoder, t5


class AdaptorLayer(nn.Module):
    """A post-LN transformer decoder layer (PyTorch's TransformerDecoderLayer): causal self-attention, attention
    to the memory, a ReLU feed-forward; `dropout` (PyTorch's: on the attention weights and after each sub-layer,
    and inside the feed-forward) and the norms' `eps` (PyTorch's 1e-5; Flax's 1e-6 here by default)."""

    heads: int
    ffn: int
    eps: float = 1e-6
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x_BxTxD, memory_Bx1xD, mask_Bx1xTxT, deterministic: bool = True):
        d = x_BxTxD.shape[-1]
        att = lambda name: nn.MultiHeadDotProductAttention(  # noqa: E731
            self.heads, qkv_features=d, dropout_rate=self.dropout, deterministic=deterministic, name=name)
        drop = lambda y: nn.Dropout(self.dropout)(y, deterministic=deterministic)  # noqa: E731
        norm = lambda name: nn.LayerNorm(epsilon=self.eps, name=name)  # noqa: E731
        x = norm("self_norm")(x_BxTxD + drop(att("self_attention")(x_BxTxD, x_BxTxD, mask=mask_Bx1xTxT)))
        x = norm("memory_norm")(x + drop(att("memory_attention")(x, memory_Bx1xD)))
        h = nn.Dense(d, name="ffn_out")(drop(jax.nn.relu(nn.Dense(self.ffn, name="ffn_in")(x))))
        return norm("ffn_norm")(x + drop(h))


class Adaptor(nn.Module):
    """prefix embeddings [B, T, D] → g [B, T, D]; g_t depends on positions ≤ t only."""

    layers: int
    heads: int
    ffn: int
    eps: float = 1e-6
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x_BxTxD, deterministic: bool = True):
        B, T, D = x_BxTxD.shape
        memory = self.param("memory", nn.initializers.uniform(1.0), (1, 1, D))
        mask = nn.make_causal_mask(jnp.ones((B, T), jnp.int32))
        x = x_BxTxD.astype(jnp.float32)
        for i in range(self.layers):
            x = AdaptorLayer(self.heads, self.ffn, self.eps, self.dropout, name=f"layer_{i}")(
                x, jnp.broadcast_to(memory, (B, 1, D)), mask, deterministic)
        return x


@gin.configurable
@dataclasses.dataclass(frozen=True)
class PawaHead(CodebookHead):
    """`CodebookHead` with the prefix-aware weight-adaptive projection (module docstring)."""

    adaptor_layers: Count = 4
    adaptor_heads: Count = 8
    adaptor_ffn: Count = 2048
    adapt_init_std: float = 0.02
    kind = "codebook"
    candidate_logits = False

    def adaptor(self) -> Adaptor:
        return Adaptor(self.adaptor_layers, self.adaptor_heads, self.adaptor_ffn)

    def init_params(self, config: t5.T5Config, key) -> dict:
        k1, k2, k3 = jax.random.split(key, 3)
        D = config.d_model
        if D % self.adaptor_heads:
            raise ValueError(f"PawaHead.adaptor_heads {self.adaptor_heads} does not divide d_model {D}")
        out = super().init_params(config, k1)
        out["adaptor"] = self.adaptor().init(k2, jnp.zeros((1, self.length, D)))["params"]
        out["adapt"] = self.adapt_init_std * jax.random.normal(k3, (D, D, self.codes), jnp.float32)  # A[j, i, v]
        return out

    def adapted(self, params, x_BxTxD):
        """g [B, T, D] for the prefix embeddings x."""
        return self.adaptor().apply({"params": params["head"]["adaptor"]}, x_BxTxD)

    def pawa_logits(self, network, params, hidden_BxTxD, g_BxTxD, positions_T):
        """logits [B, T, V] = s_t E_t^T + Σ_ij s_t[i] A[j, i, v] g_t[j], s = the scaled decoder states."""
        s = self._scale(network, hidden_BxTxD).astype(jnp.float32)
        table = self._table(params)[jnp.clip(positions_T, 0, self.length - 1)]  # [T, V, D]
        base = jnp.einsum("btd,tvd->btv", s, table)
        adapt = jnp.einsum("bti,jiv,btj->btv", s, params["head"]["adapt"], g_BxTxD.astype(jnp.float32))
        return base + adapt


def target_log_probs(logits_BxTxV, targets_BxT):
    """(log p(target) [B, T], argmax hit [B, T]) of teacher-forced logits."""
    logp = jax.nn.log_softmax(logits_BxTxV, axis=-1)
    target_logp = jnp.take_along_axis(logp, targets_BxT[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return target_logp, jnp.argmax(logits_BxTxV, axis=-1) == targets_BxT


@flax.struct.dataclass
class PawaCache:
    """The network's decode cache plus the prefix's input embeddings, a row per beam ([R, L, D])."""

    inner: t5.DecodeCache
    prefix: jax.Array

    @property
    def step_index(self):
        return self.inner.step_index


@gin.configurable
class NciRetriever(GenerativeRetriever):
    """A `GenerativeRetriever` whose codebook head is made a `PawaHead` (its adaptor settings from gin)."""

    def __init__(self, config, head=None, score_mode: str = "log_softmax", pawa: Optional[PawaHead] = None,
                 **kwargs):
        if not isinstance(head, CodebookHead):
            raise ValueError("NCI's PAWA decoder needs codebook docids (position-specific codes, e.g. "
                             "SemanticDocids); this docid scheme gives a text head")
        pawa = pawa if pawa is not None else PawaHead()
        head = dataclasses.replace(pawa, length=head.length, codes=head.codes, init_std=head.init_std)
        super().__init__(config, head, score_mode, **kwargs)

    def describe(self) -> str:
        return f"NciRetriever(score_mode={self.score_mode!r})"

    # -- training: teacher forcing with the adapted projection --------------------------------------------
    def token_logits(self, params, inputs_BxL, targets_BxT, dropout_rng=None):
        decoder_inputs = t5.shift_right(targets_BxT, self.config.decoder_start_token_id)
        hidden = self._hidden(params, inputs_BxL, decoder_inputs, dropout_rng)
        g = self.head.adapted(params, self.head.embed(self.network, params, decoder_inputs))  # the prefix's inputs
        return self.head.pawa_logits(self.network, params, hidden, g, jnp.arange(targets_BxT.shape[1]))

    def token_log_probs(self, params, inputs_BxL, targets_BxT, dropout_rng=None):
        return target_log_probs(self.token_logits(params, inputs_BxL, targets_BxT, dropout_rng), targets_BxT)

    # -- decoding: the prefix rides in the cache ----------------------------------------------------------
    def _cache(self, params, query_tokens, max_length: int):
        inner = super()._cache(params, query_tokens, max_length)
        rows = query_tokens.shape[0]
        return PawaCache(inner, jnp.zeros((rows, self.head.length, self.config.d_model), jnp.float32))

    def _step(self, params, cache: PawaCache, tokens_B):
        head, index = self.head, cache.step_index
        table = head._table(params)
        start = self.network.apply({"params": params["network"]}, tokens_B, method="embed")
        prev = table[jnp.clip(index - 1, 0, head.length - 1), jnp.clip(tokens_B, 0, head.codes - 1)]
        x_BxD = jnp.where(index == 0, start, prev.astype(start.dtype))
        prefix = jax.lax.dynamic_update_slice(cache.prefix, x_BxD[:, None, :].astype(jnp.float32),
                                              (0, jnp.minimum(index, head.length - 1), 0))
        hidden, inner = self.network.apply({"params": params["network"]}, cache.inner, x_BxD,
                                           method="decode_step_embedded")
        g = head.adapted(params, prefix)  # the adaptor is causal: row `index` sees the prefix so far
        g_t = jax.lax.dynamic_index_in_dim(g, jnp.minimum(index, head.length - 1), axis=1, keepdims=True)
        logits = head.pawa_logits(self.network, params, hidden[:, None, :], g_t, index[None])[:, 0]
        return logits, PawaCache(inner, prefix)

    @staticmethod
    def _tile(cache: PawaCache, n: int):
        return PawaCache(share_encoder(cache.inner, n), jnp.repeat(cache.prefix, n, axis=0))


def _docid_logp(model, params, batch, rng):
    logits = model.token_logits(params, batch["inputs"], batch["targets"], rng)
    return jax.nn.log_softmax(logits, axis=-1)


def contrast(s_NxTxD, pairs: int):
    """NCI's released "Contrast" term (`released.py`'s docstring) over N = 2·`pairs` rows: per position t, a
    softmax over the other rows of s_t·s_t'ᵀ, a cross-entropy applied to those probabilities with row a's positive
    a ± pairs, the mean over (position, row)."""
    N = s_NxTxD.shape[0]
    sim = jnp.einsum("atd,btd->tab", s_NxTxD, s_NxTxD) - 1e9 * jnp.eye(N)[None]
    p = jax.nn.softmax(sim, axis=-1)
    positive = jnp.concatenate([jnp.arange(pairs, N), jnp.arange(0, pairs)])
    picked = jnp.take_along_axis(p, jnp.broadcast_to(positive[None, :, None], (p.shape[0], N, 1)), axis=-1)[..., 0]
    return (jax.nn.logsumexp(p, axis=-1) - picked).mean()


def contrast_objective(model, params, batch, dropout_rng, alpha: float):
    """`nci_objective(consistency="contrast")`: one pass over [queries; second inputs] (`released.py`'s docstring);
    `model.logits_and_states` gives the masked logits and the scaled decoder states."""
    inputs, targets = batch["inputs"], batch["targets"]
    second = batch.get("augmented_inputs", inputs)
    B = inputs.shape[0]
    width = max(inputs.shape[1], second.shape[1])
    pad = lambda x: jnp.pad(x, ((0, 0), (0, width - x.shape[1])))  # noqa: E731
    both_in = jnp.concatenate([pad(inputs), pad(second)])
    both_t = jnp.concatenate([targets, targets])
    logits, s = model.logits_and_states(params, both_in, both_t, dropout_rng)
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, both_t[..., None].astype(jnp.int32), axis=-1)[..., 0]
    mask = model.head.target_mask(both_t).astype(jnp.float32)
    tokens = mask.sum()
    ce = -(picked * mask).sum() / jnp.maximum(tokens, 1.0)
    dist = contrast(s, B)
    loss = ce + alpha * dist
    hit = ((jnp.argmax(logits[:B], -1) == targets) | (mask[:B] == 0)).all(-1)
    n = jnp.float32(B)
    return loss, {"loss": (ce * tokens, tokens), "consistency_contrast": (dist * n, n),
                  "docid_accuracy": (hit.sum().astype(jnp.float32), n)}


CONSISTENCY = ("kl", "contrast")


@gin.configurable
def nci_objective(model, params, batch, dropout_rng=None, alpha: float = 0.15, consistency: str = "kl"):
    """Cross-entropy of two dropout passes + alpha · symmetric KL between them (module docstring); without a
    dropout key (evaluation) one pass and no KL. `consistency = "contrast"`: NCI's released loss instead (one pass
    over [queries; batch["augmented_inputs"] or the queries], their "Contrast" term on the decoder states:
    `methods/nci/released.py`)."""
    if consistency not in CONSISTENCY:
        raise ValueError(f"nci_objective.consistency = {consistency!r}: one of {CONSISTENCY}")
    if consistency == "contrast" and dropout_rng is not None:
        return contrast_objective(model, params, batch, dropout_rng, alpha)
    targets = batch["targets"]
    weights = batch.get("weights")  # per-row weights, as the default docid cross-entropy reads them
    row_w = jnp.ones(targets.shape[0], jnp.float32) if weights is None else weights.astype(jnp.float32)
    mask = model.head.target_mask(targets).astype(jnp.float32) * row_w[:, None]
    tokens = mask.sum()
    pick = lambda logp: jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]  # noqa
    if dropout_rng is None:
        logp = _docid_logp(model, params, batch, None)
        ce = -(pick(logp) * mask).sum() / jnp.maximum(tokens, 1.0)
        return ce, {"loss": (ce * tokens, tokens)}
    r1, r2 = jax.random.split(dropout_rng)
    p, q = _docid_logp(model, params, batch, r1), _docid_logp(model, params, batch, r2)
    ce_sum = -((pick(p) + pick(q)) * mask).sum() / 2
    kl = 0.5 * ((jnp.exp(p) * (p - q)).sum(-1) + (jnp.exp(q) * (q - p)).sum(-1))  # [B, T]
    kl_sum = (kl * mask).sum()
    loss = (ce_sum + alpha * kl_sum) / jnp.maximum(tokens, 1.0)
    hit = ((jnp.argmax(p, -1) == targets) | (mask == 0)).all(-1)
    return loss, {"loss": (ce_sum, tokens), "consistency_kl": (kl_sum, tokens),
                  "docid_accuracy": ((hit * row_w).sum(), row_w.sum())}
