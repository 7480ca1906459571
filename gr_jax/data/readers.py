"""Readers for the datasets of the GR papers, into one in-memory form.

`Corpus` (doc ids, texts, optional titles / urls), `QuerySet` (qids, texts) and graded qrels
(`{qid: {docid: grade}}`, the form `evaluation.metrics` takes). Every reader reports a malformed row with its
file and line number, and drops nothing silently: a wrong field count, an empty id or text, a duplicate id,
a reference to an unknown document or bytes that are not UTF-8 all raise `DataError`.

Layouts: NQ320k as NCI, GLEN and GenRET ship it; MS MARCO passage (+ TREC DL); mMARCO; generic
JSONL / TSV for users' own data. The MS MARCO collection (8.8M rows) is read into packed storage — one bytes
buffer plus offsets — so memory stays near the file size.
"""

from __future__ import annotations

import array
import dataclasses
import glob
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np

from gr_jax.data.trec import Qrels, read_qrels
from gr_jax.runtime.io_utils import BOM, open_skipping_bom

log = logging.getLogger(__name__)


class DataError(ValueError):
    """A data file that cannot be read as its layout says; the message names the file and line."""


class PackedStrings(Sequence[str]):
    """An immutable list of strings stored as UTF-8 bytes in one buffer with int64 offsets."""

    def __init__(self, buffer: bytes | bytearray, offsets: np.ndarray):
        self._buf = buffer
        self._off = offsets

    @classmethod
    def from_list(cls, items: Sequence[str]) -> "PackedStrings":
        encoded = [s.encode("utf-8") for s in items]
        return cls(b"".join(encoded), np.concatenate([[0], np.cumsum([len(e) for e in encoded])]).astype(np.int64))

    def __len__(self) -> int:
        return len(self._off) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._buf[self._off[i]:self._off[i + 1]].decode("utf-8")

    @property
    def nbytes(self) -> int:
        return len(self._buf) + self._off.nbytes

    def update_hash(self, h) -> None:
        """Feeds the strings to a hashlib object: the same as hashing them one by one (`hash_strings`)."""
        h.update(np.diff(self._off).astype("<i8").tobytes())
        h.update(memoryview(self._buf)[self._off[0]:self._off[-1]])

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(uint8 buffer, int64 offsets): the strings as plain arrays for an npz (no pickle)."""
        return np.frombuffer(bytes(self._buf), dtype=np.uint8).copy(), np.asarray(self._off, np.int64)

    @classmethod
    def from_arrays(cls, buffer: np.ndarray, offsets: np.ndarray) -> "PackedStrings":
        return cls(np.asarray(buffer, np.uint8).tobytes(), np.asarray(offsets, np.int64))


def hash_strings(h, items: Sequence[str]) -> None:
    """Feeds a list of strings to a hashlib object (lengths, then the UTF-8 bytes), so that ["ab", "c"] and
    ["a", "bc"] differ; `PackedStrings.update_hash` gives the same digest for the same strings."""
    if isinstance(items, PackedStrings):
        items.update_hash(h)
        return
    encoded = [s.encode("utf-8") for s in items]
    h.update(np.array([len(e) for e in encoded], dtype="<i8").tobytes())
    for e in encoded:
        h.update(e)


def fingerprint(*lists: Sequence[str]) -> str:
    """A short digest of lists of strings (what a vocabulary, a docid scheme or a checkpoint was built from)."""
    h = hashlib.blake2b(digest_size=12)
    for items in lists:
        h.update(len(items).to_bytes(8, "little"))
        hash_strings(h, items)
    return h.hexdigest()


@dataclasses.dataclass
class Corpus:
    doc_ids: Sequence[str]
    texts: Sequence[str]
    titles: Optional[Sequence[str]] = None
    urls: Optional[Sequence[str]] = None

    def __post_init__(self):
        if len(self.doc_ids) != len(self.texts):
            raise DataError(f"corpus: {len(self.doc_ids)} ids for {len(self.texts)} texts")
        self._index: Optional[dict[str, int]] = None
        self._fingerprint: Optional[str] = None

    def __len__(self) -> int:
        return len(self.doc_ids)

    def _positions(self) -> dict[str, int]:
        if self._index is None:  # built on first use: an 8.8M-row corpus should not pay for it unasked
            self._index = {d: i for i, d in enumerate(self.doc_ids)}
        return self._index

    def index_of(self, doc_id: str) -> int:
        return self._positions()[doc_id]

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._positions()

    def fingerprint(self) -> str:
        """Digest of the document ids and texts in row order (titles and URLs included when present)."""
        if self._fingerprint is None:  # computed once: a Corpus is not edited after it is built
            self._fingerprint = fingerprint(self.doc_ids, self.texts, self.titles or [], self.urls or [])
        return self._fingerprint


@dataclasses.dataclass
class QuerySet:
    qids: list[str]
    texts: list[str]

    def __len__(self) -> int:
        return len(self.qids)

    def subset(self, qids) -> "QuerySet":
        keep = set(qids)
        pairs = [(q, t) for q, t in zip(self.qids, self.texts) if q in keep]
        return QuerySet([q for q, _ in pairs], [t for _, t in pairs])


@dataclasses.dataclass
class Dataset:
    """A corpus with query splits (e.g. "train", "dev", "dev_seen") and their qrels."""

    corpus: Corpus
    queries: dict[str, QuerySet]
    qrels: dict[str, Qrels]
    extras: dict = dataclasses.field(default_factory=dict)  # layout-specific (e.g. NCI semantic ids)


# ----------------------------------------------------------------------------------------------------------
# line-level helpers
# ----------------------------------------------------------------------------------------------------------


def fix_double_utf8(text: str) -> str:
    """Repairs text whose UTF-8 bytes were decoded as cp1252/latin-1 and re-encoded (e.g. 'cafÃ©' → 'café'),
    a known defect of the raw MS MARCO files; text that is not of that form is returned unchanged."""
    if not any(ch in text for ch in "ÃÂâ"):
        return text
    raw = bytearray()
    try:
        for ch in text:  # latin-1 for code points < 256 (C1 controls included), else cp1252's byte
            raw += bytes([ord(ch)]) if ord(ch) < 256 else ch.encode("cp1252")
        return raw.decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return text


def _decode(raw: bytes, path: Path, line_no: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}:{line_no}: not valid UTF-8 ({e.reason} at byte {e.start})") from None


def _open(path: Path):
    try:
        return open_skipping_bom(path)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None


def iter_tsv(path: str | os.PathLike, n_fields: int, header: Optional[Sequence[str]] = None,
             names: str = "") -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of a tab-separated file; checks the field count and an optional header."""
    path = Path(path)
    with _open(path) as f:
        for i, raw in enumerate(f, 1):
            line = _decode(raw, path, i).rstrip("\r\n")
            if i == 1 and header is not None:
                got = line.split("\t")
                if [h.strip().lower() for h in got] != [h.lower() for h in header]:
                    raise DataError(f"{path}:1: expected header {list(header)}, found {got}")
                continue
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != n_fields:
                raise DataError(f"{path}:{i}: expected {n_fields} tab-separated fields{names}, found "
                                f"{len(fields)}")
            yield i, fields


