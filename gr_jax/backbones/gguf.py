"""Our reader of GGUF files (llama.cpp's format): header, metadata, tensor table, and numpy dequantization of
F32, F16, BF16, Q8_0, Q4_0 and Q4_1 — memory-mapped, no dependency beyond numpy.

Facts this relies on (format version 2 and 3, little-endian):
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
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from gr_jax.backbones.t5_convert import CheckpointError

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
