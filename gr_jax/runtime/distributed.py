"""Runs over several processes, on JAX's own distributed runtime (`jax.distributed`), as t5x does.

A command started in N processes (one per host, or several on one machine) with the same flags and
`--multiprocess --coordinator_address=HOST:PORT --process_count=N --process_index=I` (t5x's flags; without
them `--multiprocess` lets JAX read the cluster's environment: SLURM, Open MPI, Kubernetes, TPU pods, or
`JAX_COORDINATOR_ADDRESS` / `JAX_NUM_PROCESSES` / `JAX_PROCESS_ID`) calls `initialize` before its first
computation. From then on `jax.devices()` lists every process's devices, the training mesh spans them, and:

* **one writer**: process 0 writes every file of the run; the others compute the same things and write
  nothing (`io_utils.read_only`: a write they attempt is a bug, raised, never a silent second writer). Orbax
  coordinates the checkpoints itself: every process takes part in a save and a restore.
* **process 0 first** (`primary_first`): what a command prepares on disk (vocabulary, docid scheme) is made by
  process 0 while the others wait, then read by them and checked as any reused state is.
* **the global batch from process-local rows** (`global_batch`): every process draws the same global batch
  (the data order is a function of the seed, as on one process) and hands JAX only the rows its own devices
  hold (`jax.make_array_from_process_local_data`), so the step sees the global batch of one process.
* **evaluation split over processes** (`share`, `gather_json`): each process searches a contiguous block of
  the queries (sorted by id), the runs are gathered into every process, and process 0 writes the merged run.
* **parameters in and out** (`put`, `local`): host values placed on the global mesh; global arrays brought
  back to this process's devices (replicated ones without a copy, sharded ones gathered) for the searches,
  which run on the local devices.

On CPU the processes' collectives go through gloo. With one process every function here is the identity of
the single-process code path.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
from typing import Iterator, Optional, Sequence

import jax
import numpy as np

from gr_jax.runtime.io_utils import read_only

log = logging.getLogger(__name__)

FLAGS = ("multiprocess", "multiprocess_gpu", "coordinator_address", "process_count", "process_index",
         "initialization_timeout")

_started = False


def initialize(multiprocess: bool = False, coordinator_address: Optional[str] = None,
               process_count: Optional[int] = None, process_index: Optional[int] = None,
               initialization_timeout: Optional[int] = None) -> None:
    """`jax.distributed.initialize` with t5x's flags (module docstring); nothing without `multiprocess`.
    A partial set of the three explicit flags is an error naming the missing ones."""
    global _started
    given = {"coordinator_address": coordinator_address, "process_count": process_count,
             "process_index": process_index}
    if not multiprocess:
        named = [k for k, v in given.items() if v is not None]
        if named:
            raise ValueError(f"--{named[0]} is given without --multiprocess: add --multiprocess to run over "
                             f"several processes")
        return
    missing = [k for k, v in given.items() if v is None]
    if len(missing) not in (0, 3):
        raise ValueError(f"--multiprocess with {', '.join('--' + k for k in given if k not in missing)} needs "
                         f"{', '.join('--' + k for k in missing)} too (or none of the three, to read them from the "
                         f"cluster's environment)")
    if process_count is not None and process_count < 1:
        raise ValueError(f"--process_count must be ≥ 1, got {process_count}")
    if process_index is not None and not 0 <= process_index < (process_count or 1):
        raise ValueError(f"--process_index must be in [0, {process_count}), got {process_index}")
    if _started:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices of several processes
    deadline = int(initialization_timeout) if initialization_timeout is not None else JOIN_DEADLINE_S
    where = coordinator_address or "the cluster's coordinator"
    log.info("process %s of %s: joining the other processes at %s (up to %d s: --initialization_timeout)",
             process_index if process_index is not None else "?", process_count or "?", where, deadline)
    # JAX's own timeout aborts the process with a C++ stack trace (exit 134), or a process whose partner never
    # comes waits on: ours ends it first, with one message
    watchdog = threading.Timer(deadline, _join_failed, (where, process_count, process_index, deadline))
    watchdog.daemon = True
    watchdog.start()
    try:
        jax.distributed.initialize(coordinator_address, process_count, process_index,
                                   initialization_timeout=deadline + 60)
    except Exception as e:  # noqa: BLE001 — JAX raises XlaRuntimeError and others for a failed join
        raise ValueError(f"process {process_index} of {process_count} could not join the run at {where}: "
                         f"{(str(e).splitlines() or [''])[0][:300]}") from None
    finally:
        watchdog.cancel()
    _started = True
    index, count = jax.process_index(), jax.process_count()
    log.info("process %d of %d; %d local and %d global devices", index, count, jax.local_device_count(),
             jax.device_count())
    if index:
        read_only(f"process {index} of a {count}-process run (process 0 writes)")
    if count > 1:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _stop_on_signal)


JOIN_DEADLINE_S = 300  # JAX's default initialization_timeout

RESTART_NOTE = ("the other processes of this run stop too. Start all of them again with the same command: training "
                "resumes from the last checkpoint")


def _join_failed(where: str, count, index, deadline: int) -> None:
    sys.stderr.write(f"error: process {index} of {count}: the other processes did not join at {where} within "
                     f"{deadline} s. Start all {count or 'N'} processes with the same --coordinator_address and "
                     f"--process_count (each with its own --process_index), or raise --initialization_timeout\n")
    sys.stderr.flush()
    os._exit(2)


def _stop_on_signal(signum, frame) -> None:
    """SIGTERM / SIGINT in a process of a multi-process run: the restart note, then out at once (JAX's shutdown
    would wait for the processes it can no longer reach; the others stop when this one is gone)."""
    sys.stderr.write(f"\nnote: process {jax.process_index()} of {jax.process_count()} stopped by "
                     f"{signal.Signals(signum).name}; {RESTART_NOTE}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(128 + signum)


def agree(settings: dict) -> None:
    """Every process of a run must run the same settings (`settings`: name → value as text, e.g. the bound gin
    parameters): compared at start, and a mismatch refused on every process in one line naming the settings
    that differ (two processes given different TRAIN_STEPS otherwise train until a collective hangs)."""
    if jax.process_count() == 1:
        return
    everyone = gather_json(settings)
    first = everyone[0]
    for i, other in enumerate(everyone[1:], 1):
        differs = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
        if differs:
            shown = "; ".join(f"{k}: {first.get(k, '(unset)')} in process 0, {other.get(k, '(unset)')} in process {i}"
                              for k in differs[:5])
            raise ValueError(f"the processes of this run were started with different settings ({shown}"
                             f"{f'; and {len(differs) - 5} more' if len(differs) > 5 else ''}): start every process "
                             f"with the same flags and gin files")


def several() -> bool:
    """Whether this process is one of several of a run started with `initialize`."""
    return _started and jax.process_count() > 1


def is_primary() -> bool:
    """Whether this process writes the run's files (process 0; the only process of a single-process run)."""
    return jax.process_index() == 0


