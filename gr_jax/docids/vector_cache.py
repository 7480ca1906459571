"""Document vectors computed once per MODEL_DIR: `document_vectors(embedder, texts, cache_dir)`.

A pretrained encoder's vectors of a corpus (all-MiniLM-L6-v2 reads 2504 pydoc documents in about a minute here,
a real corpus of 8k long documents in half an hour) are the same in every command that builds the same system:
train, infer, the dynamic protocol's steps. They are written once, to `cache_dir/<key>.npz`, and reused.

What a file is reused for: its record (`built_from`) holds the digest of the texts in order, the embedder's
`recipe()` (its class, the digest of its weights and tokenizer files — a fine-tuned encoder's vectors are
another file —, the lengths it reads) and the array's shape; the file name is a digest of that record. Before
reuse the record must equal this run's, and the vectors' own content digest, recorded when they were written,
must equal the digest of the array read back. A file that fails either check (edited, cut off, damaged, or
written for other texts under a colliding name) is never trusted: the vectors are computed again, a warning
names the file and what failed, and the new file replaces it through the keep-previous path (the damaged one
stays as `<name>.prev-<n>`).

An embedder whose `recipe()` is None (TF-IDF + SVD, fitted on the corpus in a second) is not cached. With
`write=False` (inference, which writes nothing into MODEL_DIR) a missing or stale file is computed and not
written.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from gr_jax.data.readers import fingerprint
from gr_jax.runtime import io_utils, locks
from gr_jax.runtime.io_utils import FileFormatError

log = logging.getLogger(__name__)

FORMAT = "gr_jax.document_vectors/1"


def vectors_digest(vectors: np.ndarray) -> str:
    """blake2b-12 of the array's dtype, shape and bytes: what the file records and what a read must give."""
    a = np.ascontiguousarray(vectors)
    h = hashlib.blake2b(f"{a.dtype.str}{a.shape}".encode(), digest_size=12)
    h.update(a.view(np.uint8).reshape(-1) if a.size else b"")
    return h.hexdigest()


def cache_record(embedder, texts: Sequence[str]) -> Optional[dict]:
    """What the vectors of `texts` by `embedder` are built from (None: the embedder is not cached)."""
    recipe = embedder.recipe()
    if recipe is None:
        return None
    return {"format": FORMAT, "texts": fingerprint(list(texts)), "count": len(texts),
            "embedder": json.loads(json.dumps(recipe))}


def cache_path(cache_dir: str | Path, record: dict) -> Path:
    key = hashlib.blake2b(json.dumps(record, sort_keys=True).encode(), digest_size=10).hexdigest()
    return Path(cache_dir) / f"{record['embedder'].get('class', 'vectors')}-{key}.npz"


def _read(path: Path, record: dict) -> tuple[Optional[np.ndarray], str]:
    """(the vectors, "") when the file holds what `record` describes and its content is intact; else (None,
    why not)."""
    try:
        arrays = io_utils.load_npz(path, "document vectors")
    except FileFormatError as e:
        return None, str(e)
    if set(arrays) != {"vectors", "meta"}:
        return None, f"holds {sorted(arrays)}, not vectors and meta"
    try:
        meta = json.loads(str(arrays["meta"]))
    except (json.JSONDecodeError, TypeError):
        return None, "its record is not JSON"
    if not isinstance(meta, dict) or meta.get("built_from") != record:
        return None, "it was built from other texts or another encoder"
    vectors = arrays["vectors"]
    if vectors.dtype != np.float32 or vectors.ndim != 2 or vectors.shape[0] != record["count"]:
        return None, f"its array is {vectors.dtype} {vectors.shape}, not float32 [{record['count']}, D]"
    if meta.get("digest") != vectors_digest(vectors):
        return None, "its vectors are not the ones it was written with (the content digest differs)"
    if not np.all(np.isfinite(vectors)):
        return None, "its vectors hold NaN or inf"
    return vectors, ""


def _write(path: Path, vectors: np.ndarray, record: dict) -> None:
    import io

    buf = io.BytesIO()
    meta = json.dumps({"built_from": record, "digest": vectors_digest(vectors)}, sort_keys=True)
    np.savez(buf, vectors=vectors, meta=np.asarray(meta))
    io_utils.write_bytes(path, buf.getvalue(), keep_previous=True)


def document_vectors(embedder, texts: Sequence[str], cache_dir: Optional[str | Path], *, write: bool = True,
                     what: str = "documents") -> np.ndarray:
    """`embedder.embed(texts)` ([N, D] float32), read from `cache_dir` when an intact file for exactly these texts
    and this embedder is there (module docstring), else computed (and written when `write`)."""
    texts = list(texts)
    record = cache_record(embedder, texts) if cache_dir is not None else None
    if record is None:
        return np.asarray(embedder.embed(texts), np.float32)
    path = cache_path(cache_dir, record)
    if path.exists():
        vectors, why = _read(path, record)
        if vectors is not None:
            log.info("%s: %d vectors reused from %s", what, len(texts), path)
            return vectors
        log.warning("%s: not reusing %s: %s; computing the vectors again%s", what, path, why,
                    " (the file is kept as a .prev copy)" if write and io_utils.writes() else "")
    log.info("%s: computing %d vectors (%s)%s", what, len(texts), record["embedder"].get("class"),
             f", written to {path}" if write else "")
    vectors = np.ascontiguousarray(np.asarray(embedder.embed(texts), np.float32))
    if vectors.ndim != 2 or vectors.shape[0] != len(texts):
        raise ValueError(f"{type(embedder).__name__}.embed gave an array of shape {vectors.shape} for {len(texts)} "
                         f"texts")
    if write and io_utils.writes():
        new_dir, new_file = not path.parent.exists(), not path.exists()
        _write(path, vectors, record)
        if new_file:  # removed again if the command is refused before it is accepted (nothing left half-made)
            locks.provisional(path.parent if new_dir else path)
    return vectors
