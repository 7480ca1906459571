"""BART's byte-level BPE (GPT-2's) as a library vocabulary, in the library's token ids.

A checkpoint ships its tokenizer in one of two layouts:

  HF        vocab.json (token → BART id) + merges.txt;
  fairseq   encoder.json (token → GPT-2 id) + vocab.bpe (the merges) + dict.txt (fairseq's dictionary: line k
            holds a GPT-2 id as text and is BART id 4 + k; <s> 0, <pad> 1, </s> 2, <unk> 3 come first and
            <mask> after the last line, as fairseq's BART adds it).

`write_library_tokenizer(src, out_dir)` writes `tokenizer.json` (a `tokenizers` BPE with GPT-2's byte-level
pre-tokenizer and decoder) and `tokenizer_config.json` to `out_dir`, with every id moved to the library's
order (`bart_convert.library_id_order`: <pad> 0, </s> 1, <unk> 2, <s> 3). `data/vocab.load_vocabulary` reads
that directory as an `HFTokenizerVocabulary`, which starts every text with <s> (`add_bos_token`) as BART's
inputs do; the pipeline ends it with </s>.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import numpy as np

from gr_jax.backbones.bart_convert import library_id_order
from gr_jax.backbones.t5_convert import CheckpointError
from gr_jax.runtime.io_utils import atomic_dir

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # BART ids 0..3


def layout(src: str | os.PathLike) -> Optional[str]:
    """"hf", "fairseq" or None: which tokenizer files `src` holds."""
    p = Path(src)
    if (p / "vocab.json").is_file() and (p / "merges.txt").is_file():
        return "hf"
    if (p / "encoder.json").is_file() and (p / "vocab.bpe").is_file() and (p / "dict.txt").is_file():
        return "fairseq"
    return None


def _read_json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read ({e})") from None
    if not isinstance(obj, dict) or not all(isinstance(v, int) for v in obj.values()):
        raise CheckpointError(f"{path}: expected a JSON object of token → id")
    return obj


def _merges(path: Path) -> list[tuple[str, str]]:
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line or line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise CheckpointError(f"{path}:{n}: a merge is two tokens separated by one space, got {line!r}")
        out.append((parts[0], parts[1]))
    return out


def bart_vocab(src: str | os.PathLike) -> tuple[dict[str, int], list[tuple[str, str]], int]:
    """(token → BART id, merges, vocabulary size) from either layout."""
    p = Path(src)
    kind = layout(p)
    if kind == "hf":
        vocab = _read_json(p / "vocab.json")
        return vocab, _merges(p / "merges.txt"), max(vocab.values()) + 1
    if kind != "fairseq":
        raise CheckpointError(f"{p}: no BART tokenizer (vocab.json + merges.txt, or encoder.json + vocab.bpe + "
                              f"dict.txt)")
    gpt2 = _read_json(p / "encoder.json")
    by_gpt2_id = {i: tok for tok, i in gpt2.items()}
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    entries = read_fairseq_dictionary(p / "dict.txt")
    for k, (word, overwrite) in enumerate(entries):
        fid = len(SPECIALS) + k
        token = by_gpt2_id[int(word)] if word.isdigit() and int(word) in by_gpt2_id else word  # fillers stay
        if overwrite:
            vocab[token] = fid  # fairseq: the later entry's index wins
        else:
            vocab.setdefault(token, fid)
    size = len(SPECIALS) + len(entries)
    vocab["<mask>"] = size
    return vocab, _merges(p / "vocab.bpe"), size + 1


FAIRSEQ_LINE = "'<token> <count>[ #fairseq:overwrite]'"


def read_fairseq_dictionary(path: Path) -> list[tuple[str, bool]]:
    """(token, overwrite) of each line of a fairseq `dict.txt`, read by fairseq's own rules
    (`Dictionary.add_from_file`): a line is `<token> <count>`, optionally followed by ` #fairseq:overwrite`; the
    count is an integer; a token seen before is an error unless its line carries the overwrite flag. Any other
    line is an error naming the file and the line (fairseq refuses the file too), never a token dropped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read it as fairseq's dictionary ({e})") from None
    seen: dict[str, int] = {}
    out = []
    for n, raw in enumerate(lines, 1):
        line = raw.rstrip()
        word, _, field = line.rpartition(" ")
        overwrite = field == "#fairseq:overwrite"
        if overwrite:
            word, _, field = word.rpartition(" ")
        if not word:
            raise CheckpointError(f"{path}:{n}: expected {FAIRSEQ_LINE} (fairseq's dictionary format), got "
                                  f"{raw!r}")
        try:
            int(field)
        except ValueError:
            raise CheckpointError(f"{path}:{n}: the count {field!r} of {word!r} is not an integer; expected "
                                  f"{FAIRSEQ_LINE}") from None
        if word in SPECIALS and not overwrite:
            raise CheckpointError(f"{path}:{n}: {word!r} is one of fairseq's special symbols, which the dictionary "
                                  f"holds already; fairseq refuses it unless its line ends with '#fairseq:overwrite'")
        if word in seen and not overwrite:
            raise CheckpointError(f"{path}:{n}: {word!r} is already on line {seen[word]}; fairseq refuses a repeated "
                                  f"token unless its line ends with '#fairseq:overwrite'")
        seen[word] = n
        out.append((word, overwrite))
    if not out:
        raise CheckpointError(f"{path}: empty; fairseq's dictionary has a line {FAIRSEQ_LINE} per token")
    return out


