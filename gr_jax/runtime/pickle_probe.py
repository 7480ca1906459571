"""What a refused PyTorch checkpoint pickles: `refused_global(path, allowed)` names the first global (module.name)
that the file's pickle asks for and that neither torch's weights-only loader (anything under `torch`) nor the
caller's allowlist accepts.

It is found by a `pickle.Unpickler` whose own `find_class` sees every global the stream names: nothing is imported
and nothing is called (every global it meets resolves to an inert stub, and the stream's persistent ids — tensor
storages — to None). The loaders call it only after torch has refused the file, to say what was refused
(`posix.system`, not the first word of torch's error text)."""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from typing import Iterable, Optional


class _Stub:
    """What every accepted global resolves to while probing: it takes any arguments and any state."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Stub()

    def __setstate__(self, state):
        pass

    def __setitem__(self, key, value):
        pass

    def append(self, value):
        pass

    def extend(self, values):
        pass


class _Refused(Exception):
    pass


def _name(obj) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"


class _Probe(pickle.Unpickler):
    def __init__(self, stream, allowed: set[str]):
        super().__init__(stream)
        self.allowed = allowed

    def find_class(self, module: str, name: str):
        full = f"{module}.{name}"
        if module == "torch" or module.startswith("torch.") or full in self.allowed:
            return _Stub
        raise _Refused(full)

    def persistent_load(self, pid):
        return None


def _torch_allowed() -> set[str]:
    """The globals torch's weights-only loader itself accepts outside `torch` (OrderedDict, set, ...)."""
    names = {"collections.OrderedDict", "collections.Counter", "builtins.set", "builtins.frozenset",
             "builtins.bytearray", "builtins.complex", "_codecs.encode"}
    try:
        from torch._weights_only_unpickler import _get_allowed_globals  # private, so a fallback above
    except ImportError:
        return names
    try:
        return names | set(_get_allowed_globals())
    except Exception:  # its signature is torch's to change
        return names


def _pickles(path: str | os.PathLike) -> list[bytes]:
    """The pickle streams of a checkpoint: `*/data.pkl` of torch's zip format, else the file itself (the legacy
    format, several pickles in a row)."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            return [z.read(n) for n in z.namelist() if n.endswith("data.pkl")]
    with open(path, "rb") as f:
        return [f.read()]


def refused_global(path: str | os.PathLike, allowed: Iterable = ()) -> Optional[str]:
    """'module.name' of the first global in the file's pickles outside torch and `allowed` (classes, functions or
    'module.name' strings); None when there is none or the file cannot be probed."""
    names = {a if isinstance(a, str) else _name(a) for a in allowed} | _torch_allowed()
    try:
        streams = _pickles(path)
    except (OSError, zipfile.BadZipFile):
        return None
    for data in streams:
        stream = io.BytesIO(data)
        while stream.tell() < len(data):
            try:
                _Probe(stream, names).load()
            except _Refused as e:
                return str(e)
            except Exception:  # the rest of the stream is not for us to judge: torch has refused it already
                break
    return None


def refusal_text(path, allowed: Iterable, error_text: str) -> str:
    """'the global posix.system' (found by the probe), else what torch's message names, else 'a global outside
    the allowlist'."""
    found = refused_global(path, allowed)
    if found:
        return f"the global {found}"
    marker = "Unsupported global: GLOBAL "
    if marker in error_text:
        return f"the global {error_text.split(marker, 1)[1].split()[0]}"
    return "a global outside the allowlist"
