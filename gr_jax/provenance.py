"""What a saved file was built from, and the one rule for reusing it.

Files that a command writes once and reuses on a re-run (a docid bank, pseudo-queries, query variations,
translations) start with a record of what they were built from (`built_from`: the settings, the digests of the
inputs). `reuse(path, built_from, load, what)` reads such a file back only when its record equals what this
run would build it from; otherwise it refuses with a `ProvenanceError` that names the differing keys and the
fix — a file is never silently reused for other inputs, nor silently overwritten.

`file_digest(path)`: the one digest of a file's bytes used in such records (blake2b, 12 bytes, read in blocks,
so a multi-GB weight file costs one pass and no memory).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Mapping, Optional, TypeVar

from gr_jax.errors import UserError

T = TypeVar("T")


class ProvenanceError(UserError, ValueError):
    """A saved file was built from other inputs or settings than this run's."""


def file_digest(path: str | os.PathLike, what: str = "file") -> str:
    """blake2b (12 bytes, hex) of the file's bytes; an unreadable file is an error naming it and `what` it is."""
    h = hashlib.blake2b(digest_size=12)
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    except OSError as e:
        raise ProvenanceError(f"{what} {path}: cannot read it ({e.strerror})") from None
    return h.hexdigest()


def differing_keys(held: Mapping, wanted: Mapping) -> list[str]:
    """The keys whose values differ between two provenance records, sorted."""
    return sorted(k for k in set(held) | set(wanted) if held.get(k) != wanted.get(k))


def normalized(built_from: Mapping) -> dict:
    """The record as a JSON file holds it (tuples become lists, keys strings): what a loaded record equals."""
    return json.loads(json.dumps(built_from))


def reuse(path: str | os.PathLike, built_from: Mapping, load: Callable[[Path], T],
          what: str = "the file") -> Optional[T]:
    """The object saved at `path` (`load(path)`, which must return an object with a `built_from` record) when
    it was built from `built_from`; None when there is no file yet. A file built from anything else is a
    `ProvenanceError` naming the differing keys: use the settings it was built with, another output
    directory, or delete the file to build it again."""
    path = Path(path)
    if not path.exists():
        return None
    held = load(path)
    wanted = normalized(built_from)
    if held.built_from != wanted:
        differs = differing_keys(held.built_from, wanted)
        raise ProvenanceError(f"{path}: {what} was built with another {', '.join(differs)} than this run's; use "
                              f"the settings it was built with (the config.gin beside it), another output "
                              f"directory, or delete the file to build it again")
    return held
