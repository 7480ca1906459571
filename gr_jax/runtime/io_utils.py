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
* Files and folders follow the umask (a temporary file is created 0600 and renamed into place: it is given
  the mode an `open` would have given it).
* `json_text(obj)`: strict JSON (no bare NaN/Infinity, which strict parsers reject): a non-finite number is
  written as `null`, and the caller says why beside it where it knows.
* `read_text` / `read_json` / `read_jsonl`: a file that is not UTF-8, truncated or not JSON is an error naming
  the file (and the line).
* `read_only(why)`: from then on every write through this module raises (a process of a multi-process run
  other than process 0, which writes for all: `gr_jax/runtime/distributed.py`); a missed guard is a loud bug, never a
  second writer.
* `fault_point(name)`: where the reliability tests inject a kill or a full disk (environment variable
  `GR_JAX_FAULT=<name>:<n>:<kill|enospc>`: the n-th time this process passes that point); nothing otherwise.
"""

from __future__ import annotations

import contextlib
import errno
import filecmp
import inspect
import importlib.util
import json
import logging
import math
import numbers
import os
import re
import shutil
import signal
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Iterator

from gr_jax.runtime.errors import UserError

log = logging.getLogger(__name__)

_TMP, _OLD = ".tmp-", ".old-"


class FileFormatError(UserError, ValueError):
    """A file that cannot be read as what it should be; the message names the file (and line)."""


# ----------------------------------------------------------------------------------------------------------
# fault injection (tests/reliability)
# ----------------------------------------------------------------------------------------------------------

_FAULT_COUNTS: dict[str, int] = {}


def fault_point(name: str, path: str | os.PathLike | None = None) -> None:
    """Does nothing unless `GR_JAX_FAULT=<name>:<n>:<action>` names this point: then, the n-th time this
    process passes it, `kill` sends itself SIGKILL (a crash at that moment) and `enospc` raises the OSError a
    full disk raises (for `path`)."""
    spec = os.environ.get("GR_JAX_FAULT")
    if not spec:
        return
    for one in spec.split(","):
        parts = one.split(":")
        if len(parts) != 3 or not parts[0] or not parts[1].isdigit() or int(parts[1]) < 1 \
                or parts[2] not in ("kill", "enospc"):
            raise ValueError(f"GR_JAX_FAULT={spec!r}: {one!r} is not <point>:<n ≥ 1>:<kill|enospc> (several "
                             f"separated by commas); unset GR_JAX_FAULT to run without injected faults")
        where, n, action = parts
        if where != name:
            continue
        _FAULT_COUNTS[name] = _FAULT_COUNTS.get(name, 0) + 1
        if _FAULT_COUNTS[name] != int(n):
            continue
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "enospc":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path) if path is not None else None)


# ----------------------------------------------------------------------------------------------------------
# modes
# ----------------------------------------------------------------------------------------------------------


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: Path, directory: bool = False) -> None:
    """The mode `open` / `mkdir` would have given `path` (mkstemp/mkdtemp create 0600/0700)."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


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


def keep_aside(path: str | os.PathLike) -> Path:
    """Renames an existing `path` to `<name>.prev-<n>` (the first free n) and returns the new name: an output
    that a new run replaces is kept, not deleted."""
    path = Path(path)
    _check_writer(path)
    kept = _previous_name(path)
    os.replace(path, kept)
    return kept


def _publish(tmp: Path, path: Path, keep_previous: bool) -> None:
    """Moves `tmp` to `path`; an existing `path` is renamed aside first (kept when `keep_previous` and it
    differs, otherwise removed after the swap)."""
    if not _exists(path):
        os.replace(tmp, path)
        return
    if keep_previous and not _same(path, tmp):
        kept = _previous_name(path)
        os.replace(path, kept)
        fault_point("publish", path)
        os.replace(tmp, path)
        log.warning("%s existed with a different result: the earlier one is kept as %s", path, kept.name)
        return
    aside = path.with_name(f".{path.name}{_OLD}{os.getpid()}-{os.urandom(4).hex()}")
    os.replace(path, aside)
    fault_point("publish", path)  # the old output aside, the new one not yet in: clean_stale restores it
    os.replace(tmp, path)
    _remove(aside)


_READ_ONLY: list[str] = []  # why this process writes nothing (empty: it writes)


def read_only(why: str) -> None:
    """Every later write through this module raises `RuntimeError` naming `why` (module docstring)."""
    _READ_ONLY[:] = [why]


def writes() -> bool:
    """Whether this process writes outputs (False after `read_only`)."""
    return not _READ_ONLY