def _nonempty(value: str, what: str, path: Path, line_no: int) -> str:
    value = value.strip()
    if not value:
        raise DataError(f"{path}:{line_no}: empty {what}")
    return value


def _add_unique(seen: dict, key: str, path: Path, line_no: int, what: str) -> None:
    if key in seen:
        raise DataError(f"{path}:{line_no}: duplicate {what} {key!r} (first at line {seen[key]})")
    seen[key] = line_no


def _with_rows(n: int, path: Path, what: str) -> None:
    """A file with no rows is an error that says so (it used to surface later as a qrels error: every judged
    document or query missing)."""
    if n == 0:
        raise DataError(f"{path}: no {what} (the file is empty, or holds blank lines only)")


def _queries_and_qrels(rows, path: Path, corpus: Optional[Corpus], prefix: str):
    """rows: (line, query text, doc id) → (QuerySet with one qid per row, qrels with grade 1)."""
    qids, texts, qrels = [], [], {}
    for line_no, text, doc in rows:
        text = _nonempty(text, "query", path, line_no)
        if corpus is not None and doc not in corpus:
            raise DataError(f"{path}:{line_no}: document {doc!r} is not in the corpus")
        qid = f"{prefix}{line_no}"
        qids.append(qid)
        texts.append(text)
        qrels[qid] = {doc: 1}
    return QuerySet(qids, texts), qrels


