"""GLEN's lexical docids (002_glen.txt §3.2): M tokens of the text vocabulary per document, decoded from the
document by the model itself, with the raw logit of each token (the docid's token weights, which the
collision-free ranker compares). Fixed length, no EOS (`DocidTokenSpace("text", V, length=M)`).

GLEN's docid file (their makeid output) is a headerless TSV, one line per document:

    oldid \\t tok1<->tok2<->...<->tokM \\t l1<->l2<->...<->lM \\t text

with SentencePiece pieces (e.g. `▁python`) and logits printed with 4 decimals. `read_docid_tsv` reads it,
`write_docid_tsv` writes the same format, `table_for_corpus` maps it onto a corpus's rows.

`GlenDocids` is the scheme of GLEN's phase 2 (`prepare.docid_scheme = @GlenDocids()`): its docids are a
function of the model's parameters, so it declares `decoded_by_model` and the composition decodes them
(`compose.decode_model_docids`) when parameters exist — before training, on every re-assignment, before each
evaluation, and when a checkpoint is restored.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Callable, Optional, Sequence

import gin
import numpy as np

from gr_jax.methods.api import Count, DocidScheme, DocidTable, DocidTokenSpace, file_digest, write_text

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
                    texts: Sequence[str], id_to_piece: Callable[[int], str], keep_previous: bool = False) -> None:
    """GLEN's format: logits rounded to 4 decimals and printed as Python prints a float (their makeid)."""
    lines = []
    for d, tok, lg, text in zip(doc_ids, np.asarray(tokens), np.asarray(logits, np.float64), texts):
        pieces = SEP.join(id_to_piece(int(t)) for t in tok)
        values = SEP.join(str(float(np.round(v, 4))) for v in lg)
        lines.append(f"{d}\t{pieces}\t{values}\t{text}")
    write_text(path, "\n".join(lines) + "\n", keep_previous=keep_previous)


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


@gin.configurable
@dataclasses.dataclass
class GlenDocids(DocidScheme):
    """GLEN's learned docids (002_glen.txt §3.3.2–3.4): every document's docid is the greedy decoding of the
    document by the model (argmax of its masked step logits, `GlenRetriever.decode_docids`), M = `length`
    tokens of the text vocabulary, and its token weights are the raw logits of those tokens, rounded to
    `round_weights` decimals (4: what GLEN's docid file keeps, so collision-free ranking matches a run from
    their file; None: full precision). Such a scheme holds no fitted state: the docids follow the parameters.

    With `docid_file` (GLEN's makeid TSV, e.g. the one released with their model) the docids are that file's
    instead — tokens and logits as written — and the scheme records the file's digest: a changed file is an
    error, never silently reused."""

    length: Count = 3
    round_weights: Optional[int] = 4
    docid_file: Optional[str] = None
    name = "glen"
    _vocab: object = dataclasses.field(default=None, repr=False)
    _file_digest: Optional[str] = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        if not isinstance(self.length, int) or self.length < 1:
            raise ValueError(f"GlenDocids.length must be an integer ≥ 1, got {self.length!r}")

    @property
    def decoded_by_model(self) -> bool:
        return self.docid_file is None

    def space(self, vocab_size: int) -> DocidTokenSpace:
        return DocidTokenSpace("text", int(vocab_size), length=int(self.length))

    def _digest(self) -> str:
        return file_digest(self.docid_file, "GlenDocids.docid_file")

    def fit(self, corpus, context=None) -> "GlenDocids":
        self._vocab = None if context is None else context.vocab
        if self.docid_file is not None:
            self._file_digest = self._digest()
        return self

    def bind(self, vocab) -> None:
        self._vocab = vocab

    def assign(self, corpus, rows=None, embeddings=None) -> DocidTable:
        if self.docid_file is None:
            raise ValueError("GlenDocids are decoded by the model from its parameters "
                             "(the composition's decode_model_docids), not assigned from the corpus alone")
        if rows is not None and len(rows) != len(corpus):
            raise ValueError("GlenDocids.docid_file: docids come for the whole corpus the file covers")
        if self._vocab is None or not hasattr(self._vocab, "piece_to_id"):
            raise ValueError("GlenDocids.docid_file: reading the file's pieces needs the model's vocabulary")
        docids = read_docid_tsv(self.docid_file, self._vocab.piece_to_id)
        if docids.length != self.length:
            raise ValueError(f"{self.docid_file}: docids of {docids.length} tokens, GlenDocids.length is "
                             f"{self.length}; set it to {docids.length}")
        return table_for_corpus(docids, corpus.doc_ids, self._vocab.size, source=str(self.docid_file))

    def table(self, tokens: np.ndarray, logits: np.ndarray, rows: np.ndarray, vocab_size: int) -> DocidTable:
        """The decoded docids (tokens [n, M], raw logits [n, M]) of corpus rows `rows` as a DocidTable."""
        tokens, logits = np.asarray(tokens, np.int32), np.asarray(logits, np.float32)
        if tokens.shape != logits.shape or tokens.shape[1:] != (self.length,):
            raise ValueError(f"GlenDocids: tokens {tokens.shape} and logits {logits.shape} must both be "
                             f"[n, {self.length}]")
        weights = logits if self.round_weights is None else np.round(logits, int(self.round_weights))
        o = np.argsort(np.asarray(rows), kind="stable")
        return DocidTable(tokens[o], np.full(len(o), self.length, np.int32), np.asarray(rows)[o],
                          self.space(vocab_size), weights[o])

    def write_decoded(self, directory: Path, step: int, table: DocidTable, corpus, vocab) -> Path:
        """The decoded docids of checkpoint `step` as GLEN's docid file: `directory`/step<N>.tsv."""
        path = Path(directory) / f"step{step}.tsv"
        write_docid_tsv(path, [corpus.doc_ids[r] for r in table.doc_rows], table.sequences, table.weights,
                        [" ".join(corpus.texts[r].split()) for r in table.doc_rows], vocab.id_to_piece,
                        keep_previous=True)
        return path

    def state(self):
        return {"length": int(self.length), "docid_file_sha": self._file_digest}, {}

    def load_state(self, meta: dict, arrays: dict) -> None:
        if int(meta.get("length", self.length)) != int(self.length):
            raise ValueError(f"saved GLEN docids have length {meta.get('length')}, GlenDocids.length is "
                             f"{self.length}")
        if self.docid_file is not None:
            self._file_digest = self._digest()
            if meta.get("docid_file_sha") != self._file_digest:
                raise ValueError(f"GlenDocids.docid_file {self.docid_file} changed since this MODEL_DIR was built "
                                 f"from it (its digest differs); use the file it was built with, or a new MODEL_DIR")
