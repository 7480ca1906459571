"""Things built once per test run and shared by the tests that read them (the session fixtures of conftest.py):
a folder is built by the first worker that asks for it (pytest-xdist's workers wait on a file lock), recorded
with a digest of every file in it, and checked against that digest when the session ends, so a test that wrote
into a shared folder fails loudly instead of changing what the next test reads. A test that writes takes
`copy_of(folder, tmp_path)` first."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Callable

DIGEST = ".shared_digest"


def run_root(tmp_path_factory) -> Path:
    """A folder of this test run that every xdist worker of the run sees (the workers' base folders are its
    children); without xdist, the run's own base folder."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def tree_digest(folder: Path) -> str:
    """sha256 over the relative path, kind and bytes of everything under `folder` (the digest file excepted)."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if rel == DIGEST:
            continue
        h.update(rel.encode() + b"\0")
        if p.is_symlink():
            h.update(b"l" + os.readlink(p).encode())
        elif p.is_file():
            h.update(b"f" + hashlib.sha256(p.read_bytes()).digest())
        else:
            h.update(b"d")
    return h.hexdigest()


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder `name` of this run, built by `build(folder)` the first time any worker asks for it. It is built
    where it stays (what it records of its own path holds) and its digest, written last, marks it complete: a
    folder without one (a build that failed) is built again."""
    from filelock import FileLock

    root = run_root(tmp_path_factory) / "shared"
    root.mkdir(parents=True, exist_ok=True)
    target = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (target / DIGEST).is_file():
            if target.exists():
                shutil.rmtree(target)
            target.mkdir()
            build(target)
            (target / DIGEST).write_text(tree_digest(target))
    return target


def check_unchanged(folder: Path) -> None:
    """Fails when a test wrote into a shared folder (the digest it was built with no longer matches)."""
    recorded = (folder / DIGEST).read_text()
    if tree_digest(folder) != recorded:
        raise AssertionError(f"{folder}: a test wrote into this shared folder; tests that write must work on "
                             "tests.shared.copy_of(folder, tmp_path)")


def copy_of(folder: Path, dest: Path) -> Path:
    """A private copy of a shared folder to write into (without the digest file)."""
    shutil.copytree(folder, dest, ignore=shutil.ignore_patterns(DIGEST))
    return dest
