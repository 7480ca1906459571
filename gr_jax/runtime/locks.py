"""One writer per output directory.

`output_lock(path, command)` takes an exclusive `fcntl.flock` on `path/.gr_jax.lock` for the time a command
writes `path` (a MODEL_DIR or OUTPUT_DIR). The file holds the holder's pid, host, command and start time:

* a second process that wants the directory stops at once with a `LockedError` naming the holder;
* the kernel drops a lock when its process dies, so a lock file left by a killed process (kill -9, power cut)
  is taken over, with a warning that names the process that left it;
* on a clean exit the lock file is removed, and a directory the command created and left empty (a refused
  command) is removed too: a refused command writes nothing.

What a run writes before it is accepted (the vocabulary and docid-scheme folders it builds while preparing) is
`provisional(path)`: if the run is refused before `accept()` (a training accepts once the checkpoints in MODEL_DIR
are accepted), the outermost lock removes those paths on its way out, so a refused run leaves the directory as it
found it. Nothing else is ever removed: a run that fails after `accept()` keeps what it wrote, to resume.

The lock file is written in full or not at all: on a full disk no empty lock file is left behind, and the
error names the directory and the space left there.

Taking the lock again in the same process (a protocol that trains into the directory it writes) is a no-op.
`flock` locks are advisory and local to a host where the file system does not support them across hosts
(some NFS set-ups): the host name in the file is there to tell such a case apart.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import errno
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Iterator, Optional

from gr_jax.runtime.errors import UserError
from gr_jax.runtime.io_utils import fault_point, free_space, make_dirs, no_space

log = logging.getLogger(__name__)

LOCK_NAME = ".gr_jax.lock"

_held: dict[str, int] = {}  # realpath → depth, for re-entry in one process
_provisional: list[Path] = []  # written by this run before it was accepted: removed if it is refused


def provisional(path: str | os.PathLike) -> None:
    """`path` (a file or folder this run just created) is removed if the run is refused before `accept()`."""
    _provisional.append(Path(path))


def accept() -> None:
    """The run is accepted: what it wrote so far stays, whatever happens next."""
    _provisional.clear()


def _inside(p: Path, folder: str) -> bool:
    return os.path.realpath(p).startswith(folder + os.sep)


def _remove_provisional(inside: str) -> None:
    for p in reversed(list(_provisional)):
        if not _inside(p, inside):
            continue
        _provisional.remove(p)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        log.info("the run was refused: removed %s, which it had written", p)


class LockedError(UserError, OSError):
    """Another process is writing the directory."""


def _holder(text: str) -> Optional[dict]:
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _describe(record: Optional[dict]) -> str:
    if not record:
        return "another process"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.get("started", 0)))
    return (f"process {record.get('pid')} on host {record.get('host')} ({record.get('command')}, started "
            f"{started})")


def _read(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 1 << 16).decode("utf-8", "replace")


def _acquire(lock_path: Path) -> int:
    """An open descriptor of `lock_path` holding the exclusive lock; the file checked to be the one at the path
    (a holder that removed it between our open and our lock would otherwise leave us a lock on a deleted file)."""
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(_read(fd))
            os.close(fd)
            raise LockedError(f"{lock_path.parent} is being written by {_describe(holder)}: one writer per "
                              f"directory — wait for it to finish, or use another directory") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


@contextlib.contextmanager
def output_lock(path: str | os.PathLike, command: str, suffix: str = "") -> Iterator[Path]:
    """Holds the directory `path` for this process (module docstring); yields it. `suffix` names another
    lock file, `.gr_jax.lock<suffix>`: process i > 0 of a multi-process run holds its own beside process 0's,
    so that a second run is refused by each of them."""
    path = Path(path)
    key = os.path.realpath(path)
    if _held.get(key):
        _held[key] += 1
        try:
            yield path
        finally:
            _held[key] -= 1
        return
    created = [p for p in [path, *path.parents] if not p.exists()]  # deepest first
    make_dirs(path)
    lock_path = path / f"{LOCK_NAME}{suffix}"
    fd = _acquire(lock_path)
    try:
        left = _holder(_read(fd))
        if left and left.get("pid") != os.getpid():
            log.warning("%s: took over the lock that %s left (it ended without releasing it: killed?); its "
                        "output there may be unfinished, and is resumed or replaced by this run", path,
                        _describe(left))
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "started": time.time()}
        try:
            fault_point("lock", lock_path)
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, json.dumps(record).encode())
            os.fsync(fd)
        except OSError as e:
            lock_path.unlink(missing_ok=True)  # no empty or partial lock file left behind
            if no_space(e):
                raise OSError(errno.ENOSPC, f"no space left on the device to write the lock file {lock_path} "
                              f"({free_space(path)} free there); free some space and run the command again") from None
            raise OSError(e.errno, f"cannot write the lock file {lock_path}: {e.strerror}") from None
        _held[key] = 1
        try:
            yield path
        except BaseException:
            _remove_provisional(key)
            raise
        finally:
            _held.pop(key, None)
            _provisional[:] = [p for p in _provisional if not _inside(p, key)]
            lock_path.unlink(missing_ok=True)
    finally:
        os.close(fd)
        for folder in created:  # those left empty: the command wrote nothing (a refused command, say)
            try:
                folder.rmdir()
            except OSError:
                break