# ----------------------------------------------------------------------------------------------------------
# NQ320k
# ----------------------------------------------------------------------------------------------------------


def read_nq320k_nci(data_dir: str | os.PathLike) -> Dataset:
    """NCI layout: NQ_doc_content.tsv (docid, '', '', text, '', '', lang), nq_{train,dev}_doc_newid.tsv and
    nq_512_qg.tsv (query, NQ example id, int docid, semantic id "a-b-c"; no header). Query ids are
    "<split>-<line>"; the semantic ids are kept in `extras["semantic_ids"]` (docid → tuple of ints)."""
    d = Path(data_dir)
    path = d / "NQ_doc_content.tsv"
    ids, texts, seen = [], [], {}
    for i, f in iter_tsv(path, 7, names=" (docid, '', '', text, '', '', lang)"):
        doc = _nonempty(f[0], "docid", path, i)
        _add_unique(seen, doc, path, i, "docid")
        ids.append(doc)
        texts.append(_nonempty(f[3], "document text", path, i))
    corpus = Corpus(ids, texts)
    queries, qrels, semantic = {}, {}, {}

    def rows(path):
        for i, f in iter_tsv(path, 4, names=" (query, NQ id, docid, semantic id)"):
            doc = _nonempty(f[2], "docid", path, i)
            try:
                sem = tuple(int(x) for x in f[3].strip().split("-"))
            except ValueError:
                raise DataError(f"{path}:{i}: semantic id {f[3]!r} is not of the form 'a-b-c'") from None
            if semantic.setdefault(doc, sem) != sem:
                raise DataError(f"{path}:{i}: document {doc} has semantic id {sem}, earlier {semantic[doc]}")
            yield i, f[0], doc

    for split, name in (("train", "nq_train_doc_newid.tsv"), ("dev", "nq_dev_doc_newid.tsv"),
                        ("pseudo", "nq_512_qg.tsv")):
        if (d / name).exists() or split != "pseudo":
            queries[split], qrels[split] = _queries_and_qrels(rows(d / name), d / name, corpus, f"{split}-")
    return Dataset(corpus, queries, qrels, {"semantic_ids": semantic})


def read_nq320k_glen(data_dir: str | os.PathLike, doc_file: Optional[str] = None) -> Dataset:
    """GLEN layout: DOC_NQ_*.tsv (header oldid, doc_content), GTQ_NQ_{train,dev}.tsv (header query, oldid),
    GTQ_NQ_dev_{seen,unseen}.tsv (the dev split by query string; become "dev_seen" / "dev_unseen")."""
    d = Path(data_dir)
    if doc_file is None:
        matches = sorted(glob.glob(str(d / "DOC_NQ_*.tsv")))
        if len(matches) != 1:
            raise DataError(f"{d}: expected one DOC_NQ_*.tsv, found {len(matches)}; pass doc_file")
        doc_path = Path(matches[0])
    else:
        doc_path = d / doc_file
    ids, texts, seen = [], [], {}
    for i, f in iter_tsv(doc_path, 2, header=("oldid", "doc_content")):
        doc = _nonempty(f[0], "oldid", doc_path, i)
        _add_unique(seen, doc, doc_path, i, "oldid")
        ids.append(doc)
        texts.append(_nonempty(f[1], "doc_content", doc_path, i))
    corpus = Corpus(ids, texts)
    queries, qrels = {}, {}
    for split in ("train", "dev"):
        path = d / f"GTQ_NQ_{split}.tsv"
        rows = ((i, f[0], f[1].strip()) for i, f in iter_tsv(path, 2, header=("query", "oldid")))
        queries[split], qrels[split] = _queries_and_qrels(rows, path, corpus, f"{split}-")
    for part in ("seen", "unseen"):
        path = d / f"GTQ_NQ_dev_{part}.tsv"
        if not path.exists():
            continue
        wanted = {f[0].strip() for _, f in iter_tsv(path, 2, header=("query", "oldid"))}
        qids = [q for q, t in zip(queries["dev"].qids, queries["dev"].texts) if t in wanted]
        queries[f"dev_{part}"] = queries["dev"].subset(qids)
        qrels[f"dev_{part}"] = {q: qrels["dev"][q] for q in qids}
    return Dataset(corpus, queries, qrels)


