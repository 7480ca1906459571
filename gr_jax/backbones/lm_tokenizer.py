"""A decoder-only LM's tokenizer: the byte-level BPE tokenizer a GGUF file describes in its metadata (tokens,
merges, GPT-2's split, control tokens as special tokens), built with the `tokenizers` library the way
transformers builds it for such files (`tokenizer_from_gguf` → `LMTokenizer`), and `LMVocabulary`: such a
tokenizer behind the library's `Vocabulary` protocol (fine-tuning an LM through the trainer).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from gr_jax.backbones.t5_convert import CheckpointError
from gr_jax.backbones.gguf import GGUFFile

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
