"""Token constants, vocabularies and docid token spaces: the leaf module that data/, docids/ and models/ all
import (it imports no network code).

* T5's special ids (`PAD_ID` 0 — also the decoder start token —, `EOS_ID` 1, `UNK_ID` 2);
* `SentencePieceVocabulary` (T5's SentencePiece model), `HFTokenizerVocabulary` (an HF tokenizer.json),
  `load_vocabulary`, `train_sentencepiece`;
* `DocidTokenSpace` — where docid tokens live, in two kinds:
  `"text"` — ids of the model vocabulary or placed above it (PAG-style `<docid_N>` tokens) and shared by
  every docid position; the model's embedding/output matrix is grown to hold them
  (`models.convert.grow_vocab`);
  `"codebook"` — a separate per-position codebook of L positions × V codes (NCI / RQ docids); position l,
  code c is row `l * V + c` of a docid head's own table, so the text vocabulary is untouched.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Optional, Protocol, Sequence

import numpy as np

from gr_jax.runtime.io_utils import read_json, write_bytes

log = logging.getLogger(__name__)

PAD_ID = 0  # T5: padding, also the decoder start token
EOS_ID = 1
UNK_ID = 2
T5_EXTRA_IDS = 100  # <extra_id_0> .. <extra_id_99> at the top of T5's text vocabulary


class Vocabulary(Protocol):
    pad_id: int
    eos_id: int
    unk_id: int

    @property
    def size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class SentencePieceVocabulary:
    """A SentencePiece model file plus T5's sentinel ids; ids are those of T5 (pad 0, eos 1, unk 2).

    `encode` does not append EOS; the data pipeline decides where sequences end.
    """

    pad_id = PAD_ID
    eos_id = EOS_ID
    unk_id = UNK_ID

    def __init__(self, model_file: str | os.PathLike, extra_ids: int = 0):
        import sentencepiece as spm

        self.model_file = Path(model_file)
        self.extra_ids = int(extra_ids)
        try:
            proto = self.model_file.read_bytes()
        except OSError as e:
            raise ValueError(f"{self.model_file}: cannot read SentencePiece model ({e.strerror})") from None
        self._proto = proto
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(proto)
        except Exception as e:  # sentencepiece raises RuntimeError or OSError depending on the build
            raise ValueError(f"{self.model_file}: not a SentencePiece model ({e})") from None
        specials = {"pad": (self._sp.pad_id(), PAD_ID), "eos": (self._sp.eos_id(), EOS_ID),
                    "unk": (self._sp.unk_id(), UNK_ID)}
        wrong = {k: got for k, (got, want) in specials.items() if got != want}
        if wrong:
            raise ValueError(f"{self.model_file}: special ids {wrong} differ from T5's pad=0 eos=1 unk=2; "
                             f"train it with --pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1")

    @property
    def base_size(self) -> int:
        return self._sp.GetPieceSize()

    @property
    def fingerprint(self) -> str:
        """Digest of the model file's bytes and the sentinel count: what a checkpoint records and checks."""
        return hashlib.blake2b(self._proto + f"|extra_ids={self.extra_ids}".encode(), digest_size=12).hexdigest()

    @property
    def size(self) -> int:
        return self.base_size + self.extra_ids

    def extra_id(self, n: int) -> int:
        """Id of `<extra_id_n>` (T5 counts them down from the top of the vocabulary)."""
        if not 0 <= n < self.extra_ids:
            raise ValueError(f"extra id {n} out of range (vocabulary has {self.extra_ids})")
        return self.size - 1 - n

    def encode(self, text: str) -> list[int]:
        return list(self._sp.EncodeAsIds(text))

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        if EOS_ID in ids:
            ids = ids[: ids.index(EOS_ID)]
        return self._sp.DecodeIds([i for i in ids if i != PAD_ID and i < self.base_size])

    def id_to_piece(self, i: int) -> str:
        if self.base_size <= i < self.size:
            return f"<extra_id_{self.size - 1 - i}>"
        return self._sp.IdToPiece(int(i))

    def piece_to_id(self, piece: str) -> Optional[int]:
        """The id of a piece (`▁python`, `<extra_id_0>`), None when the vocabulary has no such piece."""
        m = re.fullmatch(r"<extra_id_(\d+)>", piece)
        if m and self.extra_ids:
            n = int(m.group(1))
            return self.extra_id(n) if n < self.extra_ids else None
        i = int(self._sp.PieceToId(piece))
        return None if i == UNK_ID and piece != self._sp.IdToPiece(UNK_ID) else i


