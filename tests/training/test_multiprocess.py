"""Training over several processes (`gr_jax/runtime/distributed.py`), on the real entry point: two processes of
`python -m gr_jax.train --multiprocess` on this machine (a localhost coordinator, one CPU device each) train the
tiny demo DSI of tests/reliability/test_faults.py (40 documents, 4 steps, checkpoints at 2 and 4).

* their checkpoint equals, array for array and bit for bit, the one of a single process with two (host) devices
  and the same global batch: the same program over the same mesh, only split over processes; and it is within
  float rounding of a single process on one device (test below for why);
* their evaluation (each process searches half of the queries, process 0 writes the merged run) equals
  `gr_jax.infer` of their checkpoint in one process, and in two;
* one process killed at its second checkpoint save: the other stops with one error line and exit code 2 instead
  of waiting minutes for JAX's shutdown; both started again resume and end with the uninterrupted checkpoint.

Only process 0 writes (the others write nothing: `io_utils.read_only`)."""

from __future__ import annotations

import concurrent.futures
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from gr_jax.training import trainer
from tests.conftest import xla_flags
from tests.reliability import test_faults
from tests.reliability.test_faults import _leftovers, _one_error_line, _steps

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300

pytestmark = pytest.mark.slow  # two to five trainings of a few seconds each, in subprocesses

tiny_gin = test_faults.tiny_gin  # the fixture: tests/reliability/test_faults.py's tiny DSI (4 steps, checkpoints 2, 4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _env(devices: int = 1, fault: str | None = None) -> dict:
    env = dict(os.environ)
    env.pop("GR_JAX_FAULT", None)
    env["XLA_FLAGS"] = xla_flags(f"--xla_force_host_platform_device_count={devices}")
    if fault:
        env["GR_JAX_FAULT"] = fault
    return env