def _check_writer(path: Path) -> None:
    if _READ_ONLY:
        raise RuntimeError(f"{path}: written by {_READ_ONLY[0]}; a bug: this write needs an is_primary() guard")


def make_dirs(path: str | os.PathLike, what: str = "output directory") -> Path:
    """`mkdir -p path`; a part of it that is a file is an error that names it (not `[Errno 17] File exists`)."""
    path = Path(path)
    for part in [path, *path.parents]:
        if _exists(part) and not part.is_dir():
            raise FileFormatError(f"cannot use {path} as the {what}: {part} is a file, not a directory; choose "
                                  f"another path or move the file")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _prepare_parent(path: Path) -> None:
    _check_writer(path)
    make_dirs(path.parent, f"folder of {path.name}")
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
        follow_umask(self.tmp, directory=True)
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            if isinstance(exc, OSError) and not _names(exc, self.path):
                raise _named(exc, self.path) from None
            return False
        try:
            _publish(self.tmp, self.path, self.keep_previous)
        except OSError as e:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise e if _names(e, self.path) else _named(e, self.path) from None
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        return False


_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)


def _names(e: OSError, path: Path) -> bool:
    """Whether `e` needs no rewording: it names `path` already, is one of ours, or is not a failed write."""
    return str(path) in str(e) or isinstance(e, UserError) or not (no_space(e) or e.errno in _WRITE_ERRNOS)


def _named(e: OSError, path: Path) -> OSError:
    """An OSError of a write (a full disk: `[Errno 28] No space left on device`, no path) as one that names the
    output and the space left where it is written."""
    if no_space(e):
        return OSError(errno.ENOSPC, f"no space left on the device while writing {path} ({free_space(path)} free "
                                     f"there); free some space and run the same command again")
    return OSError(e.errno, f"cannot write {path}: {e.strerror or e} ({free_space(path)} free there)")


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", keep_previous: bool = False, **open_kwargs) -> Iterator:
    """`open(path, mode)` on a temporary sibling that replaces `path` when the block succeeds."""
    path = Path(path)
    _prepare_parent(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{_TMP}{os.getpid()}-", dir=path.parent)
    tmp = Path(tmp)
    try:
        follow_umask(tmp)
        with os.fdopen(fd, mode, **open_kwargs) as f:
            yield f
            fault_point("write", path)
        _publish(tmp, path, keep_previous)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise e if _names(e, path) else _named(e, path) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike, text: str, keep_previous: bool = False) -> None:
    with atomic_file(path, "w", keep_previous=keep_previous, encoding="utf-8") as f:
        f.write(text)


def write_bytes(path: str | os.PathLike, data: bytes, keep_previous: bool = False) -> None:
    with atomic_file(path, "wb", keep_previous=keep_previous) as f:
        f.write(data)


# ----------------------------------------------------------------------------------------------------------
# strict JSON, and reading files with errors that name them
# ----------------------------------------------------------------------------------------------------------


def finite_or_none(obj):
    """`obj` with every non-finite float (NaN, ±inf; numpy scalars included) replaced by None, and numpy
    scalars made Python numbers."""
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    if type(obj).__module__ == "numpy" and getattr(obj, "ndim", None) == 0:
        obj = obj.item()  # numpy scalars (np.bool_ is no number) as Python values
    if isinstance(obj, bool) or not isinstance(obj, numbers.Real):
        return obj
    if isinstance(obj, numbers.Integral):
        return int(obj)
    return float(obj) if math.isfinite(obj) else None


def json_text(obj, **kwargs) -> str:
    """Strict JSON: non-finite numbers become null (`finite_or_none`), never a bare NaN."""
    return json.dumps(finite_or_none(obj), allow_nan=False, **kwargs)


BOM = b"\xef\xbb\xbf"


