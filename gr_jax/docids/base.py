"""The docid-scheme interface: `fit` on the initial documents, `assign` docids to any documents, save/load.

A `DocidTable` is the plain value between a scheme and the rest of the library: token sequences (one or many
per document), the corpus row of each, and the `DocidTokenSpace` the tokens live in. From it come the
training targets (`primary`) and the prefix tree (`index`).

Two kinds of token spaces (vocab.py):
* "text" — ids of the model vocabulary (naive string docids, titles, keywords) or ids grown above it
  (atomic); sequences have variable length and end with EOS in the index and in the targets — or, when the
  space has a `length`, exactly that many tokens and no EOS (GLEN);
* "codebook" — L positions × V codes of a per-position docid head (semantic, PQ, RQ); fixed length L,
  no EOS.

State is JSON + numpy arrays (`save`/`load`), never pickle.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from gr_jax.runtime.io_utils import atomic_dir, read_json
from gr_jax.data.vocab import EOS_ID, PAD_ID
from gr_jax.data.vocab import DocidTokenSpace

log = logging.getLogger(__name__)


INDEX_KINDS = ("prefix_tree", "substrings")


@dataclasses.dataclass
class DocidTable:
    """docid `i` is `sequences[i, :lengths[i]]` and belongs to corpus row `doc_rows[i]`.

    Rows of one document are contiguous and the first one is its primary docid (the training target).
    """

    sequences: np.ndarray  # [M, Lmax] int32, padded with PAD_ID past lengths
    lengths: np.ndarray  # [M] int32
    doc_rows: np.ndarray  # [M] int64
    space: DocidTokenSpace
    # [M, Lmax] float32 or None: a weight per docid token (GLEN: the raw logit of each token when the docid was
    # decoded from its document); rankers that order documents sharing a docid read them (decoding/rankers.py)
    weights: Optional[np.ndarray] = None
    # per docid row, arrays a scheme attaches for its model ({name: [M, ...]}); PAG: "set_ids" [M, m] (the
    # document's set docid, −1 padded) and "order_key" [M] (its tie-break key, methods/pag/docids.py)
    extras: Optional[dict] = None
    # which index holds the docids: "prefix_tree" (a docid is a root-to-leaf path of a `TrieIndex`) or
    # "substrings" (each row is a document's identifier text and *any n-gram of it* identifies the document: an
    # `index.substring.SubstringIndex`; SEAL, MINDER). A substring table's rows are not training targets: the
    # method's own objectives config samples n-grams of them.
    index_kind: str = "prefix_tree"
    # constants of the scheme its model reads, JSON values (SEAL spelled in a pretrained vocabulary: the ids of
    # its markers, methods/seal/docids.py); equal in every table that is concatenated, saved with the table
    constants: Optional[dict] = None

    def __post_init__(self):
        self.sequences = np.asarray(self.sequences, dtype=np.int32)
        if self.weights is not None:
            self.weights = np.asarray(self.weights, dtype=np.float32)
            if self.weights.shape != self.sequences.shape:
                raise ValueError(f"DocidTable: weights {self.weights.shape} must match sequences "
                                 f"{self.sequences.shape}")
        self.lengths = np.asarray(self.lengths, dtype=np.int32)
        self.doc_rows = np.asarray(self.doc_rows, dtype=np.int64)
        M = len(self.doc_rows)
        if self.index_kind not in INDEX_KINDS:
            raise ValueError(f"DocidTable.index_kind must be one of {INDEX_KINDS}, got {self.index_kind!r}")
        if self.index_kind == "substrings" and (self.fixed_length or self.weights is not None):
            raise ValueError("DocidTable: a substring table holds identifier texts: no fixed length, no weights")
        if self.extras is not None:
            self.extras = {str(k): np.asarray(v) for k, v in self.extras.items()}
            bad = {k: v.shape for k, v in self.extras.items() if v.ndim < 1 or v.shape[0] != M}
            if bad:
                raise ValueError(f"DocidTable: extras {bad} must have one row per docid ({M})")
        if self.sequences.ndim != 2 or self.sequences.shape[0] != M or self.lengths.shape != (M,):
            raise ValueError(f"DocidTable: {M} doc rows, sequences {self.sequences.shape}, lengths {self.lengths.shape}")
        if M and (self.lengths < 1).any():
            raise ValueError("DocidTable: every docid needs at least one token")
        if self.fixed_length and M and (self.lengths != self.space.length).any():
            raise ValueError(f"DocidTable: this {self.space.kind} space's docids must all have length "
                             f"{self.space.length}")

    @classmethod
    def from_lists(cls, sequences: Sequence[Sequence[int]], doc_rows: Sequence[int], space: DocidTokenSpace,
                   weights: Optional[Sequence[Sequence[float]]] = None, index_kind: str = "prefix_tree",
                   constants: Optional[dict] = None):
        lengths = np.array([len(s) for s in sequences], dtype=np.int32)
        width = int(lengths.max()) if len(lengths) else 1
        arr = np.full((len(sequences), width), PAD_ID, dtype=np.int32)
        w = None if weights is None else np.zeros((len(sequences), width), np.float32)
        for i, s in enumerate(sequences):
            arr[i, : len(s)] = s
            if w is not None:
                if len(weights[i]) != len(s):
                    raise ValueError(f"DocidTable: docid {i} has {len(s)} tokens but {len(weights[i])} weights")
                w[i, : len(s)] = weights[i]
        return cls(arr, lengths, np.asarray(doc_rows, dtype=np.int64), space, w, index_kind=index_kind,
                   constants=constants)

    def __len__(self) -> int:
        return len(self.doc_rows)

    @classmethod
    def concatenate(cls, tables: Sequence["DocidTable"]) -> "DocidTable":
        """One table from several of the same token space (e.g. D0's docids and those of later parts)."""
        if not tables or any(t.space != tables[0].space for t in tables):
            raise ValueError("DocidTable.concatenate needs at least one table, all in the same token space")
        if len({t.weights is None for t in tables}) > 1:
            raise ValueError("DocidTable.concatenate: some tables have token weights and some not")
        if len({None if t.extras is None else tuple(sorted(t.extras)) for t in tables}) > 1:
            raise ValueError("DocidTable.concatenate: the tables carry different extras")
        if len({t.index_kind for t in tables}) > 1:
            raise ValueError("DocidTable.concatenate: the tables are held by different kinds of index")
        if any(t.constants != tables[0].constants for t in tables):
            raise ValueError("DocidTable.concatenate: the tables carry different scheme constants")
        width = max(t.sequences.shape[1] for t in tables)

        def pad(a, value):
            return np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=value)

        seqs = np.concatenate([pad(t.sequences, PAD_ID) for t in tables])
        weights = None if tables[0].weights is None else np.concatenate([pad(t.weights, 0.0) for t in tables])
        extras = None if tables[0].extras is None else {
            k: np.concatenate([t.extras[k] for t in tables]) for k in tables[0].extras}
        return cls(seqs, np.concatenate([t.lengths for t in tables]), np.concatenate([t.doc_rows for t in tables]),
                   tables[0].space, weights, extras, tables[0].index_kind, tables[0].constants)

    @property
    def fixed_length(self) -> bool:
        return self.space.fixed_length

    @property
    def target_length(self) -> int:
        """Decoder length needed for every docid (plus EOS for text docids); a substring table's: 1 (any
        n-gram identifies; the method's objectives config checks the length of the n-grams it trains on)."""
        if self.index_kind == "substrings":
            return 1
        longest = int(self.lengths.max()) if len(self) else 1
        return longest if self.fixed_length else longest + 1

    def sequence(self, i: int) -> list[int]:
        return self.sequences[i, : self.lengths[i]].tolist()

    def primary(self, rows: Sequence[int]) -> np.ndarray:
        """Index into the table of the first docid of each corpus row; a row without docid is an error."""
        rows = np.asarray(rows, dtype=np.int64)
        first = {}
        for i, r in enumerate(self.doc_rows.tolist()):
            first.setdefault(r, i)
        missing = [int(r) for r in rows if int(r) not in first]
        if missing:
            raise ValueError(f"{len(missing)} documents have no docid in this table, e.g. rows {missing[:3]}")
        return np.array([first[int(r)] for r in rows], dtype=np.int64)

    def all_docids(self, rows: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Every docid of each corpus row: (position in `rows`, index into the table) pairs, rows in order."""
        rows = np.asarray(rows, dtype=np.int64)
        first = self.primary(rows)  # also the missing-docid check
        counts = np.bincount(self.doc_rows, minlength=int(self.doc_rows.max()) + 1 if len(self) else 0)
        n = counts[rows]
        pos = np.repeat(np.arange(len(rows)), n)
        within = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
        return pos, np.repeat(first, n) + within  # a document's docids are contiguous rows of the table

    def targets(self, rows: Sequence[int], length: Optional[int] = None) -> np.ndarray:
        """Training targets [N, length] for corpus rows: primary docid (+ EOS for text docids), PAD-padded."""
        return self.targets_of(self.primary(rows), length)

    def targets_of(self, idx: Sequence[int], length: Optional[int] = None) -> np.ndarray:
        """Training targets [N, length] for table indices (+ EOS for text docids), PAD-padded."""
        if self.index_kind == "substrings":
            raise ValueError("the docids are held by a substring index: their rows are identifier texts, not "
                             "targets; bind the method's own objectives config (e.g. @SealPairs())")
        length = length or self.target_length
        if length < self.target_length:
            raise ValueError(f"target feature length {length} is shorter than the longest docid "
                             f"({self.target_length} tokens with EOS); raise TASK_FEATURE_LENGTHS['targets']")
        idx = np.asarray(idx, dtype=np.int64)
        out = np.full((len(idx), length), PAD_ID, dtype=np.int32)
        for j, i in enumerate(idx):
            n = self.lengths[i]
            out[j, :n] = self.sequences[i, :n]
            if not self.fixed_length:
                out[j, n] = EOS_ID
        return out

    def index(self, vocab_size: Optional[int] = None, **build_kwargs):
        """The prefix tree over these docids (leaf payloads are corpus rows), or for a substring table the
        substring index over the identifier texts (documents are corpus rows)."""
        if self.index_kind == "substrings":
            from gr_jax.index.substring import SubstringIndex

            return SubstringIndex.build([self.sequence(i) for i in range(len(self))], vocab_size or self.space.end,
                                        rows=self.doc_rows, **build_kwargs)
        from gr_jax.index.trie import TrieIndex

        seqs = [self.sequence(i) for i in range(len(self))]
        if self.fixed_length:
            size = self.space.size if self.space.kind == "codebook" else (vocab_size or self.space.end)
            return TrieIndex.build(np.asarray(seqs, dtype=np.int32).reshape(len(self), -1), self.doc_rows,
                                   vocab_size=size, **build_kwargs)
        return TrieIndex.build(seqs, self.doc_rows, vocab_size=vocab_size or self.space.end, eos_id=EOS_ID,
                               append_eos=True, **build_kwargs)

    def insert_into(self, index) -> dict:
        """Adds these docids to an existing index (dynamic corpora); leaf payloads are corpus rows."""
        seqs = [self.sequence(i) for i in range(len(self))]
        if self.index_kind == "substrings":
            return index.insert(seqs, self.doc_rows)
        if self.fixed_length:
            return index.insert(np.asarray(seqs, dtype=np.int32).reshape(len(self), -1), self.doc_rows)
        return index.insert(seqs, self.doc_rows, append_eos=True)

    def digest(self) -> str:
        """sha256 (16 hex digits) of the docids, their lengths, rows and weights: what a checkpoint records of
        the table it was trained with."""
        h = hashlib.sha256()
        for a in (self.sequences, self.lengths, self.doc_rows) + (() if self.weights is None else (self.weights,)):
            h.update(np.ascontiguousarray(a).tobytes())
        if self.index_kind != "prefix_tree":  # prefix-tree digests stay those recorded by earlier checkpoints
            h.update(self.index_kind.encode())
        return h.hexdigest()[:16]

    def stats(self) -> dict:
        """Collision rate (documents sharing a docid with another document), lengths, tokens used."""
        keys = {}
        for i in range(len(self)):
            keys.setdefault(tuple(self.sequence(i)), set()).add(int(self.doc_rows[i]))
        docs = set(self.doc_rows.tolist())
        colliding = set().union(*[s for s in keys.values() if len(s) > 1]) if keys else set()
        used = np.unique(np.concatenate([self.sequences[i, : self.lengths[i]] for i in range(len(self))])) \
            if len(self) else np.zeros(0)
        return {"documents": len(docs), "docids": len(self), "distinct_docids": len(keys),
                "collision_rate": len(colliding) / max(len(docs), 1),
                "length_mean": float(self.lengths.mean()) if len(self) else 0.0,
                "length_max": int(self.lengths.max()) if len(self) else 0,
                "distinct_tokens": int(used.size)}

    def save(self, path: str | os.PathLike) -> None:
        with atomic_dir(path) as tmp:
            extra = {} if self.weights is None else {"weights": self.weights}
            extra.update({f"extra_{k}": v for k, v in (self.extras or {}).items()})
            np.savez(tmp / "docids.npz", sequences=self.sequences, lengths=self.lengths, doc_rows=self.doc_rows,
                     **extra)
            (tmp / "docids.json").write_text(json.dumps({"space": self.space.to_json(),
                                                         "extras": sorted(self.extras or {}),
                                                         "index_kind": self.index_kind,
                                                         "constants": self.constants}))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "DocidTable":
        path = Path(path)
        try:
            meta = read_json(path / "docids.json")
            with np.load(path / "docids.npz", allow_pickle=False) as z:
                arrays = {k: z[k] for k in ("sequences", "lengths", "doc_rows", "weights") if k in z.files}
                extras = {k: z[f"extra_{k}"] for k in meta.get("extras", [])}
        except (OSError, KeyError, ValueError) as e:
            raise ValueError(f"{path}: not a saved DocidTable ({e})") from None
        return cls(**arrays, space=DocidTokenSpace(**meta["space"]), extras=extras or None,
                   index_kind=meta.get("index_kind", "prefix_tree"), constants=meta.get("constants"))


@dataclasses.dataclass(frozen=True)
class FitContext:
    """What `DocidScheme.fit` may use besides the initial documents, in one object: the text vocabulary, the
    documents' embeddings (schemes that declare `needs_embeddings`; `prepare` computes them), and the
    training queries of each document (schemes whose `uses_training_queries` is true), and the dataset's
    layout-specific `extras` (e.g. the semantic ids NCI's NQ320k files give each document)."""

    vocab: Any = None
    embeddings: Optional[np.ndarray] = None  # [N, D], one row per corpus row
    queries: Optional[Mapping[str, Sequence[str]]] = None  # document id → its training query texts
    extras: Optional[Mapping[str, Any]] = None  # Dataset.extras


class DocidScheme:
    """The base of every docid scheme: what a scheme must provide, and the optional capabilities it declares
    (read by the composition, never probed). `fit` sees only the initial documents; `assign` never refits.

    Declared capabilities (class attributes or properties; the defaults suit a plain text scheme):
      needs_embeddings       — fit/assign take document embeddings (`prepare` embeds the corpus with the
                               configured embedder and keeps it for new documents);
      uses_training_queries  — fit takes the training queries of each document (`FitContext.queries`);
      adds_tokens_per_document — every new document gets a token of its own (atomic ids): a model trained
                               before has no embedding for it, so the dynamic-corpora protocol refuses it;
      decoded_by_model       — the docids are a function of the model's parameters (GLEN): `assign` cannot
                               make them; the scheme offers `space(vocab_size)`, `table(tokens, weights,
                               rows, vocab_size)` and `write_decoded(directory, step, table, corpus, vocab)`
                               (the decoded docids in the scheme's own file format), and the composition
                               decodes them once parameters exist (with a model whose capabilities declare
                               `decodes_docids`).
    Optional methods with defaults here: `bind(vocab)` (re-attach the vocabulary after `load_state`) and
    `training_pairs()` (extra training pairs the scheme makes, e.g. MDGR's chunk → its docid; the
    `Objectives.scheme_pairs_rate` mixes them in).
    """

    name = "?"
    needs_embeddings = False
    uses_training_queries = False
    adds_tokens_per_document = False
    decoded_by_model = False

    def fit(self, corpus, context: FitContext = FitContext()) -> "DocidScheme":
        raise NotImplementedError

    def assign(self, corpus, rows: Optional[Sequence[int]] = None, embeddings=None) -> DocidTable:
        raise NotImplementedError

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        raise NotImplementedError

    def load_state(self, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def bind(self, vocab) -> None:
        """Re-attaches the vocabulary after `load_state` (schemes that tokenize keep it); default: nothing."""

    def training_pairs(self) -> list:
        """Extra training pairs (`data.pairs.Pairs` with `docid_index` into the last assigned table)."""
        return []


ADDED = "gr_jax.added_parameter"


def added_field(default):
    """A scheme parameter added after states were saved (`scheme_params` leaves it out at its default)."""
    return dataclasses.field(default=default, metadata={ADDED: True})


def scheme_params(scheme) -> dict:
    """The configured parameters of a scheme (its public scalar fields, and those of a nested dataclass such
    as its embedder), read *before* fit/load_state: part of what a saved scheme state was built from. A field
    declared with `added_field(default)` (a parameter added after states were saved) is left out while it holds
    its default, so those states still match."""
    out = {}
    if not dataclasses.is_dataclass(scheme):
        return out
    for f in dataclasses.fields(scheme):
        if f.name.startswith("_"):
            continue
        value = getattr(scheme, f.name)
        if f.metadata.get(ADDED) and value == f.default:
            continue
        if value is None or isinstance(value, (str, int, float, bool)):
            out[f.name] = value
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            out[f.name] = {"class": type(value).__name__, **scheme_params(value)}
    return out


def save_scheme(scheme: DocidScheme, path: str | os.PathLike, built_from: Optional[dict] = None) -> None:
    """Writes the state atomically, with `built_from` (corpus / vocabulary fingerprints, parameters) recorded
    so that a later run can check it before reusing the state."""
    meta, arrays = scheme.state()
    with atomic_dir(path) as tmp:
        (tmp / "scheme.json").write_text(json.dumps({"name": scheme.name, "built_from": built_from or {}, **meta,
                                                     "state_format": STATE_FORMAT,
                                                     "content_digest": _state_digest(meta, arrays)}, indent=1))
        np.savez(tmp / "scheme.npz", **arrays)


STATE_FORMAT = 2  # states written with a content digest (a state of this format without one was edited)


def _state_digest(meta: dict, arrays: dict) -> str:
    """blake2b-12 of the state as saved (its JSON, then each array's name, dtype, shape and bytes): recorded at
    save, compared at load, so an edited or damaged state is never used."""
    meta = json.loads(json.dumps({k: v for k, v in meta.items() if k != "name"}))  # as the file holds it
    h = hashlib.blake2b(json.dumps(meta, sort_keys=True).encode("utf-8"), digest_size=12)
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}{a.dtype.str}{a.shape}".encode())
        h.update(a.view(np.uint8).reshape(-1) if a.size and a.dtype != object else b"")
    return h.hexdigest()


def load_scheme_state(scheme: DocidScheme, path: str | os.PathLike,
                      built_from: Optional[dict] = None) -> DocidScheme:
    """Loads a saved state into `scheme`. With `built_from`, the state must have been built from the same
    things (each key compared), else a ValueError says what differs and how to rebuild."""
    path = Path(path)
    try:
        meta = read_json(path / "scheme.json")
        with np.load(path / "scheme.npz", allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a saved docid scheme ({e}); delete it to rebuild the docids") from None
    if meta.get("name") != scheme.name:
        raise ValueError(f"{path}: holds the state of scheme {meta.get('name')!r}, not {scheme.name!r}; use a new "
                         f"MODEL_DIR for another docid scheme")
    stored = meta.pop("built_from", None)
    recorded = meta.pop("content_digest", None)
    written_with_digest = meta.pop("state_format", None) is not None
    if recorded is None and written_with_digest:
        raise ValueError(f"{path}: the saved docid scheme lost its content digest (edited); delete {path} to rebuild "
                         f"the docids, or use a new MODEL_DIR")
    if recorded is None:
        log.warning("%s: written before content digests were recorded: its state is checked by what it was built "
                    "from only", path)
    elif recorded != _state_digest(meta, arrays):
        raise ValueError(f"{path}: the saved docid scheme is not the state that was written (its content digest "
                         f"differs: edited or damaged); delete {path} to rebuild the docids, or use a new MODEL_DIR")
    if built_from is not None:
        if not stored:
            raise ValueError(f"{path}: records nothing of what it was built from; delete {path} to rebuild "
                             f"the docids, or use a new MODEL_DIR")
        differs = [f"{k} (saved {stored.get(k)!r}, now {v!r})" for k, v in built_from.items() if stored.get(k) != v]
        if differs:
            raise ValueError(f"{path}: the saved docid scheme was built from another " + "; another ".join(differs)
                             + ". Use the configuration and data it was built with (MODEL_DIR/config.gin), or a "
                               "new MODEL_DIR")
    scheme.load_state(meta, arrays)
    return scheme