class _TokenizerFile:
    """What the vocabularies read from an HF `tokenizer.json` share: reading it, the size, decoding (up to the
    library's end id, without padding and special tokens) and the piece lookups."""

    pad_id = PAD_ID
    eos_id = EOS_ID

    def _read(self, tokenizer_json: str | os.PathLike) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ValueError(f"{tokenizer_json}: reading tokenizer.json needs the 'tokenizers' package "
                             f"(pip install 'gr_jax[torch]')") from None
        try:
            self._tok = Tokenizer.from_file(str(tokenizer_json))
        except Exception as e:  # tokenizers raises a bare Exception on parse errors
            raise ValueError(f"{tokenizer_json}: not a tokenizer.json ({e})") from None

    @property
    def size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        if EOS_ID in ids:
            ids = ids[: ids.index(EOS_ID)]
        return self._tok.decode([i for i in ids if i != PAD_ID], skip_special_tokens=True)

    def id_to_piece(self, i: int) -> str:
        return self._tok.id_to_token(int(i))

    def piece_to_id(self, piece: str) -> Optional[int]:
        return self._tok.token_to_id(piece)


class HFTokenizerVocabulary(_TokenizerFile):
    """An HF `tokenizer.json` (fast tokenizer) when no `spiece.model` is present; needs `tokenizers`. With
    `bos_token` (tokenizer_config.json's `add_bos_token` and `bos_token`, as BART's written by
    `backbones/bart_tokenizer`), `encode` starts every text with that token's id."""

    unk_id = UNK_ID

    def __init__(self, tokenizer_json: str | os.PathLike, bos_token: Optional[str] = None):
        self._read(tokenizer_json)
        for name, want in (("<pad>", PAD_ID), ("</s>", EOS_ID), ("<unk>", UNK_ID)):
            got = self._tok.token_to_id(name)
            if got != want:
                raise ValueError(f"{tokenizer_json}: {name} has id {got}, T5 expects {want}")
        self.bos_id = None if bos_token is None else self._tok.token_to_id(bos_token)
        if bos_token is not None and self.bos_id is None:
            raise ValueError(f"{tokenizer_json}: the bos_token {bos_token!r} of tokenizer_config.json is not a token")

    @property
    def fingerprint(self) -> str:
        text = self._tok.to_str() + ("" if self.bos_id is None else f"\nbos {self.bos_id}")
        return hashlib.blake2b(text.encode("utf-8"), digest_size=12).hexdigest()

    def encode(self, text: str) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return list(ids) if self.bos_id is None else [self.bos_id, *ids]


class WordPieceVocabulary(_TokenizerFile):
    """A BERT WordPiece `tokenizer.json` (a sentence-transformers encoder's, e.g. all-MiniLM-L6-v2): the text
    vocabulary of a network whose encoder is that BERT (`T5Config.pretrained_encoder`). Its [PAD] is id 0, the
    library's pad; the library's end id 1 is BERT's [unused0], a token the tokenizer never writes. `encode` adds
    no [CLS]/[SEP] (the encoder adds them around the tokens it reads). Uncased models lower-case: docids read
    in this vocabulary are compared lower-cased."""

    def __init__(self, tokenizer_json: str | os.PathLike):
        self._read(tokenizer_json)
        self._tok.no_truncation()
        self._tok.no_padding()
        if self._tok.token_to_id("[PAD]") != PAD_ID or self._tok.id_to_token(EOS_ID) != "[unused0]":
            raise ValueError(f"{tokenizer_json}: a BERT WordPiece vocabulary has [PAD] = 0 and [unused0] = 1; this "
                             f"one has [PAD] = {self._tok.token_to_id('[PAD]')}, id 1 = {self._tok.id_to_token(1)!r}")
        self.unk_id = self._tok.token_to_id("[UNK]")
        self.cls_id, self.sep_id = self._tok.token_to_id("[CLS]"), self._tok.token_to_id("[SEP]")

    @staticmethod
    def is_wordpiece(tokenizer_json: str | os.PathLike) -> bool:
        try:
            model = read_json(Path(tokenizer_json)).get("model", {})
        except (OSError, ValueError, AttributeError):
            return False
        return isinstance(model, dict) and model.get("type") == "WordPiece"

    @property
    def fingerprint(self) -> str:
        return hashlib.blake2b(self._tok.to_str().encode("utf-8"), digest_size=12).hexdigest()

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)


def train_sentencepiece(texts: Sequence[str], path: str | os.PathLike, vocab_size: int,
                        model_type: str = "unigram", character_coverage: float = 1.0) -> SentencePieceVocabulary:
    """Train a SentencePiece model with T5's special ids (pad 0, eos 1, unk 2, no bos) and write it to `path`.

    For corpora that come without a pretrained vocabulary (the demo corpus, tests). Single-threaded and
    seeded by the input order, so the same texts give the same model file. Written atomically.
    """
    import sentencepiece as spm
    import io

    texts = [t.replace("\n", " ") for t in texts if t and t.strip()]
    if not texts:
        raise ValueError("train_sentencepiece: no non-empty texts")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size,
                                   pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
                                   model_type=model_type, character_coverage=character_coverage,
                                   num_threads=1, minloglevel=2, input_sentence_size=0,
                                   shuffle_input_sentence=False, hard_vocab_limit=False)
    write_bytes(path, model.getvalue())
    return SentencePieceVocabulary(path)


