"""Crashes, full disks and concurrent writers, on the real entry points (`python -m gr_jax.<command>` in a
subprocess): a process killed at a checkpoint save, while publishing an output, or at a random moment, and one
that hits ENOSPC, is re-run with the same command and must give what an uninterrupted run gives, leaving no
temporaries behind; a second writer on the same directory is refused, and a lock left by a dead process is taken
over. Faults are injected with GR_JAX_FAULT=<point>:<n>:<kill|enospc> (gr_jax/runtime/io_utils.py `fault_point`).

Everything is tiny (40 demo documents, 4 training steps); the subprocesses share the session's XLA compilation
cache (tests/conftest.py), so only the first training of the file compiles."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.protocols.test_dynamic_corpora import PROTOCOL, SMALL
from tests.test_bad_inputs import TINY

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # each test starts two to four processes of several seconds each

# the TINY DSI of tests/test_bad_inputs.py, with a checkpoint every 2 of 4 steps (checkpoints 2 and 4); later
# bindings override earlier ones
TINY_TRAIN = TINY + """
TRAIN_STEPS = 4
train.checkpoint_period = 2
"""

# the dynamic-corpora protocol (tests/protocols/test_dynamic_corpora.py): BM25, and the text-docid DSI made smaller
DYNAMIC_BM25 = "include 'experiments/demo/dynamic_bm25.gin'\n" + PROTOCOL
DYNAMIC_GR = """
include 'runs/dynamic.gin'
include 'experiments/demo/dsi_naive.gin'
run_dynamic.method = 'gr'
EvalConfig.compare_bm25 = False
""" + SMALL + """
load_dataset.demo_docs = 40
TRAIN_STEPS = 2
EvalConfig.num_beams = 3
"""

# the BM25 robustness command of tests/protocols/test_query_variation.py
ROBUSTNESS_ARGS = ["--gin_file=experiments/demo/robustness_bm25.gin", "--gin.run_robustness.max_queries=10",
                   "--gin.run_robustness.seeds=[5, 27]", "--gin.run_robustness.generators={}"]

TIMEOUT = 300


# ---------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------

def _env(fault: str | None = None) -> dict:
    env = dict(os.environ)
    env.pop("GR_JAX_FAULT", None)
    if fault:
        env["GR_JAX_FAULT"] = fault
    return env


def _cmd(module: str, args) -> list[str]:
    return [sys.executable, "-m", f"gr_jax.{module}", *map(str, args)]


def _run(module: str, args, fault: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(_cmd(module, args), cwd=REPO, env=_env(fault), capture_output=True, text=True,
                          timeout=TIMEOUT)


def _ok(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert res.returncode == 0, f"exit code {res.returncode}\n{res.stderr[-4000:]}"
    return res


def _train_args(gin_file: Path, model_dir: Path) -> list[str]:
    return [f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{model_dir}'"]


def _leftovers(root: Path) -> list[str]:
    """Temporaries of atomic writes (`.<name>.tmp-<pid>-…`) and outputs renamed aside (`.<name>.old-<pid>-…`)."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if ".tmp-" in p.name or ".old-" in p.name)


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def _train_result(model_dir: Path) -> dict:
    """What a tiny training produces that does not name MODEL_DIR or hold times: the run file, the vocabulary and
    docid scheme (bytes), and final_metrics.json's metrics."""
    out = {p.relative_to(model_dir).as_posix(): p.read_bytes()
           for sub in ("runs", "vocabulary", "docid_scheme") for p in sorted((model_dir / sub).rglob("*"))
           if p.is_file()}
    out["final_metrics.json:metrics"] = json.loads((model_dir / "final_metrics.json").read_text())["metrics"]
    return out


def _all_files(root: Path, skip=("tensorboard",)) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).parts[0] not in skip}


def _one_error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    assert "Traceback" not in stderr, stderr
    return errors[0]