def _args(gin_file: Path, model_dir: Path) -> list[str]:
    return [sys.executable, "-m", "gr_jax.train", f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{model_dir}'"]


def _start_two(gin_file: Path, model_dir: Path, faults=(None, None), extra=((), ())) -> list[subprocess.Popen]:
    """Both processes of a two-process training; `extra`: each one's own further flags."""
    port = _free_port()
    return [subprocess.Popen(_args(gin_file, model_dir) + ["--multiprocess", f"--coordinator_address=localhost:{port}",
                                                           "--process_count=2", f"--process_index={i}", *extra[i]],
                             cwd=REPO, env=_env(1, faults[i]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
            for i in range(2)]


def _finish(procs) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of each process, read concurrently: a process blocked on a full pipe would
    stall the other in a collective."""
    with concurrent.futures.ThreadPoolExecutor(len(procs)) as pool:
        reads = [pool.submit(p.communicate, timeout=TIMEOUT) for p in procs]
        try:
            outs = [r.result() for r in reads]
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return [(p.returncode, o, e) for p, (o, e) in zip(procs, outs)]


def _ok(results) -> None:
    for i, (rc, _, stderr) in enumerate(results):
        assert rc == 0, f"process {i}: exit code {rc}\n{stderr[-4000:]}"


def _params(model_dir: Path, step: int = 4) -> dict:
    manager = ocp.CheckpointManager((model_dir / "checkpoints").absolute())
    state = trainer.read_checkpoint(manager, step, model_dir)["state"]
    return {trainer._key(k): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(state)[0]}


@pytest.fixture(scope="module")
def two(tiny_gin, tmp_path_factory) -> Path:
    """An uninterrupted two-process training (its MODEL_DIR)."""
    model_dir = tmp_path_factory.mktemp("two") / "model"
    results = _finish(_start_two(tiny_gin, model_dir))
    _ok(results)
    assert "checkpoint:" in results[0][1] and "checkpoint:" not in results[1][1]  # process 0 prints the summary
    assert _steps(model_dir / "train_metrics.jsonl") == [1, 2, 3, 4]
    return model_dir


def _one_process(tiny_gin, model_dir: Path, devices: int) -> Path:
    res = subprocess.run(_args(tiny_gin, model_dir), cwd=REPO, env=_env(devices), capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr[-4000:]
    return model_dir


def test_two_processes_train_bit_for_bit_as_one_process_over_the_same_devices(two, tiny_gin, tmp_path):
    one = _one_process(tiny_gin, tmp_path / "one", devices=2)
    got, want = _params(two), _params(one)
    assert sorted(got) == sorted(want)
    differ = [k for k in want if not np.array_equal(got[k], want[k])]
    assert not differ, differ[:5]
    assert [p.name for p in sorted((two / "checkpoints").iterdir())] == ["2", "4"]
    assert not _leftovers(two) and not list(two.glob(".gr_jax.lock*"))


def test_two_processes_train_within_rounding_of_one_device(two, tiny_dsi_process):
    """One device sums the whole batch's gradient in one reduction, two devices sum two halves and then add them:
    float32 rounding of the gradient (~1e-7 relative) that Adam's normalised update passes on. Measured: 1.5e-6
    of a tensor's largest magnitude after 4 steps; the bound leaves room for other CPUs' kernels, and a
    different batch or a lost update (lr 5e-3 per step) would be ~1e-3."""
    got, want = _params(two), _params(tiny_dsi_process[1])  # the same command in one process on one device
    for k, w in want.items():
        if w.dtype.kind == "f" and w.size:
            scale = max(float(np.abs(w).max()), 1e-30)
            assert float(np.abs(got[k] - w).max()) <= 1e-5 * scale, k
        else:
            assert np.array_equal(got[k], w), k


def test_their_evaluation_equals_one_process_inferring_from_their_checkpoint(two, tiny_gin, tmp_path):
    run = (two / "runs" / "test.step4.run").read_bytes()
    model_dir = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(two), str(model_dir)], check=True)
    res = subprocess.run([sys.executable, "-m", "gr_jax.infer", f"--gin_file={tiny_gin}", "--gin_file=runs/infer.gin",
                          f"--gin.MODEL_DIR='{model_dir}'", "--gin.EVAL_SPLIT='test'", "--gin.NUM_BEAMS=3"],
                         cwd=REPO, env=_env(1), capture_output=True, text=True, timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr[-4000:]
    assert (model_dir / "runs" / "test.step4.run").read_bytes() == run
    assert not list((model_dir / "runs").glob("*.prev-*"))  # the same result: nothing kept aside
    assert len(run.decode().splitlines()) == 40 * 3  # every test query, three beams each
    # gr_jax.infer in two processes: each searches half of the queries, process 0 writes the merged run
    model_dir = tmp_path / "copy2"
    subprocess.run(["cp", "-r", str(two), str(model_dir)], check=True)
    port = _free_port()
    infer = [sys.executable, "-m", "gr_jax.infer", f"--gin_file={tiny_gin}", "--gin_file=runs/infer.gin",
             f"--gin.MODEL_DIR='{model_dir}'", "--gin.EVAL_SPLIT='test'", "--gin.NUM_BEAMS=3", "--multiprocess",
             f"--coordinator_address=localhost:{port}", "--process_count=2"]
    results = _finish([subprocess.Popen(infer + [f"--process_index={i}"], cwd=REPO, env=_env(1),
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)])
    _ok(results)
    assert (model_dir / "runs" / "test.step4.run").read_bytes() == run
    assert not list((model_dir / "runs").glob("*.prev-*"))


def test_a_process_killed_mid_run_stops_the_other_and_both_resume_to_the_same_checkpoint(two, tiny_gin, tmp_path):
    model_dir = tmp_path / "killed"
    results = _finish(_start_two(tiny_gin, model_dir, faults=(None, "checkpoint:2:kill")))
    assert results[1][0] == -9  # killed at its second checkpoint save (step 4)
    assert results[0][0] == 2, results[0][2][-4000:]
    _one_error_line(results[0][2])
    assert "Start all of them again with the same command" in results[0][2]
    assert [p.name for p in (model_dir / "checkpoints").iterdir()] == ["2"]
    results = _finish(_start_two(tiny_gin, model_dir))
    _ok(results)
    assert all("resumed from" in stderr for _, _, stderr in results)
    got, want = _params(model_dir), _params(two)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert (model_dir / "runs" / "test.step4.run").read_bytes() == (two / "runs" / "test.step4.run").read_bytes()
    steps = _steps(model_dir / "train_metrics.jsonl")
    assert sorted(steps) == [1, 2, 3, 4], steps
    assert not _leftovers(model_dir)


def test_multi_process_flags_are_checked_before_anything_runs(tiny_gin, tmp_path, capsys):
    """Refused before anything runs (no process group is joined): the commands' mains in this process."""
    import gin

    from gr_jax import dynamic as dynamic_cmd
    from gr_jax import train as train_cmd

    cases = [(["--process_count=2"], "without --multiprocess"),
             (["--multiprocess", "--process_count=2"], "needs --coordinator_address, --process_index too"),
             (["--multiprocess", "--coordinator_address=localhost", "--process_count=2", "--process_index=0"],
              "expected HOST:PORT"),
             (["--multiprocess", "--coordinator_address=localhost:1", "--process_count=2", "--process_index=2"],
              "--process_index must be in [0, 2)")]
    for flags, message in cases:
        gin.clear_config()
        capsys.readouterr()
        assert train_cmd.main(_args(tiny_gin, tmp_path / "model")[3:] + flags) == 2, flags
        assert message in _one_error_line(capsys.readouterr().err), flags
        assert not (tmp_path / "model").exists()
    gin.clear_config()
    argv = [f"--gin_file={tiny_gin}", f"--gin.MODEL_DIR='{tmp_path / 'model'}'", "--multiprocess"]
    assert dynamic_cmd.main(argv) == 2
    assert "are for gr_jax.train and gr_jax.infer" in _one_error_line(capsys.readouterr().err)


def test_processes_that_do_not_agree_or_do_not_come_stop_with_exit_2(tiny_gin, tmp_path):
    """Two processes given different TRAIN_STEPS trained until a collective hung, with no message; one process
    without its partner waited silently or aborted with a C++ stack trace (exit 134). Now: exit 2 on each, in one
    line naming the differing setting or the missing processes, well within the bound below (the deadline is 5 s;
    a hang would take the test's TIMEOUT). Nothing is written to MODEL_DIR."""
    import time

    t = time.time()
    results = _finish(_start_two(tiny_gin, tmp_path / "m", extra=(["--gin.TRAIN_STEPS=4"], ["--gin.TRAIN_STEPS=6"])))
    for rc, _, err in results:
        assert rc == 2, err[-3000:]
        line = _one_error_line(err)
        assert "different settings (TRAIN_STEPS: 4 in process 0, 6 in process 1" in line, line
    assert not (tmp_path / "m").exists()
    lone = subprocess.run(_args(tiny_gin, tmp_path / "lone") + [
        "--multiprocess", f"--coordinator_address=localhost:{_free_port()}", "--process_count=2", "--process_index=0",
        "--initialization_timeout=5"], cwd=REPO, env=_env(1), capture_output=True, text=True, timeout=TIMEOUT)
    assert lone.returncode == 2, lone.stderr[-3000:]
    assert "the other processes did not join at localhost:" in _one_error_line(lone.stderr)
    assert time.time() - t < 150  # two starts and a 5 s deadline, not a hang
    assert not (tmp_path / "lone").exists()


def test_sigterm_stops_every_process_with_the_restart_note(tiny_gin, tmp_path):
    """JAX catches SIGTERM, so `timeout` could not stop a multi-process run: now the signalled process stops with
    the restart note and the other stops too, once its partner is gone."""
    import signal
    import time

    model_dir = tmp_path / "m"
    # a long run (checkpoints every 2 steps): signalled once its first checkpoint is there
    procs = _start_two(tiny_gin, model_dir, extra=(["--gin.TRAIN_STEPS=100000"],) * 2)
    deadline = time.time() + TIMEOUT
    while not (model_dir / "checkpoints" / "2").is_dir() and time.time() < deadline:
        assert all(p.poll() is None for p in procs), [p.communicate()[1][-2000:] for p in procs]
        time.sleep(0.5)
    procs[1].send_signal(signal.SIGTERM)
    t = time.time()
    results = _finish(procs)
    assert results[1][0] == 128 + signal.SIGTERM, results[1][2][-3000:]
    assert "stopped by SIGTERM" in results[1][2] and "Start all of them again with the same command" in results[1][2]
    assert results[0][0] != 0 and "Start all of them again with the same command" in results[0][2], \
        results[0][2][-3000:]
    assert time.time() - t < 120
