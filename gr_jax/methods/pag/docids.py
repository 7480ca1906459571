"""PAG's two docids per document (004_pag_lost_in_decoding.txt §2): a *sequential* docid of M tokens — residual
quantization codes, code j at level i written as the vocabulary id base + K·i + j, i.e. M × K docid tokens
appended i-major above the text vocabulary (PAG: base 32100, M 8, K 2048) — and a *set* docid: the m vocabulary
ids a lexical model weighs most for the document.

`PagDocids` (`prepare.docid_scheme = @PagDocids()`) makes both. Sequential: RQ of the document embeddings
(`prepare.embedder`), or PAG's released `docid_to_tokenids.json` (`docid_file`). Set: top-m ids of the
document's TF-IDF weights over the model vocabulary (a lexical model fitted here, ties by lower id), or PAG's
released set-docid `docid_to_tokenids.json` (`set_docid_file`, ids by descending weight; a smaller
`set_size` keeps each list's first m, as the reproduction paper does for m ∈ {16, 32}). The table is a fixed-
length text table (`DocidTokenSpace("text", M·K, offset=base, length=M)`); the set docids ride along as
`extras["set_ids"]` [rows, m] (−1 padded) with `extras["order_key"]`: a hash of the document id (30 bits), the
documented key that breaks ties at the planning boundary (`methods.pag.planner.top_n_exact`), so no ranking depends
on corpus order.

PAG's artefact formats: `docid_to_tokenids.json` is a JSON object {"<docid>": [ints]}; query files `raw.tsv`
are `id \\t text` (read by `data.readers`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Optional, Sequence

import gin
import numpy as np

from gr_jax.methods.api import (
    checked_embeddings,
    Count,
    DocidScheme,
    DocidTable,
    DocidTokenSpace,
    file_digest,
    FitContext,
    read_json,
    ResidualQuantizer,
)

FIRST_TEXT_ID = 3  # ids below (PAD, EOS, UNK) never enter a set docid built here


def order_keys(doc_ids: Sequence[str]) -> np.ndarray:
    """int32 [n] in [0, 2^30): 30 bits of blake2b(document id) — a key that depends on the id alone (30 bits so
    that the planner can compare keys as floats, `methods.pag.planner._key_as_float`). Two documents share a key
    with probability 2^-30 per pair (~36k pairs among 8.8M documents); a tie in both s_simul and key at the n-th
    planning place is decided by corpus position, the earlier row first."""
    out = np.empty(len(doc_ids), np.int32)
    for i, d in enumerate(doc_ids):
        out[i] = int.from_bytes(hashlib.blake2b(str(d).encode(), digest_size=4).digest(), "big") & 0x3FFFFFFF
    return out


def read_docid_to_tokenids(path, what: str = "docid_to_tokenids.json") -> dict[str, list[int]]:
    """PAG's `docid_to_tokenids.json` → {docid: token ids}; every list must have the same length."""
    path = Path(path)
    try:
        data = read_json(path)
    except OSError as e:
        raise ValueError(f"{what} {path}: cannot read it ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{what} {path}: not JSON ({e})") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{what} {path}: expected a non-empty JSON object {{\"<docid>\": [token ids]}}")
    lengths = set()
    for k, v in data.items():
        if not isinstance(v, list) or not v or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            raise ValueError(f"{what} {path}: docid {k!r} maps to {str(v)[:60]}, not a list of integer ids")
        lengths.add(len(v))
    if len(lengths) > 1:
        raise ValueError(f"{what} {path}: token lists of different lengths {sorted(lengths)}")
    return data


def tfidf_set_ids(token_lists: Sequence[Sequence[int]], idf: np.ndarray, m: int) -> np.ndarray:
    """Top-m ids of each document by tf · idf (ties: lower id first), −1 padded → int32 [n, m]."""
    out = np.full((len(token_lists), m), -1, np.int32)
    for i, toks in enumerate(token_lists):
        t = np.asarray([x for x in toks if FIRST_TEXT_ID <= x < len(idf)], np.int64)
        if not len(t):
            continue
        ids, tf = np.unique(t, return_counts=True)
        w = tf * idf[ids]
        o = np.lexsort((ids, -w))[:m]
        out[i, : len(o)] = ids[o]
    return out


@gin.configurable
@dataclasses.dataclass
class PagDocids(DocidScheme):
    levels: Count = 8  # M
    k: Count = 2048  # K codes per level
    beam: Count = 1  # RQ encoding beam
    seed: int = 0
    set_size: Count = 64  # m
    base: int = 0  # first docid token id; 0: right above the text vocabulary (its size)
    docid_file: Optional[str] = None  # PAG's sequential docid_to_tokenids.json
    set_docid_file: Optional[str] = None  # PAG's set docid_to_tokenids.json
    name = "pag"

    def __post_init__(self):
        for f in ("levels", "k", "set_size"):
            if int(getattr(self, f)) <= 0:
                raise ValueError(f"PagDocids.{f} must be positive, got {getattr(self, f)}")
        self._rq: Optional[ResidualQuantizer] = None
        self._idf: Optional[np.ndarray] = None
        self._vocab = None
        self._digests: dict = {}

    @property
    def needs_embeddings(self) -> bool:
        return self.docid_file is None

    def space(self, vocab_size: int = 0) -> DocidTokenSpace:
        return DocidTokenSpace("text", int(self.levels) * int(self.k), offset=int(self.base), length=int(self.levels))

    # -- fitting ----------------------------------------------------------------------------------------
    def fit(self, corpus, context: FitContext = FitContext()) -> "PagDocids":
        self._vocab = context.vocab
        if not self.base:
            if context.vocab is None:
                raise ValueError("PagDocids.base 0 puts the docid tokens above the vocabulary, but none was given")
            self.base = int(context.vocab.size)
        if self.docid_file is None:
            if context.embeddings is None:
                raise ValueError("PagDocids: RQ docids need document embeddings (prepare.embedder)")
            self._rq = ResidualQuantizer(int(self.levels), int(self.k), beam=int(self.beam), seed=int(self.seed))
            self._rq.fit(np.asarray(context.embeddings, np.float32))
        else:
            self._digests["docid_file"] = file_digest(self.docid_file, "PagDocids.docid_file")
        if self.set_docid_file is None:
            if context.vocab is None:
                raise ValueError("PagDocids: TF-IDF set docids need the model vocabulary")
            df = np.zeros(int(context.vocab.size), np.float64)
            for text in corpus.texts:
                df[np.unique(np.asarray(context.vocab.encode(text), np.int64))] += 1
            self._idf = np.log((1 + len(corpus)) / (1 + df)) + 1.0  # smoothed idf (scikit-learn's formula)
        else:
            self._digests["set_docid_file"] = file_digest(self.set_docid_file, "PagDocids.set_docid_file")
        return self

    def bind(self, vocab) -> None:
        self._vocab = vocab

    # -- assignment -------------------------------------------------------------------------------------
    def _from_file(self, path, what: str, doc_ids: Sequence[str], width: Optional[int]) -> np.ndarray:
        data = read_docid_to_tokenids(path, what)
        missing = [d for d in doc_ids if d not in data]
        if missing:
            raise ValueError(f"{what} {path}: no entry for {len(missing)} corpus documents, e.g. {missing[:3]}; "
                             f"the file must cover the corpus it is used with")
        arr = np.asarray([data[d] for d in doc_ids], np.int64).reshape(len(doc_ids), -1)
        if width is not None and arr.shape[1] != width:
            raise ValueError(f"{what} {path}: docids of {arr.shape[1]} tokens, PagDocids.levels is {width}")
        return arr

    def _sequential(self, corpus, rows, embeddings) -> np.ndarray:
        M, K, base = int(self.levels), int(self.k), int(self.base)
        if self.docid_file is not None:
            tokens = self._from_file(self.docid_file, "PagDocids.docid_file",
                                     [corpus.doc_ids[r] for r in rows], M)
            level_of = (tokens - base) // K
            if ((tokens < base) | (tokens >= base + M * K)).any() or (level_of != np.arange(M)[None]).any():
                raise ValueError(f"PagDocids.docid_file {self.docid_file}: token ids must be base + K·level + code "
                                 f"with base {base}, K {K}, M {M} (set PagDocids.base / k / levels to the file's)")
            return tokens.astype(np.int32)
        if self._rq is None:
            raise ValueError("PagDocids.assign before fit()")
        codes = self._rq.encode(checked_embeddings(corpus, embeddings, rows, "PAG RQ"))
        return (base + K * np.arange(M)[None, :] + codes).astype(np.int32)

    def _set(self, corpus, rows) -> np.ndarray:
        m = int(self.set_size)
        if self.set_docid_file is not None:
            ids = self._from_file(self.set_docid_file, "PagDocids.set_docid_file",
                                  [corpus.doc_ids[r] for r in rows], None)
            if (ids < 0).any():
                raise ValueError(f"PagDocids.set_docid_file {self.set_docid_file}: negative token ids")
            out = np.full((len(rows), m), -1, np.int32)
            out[:, : min(m, ids.shape[1])] = ids[:, :m]
            return out
        if self._idf is None or self._vocab is None:
            raise ValueError("PagDocids: TF-IDF set docids before fit()")
        return tfidf_set_ids([self._vocab.encode(corpus.texts[r]) for r in rows], self._idf, m)

    def assign(self, corpus, rows: Optional[Sequence[int]] = None, embeddings=None) -> DocidTable:
        rows = np.arange(len(corpus)) if rows is None else np.asarray(rows, np.int64)
        seqs = self._sequential(corpus, rows, embeddings)
        extras = {"set_ids": self._set(corpus, rows), "order_key": order_keys([corpus.doc_ids[r] for r in rows])}
        return DocidTable(seqs, np.full(len(rows), int(self.levels), np.int32), rows, self.space(), extras=extras)

    # -- state ------------------------------------------------------------------------------------------
    def state(self):
        meta = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        meta["digests"] = dict(self._digests)
        arrays = {}
        if self._rq is not None:
            arrays["codebooks"] = self._rq.codebooks
        if self._idf is not None:
            arrays["idf"] = self._idf
        return meta, arrays

    def load_state(self, meta: dict, arrays: dict) -> None:
        self.base = int(meta.get("base", self.base))
        for name, what in (("docid_file", "PagDocids.docid_file"), ("set_docid_file", "PagDocids.set_docid_file")):
            path = getattr(self, name)
            if path is not None:
                digest = file_digest(path, what)
                if meta.get("digests", {}).get(name) != digest:
                    raise ValueError(f"{what} {path} changed since this MODEL_DIR was built from it (its digest "
                                     f"differs); use the file it was built with, or a new MODEL_DIR")
                self._digests[name] = digest
        if "codebooks" in arrays:
            self._rq = ResidualQuantizer(int(self.levels), int(self.k), beam=int(self.beam), seed=int(self.seed))
            self._rq.codebooks = np.asarray(arrays["codebooks"])
        if "idf" in arrays:
            self._idf = np.asarray(arrays["idf"])


def table_from_files(docid_file, set_docid_file, doc_ids: Sequence[str], *, levels: int, k: int, base: int,
                     set_size: Optional[int] = None) -> DocidTable:
    """PAG's two released `docid_to_tokenids.json` files mapped onto the rows of a corpus with `doc_ids`."""
    class _Corpus:  # the two fields assignment reads
        def __init__(self, ids):
            self.doc_ids = list(ids)
            self.texts = None

        def __len__(self):
            return len(self.doc_ids)

    m = set_size
    if m is None:
        m = len(next(iter(read_docid_to_tokenids(set_docid_file, "set docid file").values())))
    scheme = PagDocids(levels=levels, k=k, base=base, set_size=m, docid_file=str(docid_file),
                       set_docid_file=str(set_docid_file))
    return scheme.assign(_Corpus(doc_ids))