@pytest.fixture(scope="session")
def tiny_gin(tiny_dsi_process) -> Path:
    """TINY_TRAIN's gin file (the session's shared run was made from it)."""
    return tiny_dsi_process[0]


@pytest.fixture(scope="session")
def reference(tiny_dsi_process) -> Path:
    """An uninterrupted tiny training (its MODEL_DIR): the session's shared one, read-only."""
    model_dir = tiny_dsi_process[1]
    assert _steps(model_dir / "train_metrics.jsonl") == [1, 2, 3, 4]
    assert sorted(p.name for p in (model_dir / "runs").iterdir()) == ["test.step4.run"]
    return model_dir


def _resumes_to_the_reference(args: list, model_dir: Path, reference: Path) -> None:
    """The same command again resumes and ends with the uninterrupted run's run file and metrics, each step
    logged once."""
    res = _ok(_run("train", args))
    assert "resumed from" in res.stderr
    assert (model_dir / "runs" / "test.step4.run").read_bytes() == (reference / "runs" / "test.step4.run").read_bytes()
    assert _train_result(model_dir) == _train_result(reference)
    steps = _steps(model_dir / "train_metrics.jsonl")
    assert len(steps) == len(set(steps)) and sorted(steps) == [1, 2, 3, 4], steps


# ---------------------------------------------------------------------------------------------------------------
# 1. killed at a checkpoint save
# ---------------------------------------------------------------------------------------------------------------

def test_train_killed_at_a_checkpoint_save_resumes_to_the_uninterrupted_result(tiny_gin, reference, tmp_path):
    model_dir = tmp_path / "model"
    args = _train_args(tiny_gin, model_dir)
    res = _run("train", args, fault="checkpoint:2:kill")  # just before saving step 4
    assert res.returncode == -signal.SIGKILL, res.stderr[-4000:]
    assert (model_dir / "checkpoints" / "2").is_dir() and not (model_dir / "checkpoints" / "4").exists()
    assert not (model_dir / "final_metrics.json").exists()
    assert _steps(model_dir / "train_metrics.jsonl") == [1, 2, 3, 4]  # logged before the kill

    _resumes_to_the_reference(args, model_dir, reference)
    assert not (model_dir / ".gr_jax.lock").exists()


# ---------------------------------------------------------------------------------------------------------------
# 2. killed while publishing an output
# ---------------------------------------------------------------------------------------------------------------

def test_train_killed_while_publishing_outputs_reruns_to_the_same_bytes(tiny_gin, reference, tmp_path):
    model_dir = tmp_path / "model"
    args = _train_args(tiny_gin, model_dir)
    # (a) the first atomic write of a fresh run (the vocabulary), killed just before it is published
    res = _run("train", args, fault="write:1:kill")
    assert res.returncode == -signal.SIGKILL, res.stderr[-4000:]
    assert _leftovers(model_dir), "the kill should have left the unpublished temporary behind"
    _ok(_run("train", args))
    assert _train_result(model_dir) == _train_result(reference)
    assert _leftovers(model_dir) == []

    # (b) a re-run of the finished job, killed in the swap of its first output (config.gin): the old file is
    # renamed aside and the new one not yet in
    before = _all_files(model_dir, skip=("tensorboard", "eval_metrics.jsonl"))
    res = _run("train", args, fault="publish:1:kill")
    assert res.returncode == -signal.SIGKILL, res.stderr[-4000:]
    assert not (model_dir / "config.gin").exists()
    assert any(".config.gin.old-" in name for name in _leftovers(model_dir)), _leftovers(model_dir)
    _ok(_run("train", args))
    assert _leftovers(model_dir) == []
    after = _all_files(model_dir, skip=("tensorboard", "eval_metrics.jsonl"))
    assert sorted(after) == sorted(before)  # nothing set aside as .prev-N: the same result
    assert after == before
    assert _train_result(model_dir) == _train_result(reference)


