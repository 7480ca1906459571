"""NCI as its authors' released code computes it (solidsea98/Neural-Corpus-Indexer-NCI, NCI_model/: a T5 of
transformers 3.4.0 with the PAWA decoder, `train.sh`'s settings), to load their checkpoints and check parity.

The docid vocabulary is flat (`NciFlatHead`, a text-kind head with a vocabulary of its own): 0 is the padding and
the decoder's start, 1 ends a docid, code c at position t is token 2 + t·V + c, so Vd = V·T + 2 tokens for T
positions of V codes; docids are variable-length k-means paths followed by the end token (`NciDocids`). One
table E [Vd, D] is the decoder's input embedding and, tied, the output projection; PAWA adds to it a weight adapted
to the prefix, one per (position, code) column:

    g_t       = Adaptor(E[x_0..x_t])           PyTorch's TransformerDecoder (post-LN, eps 1e-5, dropout 0.1 also on
                                               the attention weights) over the prefix, reading one learned vector
    logits_t  = s_t·E[v] + Σ_ij s_t[i] A[i, v, j] g_t[j]     s_t = the decoder state × d_model^-0.5, A [D, Vd, D]
    + a mask: position t's codes and the end token (training: the last position T − 1 the end token only)

The T5 has transformers 3.x's position bias in the decoder's cross-attention (`T5Config.cross_attention_bias`).
The loss of `nci_objective(consistency="contrast")`: one pass over the 2B rows [queries; second inputs], token
cross-entropy over both halves (end tokens included) + α · their "Contrast" term on the scaled decoder states:
per position t, a softmax over the other rows of s_t·s_t'ᵀ (self masked by −1e9), then a cross-entropy applied to
those *probabilities* with row a's positive a ± B, averaged over all T·2B (row, position) pairs, padding included.
(Their KL option is dead code: modeling_t5.py hard-sets "Contrast".) The second inputs are the batch's
"augmented_inputs" when the batch has them (theirs: a corrupted span of the query), else the queries again.

Search: the network's constrained beam search over the docids' prefix tree, log-softmax over the masked vocabulary
(their `generate`: codes + end token), length penalty 0.8 (`NciReleasedRetriever.length_penalty`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import gin
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.api import (Count, DocidScheme, Fraction, DocidTable, DocidTokenSpace, FitContext, GenerativeRetriever,
                                initial, share_encoder, t5)
from gr_jax.methods.api import refusal_text
from gr_jax.methods.nci.model import Adaptor, PawaCache, target_log_probs

START, END = 0, 1


@gin.configurable
@dataclasses.dataclass(frozen=True)
class NciFlatHead:
    """NCI's released docid head (module docstring): V `codes` per position, T `positions`, the adaptor's
    settings (train.sh: 4 layers; PyTorch's defaults: 8 heads, 2048 feed-forward, dropout 0.1, eps 1e-5)."""

    codes: Count = 30
    positions: Count = 10
    adaptor_layers: Count = 4
    adaptor_heads: Count = 8
    adaptor_ffn: Count = 2048
    adaptor_dropout: Fraction = 0.1
    kind = "text"
    candidate_logits = False

    @property
    def vocab(self) -> int:
        return self.codes * self.positions + 2

    def token(self, position: int, code: int) -> int:
        return 2 + position * self.codes + code

    def adaptor(self) -> Adaptor:
        return Adaptor(self.adaptor_layers, self.adaptor_heads, self.adaptor_ffn, eps=1e-5,
                       dropout=self.adaptor_dropout)

    def init_params(self, config: t5.T5Config, key) -> dict:
        """As their code initialises: E ~ N(0, 1), A ~ U(±1/√D) (PyTorch's Linear), the adaptor's memory U[0, 1)."""
        k1, k2, k3 = jax.random.split(key, 3)
        D, V = config.d_model, self.vocab
        if D % self.adaptor_heads:
            raise ValueError(f"NciFlatHead.adaptor_heads {self.adaptor_heads} does not divide d_model {D}")
        bound = 1.0 / math.sqrt(D)
        return {"decode_embeddings": jax.random.normal(k1, (V, D), jnp.float32),
                "adaptor": self.adaptor().init(k2, jnp.zeros((1, 2, D)))["params"],
                "adapt": jax.random.uniform(k3, (D, V, D), jnp.float32, -bound, bound)}

    def output_size(self, config) -> int:
        return self.vocab

    def target_mask(self, targets_BxT):
        return targets_BxT != START

    def embed(self, network, params, tokens):
        return params["head"]["decode_embeddings"][tokens]

    def mask(self, rows: int, training: bool, first: int = 0):
        """The additive mask [rows, Vd] of positions first .. first + rows − 1: position t's codes and the end
        token (in training, from position T − 1 on, the end token only)."""
        t = jnp.minimum(first + jnp.arange(rows), self.positions - 1)[:, None]
        v = jnp.arange(self.vocab)[None, :]
        code_ok = (v >= 2 + t * self.codes) & (v < 2 + (t + 1) * self.codes)
        if training:
            code_ok &= t < self.positions - 1
        return jnp.where(code_ok | (v == END), 0.0, -1e9).astype(jnp.float32)

    def adapted(self, params, x_BxTxD, dropout_rng=None):
        rngs = {} if dropout_rng is None else {"dropout": dropout_rng}
        return self.adaptor().apply({"params": params["head"]["adaptor"]}, x_BxTxD, dropout_rng is None, rngs=rngs)

    def pawa_logits(self, config, params, hidden_BxTxD, g_BxTxD):
        """s_t·E[v] + s_tᵀ A[:, v, :] g_t for every v, s = the states × d_model^-0.5 (always, as theirs)."""
        s = hidden_BxTxD.astype(jnp.float32) * config.d_model ** -0.5
        E = params["head"]["decode_embeddings"].astype(jnp.float32)
        base = jnp.einsum("btd,vd->btv", s, E)
        adapt = jnp.einsum("bti,ivj,btj->btv", s, params["head"]["adapt"].astype(jnp.float32),
                           g_BxTxD.astype(jnp.float32), optimize=True)
        return base + adapt, s


@gin.configurable
class NciReleasedRetriever(GenerativeRetriever):
    """NCI's released model (module docstring): a `NciFlatHead` on a T5 with the cross-attention position bias;
    beams scored as theirs (length penalty 0.8). `decoder_padding_mask` (default True, as their training runs):
    in training, the padded target positions (label 0) are hidden from the decoder's self-attention as keys (their
    `decoder_attention_mask = labels != 0`, main_models.py); False keeps them visible, which leaves the real
    positions' logits as they are and changes the states of the padded positions, which their Contrast term reads
    (by ~1e-6 to ~1e-4 of the loss, depending on the shape)."""

    def __init__(self, config, head=None, score_mode: str = "log_softmax", length_penalty: float = 0.8,
                 flat: NciFlatHead | None = None, decoder_padding_mask: bool = True, **kwargs):
        flat = flat if flat is not None else (head if isinstance(head, NciFlatHead) else NciFlatHead())
        super().__init__(config, flat, score_mode, length_penalty, **kwargs)
        self.decoder_padding_mask = bool(decoder_padding_mask)

    def describe(self) -> str:
        return (f"NciReleasedRetriever(score_mode={self.score_mode!r}, length_penalty={self.length_penalty}, "
                f"decoder_padding_mask={self.decoder_padding_mask})")

    def logits_and_states(self, params, inputs_BxL, targets_BxT, dropout_rng=None):
        """Teacher forcing → (masked logits [B, T, Vd], scaled decoder states [B, T, D]); with a dropout key the
        training mask and dropout (network and adaptor), else the evaluation mask."""
        training = dropout_rng is not None
        net_rng = ad_rng = None
        if training:
            net_rng, ad_rng = jax.random.split(dropout_rng)
        decoder_inputs = t5.shift_right(targets_BxT, START)
        keys = targets_BxT != 0 if training and self.decoder_padding_mask else None  # their decoder_attention_mask
        hidden = self._hidden(params, inputs_BxL, decoder_inputs, net_rng, keys)
        g = self.head.adapted(params, self.head.embed(self.network, params, decoder_inputs), ad_rng)
        logits, s = self.head.pawa_logits(self.config, params, hidden, g)
        return logits + self.head.mask(targets_BxT.shape[1], training)[None], s

    def token_logits(self, params, inputs_BxL, targets_BxT, dropout_rng=None):
        return self.logits_and_states(params, inputs_BxL, targets_BxT, dropout_rng)[0]

    def token_log_probs(self, params, inputs_BxL, targets_BxT, dropout_rng=None):
        return target_log_probs(self.token_logits(params, inputs_BxL, targets_BxT, dropout_rng), targets_BxT)

    # -- decoding: the prefix's embeddings ride in the cache ------------------------------------------------
    def _cache(self, params, query_tokens, max_length: int):
        inner = super()._cache(params, query_tokens, max_length)
        return PawaCache(inner, jnp.zeros((query_tokens.shape[0], max_length, self.config.d_model), jnp.float32))

    def _step(self, params, cache: PawaCache, tokens_B):
        head, index = self.head, cache.step_index
        x_BxD = head.embed(self.network, params, tokens_B)
        slot = jnp.minimum(index, cache.prefix.shape[1] - 1)
        prefix = jax.lax.dynamic_update_slice(cache.prefix, x_BxD[:, None, :].astype(jnp.float32), (0, slot, 0))
        hidden, inner = self.network.apply({"params": params["network"]}, cache.inner, x_BxD.astype(jnp.float32),
                                           method="decode_step_embedded")
        g = jax.lax.dynamic_index_in_dim(head.adapted(params, prefix), slot, axis=1, keepdims=True)
        logits, _ = head.pawa_logits(self.config, params, hidden[:, None, :], g)
        return logits[:, 0] + head.mask(1, False, index)[0], PawaCache(inner, prefix)

    @staticmethod
    def _tile(cache: PawaCache, n: int):
        return PawaCache(share_encoder(cache.inner, n), jnp.repeat(cache.prefix, n, axis=0))


# ----------------------------------------------------------------------------------------------------------
# docids and checkpoints
# ----------------------------------------------------------------------------------------------------------


@gin.configurable
@dataclasses.dataclass
class NciDocids(DocidScheme):
    """NCI's docids as the dataset gives them (NQ320k in NCI's layout: the "a-b-c" k-means paths of
    nq_*_doc_newid.tsv, `extras["semantic_ids"]`), in NCI's flat vocabulary: 2 + t·V + c per code, then the end
    token. V = `codes`, T = `positions` (train.sh: 30 and 10, the end token included)."""

    codes: Count = 30
    positions: Count = 10
    name = "nci"
    ids: dict = dataclasses.field(default_factory=dict)

    def space(self, vocab_size: int) -> DocidTokenSpace:
        return DocidTokenSpace("text", self.codes * self.positions, offset=2)

    def fit(self, corpus, context: FitContext = FitContext()) -> "NciDocids":
        semantic = (context.extras or {}).get("semantic_ids")
        if not semantic:
            raise ValueError("NciDocids: the dataset gives no semantic ids; NCI's docids come with NQ320k in NCI's "
                             "layout (MIXTURE_OR_TASK_NAME = 'nq320k_nci': nq_*_doc_newid.tsv)")
        self.ids = {d: list(map(int, p)) for d, p in semantic.items()}
        return self

    def assign(self, corpus, rows=None, embeddings=None) -> DocidTable:
        rows = np.arange(len(corpus)) if rows is None else np.asarray(rows, np.int64)
        seqs = []
        for r in rows:
            doc = corpus.doc_ids[int(r)]
            path = self.ids.get(doc)
            if path is None:
                raise ValueError(f"NciDocids: document {doc!r} has no semantic id in the dataset (NCI's "
                                 f"nq_*_doc_newid.tsv files give one per judged document)")
            if len(path) > self.positions - 1 or any(not 0 <= c < self.codes for c in path):
                raise ValueError(f"NciDocids: document {doc!r}'s semantic id {path} does not fit "
                                 f"{self.positions - 1} positions of {self.codes} codes (NciDocids.positions/codes)")
            seqs.append([2 + t * self.codes + c for t, c in enumerate(path)])  # the table appends the end token
        return DocidTable.from_lists(seqs, rows, self.space(0))

    def state(self):
        return {"codes": self.codes, "positions": self.positions, "ids": self.ids}, {}

    def load_state(self, meta, arrays) -> None:
        self.codes, self.positions = int(meta["codes"]), int(meta["positions"])
        self.ids = {d: list(map(int, p)) for d, p in meta["ids"].items()}


def params_from_nci(tensors: dict, config: t5.T5Config, head: NciFlatHead, source: str = "NCI checkpoint") -> dict:
    """Their state dict (keys as T5ForConditionalGeneration of NCI_model/transformers names them; a Lightning
    checkpoint's "model." prefix removed) → our {"network", "head"}. Unknown or missing keys are refused by name."""
    from gr_jax.methods.api import t5_convert

    tensors = {k[len("model."):] if k.startswith("model.") else k: np.asarray(v) for k, v in tensors.items()}
    network = {k: v for k, v in tensors.items() if not _is_head_key(k)}
    net = t5_convert.params_from_hf(network, config, source)
    E = tensors["decode_embeddings.weight"]
    D, V = config.d_model, head.vocab
    if E.shape != (V, D):
        raise ValueError(f"{source}: decode_embeddings.weight is {E.shape}, the head expects [{V}, {D}] "
                         f"(NciFlatHead.codes × positions + 2 = Vd)")
    for alias in ("lm_head.weight", "decoder.embed_tokens.weight"):
        if alias in tensors and not np.array_equal(tensors[alias], E):
            raise ValueError(f"{source}: {alias} differs from decode_embeddings.weight (their tied table)")
    adaptor = {"memory": tensors["adaptor_embeddings"].reshape(1, 1, D)}
    H = head.adaptor_heads
    for i in range(head.adaptor_layers):
        p = f"adaptor.layers.{i}."
        layer = {}
        for ours, theirs in (("self_attention", "self_attn"), ("memory_attention", "multihead_attn")):
            w, b = tensors[p + f"{theirs}.in_proj_weight"], tensors[p + f"{theirs}.in_proj_bias"]
            att = {}
            for j, name in enumerate(("query", "key", "value")):
                att[name] = {"kernel": w[j * D:(j + 1) * D].T.reshape(D, H, D // H),
                             "bias": b[j * D:(j + 1) * D].reshape(H, D // H)}
            att["out"] = {"kernel": tensors[p + f"{theirs}.out_proj.weight"].T.reshape(H, D // H, D),
                          "bias": tensors[p + f"{theirs}.out_proj.bias"]}
            layer[ours] = att
        layer["ffn_in"] = {"kernel": tensors[p + "linear1.weight"].T, "bias": tensors[p + "linear1.bias"]}
        layer["ffn_out"] = {"kernel": tensors[p + "linear2.weight"].T, "bias": tensors[p + "linear2.bias"]}
        for ours, theirs in (("self_norm", "norm1"), ("memory_norm", "norm2"), ("ffn_norm", "norm3")):
            layer[ours] = {"scale": tensors[p + f"{theirs}.weight"], "bias": tensors[p + f"{theirs}.bias"]}
        adaptor[f"layer_{i}"] = layer
    extra = sorted(k for k in tensors if k.startswith("adaptor.layers.") and
                   int(k.split(".")[2]) >= head.adaptor_layers)
    if extra:
        raise ValueError(f"{source}: the adaptor has more layers than NciFlatHead.adaptor_layers = "
                         f"{head.adaptor_layers} ({extra[0]}); set it to the checkpoint's")
    A = tensors["adaptor_linear.weight"]
    if A.shape != (D * V, D):
        raise ValueError(f"{source}: adaptor_linear.weight is {A.shape}, expected [{D * V}, {D}]")
    head_params = {"decode_embeddings": E, "adaptor": adaptor, "adapt": A.reshape(D, V, D)}
    return {"network": net, "head": jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), head_params)}


# ----------------------------------------------------------------------------------------------------------
# their checkpoint as INITIAL_CHECKPOINT_PATH
# ----------------------------------------------------------------------------------------------------------

NCI_ALLOWED = ("argparse.Namespace", "collections.OrderedDict", "collections.defaultdict")


def is_nci_checkpoint(path) -> bool:
    """NCI's released checkpoints: a PyTorch Lightning `.ckpt` file (its `state_dict`, keys "model.…")."""
    return Path(path).is_file() and Path(path).suffix == ".ckpt"


@functools.lru_cache(maxsize=1)
def _read(path: str, stamp: tuple) -> dict:
    import argparse
    import collections
    import pickle

    try:
        import torch
    except ImportError:
        raise ValueError(f"{path}: reading NCI's checkpoint needs torch (pip install 'gr_jax[torch]')") from None
    try:
        with torch.serialization.safe_globals([argparse.Namespace, collections.OrderedDict, collections.defaultdict]):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        what = refusal_text(path, [argparse.Namespace, collections.OrderedDict, collections.defaultdict], str(e))
        raise ValueError(f"{path}: refused: it pickles {what}, which NCI's checkpoint does not need (allowed: "
                         f"{', '.join(NCI_ALLOWED)})") from None
    except Exception as e:  # torch raises many types for a corrupt file
        raise ValueError(f"{path}: cannot read as NCI's checkpoint ({type(e).__name__}: {e})") from None
    state = obj.get("state_dict", obj) if isinstance(obj, dict) else None
    if not isinstance(state, dict) or not any(k.endswith("decode_embeddings.weight") for k in state):
        raise ValueError(f"{path}: not NCI's checkpoint (no decode_embeddings.weight in its state dict)")
    out = {}
    for k, v in state.items():
        if not hasattr(v, "detach"):
            raise ValueError(f"{path}: state dict entry {k!r} is a {type(v).__name__}, not a tensor")
        out[k[len("model."):] if k.startswith("model.") else k] = v.detach().to(torch.float32).numpy()
    return out


def read_nci(path) -> dict:
    """Their state dict (numpy, the "model." prefix removed), read once per file version."""
    p = Path(path)
    st = p.stat()
    return _read(str(p), (st.st_size, st.st_mtime_ns))


def nci_config(tensors: dict, source: str) -> t5.T5Config:
    """The T5 of their checkpoint from its tensors' shapes (v1.0: ReLU, the output scaled; the cross-attention
    bias of transformers 3.x)."""
    try:
        vocab, D = tensors["shared.weight"].shape
        heads = tensors["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].shape[1]
        buckets = tensors["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].shape[0]
        d_kv = tensors["encoder.block.0.layer.0.SelfAttention.q.weight"].shape[0] // heads
        d_ff = tensors["encoder.block.0.layer.1.DenseReluDense.wi.weight"].shape[0]
    except KeyError as e:
        raise ValueError(f"{source}: {e.args[0]} is missing; not NCI's T5") from None
    count = lambda stack: len({k.split(".")[2] for k in tensors if k.startswith(f"{stack}.block.")})  # noqa: E731
    return t5.T5Config(vocab_size=int(vocab), d_model=int(D), d_kv=int(d_kv), d_ff=int(d_ff),
                       num_layers=count("encoder"), num_decoder_layers=count("decoder"), num_heads=int(heads),
                       relative_attention_num_buckets=int(buckets), cross_attention_bias=True)


def _load_network(path):
    """(config, the T5's parameters); the head's are read by `_load_head`."""
    from gr_jax.methods.api import t5_convert

    tensors = read_nci(path)
    config = nci_config(tensors, str(path))
    network = {k: v for k, v in tensors.items() if not _is_head_key(k)}
    return config, t5_convert.params_from_hf(network, config, str(path))


def _is_head_key(k: str) -> bool:
    return k in ("decode_embeddings.weight", "lm_head.weight", "adaptor_embeddings", "adaptor_linear.weight",
                 "decoder.embed_tokens.weight") or k.startswith("adaptor.")


def _load_head(path, model) -> dict:
    if not isinstance(model.head, NciFlatHead):
        raise ValueError(f"INITIAL_CHECKPOINT_PATH {path} is NCI's checkpoint: its docid table and adaptor need "
                         f"prepare.model_fn = @NciReleasedRetriever (experiments/released/nci_nq320k.gin)")
    return params_from_nci(read_nci(path), model.config, model.head, str(path))["head"]


initial.register(initial.InitialLoader("NCI checkpoint", is_nci_checkpoint, _load_network, head=_load_head,
                                       priority=15))