def _read_json(path: Path):
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None


def read_nq320k_genret(data_dir: str | os.PathLike) -> Dataset:
    """GenRET layout: corpus_lite.json (list of texts; doc id = position), {train,dev}.json (list of
    [query, doc_index]), dev.json.seen / dev.json.unseen (row indices of dev.json, JSON list or one per line)."""
    d = Path(data_dir)
    texts = _read_json(d / "corpus_lite.json")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise DataError(f"{d / 'corpus_lite.json'}: expected a JSON list of document texts")
    for i, t in enumerate(texts):
        if not t.strip():
            raise DataError(f"{d / 'corpus_lite.json'}: document {i} is empty")
    corpus = Corpus([str(i) for i in range(len(texts))], texts)
    queries, qrels = {}, {}
    for split in ("train", "dev"):
        path = d / f"{split}.json"
        data = _read_json(path)
        rows = []
        for i, row in enumerate(data if isinstance(data, list) else [None]):
            if not (isinstance(row, list) and len(row) == 2 and isinstance(row[0], str)
                    and isinstance(row[1], int) and not isinstance(row[1], bool)):
                raise DataError(f"{path}: row {i} is not [query, doc_index]: {row!r}")
            if not 0 <= row[1] < len(texts):
                raise DataError(f"{path}: row {i} points to document {row[1]}, corpus has {len(texts)}")
            rows.append((i, row[0], str(row[1])))
        queries[split], qrels[split] = _queries_and_qrels(rows, path, corpus, f"{split}-")
    for part in ("seen", "unseen"):
        path = d / f"dev.json.{part}"
        if not path.exists():
            continue
        raw = _decode(path.read_bytes().removeprefix(BOM), path, 1).strip()
        try:
            rows = json.loads(raw) if raw.startswith("[") else [int(x) for x in raw.split()]
        except ValueError as e:
            raise DataError(f"{path}: expected row indices ({e})") from None
        bad = [r for r in rows if not 0 <= int(r) < len(queries["dev"])]
        if bad:
            raise DataError(f"{path}: row indices {bad[:5]} outside dev.json ({len(queries['dev'])} rows)")
        qids = [queries["dev"].qids[int(r)] for r in rows]
        queries[f"dev_{part}"] = queries["dev"].subset(qids)
        qrels[f"dev_{part}"] = {q: qrels["dev"][q] for q in qids}
    return Dataset(corpus, queries, qrels)


# ----------------------------------------------------------------------------------------------------------
# MS MARCO, TREC DL, mMARCO
# ----------------------------------------------------------------------------------------------------------


def read_msmarco_collection(path: str | os.PathLike, repair_utf8: bool = False) -> Corpus:
    """collection.tsv (pid, passage), streamed into packed storage (memory ≈ file size + 24 bytes a row).
    A blank or duplicate pid is an error naming its line (duplicates are found through a 64-bit hash per
    row, then confirmed on the strings, so no set of 8.8M Python strings is built)."""
    path = Path(path)
    ids = bytearray()
    texts = bytearray()
    id_off, text_off = array.array("q", [0]), array.array("q", [0])  # 8 bytes a row, not a Python int
    hashes, lines = array.array("q"), array.array("q")
    with _open(path) as f:
        for i, raw in enumerate(f, 1):
            raw = raw.rstrip(b"\r\n")
            if not raw.strip():
                continue
            tab = raw.find(b"\t")
            if tab < 0 or raw.find(b"\t", tab + 1) != -1:
                raise DataError(f"{path}:{i}: expected 2 tab-separated fields (pid, passage)")
            pid, text = raw[:tab].strip(), raw[tab + 1:]
            if not pid:
                raise DataError(f"{path}:{i}: empty pid")
            if not text.strip():
                raise DataError(f"{path}:{i}: empty passage")
            decoded = _decode(text, path, i)
            _decode(pid, path, i)
            if repair_utf8:
                text = fix_double_utf8(decoded).encode("utf-8")
            ids += pid
            texts += text
            id_off.append(len(ids))
            text_off.append(len(texts))
            hashes.append(hash(pid))
            lines.append(i)
    # the bytearrays become the buffers as they are (no copy: a copy would double the peak memory)
    doc_ids = PackedStrings(ids, np.frombuffer(id_off, np.int64))
    _with_rows(len(lines), path, "passages")
    _check_unique_ids(doc_ids, np.frombuffer(hashes, np.int64), np.frombuffer(lines, np.int64), path, "pid")
    corpus = Corpus(doc_ids, PackedStrings(texts, np.frombuffer(text_off, np.int64)))
    log.info("read %d passages from %s", len(corpus), path)
    return corpus


