"""SEAL's and MINDER's identifier texts: what the substring index holds for each document.

A document's identifier text is, in token ids of the run's vocabulary,

    DOC_START  title  TITLE_END  body[:max_text_tokens]  ( QUERY_START  pseudo-query  TITLE_END )*

SEAL indexes `title @@ body</s>` per document and decodes a title as the tokens after a document's start up to
`@@`; DOC_START plays the part of the previous document's `</s>`, TITLE_END of ` @@`. MINDER appends each
pseudo-query as ` || q @@`: QUERY_START is ` ||`. Any n-gram of the text is a body key (it may cross into the
title, as in SEAL); a title key is DOC_START … TITLE_END; a pseudo-query key QUERY_START … TITLE_END. Three more
ids mark the *input* with the view the model is asked to generate (SEAL's ` || body`, ` || title`,
` || query`). The six ids sit right above the text vocabulary (the model's vocabulary grows by six); with
`marker_ids = 'spelled'` they are SEAL's own, spelled in the vocabulary (a released checkpoint's BPE: DOC_START is
EOS, TITLE_END ` @@`, QUERY_START ` ||`, the views ` || body || +` …), and the table carries them (`markers_of`).

A corpus without titles gives no title view; a document without pseudo-queries no pseudo-query view.

Fixed-position units (000 Fig. 2's docid granularity): with `units = 'sentence'` or `'paragraph'` the pseudo-query
slots hold the document's own sentences or paragraphs instead (each cut to its first `max_unit_tokens` tokens), so
the pseudo-query view generates a whole unit from its start (`text_units`: sentences end at . ! ? followed by
white space; paragraphs are separated by blank lines, else by line breaks, or, in a text without line breaks,
are runs of `sentences_per_paragraph` sentences); only the units that start within the indexed body count. Pseudo-
queries come from `pseudo_queries_file` (`python -m gr_jax.pseudo_queries`, or any doc_id → queries file: its
digest is kept when the scheme is fitted, and assigning with a changed file is an error — the index would no
longer be what the model was trained on), or with `pseudo_queries_file = 'train'` from the judged queries of
the training split (the demo has no generated ones; kept in the scheme's state; documents added later have
none).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Optional, Sequence

import gin
import numpy as np

from gr_jax.methods.api import (
    added_field,
    Count,
    DocidScheme,
    DocidTable,
    DocidTokenSpace,
    file_digest,
    FitContext,
    read_queries_file,
    UserError,
)

log = logging.getLogger(__name__)

MARKERS = ("doc_start", "title_end", "query_start", "view_body", "view_title", "view_query")
UNITS = ("sentence", "paragraph")


def text_units(text: str, kind: str, sentences_per_paragraph: int = 3) -> list[str]:
    """A text's sentences or paragraphs, in order (module docstring); empty ones dropped."""
    if kind == "paragraph" and "\n" in text.strip():  # blank lines separate paragraphs, else line breaks do
        blank = re.search(r"\n\s*\n", text.strip())
        return [p.strip() for p in re.split(r"\n\s*\n" if blank else r"\n", text) if p.strip()]
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s.strip()]
    if kind == "sentence":
        return sentences
    n = sentences_per_paragraph
    return [" ".join(sentences[i:i + n]) for i in range(0, len(sentences), n)]


@dataclasses.dataclass(frozen=True)
class Markers:
    """Where identifier texts and inputs mark SEAL's views: three ids inside identifier texts (DOC_START,
    TITLE_END, QUERY_START) and three token sequences a query is marked with for the view it is asked to
    generate; `special` are ids that are never content (their unigram scores are 0). Either six new ids above a
    text vocabulary (`above`), or SEAL's released markers spelled in a pretrained vocabulary (`spelled`)."""

    doc_start: int
    title_end: int
    query_start: int
    view_body: tuple
    view_title: tuple
    view_query: tuple
    special: tuple = ()

    @classmethod
    def above(cls, text_vocab_size: int) -> "Markers":
        ids = [text_vocab_size + i for i in range(len(MARKERS))]
        return cls(ids[0], ids[1], ids[2], (ids[3],), (ids[4],), (ids[5],), special=tuple(ids))

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_json(cls, d: dict) -> "Markers":
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def markers_of(table) -> Markers:
    """The markers of a SEAL identifier table: spelled ones from its constants, else the six ids at the top of its
    token space."""
    spelled = (table.constants or {}).get("seal_markers")
    return Markers.from_json(spelled) if spelled else Markers.above(table.space.end - len(MARKERS))


# SEAL's markers as its released checkpoints read and write them (seal/retrieval.py, scripts/build_fm_index.py):
# a title ends with " @@", a pseudo-query (MINDER) starts with " ||", a query is marked " || body || +" etc.
SPELLED = {"title_end": " @@", "query_start": " ||", "view_body": " || body || +", "view_title": " || title || +",
           "view_query": " || query || +"}