def process_count() -> int:
    return jax.process_count()


def process_index() -> int:
    return jax.process_index()


def barrier(name: str) -> None:
    """Every process waits here until all have arrived (nothing with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


@contextlib.contextmanager
def primary_first(name: str) -> Iterator[None]:
    """Process 0 runs the block first (it writes what the block prepares on disk); the others run it after,
    reading what process 0 wrote."""
    if not is_primary():
        barrier(name)
    yield
    if is_primary():
        barrier(name)


def process_rows(sharding, rows: int) -> slice:
    """The rows of a [rows, ...] array sharded by `sharding` over its first axis that this process's devices
    hold: one contiguous range (a mesh whose data axis interleaves processes is an error)."""
    spans = sorted({(s[0].start or 0, rows if s[0].stop is None else s[0].stop)
                    for s in sharding.addressable_devices_indices_map((rows,)).values()})
    lo, hi = spans[0][0], spans[0][1]
    for a, b in spans[1:]:
        if a > hi:
            raise ValueError(f"this process's devices hold rows {spans} of the batch, not one range: order the "
                             f"mesh's devices by process")
        hi = max(hi, b)
    return slice(lo, hi)


def global_batch(batch, sharding):
    """The global batch as arrays sharded by `sharding` over their first axis. Every process passes the same
    global batch; each hands JAX only the rows its devices hold."""
    if jax.process_count() == 1:
        return jax.device_put(batch, sharding)

    def one(x):
        x = np.asarray(x)
        rows = process_rows(sharding, x.shape[0])
        return jax.make_array_from_process_local_data(sharding, x[rows], x.shape)

    return jax.tree_util.tree_map(one, batch)


def put(tree, shardings):
    """`jax.device_put(tree, shardings)`, also where the shardings span several processes: every process holds
    the same host values (the same seed, the same checkpoint), each places its devices' parts."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)

    def one(x, sharding):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return x if x.sharding == sharding else jax.jit(lambda a: a, out_shardings=sharding)(x)
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree_util.tree_map(one, tree, shardings)


def to_host(x) -> np.ndarray:
    """One array as numpy on this process: its own copy when it holds it whole, else gathered from every
    process (every process must call)."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return np.asarray(x)
    if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def local(tree):
    """`tree` on this process's devices: an array of the global mesh that every process holds whole
    (replicated) is its local copy, one sharded over processes is gathered (every process must call)."""
    if jax.process_count() == 1:
        return tree

    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return x
        return x.addressable_data(0) if x.is_fully_replicated else jax.numpy.asarray(to_host(x))

    return jax.tree_util.tree_map(one, tree)


def share(items: Sequence) -> Sequence:
    """This process's contiguous block of `items` (the first processes take one more when they do not divide)."""
    count, index = jax.process_count(), jax.process_index()
    if count == 1:
        return items
    size, extra = divmod(len(items), count)
    start = index * size + min(index, extra)
    return items[start:start + size + (index < extra)]


def gather_json(obj) -> list:
    """Every process's `obj` (anything JSON can hold: numbers round-trip exactly), in process order; every
    process must call."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int64))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    rows = np.asarray(multihost_utils.process_allgather(padded))
    return [json.loads(rows[i, :int(n)].tobytes().decode()) for i, n in enumerate(sizes)]
