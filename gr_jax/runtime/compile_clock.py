"""Time spent compiling, apart from time spent running: JAX reports the duration of each compilation phase
(tracing, lowering, XLA's compile) as `jax.monitoring` events; `CompileClock` adds up those that happen inside a
block, and counts the programs XLA compiled there. The dynamic-corpora protocol writes them beside each step's
search time (`dynamic_timing.json`: compile_s, compiled_programs), so that a run that recompiles its search for
every part shows it."""

from __future__ import annotations

import threading

_lock = threading.Lock()
_totals = {"seconds": 0.0, "programs": 0}
_listening = False
PREFIX = "/jax/core/compile/"


def _listen(event: str, duration: float, **_) -> None:
    if event.startswith(PREFIX):
        with _lock:
            _totals["seconds"] += duration
            if event.endswith("backend_compile_duration"):
                _totals["programs"] += 1


def _start_listening() -> None:
    global _listening
    with _lock:
        if _listening:
            return
        _listening = True
    from jax import monitoring

    monitoring.register_event_duration_secs_listener(_listen)


class CompileClock:
    """`with CompileClock() as c: ...` → `c.seconds` (compilation inside the block, every thread of the process)
    and `c.programs` (programs XLA compiled)."""

    seconds: float = 0.0
    programs: int = 0

    def __enter__(self) -> "CompileClock":
        _start_listening()
        with _lock:
            self._start = dict(_totals)
        return self

    def __exit__(self, *exc) -> None:
        with _lock:
            self.seconds = _totals["seconds"] - self._start["seconds"]
            self.programs = _totals["programs"] - self._start["programs"]
