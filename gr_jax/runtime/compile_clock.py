"""Time spent compiling, apart from time spent running: JAX reports the duration of each compilation phase
(tracing, lowering, XLA's compile) as `jax.monitoring` events; `CompileClock` adds up those that happen inside a
block, and counts the programs XLA compiled there. The dynamic-corpora protocol writes them beside each step's
search time (`dynamic_timing.json`: compile_s, compiled_programs), so that a run that recompiles its search for
every part shows it."""

from __future__ import annotations

import collections
import contextlib
import os
import threading

_lock = threading.Lock()
_local = threading.local()
_totals = {"seconds": 0.0, "programs": 0, "loaded": 0}
_names: collections.Counter = collections.Counter()  # programs XLA compiled, by function name
_listening = False
PREFIX = "/jax/core/compile/"
CACHE_HIT = "/jax/compilation_cache/cache_hits"


def _listen(event: str, duration: float, fun_name: str = "?", **_) -> None:
    if event.startswith(PREFIX):
        with _lock:
            _totals["seconds"] += duration
            if event.endswith("backend_compile_duration"):  # a program compiled, or read back from the cache
                if getattr(_local, "hit", False):
                    _totals["loaded"] += 1
                else:
                    _totals["programs"] += 1
                    _names[fun_name] += 1
                _local.hit = False


def _hit(event: str, **_) -> None:
    if event == CACHE_HIT:  # recorded inside the backend compile it replaces, on the same thread
        _local.hit = True


def _start_listening() -> None:
    global _listening
    with _lock:
        if _listening:
            return
        _listening = True
    from jax import monitoring

    monitoring.register_event_duration_secs_listener(_listen)
    monitoring.register_event_listener(_hit)


class CompileClock:
    """`with CompileClock() as c: ...` → `c.seconds` (compilation inside the block — tracing, lowering, XLA or a
    read from the persistent cache — every thread of the process), `c.programs` (programs XLA compiled),
    `c.loaded` (programs read back from the persistent cache instead) and `c.names` (the compiled ones by
    function name: {name: count})."""

    seconds: float = 0.0
    programs: int = 0
    loaded: int = 0
    names: dict = {}

    def __enter__(self) -> "CompileClock":
        _start_listening()
        with _lock:
            self._start = dict(_totals)
            self._names = collections.Counter(_names)
        return self

    def __exit__(self, *exc) -> None:
        with _lock:
            self.seconds = _totals["seconds"] - self._start["seconds"]
            self.programs = _totals["programs"] - self._start["programs"]
            self.loaded = _totals["loaded"] - self._start["loaded"]
            self.names = dict(sorted((_names - self._names).items()))


CACHE_VARIABLE = "JAX_COMPILATION_CACHE_DIR"


@contextlib.contextmanager
def compilation_cache(folder, min_compile_seconds: float = 0.2):
    """Within the block, XLA's compiled programs are kept in `folder` (JAX's persistent cache: an entry is keyed by
    the program, the backend, the compile options and the JAX version, so a hit is the program XLA would compile),
    unless JAX_COMPILATION_CACHE_DIR names one already (a caller's, e.g. `reproduce` sharing one over its systems).
    A program that compiles in under `min_compile_seconds` is not kept. Both settings come back after the block
    (JAX keeps using a folder it opened inside it for the rest of the process)."""
    import jax

    chosen = os.environ.get(CACHE_VARIABLE) or str(folder)
    os.makedirs(chosen, exist_ok=True)
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    before = [getattr(jax.config, n) for n in names]
    jax.config.update(names[0], chosen)
    jax.config.update(names[1], float(min_compile_seconds))
    try:
        yield chosen
    finally:
        for n, v in zip(names, before):
            jax.config.update(n, v)
