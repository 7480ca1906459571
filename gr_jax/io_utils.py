"""Writing outputs all-or-nothing, and never losing an earlier result.

* `atomic_dir(path)` yields a temporary sibling directory; on success it replaces `path` by
  rename-aside-then-swap (the old output is renamed to a sibling, the new one renamed in, then the old one
  removed), so a crash at any moment leaves either the old or the new output under `path` or beside it;
  on an exception the temporary directory is removed.
* `atomic_file(path)` / `write_text(path, text)` do the same for one file (temporary sibling, then
  `os.replace`).
* `keep_previous=True` (results: run files, metrics, reports, config.gin): when `path` already holds
  *different* content, the earlier one is kept as `<name>.prev-<n>` and a warning names it; identical content
  is replaced quietly (a re-run of a deterministic job). Without it (caches and state the caller has
  already checked), the old content is replaced.
* `clean_stale(path)`: temporaries of a killed writer (named with its process id) are removed on the next
  write to the same path, and an output that a killed swap had renamed aside is put back.
"""

from __future__ import annotations

import contextlib
import filecmp
import importlib.util
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)

_TMP, _OLD = ".tmp-", ".old-"


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def _exists(p: Path) -> bool:
    return p.exists() or p.is_symlink()


def _owner_gone(p: Path, tag: str) -> bool:
    """True when the writer whose pid is in the temporary name is no longer running."""
    m = re.match(r"(\d+)-", p.name.split(tag, 1)[1])
    if not m:
        return True
    pid = int(m.group(1))
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by someone else
        return False
    return False


def clean_stale(path: str | os.PathLike) -> None:
    """Removes temporaries that a killed writer left beside `path`; restores an output renamed aside."""
    path = Path(path)
    if not path.parent.is_dir():
        return
    for old in sorted(path.parent.glob(f".{path.name}{_OLD}*")):
        if not _owner_gone(old, _OLD):
            continue
        if _exists(path):
            _remove(old)
        else:  # killed between renaming the old output aside and renaming the new one in
            os.replace(old, path)
            log.warning("%s: restored the earlier output that an interrupted write had moved aside", path)
    for tmp in path.parent.glob(f".{path.name}{_TMP}*"):
        if _owner_gone(tmp, _TMP):
            _remove(tmp)
            log.info("removed %s, left by an interrupted write", tmp)


def _same(a: Path, b: Path) -> bool:
    if a.is_dir() != b.is_dir():
        return False
    if not a.is_dir():
        return filecmp.cmp(a, b, shallow=False)
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    return not mismatch and not errors and all(_same(a / d, b / d) for d in cmp.common_dirs)


def _previous_name(path: Path) -> Path:
    n = 1
    while _exists(path.with_name(f"{path.name}.prev-{n}")):
        n += 1
    return path.with_name(f"{path.name}.prev-{n}")


def _publish(tmp: Path, path: Path, keep_previous: bool) -> None:
    """Moves `tmp` to `path`; an existing `path` is renamed aside first (kept when `keep_previous` and it
    differs, otherwise removed after the swap)."""
    if not _exists(path):
        os.replace(tmp, path)
        return
    if keep_previous and not _same(path, tmp):
        kept = _previous_name(path)
        os.replace(path, kept)
        os.replace(tmp, path)
        log.warning("%s existed with a different result: the earlier one is kept as %s", path, kept.name)
        return
    aside = path.with_name(f".{path.name}{_OLD}{os.getpid()}-{os.urandom(4).hex()}")
    os.replace(path, aside)
    os.replace(tmp, path)
    _remove(aside)


def _prepare_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise OSError(f"cannot write {path}: a part of its parent path is a file, not a directory") from None
    clean_stale(path)


class atomic_dir:
    """Context manager yielding a temporary directory next to `path`; on success it replaces `path` (see the
    module docstring), on an exception it is deleted, so `path` never holds a half-written result."""

    def __init__(self, path: str | os.PathLike, overwrite: bool = True, keep_previous: bool = False):
        self.path = Path(path)
        self.overwrite = overwrite
        self.keep_previous = keep_previous

    def __enter__(self) -> Path:
        empty_dir = self.path.is_dir() and not self.path.is_symlink() and not any(self.path.iterdir())
        if not self.overwrite and _exists(self.path) and not empty_dir:
            raise FileExistsError(f"{self.path}: exists{' and is not empty' if self.path.is_dir() else ''}; "
                                  f"choose another destination or allow overwriting")
        _prepare_parent(self.path)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}{_TMP}{os.getpid()}-", dir=self.path.parent))
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        try:
            _publish(self.tmp, self.path, self.keep_previous)
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        return False


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", keep_previous: bool = False, **open_kwargs) -> Iterator:
    """`open(path, mode)` on a temporary sibling that replaces `path` when the block succeeds."""
    path = Path(path)
    _prepare_parent(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{_TMP}{os.getpid()}-", dir=path.parent)
    tmp = Path(tmp)
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            yield f
        _publish(tmp, path, keep_previous)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike, text: str, keep_previous: bool = False) -> None:
    with atomic_file(path, "w", keep_previous=keep_previous, encoding="utf-8") as f:
        f.write(text)


def write_bytes(path: str | os.PathLike, data: bytes, keep_previous: bool = False) -> None:
    with atomic_file(path, "wb", keep_previous=keep_previous) as f:
        f.write(data)


def package_data(package: str, relative: str, install: str) -> Path:
    """A data file shipped inside an installed package, found without importing the package (whose import
    may need dependencies we do not install). `install`: the command that provides it, for the error."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{relative} comes from the PyPI package {package!r}: {install}")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.exists():
        raise FileNotFoundError(f"{path}: not found; reinstall it ({install} --force-reinstall)")
    return path