@gin.configurable
@dataclasses.dataclass
class SealDocids(DocidScheme):
    max_text_tokens: Count = 512  # body tokens indexed per document (the paper's maximum input: 512)
    with_titles: bool = True
    pseudo_queries_file: Optional[str] = None  # MINDER's pseudo-query view: a file, or "train"
    max_pseudo_queries: Count = 10  # per document
    # 'sentence' | 'paragraph': the document's own units in the pseudo-query slots (added later: schemes saved
    # before them still match while they keep their defaults)
    units: Optional[str] = added_field(None)
    max_unit_tokens: Count = added_field(24)
    sentences_per_paragraph: Count = added_field(3)
    # "new": six marker ids above the text vocabulary (a model trained here); "spelled": SEAL's released markers
    # spelled in the vocabulary (SPELLED; DOC_START is EOS), so that a released SEAL/MINDER/LTRGR checkpoint reads
    # and writes them as it was trained to
    marker_ids: str = added_field("new")
    name = "seal"
    text_vocab_size: int = 0
    spelled: Optional[dict] = added_field(None)  # the marker ids of marker_ids="spelled" (fitted)
    pseudo_queries_digest: str = ""
    _vocab: object = dataclasses.field(default=None, repr=False)
    _queries: Optional[dict] = dataclasses.field(default=None, repr=False)

    @property
    def uses_training_queries(self) -> bool:
        return self.pseudo_queries_file == "train"

    @property
    def markers(self) -> Markers:
        return Markers.from_json(self.spelled) if self.spelled else Markers.above(self.text_vocab_size)

    def __post_init__(self):
        if self.marker_ids not in ("new", "spelled"):
            raise ValueError(f"SealDocids.marker_ids must be 'new' or 'spelled', got {self.marker_ids!r}")
        if self.units not in (None, *UNITS):
            raise ValueError(f"SealDocids.units must be one of {UNITS} or None, got {self.units!r}")
        if self.units and self.pseudo_queries_file:
            raise ValueError("SealDocids: units and pseudo_queries_file both fill the pseudo-query slots; set one")

    def fit(self, corpus, context: FitContext = FitContext()) -> "SealDocids":
        if context.vocab is None:
            raise ValueError("SEAL identifiers need the text vocabulary")
        self._vocab, self.text_vocab_size = context.vocab, int(context.vocab.size)
        self.spelled = _spell(context.vocab) if self.marker_ids == "spelled" else None
        if self.uses_training_queries:
            if context.queries is None:
                raise ValueError("SealDocids(pseudo_queries_file='train') needs the training queries")
            self._queries = {str(d): list(q) for d, q in sorted(context.queries.items())}
        elif self.pseudo_queries_file:
            self.pseudo_queries_digest = file_digest(self.pseudo_queries_file, "SealDocids.pseudo_queries_file")
        return self

    def bind(self, vocab) -> None:
        self._vocab = vocab

    def space(self, vocab_size: int = 0) -> DocidTokenSpace:
        if self.spelled:  # the markers are words of the vocabulary: nothing above it
            return DocidTokenSpace("text", self.text_vocab_size)
        return DocidTokenSpace("text", self.text_vocab_size + len(MARKERS))

    def _pseudo_queries(self) -> dict:
        if self._queries is None:
            self._queries = {}
            if self.uses_training_queries:
                raise ValueError("SealDocids: the training queries of the pseudo-query view were not kept")
            if self.pseudo_queries_file:
                digest = file_digest(self.pseudo_queries_file, "SealDocids.pseudo_queries_file")
                if digest != self.pseudo_queries_digest:
                    raise UserError(f"{self.pseudo_queries_file}: the pseudo-queries changed since this docid "
                                    f"scheme was fitted (digest {digest}, fitted with "
                                    f"{self.pseudo_queries_digest or 'none'}); restore the file or train again "
                                    f"in a new MODEL_DIR")
                self._queries = read_queries_file(self.pseudo_queries_file)
        return self._queries

    def identifier(self, corpus, row: int) -> list[int]:
        """The identifier text of corpus row `row` (module docstring)."""
        m, enc = self.markers, self._encode
        ids = [m.doc_start]
        if self.with_titles and corpus.titles is not None:  # a blank title is empty: the title view never
            title = corpus.titles[row] or ""                 # runs on into the body or a pseudo-query
            ids += (enc(title) if title.strip() else []) + [m.title_end]
        ids += enc(corpus.texts[row])[: self.max_text_tokens]
        if self.units:  # the units that start within the indexed body (its first max_text_tokens tokens)
            at = 0
            for unit in text_units(corpus.texts[row], self.units, self.sentences_per_paragraph):
                if at >= self.max_text_tokens:
                    break
                tokens = enc(unit)
                ids += [m.query_start] + tokens[: self.max_unit_tokens] + [m.title_end]
                at += len(tokens)
            return ids
        for q in self._pseudo_queries().get(corpus.doc_ids[row], [])[: self.max_pseudo_queries]:
            if q.strip():
                ids += [m.query_start] + enc(q) + [m.title_end]
        return ids

    def assign(self, corpus, rows: Optional[Sequence[int]] = None, embeddings=None) -> DocidTable:
        if self._vocab is None:
            raise ValueError("SealDocids.assign before fit() (or bind(vocab) after loading)")
        rows = np.arange(len(corpus)) if rows is None else np.asarray(rows, dtype=np.int64)
        seqs = [self.identifier(corpus, r) for r in rows.tolist()]
        if self.pseudo_queries_file and not self.uses_training_queries:
            missing = sum(corpus.doc_ids[r] not in self._pseudo_queries() for r in rows.tolist())
            if missing:
                log.warning("%s: %d of %d documents have no pseudo-queries (no pseudo-query view for them)",
                            self.pseudo_queries_file, missing, len(rows))
        constants = {"seal_markers": self.spelled} if self.spelled else None
        return DocidTable.from_lists(seqs, rows, self.space(), index_kind="substrings", constants=constants)

    def _encode(self, text: str) -> list[int]:
        """Token ids of a piece of text inside an identifier (without the vocabulary's start token, if it has one)."""
        ids = self._vocab.encode(text)
        bos = getattr(self._vocab, "bos_id", None)
        return ids[1:] if bos is not None and ids[:1] == [bos] else ids

    def state(self):
        return {"max_text_tokens": self.max_text_tokens, "with_titles": self.with_titles,
                "pseudo_queries_file": self.pseudo_queries_file, "max_pseudo_queries": self.max_pseudo_queries,
                "text_vocab_size": self.text_vocab_size, "pseudo_queries_digest": self.pseudo_queries_digest,
                "training_queries": self._queries if self.uses_training_queries else None,
                "units": self.units, "max_unit_tokens": self.max_unit_tokens,
                "sentences_per_paragraph": self.sentences_per_paragraph, "marker_ids": self.marker_ids,
                "spelled": self.spelled}, {}

    def load_state(self, meta, arrays) -> None:
        self.max_text_tokens, self.with_titles = int(meta["max_text_tokens"]), bool(meta["with_titles"])
        self.pseudo_queries_file = meta["pseudo_queries_file"]
        self.max_pseudo_queries = int(meta["max_pseudo_queries"])
        self.text_vocab_size = int(meta["text_vocab_size"])
        self.pseudo_queries_digest = meta["pseudo_queries_digest"]
        self.units = meta.get("units")  # schemes saved before units existed have none
        self.max_unit_tokens = int(meta.get("max_unit_tokens", self.max_unit_tokens))
        self.sentences_per_paragraph = int(meta.get("sentences_per_paragraph", self.sentences_per_paragraph))
        self.marker_ids = meta.get("marker_ids", "new")  # schemes saved before spelled markers had new ids
        self.spelled = meta.get("spelled")
        if meta.get("training_queries") is not None:
            self._queries = {str(d): list(q) for d, q in meta["training_queries"].items()}


def _spell(vocab) -> dict:
    """SEAL's markers (SPELLED) as ids of `vocab`; DOC_START is EOS (SEAL's passages follow one another's EOS). The
    three identifier markers must each be one token, as in BART's vocabulary."""
    from gr_jax.methods.api import EOS_ID, PAD_ID

    bos = getattr(vocab, "bos_id", None)

    def enc(text):
        ids = vocab.encode(text)
        return ids[1:] if bos is not None and ids[:1] == [bos] else ids

    out = {"doc_start": EOS_ID}
    for name, text in SPELLED.items():
        ids = enc(text)
        if name in ("title_end", "query_start"):
            if len(ids) != 1:
                raise UserError(f"SealDocids(marker_ids='spelled'): {text!r} is {len(ids)} tokens in this vocabulary, "
                                f"but SEAL's released checkpoints read it as one token of BART's vocabulary: the "
                                f"vocabulary is not the released checkpoint's (check its dict.txt / vocab.json "
                                f"against the checkpoint). marker_ids='new' is for a model trained here, not for "
                                f"a released checkpoint")
            out[name] = ids[0]
        else:
            out[name] = list(ids)
    out["special"] = [PAD_ID, EOS_ID] + ([bos] if bos is not None else [])
    return out
