"""What a saved file was built from, and the one rule for reusing it.

Files that a command writes once and reuses on a re-run (a docid bank, pseudo-queries, query variations,
translations) start with a record of what they were built from (`built_from`: the settings, the digests of the
inputs). `reuse(path, built_from, load, what)` reads such a file back only when its record equals what this
run would build it from; otherwise it refuses with a `ProvenanceError` that names the differing keys and the
fix — a file is never silently reused for other inputs, nor silently overwritten.

`file_digest(path)`: the one digest of a file's bytes used in such records (blake2b, 12 bytes, read in blocks,
so a multi-GB weight file costs one pass and no memory).

`records_text(head, rows)` / `read_records(path, what)`: the JSON-lines format of such files — a header line
(the record, statistics, the number of rows and a digest of the row lines), then one row a line. Reading checks
the rows against the header's digest, so a file whose rows were edited, deleted or cut off is refused, not
reused with its settings' blessing.

`array_digests(tree)` / `changed_arrays(tree, recorded)`: the checksums of a tree of arrays (a checkpoint's
state, a converted checkpoint's parameters), recorded at save and compared on every read: a flipped bit on disk
is a finite number, and only the checksum tells.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, TypeVar

import numpy as np

from gr_jax.runtime.errors import UserError
from gr_jax.runtime.io_utils import FileFormatError, read_text

T = TypeVar("T")

log = logging.getLogger(__name__)


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


def json_digest(obj) -> str:
    """blake2b-12 of a JSON value in its canonical text (sorted keys): the content digest of a stored result,
    recorded beside it when written and compared before it is reused."""
    return hashlib.blake2b(json.dumps(obj, sort_keys=True, allow_nan=False).encode("utf-8"),
                           digest_size=12).hexdigest()


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


def _rows_digest(lines: list[str]) -> str:
    return hashlib.blake2b("\n".join(lines).encode("utf-8"), digest_size=12).hexdigest()


def records_text(head: Mapping, rows: list) -> str:
    """The file's text: `head` plus the row count and digest on the first line, then a row a line."""
    lines = [json.dumps(r, ensure_ascii=False, allow_nan=False) for r in rows]
    head = {**head, "rows": len(lines), "rows_digest": _rows_digest(lines)}
    return "".join(line + "\n" for line in [json.dumps(head, sort_keys=True, allow_nan=False), *lines])


def read_records(path: str | os.PathLike, what: str) -> tuple[dict, list]:
    """(header, rows) of a file written from `records_text`; anything else — not UTF-8, not JSON, no header,
    rows that are not the ones the header's digest was computed over — is an error naming the file (and line)
    that says to delete it to build it again."""
    path = Path(path)
    fix = "delete it to build it again"
    # "\n" only: str.splitlines would also split a row at U+2028, U+2029 or \x85 inside its text
    lines = [line.rstrip("\r") for line in read_text(path, what).split("\n") if line.strip()]
    parsed = []
    for n, line in enumerate(lines, 1):
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise FileFormatError(f"{what} {path}: line {n}: {e.msg} (truncated or edited?); {fix}") from None
    if not parsed or not isinstance(parsed[0], dict) or "built_from" not in parsed[0]:
        raise FileFormatError(f"{what} {path}: no header line with what it was built from; not a file of this "
                              f"library, or emptied; {fix}")
    head, rows = parsed[0], parsed[1:]
    if "rows_digest" not in head:  # never read unchecked: a header stripped of its digest would pass anything
        raise ProvenanceError(f"{what} {path}: its header records no checksum of its rows (written before row "
                              f"checksums, or edited), so its rows cannot be checked; {fix}")
    if head.get("rows") != len(rows) or head["rows_digest"] != _rows_digest(lines[1:]):
        raise ProvenanceError(f"{what} {path}: its rows are not the ones it was written with ({len(rows)} rows, "
                              f"{head.get('rows')} written; the checksum differs): edited, cut off or damaged; "
                              f"{fix}")
    return head, rows


def key_path(path) -> str:
    """'opt_state/1/0/mu/...': a tree leaf's key path as text, the same for a tree and for the plain dicts and
    lists orbax restores it as without a template (a named tuple's field and a dict key, a tuple index and a list
    index alike)."""
    parts = []
    for k in path:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


def array_digests(tree, to_host: Callable[[Any], np.ndarray] = np.asarray) -> dict[str, str]:
    """{key path: blake2b-12 of dtype, shape and bytes} of every array of `tree`, one array on the host at a
    time (`to_host`: how a leaf reaches this process, e.g. gathered from several)."""
    import jax

    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        a = np.ascontiguousarray(to_host(leaf))
        h = hashlib.blake2b(f"{a.dtype.str}{a.shape}".encode(), digest_size=12)
        h.update(a.view(np.uint8).reshape(-1) if a.size else b"")
        out[key_path(path)] = h.hexdigest()
    return out


def changed_arrays(held: Mapping[str, str], recorded: Mapping[str, str]) -> list[str]:
    """The key paths whose digest differs between two `array_digests` records (missing on either side
    included), sorted."""
    return sorted(k for k in set(held) | set(recorded) if held.get(k) != recorded.get(k))


def git_commit(repo) -> str:
    """The HEAD commit of the git working tree `repo` (a reference code a fixture tool ran), or a note saying it is
    not one."""
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git working tree)"