def test_train_killed_after_the_final_evaluation_logs_each_step_once(tiny_gin, reference, tmp_path):
    model_dir = tmp_path / "model"
    args = _train_args(tiny_gin, model_dir)
    res = _run("train", args, fault="write:4:kill")  # final_metrics.json (after the vocabulary, config.gin and
    # the run file): the final evaluation's scalars are in eval_metrics.jsonl already
    assert res.returncode == -signal.SIGKILL, res.stderr[-4000:]
    assert not (model_dir / "final_metrics.json").exists() and _steps(model_dir / "eval_metrics.jsonl") == [4]
    _ok(_run("train", args))
    assert _train_result(model_dir) == _train_result(reference)
    assert _leftovers(model_dir) == []
    assert (model_dir / "eval_metrics.jsonl").read_bytes() == (reference / "eval_metrics.jsonl").read_bytes()


# ---------------------------------------------------------------------------------------------------------------
# 3. a full disk at a checkpoint save
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def no_space(tiny_gin, reference, tmp_path_factory):
    """A tiny training whose second checkpoint save (step 4) meets a full disk: (args, MODEL_DIR, result)."""
    model_dir = tmp_path_factory.mktemp("no_space") / "model"
    args = _train_args(tiny_gin, model_dir)
    return args, model_dir, _run("train", args, fault="checkpoint:2:enospc")


def test_no_space_at_a_checkpoint_save_is_one_error_and_a_rerun_resumes(no_space, reference):
    args, model_dir, res = no_space
    assert res.returncode == 2, res.stderr[-4000:]
    line = _one_error_line(res.stderr)
    assert "no space" in line.lower(), line
    assert not (model_dir / "checkpoints" / "4").exists() and not (model_dir / "final_metrics.json").exists()
    assert not (model_dir / ".gr_jax.lock").exists()

    _resumes_to_the_reference(args, model_dir, reference)
    assert _leftovers(model_dir) == []


def test_no_space_at_a_checkpoint_save_names_the_checkpoint_and_the_fix(no_space):
    _, _, res = no_space
    line = _one_error_line(res.stderr)
    assert "saving checkpoint 4" in line and "free some space" in line, line


# ---------------------------------------------------------------------------------------------------------------
# 4. two writers on one MODEL_DIR; a lock left by a dead process
# ---------------------------------------------------------------------------------------------------------------

