"""RIPOR's model, with a pretrained sentence encoder on the query side (the offline variant; RIPOR's own layout is
a T5 whose decoder states score the codes).

A query q (all-MiniLM-L6-v2: mean pooling, normalised; VOCABULARY = 'all-MiniLM-L6-v2') is decoded into the M
codes of a docid. Position l's state is

    h_l = q + W2_l · gelu(W1_l · [q; p_l] + b1_l) + b2_l,    p_l = Σ_{j<l} C_j[d_j]    (the prefix's reconstruction)

and code k scores ⟨h_l, C_l[k]⟩ (a raw logit), with C [M, K, D] the per-position code embeddings. A docid's score is
the sum of its raw logits (RIPOR's, and PAG's, additive score: score mode 'raw'). The "decoder" is this small
residual layer per position; W2 and b2 start at zero and C at the RQ codebooks (`RiporDocids`: "relevance-based
docid initialisation"), so before training h_l = q and a docid's score is Σ_l ⟨q, C_l[d_l]⟩ = ⟨q, the document's
reconstructed vector⟩: the model *is* dense retrieval over the RQ reconstructions (with beams enough to keep
every prefix, exactly; tests/methods/ripor).

Training (`loss_fn`):
  seq2seq      Σ_l cross-entropy of the target code over the K codes of position l, logits / `temperature`
               (RIPOR trains its T5 with cross-entropy on (document or query) → docid);
  rank         a batch that carries a negative docid and the dense teacher's margin (`objectives.RiporRankData`):
               RIPOR's prefix-oriented ranking loss (`prefix_rank_loss`, its `lng_knp`: MarginMSE at each prefix
               length of `prefix_lengths` with the teacher's margin times that length's factor, and at the full
               length) — the second phase, started from the seq2seq MODEL_DIR (ripor_minilm_rank.gin).
Ranking: constrained beam search over the docid prefix tree (`Searcher`, score mode 'raw'), each docid's
documents by the first beam that reaches it (collisions share its score).

Deviation from RIPOR, and the setting that selects it: the query side is a pretrained MiniLM with this residual
decoder (`t5.get_config.pretrained_encoder = 'all-MiniLM-L6-v2'`, `prepare.model_fn = @RiporRetriever`) because no
pretrained T5 is available offline; RIPOR's T5 (decoder start state as the dense vector) runs from
INITIAL_CHECKPOINT_PATH with an HF T5 directory (experiments/msmarco/ripor.gin)."""

from __future__ import annotations

import functools
from typing import Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from gr_jax.methods.api import (EOS_ID, PAD_ID, Capabilities, Count, Positive, Searcher, beam_search,
                                leaf_documents, load_sentence_encoder, rankers)
from gr_jax.methods.ripor.docids import unpack_codebooks
from gr_jax.methods.ripor.objectives import MARGIN_UNIT


@functools.lru_cache(maxsize=4)
def _encoder(spec: str):
    return load_sentence_encoder(spec)


def prefix_states(decoder: dict, q_BxD, prefix_BxMxD):
    """h [B, M, D] of every position from the query vectors and the prefixes' reconstructions (teacher forcing)."""
    x = jnp.concatenate([jnp.broadcast_to(q_BxD[:, None], prefix_BxMxD.shape), prefix_BxMxD], axis=-1)
    hidden = jax.nn.gelu(jnp.einsum("bmi,mih->bmh", x, decoder["w1"]) + decoder["b1"])
    return q_BxD[:, None] + jnp.einsum("bmh,mhd->bmd", hidden, decoder["w2"]) + decoder["b2"]


def docid_logits(params: dict, q_BxD, codes_BxM):
    """Raw logits [B, M, K] of every position's K codes, the prefixes being `codes_BxM` (teacher forcing)."""
    books = params["codes"]  # [M, K, D]: the output embeddings
    M = books.shape[0]
    chosen = params["inputs"][jnp.arange(M)[None, :], codes_BxM[:, :M]]  # [B, M, D]: I_l[d_l]
    prefix = jnp.cumsum(chosen, axis=1) - chosen  # Σ_{j<l}
    h = prefix_states(params["decoder"], q_BxD, prefix)
    return jnp.einsum("bmd,mkd->bmk", h, books)


def docid_scores(params: dict, q_BxD, codes_BxM):
    """The raw score of each prefix length [B, M]: column L−1 is Σ_{l<L} ⟨h_l, C_l[d_l]⟩ (the last column is the
    docid's score, what the beam search sums)."""
    logits = docid_logits(params, q_BxD, codes_BxM)
    M = params["codes"].shape[0]
    return jnp.cumsum(jnp.take_along_axis(logits, codes_BxM[:, :M, None], axis=-1)[..., 0], axis=1)


