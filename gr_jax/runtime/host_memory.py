"""Host memory for jitted programs on the CPU: keep freed blocks for reuse instead of returning them to the OS.

XLA's CPU runtime allocates the temporaries of every execution afresh and frees them when it returns. With
glibc's defaults a block above the mmap threshold (dynamic, at most 32 MiB) is mapped from the OS on every
call and unmapped afterwards, and a freed heap top above the trim threshold is given back: either way every
page of the temporaries is faulted in — and zeroed by the kernel — again on every step. The tiny T5 train step
(44 MiB of temporaries: batch 32, 64 + 8 tokens) took about 10,600 page faults a step and spent a third of its
time in them (BENCHMARKS.md, bench_train).

`reuse_freed_memory()` raises glibc's mmap threshold, trim threshold and top pad while its block runs, so such
blocks come from the heap and stay there from one step to the next; on leaving, it sets them to the values
glibc adapts to by itself after freeing a large block (mmap 32 MiB, trim 64 MiB, top pad 128 KiB). What it
does not reach: a single temporary of tens of MiB or more that XLA's dispatch thread allocates is larger than a
thread arena's heap can hold (glibc caps those at 64 MiB), so glibc maps it per call whatever the thresholds
(t5_small's train step: ~230k faults, 0.9 GB of temporaries, in a 1.3 s step; the demo's tiny step at batch
64: 28k faults, 60 ms). Executions on the calling thread (`cpu_dispatch(synchronous=True)` before JAX's first
computation) allocate from the main arena, where the thresholds apply: those steps then took 1.07 s and 35 ms
with no faults. The entry points (`gin_utils.run_entry`) dispatch synchronously for that reason; JAX's default
stays for code that imports the library (call `cpu_dispatch()` first to get the same).
Memory freed inside the block stays with the process until a later trim, which is the point: the next step
needs it again. Elsewhere than glibc (macOS, musl) this is a no-op.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import platform
import threading

log = logging.getLogger(__name__)

# mallopt(3) parameters
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
_KEEP = {M_MMAP_THRESHOLD: 1 << 30, M_TRIM_THRESHOLD: 1 << 30, M_TOP_PAD: 64 << 20}
_ADAPTED = {M_MMAP_THRESHOLD: 32 << 20, M_TRIM_THRESHOLD: 64 << 20, M_TOP_PAD: 128 << 10}

_lock = threading.Lock()
_depth = 0
_libc = None


def _mallopt():
    global _libc
    if _libc is None:
        _libc = False
        if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
            try:
                _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                _libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
            except (OSError, AttributeError):
                _libc = False
    return _libc.mallopt if _libc else None


def _set(values: dict) -> bool:
    mallopt = _mallopt()
    if mallopt is None:
        return False
    ok = all(mallopt(k, v) == 1 for k, v in values.items())
    if not ok:
        log.debug("glibc refused one of the malloc settings %s", values)
    return ok


@contextlib.contextmanager
def reuse_freed_memory():
    """Within the block, glibc keeps freed memory for reuse (see the module docstring). Re-entrant: nested
    blocks (an evaluation inside training) leave the settings to the outermost one."""
    global _depth
    with _lock:
        _depth += 1
        if _depth == 1:
            _set(_KEEP)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _set(_ADAPTED)


def active() -> bool:
    """Whether the settings are in force (inside a block, on glibc)."""
    return _depth > 0 and _mallopt() is not None


def cpu_dispatch(synchronous: bool = True) -> None:
    """Whether JAX's CPU client runs each computation on the calling thread (synchronous: its temporaries come
    from glibc's main arena, which `reuse_freed_memory` reaches) or hands it to a dispatch thread (JAX's
    default: the Python loop overlaps the computation). Read when JAX makes its CPU client, i.e. at the first
    computation: later calls change nothing for this process. No effect on GPU/TPU computations."""
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", not synchronous)


@contextlib.contextmanager
def as_entry_points():
    """JAX on the CPU as the entry points run it (`gin_utils.run_entry`): synchronous dispatch — enter before the
    first computation — and freed memory kept for the whole block. For benchmarks that time what a command does."""
    cpu_dispatch(synchronous=True)
    with reuse_freed_memory():
        yield


def resident_mb() -> float:
    """This process's resident memory now (Linux: /proc/self/statm; elsewhere the peak, from getrusage)."""
    try:
        pages = int(open("/proc/self/statm").read().split()[1])
        return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)
    except (OSError, ValueError, IndexError):
        import resource

        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def release_between_steps(programs: bool = True) -> None:
    """Between the steps of a protocol whose shapes change from step to step (the dynamic-corpora protocol: the
    index grows with each part), the programs compiled for the last step's shapes are never called again, yet
    JAX keeps every one (SEAL's 120-document demo run: 1.5 → 3.1 GB over five steps): drop them (`programs`),
    collect, and hand the freed heap back to the system (glibc's malloc_trim; without it a step's temporaries
    kept SEAL's demo run 0.6 GB higher)."""
    import gc

    import jax

    if programs:
        jax.clear_caches()
    gc.collect()
    if _mallopt() is not None:
        try:
            _libc.malloc_trim(0)
        except AttributeError:
            pass