def test_a_second_writer_is_refused_and_a_dead_writers_lock_is_taken_over(tiny_gin, reference, tmp_path):
    model_dir = tmp_path / "model"
    args = _train_args(tiny_gin, model_dir)
    lock = model_dir / ".gr_jax.lock"
    first = subprocess.Popen(_cmd("train", args), cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + TIMEOUT
        while not lock.exists():
            assert first.poll() is None, f"the first run ended before taking the lock:\n{first.communicate()[1]}"
            assert time.time() < deadline, "no lock file after 300 s"
            time.sleep(0.05)
        second = _run("train", args)
        still_running = first.poll() is None
        out, err = first.communicate(timeout=TIMEOUT)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert still_running, "the first run ended before the second one asked for the lock: the test proved nothing"
    assert second.returncode == 2, second.stderr[-4000:]
    line = _one_error_line(second.stderr)
    assert "is being written by" in line and f"process {first.pid}" in line, line
    assert first.returncode == 0, err[-4000:]
    assert _train_result(model_dir) == _train_result(reference)  # the refused run changed nothing
    assert not lock.exists()

    lock.write_text(json.dumps({"pid": 999999, "host": "x", "command": "gr_jax train", "started": 0}))
    res = _ok(_run("train", args))
    assert "took over the lock" in res.stderr and "999999" in res.stderr, res.stderr[-4000:]
    assert _train_result(model_dir) == _train_result(reference)
    assert not lock.exists()


# ---------------------------------------------------------------------------------------------------------------
# 5. kill -9 at a random moment of the protocols, then a re-run
# ---------------------------------------------------------------------------------------------------------------

def _kill_and_rerun(module: str, args, out_dir: Path, reference_seconds: float, case: int):
    """Starts the command, sends it SIGKILL after a seeded delay in [1, 6] s (capped below the uninterrupted
    run's duration, so that it lands while the command runs), re-runs it to completion. Returns whether the
    kill hit a running process."""
    rng = random.Random(0)
    delay = [rng.uniform(1, 6) for _ in range(case + 1)][case]
    delay = max(0.5, min(delay, 0.8 * reference_seconds))
    p = subprocess.Popen(_cmd(module, args), cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(delay)
        hit = p.poll() is None
        if hit:
            os.kill(p.pid, signal.SIGKILL)
        _, err = p.communicate(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode in (0, -signal.SIGKILL), err[-4000:]
    print(f"{module}: SIGKILL after {delay:.2f} s {'while it ran' if hit else 'came after it had ended'}")
    res = _ok(_run(module, args))
    assert _leftovers(out_dir) == []
    assert not (out_dir / ".gr_jax.lock").exists()
    return hit, res


def _timed(module: str, args) -> tuple[float, subprocess.CompletedProcess]:
    t = time.time()
    res = _ok(_run(module, args))
    return time.time() - t, res


@pytest.mark.parametrize("system", ["bm25", "gr"])
def test_dynamic_protocol_killed_at_a_random_moment_reruns_to_the_same_result(system, tmp_path):
    f = tmp_path / f"{system}.gin"
    f.write_text(DYNAMIC_BM25 if system == "bm25" else DYNAMIC_GR)
    seconds, _ = _timed("dynamic", [f"--gin_file={f}", f"--gin.MODEL_DIR='{tmp_path / 'whole'}'"])
    expected = json.loads((tmp_path / "whole" / "dynamic" / "dynamic.json").read_text())
    out = tmp_path / "killed"
    _kill_and_rerun("dynamic", [f"--gin_file={f}", f"--gin.MODEL_DIR='{out}'"], out, seconds,
                    case=["bm25", "gr"].index(system))
    assert json.loads((out / "dynamic" / "dynamic.json").read_text()) == expected


def _pseudo_queries(path: Path) -> list:
    """The file's lines, parsed; the header's `stats` (generation seconds) left out."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows[0].pop("stats", None)
    return rows


@pytest.mark.torch
def test_pseudo_queries_killed_at_a_random_moment_reruns_to_the_same_file(tiny_hf_llama, tmp_path):
    hf = tiny_hf_llama  # the session's tiny random HF Llama with its BPE tokenizer (tests/conftest.py)

    def args(model_dir):  # 16 documents in batches of 2: a file saved after every batch
        return ["--gin_file=experiments/demo/pseudo_queries_smollm2.gin", f"--gin.MODEL_DIR='{model_dir}'",
                f"--gin.LM='{hf}'", "--gin.write_pseudo_queries.max_documents=16",
                "--gin.write_pseudo_queries.batch_size=2", "--gin.write_pseudo_queries.num_queries=2",
                "--gin.PseudoQueryGenerator.max_query_tokens=4", "--gin.PseudoQueryGenerator.max_document_tokens=24"]

    seconds, _ = _timed("pseudo_queries", args(tmp_path / "whole"))
    expected = _pseudo_queries(tmp_path / "whole" / "pseudo_queries.jsonl")
    assert len(expected) == 17
    out = tmp_path / "killed"
    _, res = _kill_and_rerun("pseudo_queries", args(out), out, seconds, case=2)
    assert _pseudo_queries(out / "pseudo_queries.jsonl") == expected
    assert json.loads(res.stdout.strip().splitlines()[-1])["documents"] == 16


def test_robustness_killed_at_a_random_moment_reruns_to_the_same_result(tmp_path):
    def args(out):
        return ROBUSTNESS_ARGS + [f"--gin.OUTPUT_DIR='{out}'", f"--gin.VARIATIONS_DIR='{out}_variations'"]

    seconds, _ = _timed("robustness", args(tmp_path / "whole"))
    expected = json.loads((tmp_path / "whole" / "robustness.json").read_text())
    runs = {p.name: p.read_bytes() for p in (tmp_path / "whole" / "runs").iterdir()}
    out = tmp_path / "killed"
    _kill_and_rerun("robustness", args(out), out, seconds, case=3)
    assert json.loads((out / "robustness.json").read_text()) == expected
    assert {p.name: p.read_bytes() for p in (out / "runs").iterdir()} == runs
    assert _leftovers(tmp_path / "killed_variations") == []


# ---------------------------------------------------------------------------------------------------------------
# 6. a damaged checkpoint: one message, nothing after it
# ---------------------------------------------------------------------------------------------------------------

def _rewrite_one_value(state_dir: Path) -> None:
    """Damage that no reader can notice: the checkpoint's state saved again through orbax itself with one
    parameter value changed, the checksums recorded at the original save left as they were."""
    import shutil

    import numpy as np
    import orbax.checkpoint as ocp

    import jax

    state = ocp.StandardCheckpointer().restore(state_dir.absolute())
    first = [True]

    def change(leaf):  # the first non-empty floating array of the parameters, one value
        a = np.array(leaf)
        if first[0] and a.size and np.issubdtype(a.dtype, np.floating):
            first[0] = False
            a.reshape(-1)[0] += 1.0  # far above float32's spacing at any value the tiny model holds
        return a

    state["params"] = jax.tree_util.tree_map(change, state["params"])
    assert not first[0], "no floating parameter found"
    fresh = state_dir.parent / "state.rewritten"
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(fresh.absolute(), state)
    shutil.rmtree(state_dir)
    fresh.rename(state_dir)


@pytest.mark.parametrize("damage", ["flipped bit", "rewritten value", "truncated"])
def test_a_damaged_checkpoint_stops_inference_with_one_line(tiny_gin, reference, tmp_path, damage):
    """Damage to an array is one error line naming the checkpoint, never a result. A value rewritten cleanly is
    caught only by the checksum recorded at save; a flipped bit in a compressed array file is caught by the
    checksum or, when it breaks the decompression (which one depends on where the bit falls), by the reader; a
    truncated file by orbax, whose abandoned asynchronous reads used to print an "Event loop is closed" traceback
    after the message."""
    import shutil

    model_dir = tmp_path / "model"
    shutil.copytree(reference, model_dir)
    state_dir = model_dir / "checkpoints" / "4" / "state"
    if damage == "rewritten value":
        _rewrite_one_value(state_dir)
    else:
        data = max((p for p in state_dir.rglob("*") if p.is_file() and "/d/" in p.as_posix()),
                   key=lambda p: p.stat().st_size)
        raw = bytearray(data.read_bytes())
        if damage == "flipped bit":
            raw[len(raw) // 2] ^= 0x01
        else:
            raw = raw[: len(raw) // 3]
        data.write_bytes(bytes(raw))
    res = _run("infer", [f"--gin_file={tiny_gin}", "--gin_file=runs/eval.gin", f"--gin.MODEL_DIR='{model_dir}'"])
    assert res.returncode == 2, res.stderr[-4000:]
    line = _one_error_line(res.stderr)
    assert f"{model_dir / 'checkpoints' / '4'}: damaged" in line, line
    assert "Event loop" not in res.stderr and "Exception ignored" not in res.stderr and "never awaited" not in res.stderr
    if damage == "rewritten value":
        assert "1 array(s) differ from the checksums recorded" in line and "params/" in line, line
    elif damage == "flipped bit":
        assert "differ from the checksums recorded" in line or "its arrays cannot be read" in line, line