def prefix_rank_loss(scores_pos_BxM, scores_neg_BxM, margin_B, lengths, factors):
    """RIPOR's prefix-oriented ranking loss (its `lng_knp`): for each prefix length L of `lengths` (the full
    length M included, factor 1), the squared error between the model's margin at L, S_L(q, d⁺) − S_L(q, d⁻),
    and the teacher's margin scaled by that length's factor; summed over lengths, averaged over the batch ([B]
    per-row values returned for weighting)."""
    out = 0.0
    for L, f in zip(lengths, factors):
        diff = scores_pos_BxM[:, L - 1] - scores_neg_BxM[:, L - 1]
        out = out + (diff - f * margin_B) ** 2
    return out


def prefix_schedule(M: int, prefix_lengths, prefix_factors) -> tuple[list, list]:
    """The prefix lengths below M with their factors, then the full length M at factor 1."""
    lengths = [int(L) for L in prefix_lengths if int(L) < M] + [M]
    factors = [float(f) for L, f in zip(prefix_lengths, prefix_factors) if int(L) < M] + [1.0]
    return lengths, factors


def rank_objective(pos_BxM, neg_BxM, batch, prefix_lengths, prefix_factors):
    """(loss, metrics) of the ranking phase from the prefix scores of the positive and the negative docids: the
    batch's `margin` (integers of MARGIN_UNIT) and optional per-row `weights`; metrics loss and pair_accuracy
    (the positive's full score above the negative's)."""
    lengths, factors = prefix_schedule(pos_BxM.shape[1], prefix_lengths, prefix_factors)
    margin = batch["margin"][:, 0].astype(jnp.float32) * MARGIN_UNIT
    per_row = prefix_rank_loss(pos_BxM, neg_BxM, margin, lengths, factors)
    weights = batch.get("weights")
    w = jnp.ones(pos_BxM.shape[0], jnp.float32) if weights is None else weights.astype(jnp.float32)
    ordered = ((pos_BxM[:, -1] > neg_BxM[:, -1]) * w).sum()
    metrics = {"loss": ((per_row * w).sum(), w.sum()), "pair_accuracy": (ordered, w.sum())}
    return (per_row * w).sum() / jnp.maximum(w.sum(), 1.0), metrics


def check_prefixes(owner: str, prefix_lengths, prefix_factors) -> tuple[tuple, tuple]:
    if len(prefix_lengths) != len(prefix_factors) or any(int(L) < 1 for L in prefix_lengths):
        raise ValueError(f"{owner}.prefix_lengths {prefix_lengths} and prefix_factors {prefix_factors} must pair "
                         f"up, each length ≥ 1")
    return tuple(int(L) for L in prefix_lengths), tuple(float(f) for f in prefix_factors)