def _check_unique_ids(ids: Sequence[str], hashes: np.ndarray, lines: np.ndarray, path: Path, what: str) -> None:
    """Rows whose hash another row shares (rare) are compared as strings, in file order."""
    order = np.argsort(hashes, kind="stable")
    dup = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
    if not len(dup):
        return
    first: dict[str, int] = {}
    for r in np.unique(np.concatenate([order[dup], order[dup + 1]])).tolist():
        key = ids[r]
        if key in first:
            raise DataError(f"{path}:{int(lines[r])}: duplicate {what} {key!r} (first at line "
                            f"{int(lines[first[key]])})")
        first[key] = r


def read_queries_tsv(path: str | os.PathLike, repair_utf8: bool = False) -> QuerySet:
    """qid<TAB>query (MS MARCO queries.*.tsv, TREC DL topics, mMARCO translations)."""
    path = Path(path)
    qids, texts, seen = [], [], {}
    for i, f in iter_tsv(path, 2, names=" (qid, query)"):
        qid = _nonempty(f[0], "qid", path, i)
        _add_unique(seen, qid, path, i, "qid")
        text = _nonempty(f[1], "query", path, i)
        qids.append(qid)
        texts.append(fix_double_utf8(text) if repair_utf8 else text)
    _with_rows(len(qids), path, "queries")
    return QuerySet(qids, texts)


def read_msmarco(data_dir: str | os.PathLike, splits: Sequence[str] = ("train", "dev"),
                 repair_utf8: bool = False) -> Dataset:
    """collection.tsv, queries.{split}.tsv and qrels.{split}.tsv (`qid 0 pid rel`) for each split."""
    d = Path(data_dir)
    corpus = read_msmarco_collection(d / "collection.tsv", repair_utf8)
    queries, qrels = {}, {}
    for split in splits:
        queries[split] = read_queries_tsv(d / f"queries.{split}.tsv", repair_utf8)
        qrels[split] = read_qrels_checked(d / f"qrels.{split}.tsv", queries[split], corpus)
    return Dataset(corpus, queries, qrels)


def read_qrels_checked(path: str | os.PathLike, queries: Optional[QuerySet] = None,
                       corpus: Optional[Corpus] = None) -> Qrels:
    """TREC qrels (tabs or spaces; TREC DL grades 0–3). A judged query without text in `queries`, or a judged
    document missing from `corpus`, is an error naming its line."""
    try:
        return read_qrels(path, known_docs=corpus, known_qids=set(queries.qids) if queries is not None else None)
    except ValueError as e:
        raise DataError(str(e)) from None


def read_mmarco_queries(path: str | os.PathLike, english_qrels: Qrels) -> tuple[QuerySet, Qrels]:
    """A translated query file joined to the English qrels: the queries that are judged, and their qrels."""
    queries = read_queries_tsv(path)
    judged = [q for q in queries.qids if q in english_qrels]
    if not judged:
        raise DataError(f"{path}: none of its {len(queries)} query ids appear in the qrels")
    return queries.subset(judged), {q: english_qrels[q] for q in judged}


# ----------------------------------------------------------------------------------------------------------
# generic JSONL / TSV
# ----------------------------------------------------------------------------------------------------------

_ID_KEYS = ("id", "_id", "doc_id", "docid", "qid", "query_id")
_TEXT_KEYS = ("text", "contents", "body", "query")


def _first_key(obj: dict, keys, path: Path, i: int, what: str, allow_int: bool = False) -> str:
    """The first of `keys` present in a JSONL object: a non-empty string (or an integer id, with
    `allow_int`); null, a list, a number or a blank string is an error naming the line."""
    for k in keys:
        if k in obj:
            value = obj[k]
            if allow_int and isinstance(value, int) and not isinstance(value, bool):
                value = str(value)
            if not isinstance(value, str):
                raise DataError(f"{path}:{i}: field {k!r} ({what}) must be a string, found "
                                f"{type(value).__name__ if value is not None else 'null'}: {value!r:.60}")
            return _nonempty(value, what, path, i)
    raise DataError(f"{path}:{i}: no {what} field (one of {list(keys)})")