def write_library_tokenizer(src: str | os.PathLike, out_dir: str | os.PathLike, vocab_size: Optional[int] = None,
                            overwrite: bool = False, embedding_rows: Optional[int] = None) -> Path:
    """tokenizer.json + tokenizer_config.json in library ids (module docstring). `vocab_size`: the network's
    (an id the network has but the tokenizer lacks is never produced); a tokenizer larger than it is refused.
    `embedding_rows`: the rows of a released fairseq checkpoint's embedding, which its dict.txt must account for
    exactly (4 specials + one id per line + <mask>)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab, merges, size = bart_vocab(src)
    if vocab_size is not None and size > vocab_size:
        raise CheckpointError(f"{src}: the tokenizer has {size} ids but the network only {vocab_size}; they do not "
                              f"belong together")
    # fairseq's BART has 4 specials + the entries + <mask>; a model fine-tuned with another task may drop <mask>
    if embedding_rows is not None and layout(src) == "fairseq" and embedding_rows not in (size, size - 1):
        raise CheckpointError(f"{Path(src) / 'dict.txt'}: {size - len(SPECIALS) - 1} entries give {size} ids (4 "
                              f"specials, the entries, <mask>) but the checkpoint's embedding has {embedding_rows} "
                              f"rows: this dict.txt is not the checkpoint's (cut off, or another model's); use the "
                              f"dict.txt released with it")
    perm = library_id_order(max(size, vocab_size or 0))
    lib = {tok: int(perm[i]) for tok, i in vocab.items()}
    known = set(lib)
    merges = [m for m in merges if m[0] in known and m[1] in known and m[0] + m[1] in known]
    tok = Tokenizer(models.BPE(vocab=lib, merges=merges, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in (*SPECIALS, "<mask>") if t in lib])
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        tok.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(
            {"add_bos_token": True, "bos_token": "<s>", "extra_ids": 0, "source_layout": layout(src)}, indent=1))
    return Path(out_dir)


def library_ids(bart_ids, vocab_size: int) -> np.ndarray:
    """BART ids → library ids (tests, tools)."""
    return library_id_order(vocab_size)[np.asarray(bart_ids)]


def main(argv=None) -> int:
    """`python -m gr_jax.backbones.bart_tokenizer SRC OUT_DIR`: a checkpoint's tokenizer files (either layout) as
    a library vocabulary directory (VOCABULARY for a run that starts from that checkpoint)."""
    import argparse
    import logging

    from gr_jax.runtime.cli import setup_logging

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("src", help="a directory with vocab.json + merges.txt, or encoder.json + vocab.bpe + dict.txt")
    parser.add_argument("out_dir", help="where tokenizer.json and tokenizer_config.json go (a new directory)")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        write_library_tokenizer(args.src, args.out_dir, overwrite=False)
    except (ValueError, OSError) as e:  # CheckpointError is a ValueError
        logging.getLogger(__name__).error("%s", e)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