@gin.configurable
class RiporRetriever:
    """`config`: the run's network config; its `pretrained_encoder` names the query encoder. `temperature`: of the
    per-position softmax in training. `hidden`: width of each position's residual layer. `rank_weight`: the
    prefix-oriented ranking loss's weight (0: seq2seq only)."""

    ranker = rankers.FirstOccurrence()

    def __init__(self, config, head=None, score_mode: str = "raw", *, temperature: Positive = 0.05,
                 hidden: Count = 256, prefix_lengths: Sequence[int] = (1, 2),
                 prefix_factors: Sequence[float] = (0.75, 0.875)):
        spec = getattr(config, "pretrained_encoder", "")
        if not spec:
            raise ValueError("RiporRetriever reads queries with a pretrained sentence encoder: set "
                             "t5.get_config.pretrained_encoder = 'all-MiniLM-L6-v2' (prepare.network)")
        if score_mode != "raw":
            raise ValueError(f"RiporRetriever scores a docid by the sum of its raw logits (score mode 'raw'), got "
                             f"{score_mode!r}")
        self.config, self.head, self.score_mode, self.spec = config, head, score_mode, spec
        self.temperature, self.hidden = float(temperature), int(hidden)
        self.prefix_lengths, self.prefix_factors = check_prefixes("RiporRetriever", prefix_lengths, prefix_factors)
        self.encoder = _encoder(spec)
        self._books = None
        self._searchers: dict = {}

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities()

    def describe(self) -> str:
        return (f"RiporRetriever(encoder={self.spec!r}, temperature={self.temperature}, hidden={self.hidden}, "
                f"prefix_lengths={self.prefix_lengths}, prefix_factors={self.prefix_factors})")

    def decode_docids(self, params, doc_tokens):
        raise ValueError("RiporRetriever does not decode docids from documents: RiporDocids assigns them")

    # -- docids -------------------------------------------------------------------------------------------
    def use_docids(self, table) -> None:
        books = unpack_codebooks(table.constants)
        M, K, _ = books.shape
        if table.space.kind != "codebook" or table.space.length != M or table.space.size != K:
            raise ValueError(f"RiporRetriever: the docid table's space {table.space} is not the codebooks' "
                             f"{M} positions × {K} codes")
        self._books = books

    # -- parameters ---------------------------------------------------------------------------------------
    def init_params(self, seed: int = 0) -> dict:
        """MiniLM's weights, the code embeddings at the RQ centroids, and the residual layers at h_l = q."""
        if self._books is None:
            raise ValueError("RiporRetriever: no docid table yet (use_docids)")
        M, K, D = self._books.shape
        H = self.hidden
        w1 = jax.random.normal(jax.random.PRNGKey(seed), (M, 2 * D, H), jnp.float32) / np.sqrt(2 * D)
        copy = lambda x: jnp.array(x, copy=True)  # noqa: E731 — buffers of their own (training donates them)
        # output and input code embeddings both start at the centroids and are trained apart (RIPOR's untied
        # `list_output_embeds` / `list_decoder_embeds`)
        return {"encoder": jax.tree_util.tree_map(copy, self.encoder.params), "codes": copy(self._books),
                "inputs": copy(self._books),
                "decoder": {"w1": w1, "b1": jnp.zeros((M, H)), "w2": jnp.zeros((M, H, D)), "b2": jnp.zeros((M, D))}}

    def param_axes(self, params) -> dict:
        return jax.tree_util.tree_map(lambda x: P(), params)  # replicated: a small encoder and codebooks

    # -- the network --------------------------------------------------------------------------------------
    def encode(self, encoder_params, tokens_BxL) -> jax.Array:
        return self.encoder.encode_run_tokens(encoder_params, tokens_BxL, PAD_ID, EOS_ID)

    def loss_fn(self, params, batch, dropout_rng=None):
        """Seq2seq: Σ_l cross-entropy of the target codes (optional per-row `weights`); metrics loss, docid_accuracy
        (every code right) and code_accuracy. A batch with `negatives` and `margin` (`RiporRankData`) is the
        ranking phase instead: `prefix_rank_loss` at `prefix_lengths` and the full length."""
        M = params["codes"].shape[0]
        targets = batch["targets"][:, :M].astype(jnp.int32)
        q = self.encode(params["encoder"], batch["inputs"])
        if "negatives" in batch:
            return self._rank_loss(params, q, targets, batch)
        logits = docid_logits(params, q, targets) / self.temperature  # [B, M, K]
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0].sum(axis=1)  # [B]
        weights = batch.get("weights")
        w = jnp.ones(targets.shape[0], jnp.float32) if weights is None else weights.astype(jnp.float32)
        right = jnp.argmax(logits, axis=-1) == targets
        metrics = {"loss": ((nll * w).sum(), w.sum()),
                   "docid_accuracy": ((right.all(axis=1) * w).sum(), w.sum()),
                   "code_accuracy": ((right.mean(axis=1) * w).sum(), w.sum())}
        return (nll * w).sum() / jnp.maximum(w.sum(), 1.0), metrics

    def _rank_loss(self, params, q, targets, batch):
        M = params["codes"].shape[0]
        pos = docid_scores(params, q, targets)
        neg = docid_scores(params, q, batch["negatives"][:, :M].astype(jnp.int32))
        return rank_objective(pos, neg, batch, self.prefix_lengths, self.prefix_factors)

    # -- ranking ------------------------------------------------------------------------------------------
    def _cache(self, params, query_tokens_BxL, depth: int):
        q = self.encode(params["encoder"], query_tokens_BxL)
        B = q.shape[0]
        return {"q": q, "prefix": jnp.zeros_like(q), "level": jnp.zeros((B,), jnp.int32)}

    @staticmethod
    def _step(params, cache, tokens_R):
        """One level of the search: every row is at the same level (the search runs level by level)."""
        books = params["codes"]
        M, K, _ = books.shape
        level = cache["level"][0]
        previous = params["inputs"][jnp.maximum(level - 1, 0)][jnp.clip(tokens_R, 0, K - 1)]  # [R, D]: last code in
        prefix = cache["prefix"] + jnp.where(level > 0, 1.0, 0.0) * previous
        dec = jax.tree_util.tree_map(lambda a: a[jnp.minimum(level, M - 1)][None], params["decoder"])
        h = prefix_states(dec, cache["q"], prefix[:, None])[:, 0]
        logits = h @ books[jnp.minimum(level, M - 1)].T  # [R, K]
        return logits, {"q": cache["q"], "prefix": prefix, "level": cache["level"] + 1}

    @staticmethod
    def _tile(cache, n: int):
        return beam_search.tile_rows(cache, n, cache["q"].shape[0])

    def searcher(self, num_beams: int) -> Searcher:
        if num_beams not in self._searchers:
            self._searchers[num_beams] = Searcher(
                self._step, self._cache, start_token=0, eos_id=EOS_ID, vocab_size=int(self._books.shape[1]),
                num_beams=num_beams, score_mode="raw", tile_fn=self._tile)
        return self._searchers[num_beams]

    def rank(self, params, query_tokens_BxL, index, num_beams: int = 10):
        """(query, document row, score) of the documents of each query's `num_beams` best docids."""
        if self._books is None:
            raise ValueError("RiporRetriever: no docid table yet (use_docids)")
        res = self.searcher(num_beams).search(params, jnp.asarray(query_tokens_BxL), index.device())
        docs, valid = leaf_documents(index.device_payload(), jnp.where(res.valid, res.leaf_ids, -1))
        docs, valid, scores = jax.device_get((docs, valid, res.scores))
        return self.ranker(docs, valid, scores)