def _optional_text(obj: dict, key: str, path: Path, i: int) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DataError(f"{path}:{i}: field {key!r} must be a string, found {type(value).__name__}: {value!r:.60}")
    return value


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    path = Path(path)
    with _open(path) as f:
        for i, raw in enumerate(f, 1):
            line = _decode(raw, path, i)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{i}: invalid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path}:{i}: expected a JSON object")
            yield i, obj


_CORPUS_COLUMNS = ["id", "text", "title", "url"]  # DPR's and SEAL's psgs_w100.tsv start with its first three
_HEADER_WORDS = {"id", "docid", "doc_id", "pid", "text", "contents", "passage", "body", "title", "url"}


def _corpus_header(fields: list[str], path: Path) -> Optional[list[str]]:
    """The first line of a TSV corpus as its header: `id text[ title[ url]]` in any case and spacing (DPR's and
    SEAL's psgs_w100.tsv start with `id text title`). A first line made only of column-like words that is not
    that header is refused with the header expected, not read as a document."""
    names = [f.strip().lower() for f in fields]
    if names == _CORPUS_COLUMNS[:len(names)]:
        return _CORPUS_COLUMNS[:len(names)]
    if names and all(n in _HEADER_WORDS for n in names):
        raise DataError(f"{path}:1: {fields} looks like a header but is not one this reader knows; expected "
                        f"{'<TAB>'.join(_CORPUS_COLUMNS[:len(names)])} (any case), or no header (the first line a "
                        f"document)")
    return None


def read_corpus(path: str | os.PathLike) -> Corpus:
    """JSONL ({"id", "text", optional "title", "url"}) or TSV (id, text[, title[, url]]; a first line that is
    DPR's header `id text title`, as SEAL's psgs_w100.tsv has, is the header)."""
    path = Path(path)
    ids, texts, titles, urls, seen = [], [], [], [], {}
    if path.suffix == ".jsonl":
        for i, obj in iter_jsonl(path):
            doc = _first_key(obj, _ID_KEYS, path, i, "document id", allow_int=True)
            _add_unique(seen, doc, path, i, "document id")
            ids.append(doc)
            texts.append(_first_key(obj, _TEXT_KEYS, path, i, "text"))
            titles.append(_optional_text(obj, "title", path, i))
            urls.append(_optional_text(obj, "url", path, i))
    else:
        with _open(path) as f:
            first = _decode(f.readline(), path, 1)
        _with_rows(len(first.strip()), path, "documents")
        n = len(first.rstrip("\r\n").split("\t"))
        if n not in (2, 3, 4):
            raise DataError(f"{path}:1: expected 2 to 4 tab-separated fields (id, text[, title[, url]])")
        header = _corpus_header(first.rstrip("\r\n").split("\t"), path)
        for i, fields in iter_tsv(path, n, header=header, names=" (id, text[, title[, url]])"):
            doc = _nonempty(fields[0], "document id", path, i)
            _add_unique(seen, doc, path, i, "document id")
            ids.append(doc)
            texts.append(_nonempty(fields[1], "text", path, i))
            titles.append(fields[2] if n > 2 else "")
            urls.append(fields[3] if n > 3 else "")
    _with_rows(len(ids), path, "documents")
    return Corpus(ids, texts, titles if any(titles) else None, urls if any(urls) else None)


def read_queries(path: str | os.PathLike) -> QuerySet:
    """JSONL ({"id", "text"}) or TSV (qid, query)."""
    path = Path(path)
    if path.suffix != ".jsonl":
        return read_queries_tsv(path)
    qids, texts, seen = [], [], {}
    for i, obj in iter_jsonl(path):
        qid = _first_key(obj, _ID_KEYS, path, i, "query id", allow_int=True)
        _add_unique(seen, qid, path, i, "query id")
        qids.append(qid)
        texts.append(_first_key(obj, _TEXT_KEYS, path, i, "query"))
    _with_rows(len(qids), path, "queries")
    return QuerySet(qids, texts)
