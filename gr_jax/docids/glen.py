"""GLEN's lexical docids (002_glen.txt §3.2): M tokens of the text vocabulary per document, decoded from the
document by the model itself, with the raw logit of each token (the docid's token weights, which the
collision-free ranker compares). Fixed length, no EOS (`DocidTokenSpace("text", V, length=M)`).

GLEN's docid file (their makeid output) is a headerless TSV, one line per document:

    oldid \\t tok1<->tok2<->...<->tokM \\t l1<->l2<->...<->lM \\t text

with SentencePiece pieces (e.g. `▁python`) and logits printed with 4 decimals. `read_docid_tsv` reads it,
`write_docid_tsv` writes the same format, `table_for_corpus` maps it onto a corpus's rows.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from gr_jax.docids.base import DocidTable
from gr_jax.io_utils import write_text
from gr_jax.vocab import DocidTokenSpace

SEP = "<->"


@dataclasses.dataclass
class GlenDocidFile:
    """The contents of a GLEN docid TSV: document ids, tokens [n, M], logits [n, M] (as printed), texts."""

    doc_ids: list[str]
    tokens: np.ndarray
    logits: np.ndarray
    texts: list[str]

    @property
    def length(self) -> int:
        return int(self.tokens.shape[1])


def read_docid_tsv(path: str | Path, piece_to_id: Callable[[str], Optional[int]]) -> GlenDocidFile:
    """Reads GLEN's docid file; `piece_to_id(piece)` maps a SentencePiece piece to its id (None: unknown).
    Every problem is an error naming the file and line."""
    path = Path(path)
    ids, toks, logits, texts = [], [], [], []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read GLEN's docid file ({e})") from None
    seen: dict[str, int] = {}
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{no}"
        parts = line.split("\t", 3)
        if len(parts) < 3:
            raise ValueError(f"{where}: expected `oldid<TAB>tok1<->tok2…<TAB>l1<->l2…<TAB>text` (GLEN's docid "
                             f"file), found {len(parts)} field(s)")
        oldid, pieces, values = parts[0].strip(), parts[1].split(SEP), parts[2].split(SEP)
        if not oldid:
            raise ValueError(f"{where}: empty document id")
        if oldid in seen:
            raise ValueError(f"{where}: document id {oldid!r} repeats line {seen[oldid]}")
        seen[oldid] = no
        if len(pieces) != len(values):
            raise ValueError(f"{where}: {len(pieces)} docid tokens but {len(values)} logits")
        if toks and len(pieces) != len(toks[0]):
            raise ValueError(f"{where}: a docid of {len(pieces)} tokens; line {seen[ids[0]]} has {len(toks[0])} "
                             f"(GLEN docids all have the same length M)")
        row = []
        for piece in pieces:
            i = piece_to_id(piece)
            if i is None:
                raise ValueError(f"{where}: docid token {piece!r} is not in the vocabulary (is the tokenizer the "
                                 f"one the docids were made with?)")
            row.append(int(i))
        try:
            vals = [float(v) for v in values]
        except ValueError:
            raise ValueError(f"{where}: logits {parts[2]!r} are not numbers") from None
        if not all(math.isfinite(v) for v in vals):
            raise ValueError(f"{where}: non-finite logit in {parts[2]!r}")
        ids.append(oldid)
        toks.append(row)
        logits.append(vals)
        texts.append(parts[3] if len(parts) > 3 else "")
    if not ids:
        raise ValueError(f"{path}: no docids in GLEN's docid file")
    return GlenDocidFile(ids, np.asarray(toks, np.int32), np.asarray(logits, np.float32), texts)


def write_docid_tsv(path: str | Path, doc_ids: Sequence[str], tokens: np.ndarray, logits: np.ndarray,
                    texts: Sequence[str], id_to_piece: Callable[[int], str]) -> None:
    """GLEN's format: logits rounded to 4 decimals and printed as Python prints a float (their makeid)."""
    lines = []
    for d, tok, lg, text in zip(doc_ids, np.asarray(tokens), np.asarray(logits, np.float64), texts):
        pieces = SEP.join(id_to_piece(int(t)) for t in tok)
        values = SEP.join(str(float(np.round(v, 4))) for v in lg)
        lines.append(f"{d}\t{pieces}\t{values}\t{text}")
    write_text(path, "\n".join(lines) + "\n")


def table_for_corpus(docids: GlenDocidFile, corpus_doc_ids: Sequence[str], vocab_size: int,
                     source: str = "GLEN docid file") -> DocidTable:
    """The docids as a DocidTable over the corpus's rows (token weights = the file's logits). Every corpus
    document needs a docid and every docid a corpus document."""
    row_of = {str(d): r for r, d in enumerate(corpus_doc_ids)}
    unknown = [d for d in docids.doc_ids if d not in row_of]
    if unknown:
        raise ValueError(f"{source}: {len(unknown)} document ids are not in the corpus, e.g. {unknown[:3]}")
    if len(docids.doc_ids) != len(row_of):
        have = set(docids.doc_ids)
        missing = [d for d in row_of if d not in have]
        raise ValueError(f"{source}: {len(missing)} corpus documents have no docid, e.g. {missing[:3]}")
    if int(docids.tokens.max()) >= vocab_size:
        raise ValueError(f"{source}: token id {int(docids.tokens.max())} ≥ the model's vocabulary ({vocab_size})")
    rows = np.array([row_of[d] for d in docids.doc_ids], np.int64)
    o = np.argsort(rows)
    M = docids.length
    return DocidTable(docids.tokens[o], np.full(len(rows), M, np.int32), rows[o],
                      DocidTokenSpace("text", vocab_size, length=M), docids.logits[o])