def load_vocabulary(path: str | os.PathLike, extra_ids: int | None = None) -> Vocabulary:
    """A `.model` SentencePiece file, or an HF tokenizer directory (spiece.model or tokenizer.json).

    For a directory, the number of sentinel ids comes from `tokenizer_config.json` ("extra_ids"), else 100
    as in T5's released tokenizers, unless `extra_ids` is given.
    """
    p = Path(path)
    if p.is_file():
        return SentencePieceVocabulary(p, extra_ids or 0)
    if not p.is_dir():
        raise ValueError(f"{p}: no such vocabulary file or tokenizer directory")
    cfg_path = p / "tokenizer_config.json"
    try:
        cfg = read_json(cfg_path) if cfg_path.exists() else {}
        if extra_ids is None:
            extra_ids = int(cfg.get("extra_ids", T5_EXTRA_IDS))
    except (json.JSONDecodeError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{cfg_path}: cannot read extra_ids ({e})") from None
    if (p / "spiece.model").exists():
        return SentencePieceVocabulary(p / "spiece.model", extra_ids)
    if (p / "tokenizer.json").exists() and WordPieceVocabulary.is_wordpiece(p / "tokenizer.json"):
        return WordPieceVocabulary(p / "tokenizer.json")
    if (p / "tokenizer.json").exists():
        bos = cfg.get("bos_token") if cfg.get("add_bos_token") else None
        return HFTokenizerVocabulary(p / "tokenizer.json", bos_token=bos if isinstance(bos, str) else None)
    raise ValueError(f"{p}: neither spiece.model nor tokenizer.json found")


# ----------------------------------------------------------------------------------------------------------
# Docid token spaces
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DocidTokenSpace:
    """Where docid tokens live.

    kind "text": `size` ids `offset .. offset + size - 1` in the model's vocabulary, valid at every position;
      `length` 0: docids of any length, ended by EOS; `length` > 0: every docid exactly `length` tokens, no
      EOS (GLEN's lexical docids).
    kind "codebook": `length` positions × `size` codes in a separate table (row = position * size + code).
    """

    kind: str
    size: int
    offset: int = 0
    length: int = 0

    def __post_init__(self):
        if self.kind not in ("text", "codebook"):
            raise ValueError(f"DocidTokenSpace.kind must be 'text' or 'codebook', got {self.kind!r}")
        if self.size <= 0:
            raise ValueError(f"DocidTokenSpace.size must be positive, got {self.size}")
        if self.kind == "codebook" and self.length <= 0:
            raise ValueError("a codebook DocidTokenSpace needs length > 0 (the number of docid positions)")

    @property
    def fixed_length(self) -> bool:
        """Every docid has exactly `length` tokens and no EOS (codebook docids, fixed-length text docids)."""
        return self.length > 0

    @classmethod
    def above_text(cls, vocab_size: int, count: int) -> "DocidTokenSpace":
        """`count` new ids right above a model vocabulary of `vocab_size` rows (PAG-style)."""
        return cls("text", count, offset=vocab_size)

    @classmethod
    def codebook(cls, length: int, codes: int) -> "DocidTokenSpace":
        return cls("codebook", codes, length=length)

    @property
    def end(self) -> int:
        """One past the last model-vocabulary id this space needs (text kind)."""
        return self.offset + self.size

    def token_id(self, code: int | np.ndarray, position: int | np.ndarray = 0):
        """Model id (text) or codebook row (codebook) of a code."""
        code = np.asarray(code)
        if np.any((code < 0) | (code >= self.size)):
            raise ValueError(f"docid code out of range [0, {self.size})")
        if self.kind == "text":
            return code + self.offset
        position = np.asarray(position)
        if np.any((position < 0) | (position >= self.length)):
            raise ValueError(f"docid position out of range [0, {self.length})")
        return position * self.size + code

    def code(self, token_id: int | np.ndarray, position: int | np.ndarray = 0):
        """Inverse of `token_id`."""
        t = np.asarray(token_id)
        code = t - self.offset if self.kind == "text" else t - np.asarray(position) * self.size
        if np.any((code < 0) | (code >= self.size)):
            raise ValueError(f"token id(s) {t} outside this docid space")
        return code

    def to_json(self) -> dict:
        return dataclasses.asdict(self)
