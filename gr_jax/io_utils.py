"""Writing outputs all-or-nothing: a temporary sibling directory renamed into place on success."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


class atomic_dir:
    """Context manager yielding a temporary directory next to `path`; on success it replaces `path`, on an
    exception it is deleted, so `path` never holds a half-written result."""

    def __init__(self, path: str | os.PathLike, overwrite: bool = True):
        self.path = Path(path)
        self.overwrite = overwrite

    def __enter__(self) -> Path:
        if self.path.exists() and any(self.path.iterdir()) and not self.overwrite:
            raise FileExistsError(f"{self.path}: exists and is not empty")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.tmp-", dir=self.path.parent))
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        if self.path.exists():
            shutil.rmtree(self.path)
        os.replace(self.tmp, self.path)
        return False