def open_skipping_bom(path: str | os.PathLike):
    """The file opened in binary, past a UTF-8 byte-order mark if it starts with one (editors on Windows write
    it; left in, it would become part of the first id, and a lookup of that id fail in another file)."""
    f = open(path, "rb")
    if f.read(len(BOM)) != BOM:
        f.seek(0)
    return f


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """The file's text (UTF-8; a leading byte-order mark is dropped); bytes that are not UTF-8 → an error naming
    the file, the line and the offset."""
    path = Path(path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise FileFormatError(f"{what} {path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}, "
                              f"line {line}); save it as UTF-8") from None
    return text[1:] if text.startswith("\ufeff") else text


def _json_error(path: Path, what: str, e: json.JSONDecodeError, line_offset: int = 0) -> FileFormatError:
    return FileFormatError(f"{what} {path}: line {e.lineno + line_offset} column {e.colno}: {e.msg} (is the "
                           f"file truncated or not JSON?)")


def read_json(path: str | os.PathLike, what: str = "JSON file"):
    path = Path(path)
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise _json_error(path, what, e) from None


def read_jsonl(path: str | os.PathLike, what: str = "JSON-lines file") -> list:
    """One JSON value per non-empty line; a bad line is an error naming the file and the line."""
    path = Path(path)
    rows = []
    for n, line in enumerate(read_text(path, what).splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise _json_error(path, what, e, n - 1) from None
    return rows


def load_npz(path: str | os.PathLike, what: str = "array file") -> dict:
    """The arrays of a .npz file (no pickled objects), as a dict; a truncated or foreign file is an error naming it."""
    import zipfile

    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise FileFormatError(f"{what} {path}: no such file") from None
    except (zipfile.BadZipFile, EOFError, ValueError, OSError) as e:
        raise FileFormatError(f"{what} {path}: not a readable .npz file ({type(e).__name__}: {e}); truncated or "
                              f"damaged?") from None


def no_space(e: BaseException) -> bool:
    """Whether `e`, or an exception it came from, is a full disk (orbax and tensorstore wrap the OSError)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC or "No space left on device" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def free_space(path: str | os.PathLike) -> str:
    """The free space of the file system that holds `path` (or its nearest existing parent), for messages."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return f"{shutil.disk_usage(path).free / 2**20:.0f} MiB"


class _OrbaxThreadNoise(logging.Filter):
    """orbax's worker threads log the error they hit (a full disk, an unreadable file) with its traceback, at
    ERROR, before the call that started them raises it; the caller then reports it once, naming the path. Those
    records (from orbax's own files, with a traceback) go to our debug log instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.levelno >= logging.ERROR and _from_orbax(record):
            log.debug("orbax worker: %s", record.getMessage()[:300])
            return False
        return True


def _from_orbax(record: logging.LogRecord) -> bool:
    """Whether the record was logged by orbax's code: its call site, or (absl's logger names its own file as the
    call site) a frame of its traceback."""
    mark = f"{os.sep}orbax{os.sep}"
    if mark in record.pathname:
        return True
    tb = record.exc_info[2] if record.exc_info else None
    while tb is not None:
        if mark in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


_ORBAX_NOISE = _OrbaxThreadNoise()


def quiet_orbax_threads() -> None:
    """Routes orbax's worker-thread tracebacks to the debug log (idempotent; every module that calls orbax
    calls it at import, so every path is covered)."""
    for name in ("absl", "orbax"):
        logger = logging.getLogger(name)
        if _ORBAX_NOISE not in logger.filters:
            logger.addFilter(_ORBAX_NOISE)


def orbax_error_line(e: BaseException, limit: int = 200) -> str:
    """The first line of an orbax / tensorstore error, without tensorstore's "See full TensorStore details"
    tail: the cause a message about an unreadable checkpoint keeps."""
    return (str(e).splitlines() or [""])[0].split(" See full TensorStore details")[0][:limit]


@contextlib.contextmanager
def abandoned_reads_quiet():
    """When one array of a checkpoint cannot be read, orbax gives up on the others while tensorstore still
    completes them: each completion then reports "Event loop is closed" (or a coroutine never awaited) as an
    unraisable exception — a dozen tracebacks around the one error message, some after it. Those go to the
    debug log: for the restore, and, if it failed, for the rest of the process (the abandoned reads finish
    later). Other unraisable exceptions still reach the previous hook."""
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if inspect.iscoroutine(unraisable.object) or "Event loop is closed" in str(unraisable.exc_value):
            log.debug("abandoned checkpoint read: %s", unraisable.exc_value)
        else:
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    except BaseException:
        warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
        if _abandoned_read_tasks not in logging.getLogger("asyncio").filters:  # "… exception was never retrieved"
            logging.getLogger("asyncio").addFilter(_abandoned_read_tasks)
        raise
    sys.unraisablehook = previous


def _abandoned_read_tasks(record: logging.LogRecord) -> bool:
    """asyncio's "Task / _GatheringFuture exception was never retrieved", which follows a failed checkpoint read
    (the filter is installed only then): the abandoned reads' futures, to the debug log."""
    message = record.getMessage()
    if "exception was never retrieved" in message.split("\n", 1)[0]:
        log.debug("abandoned checkpoint read: %s", message[:200])
        return False
    return True


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
