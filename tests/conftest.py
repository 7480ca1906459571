"""Shared fixtures. Optional dependencies: a test that needs one skips locally when it is missing, but under
CI (CI=true) a missing dependency is an error, so a broken install cannot hide behind skipped tests."""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import tempfile

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# One persistent XLA compilation cache for the session (and the subprocesses tests start): the trainer tests
# run several short trainings of the same model, which then compile their step once.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="gr_jax_xla_cache_")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

# The suite compiles hundreds of small programs, each run a few times: LLVM's optimisation passes are most of each
# compile and buy nothing at these sizes (2026-11-27, a T5 search oracle test: 56 s -> 38 s on 2 cores). XLA does
# not reassociate float arithmetic at any level (its fast-math flag is off by default); a result may still differ
# from the default level's in the last bit where the backend contracts a multiply-add, so bit-for-bit comparisons
# are between programs of one session, and comparisons with recorded references carry tolerances. The tests and
# the commands they start inherit the flags; a test that sets XLA_FLAGS for host devices appends to them.
# GR_JAX_TEST_FULL_OPT=1 runs the suite at XLA's default optimisation instead.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
FULL_OPT = os.environ.get("GR_JAX_TEST_FULL_OPT", "") in ("1", "true")
if not FULL_OPT and FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()


def xla_flags(*flags: str) -> str:
    """XLA_FLAGS for a subprocess: the session's flags plus `flags` (e.g. a host device count)."""
    return " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()


@pytest.fixture(autouse=True)
def clean_gin():
    """Every test starts and ends with an empty gin configuration (entry points parse into gin's global state)."""
    import gin

    gin.clear_config()
    yield
    gin.clear_config()


@pytest.fixture(autouse=True, scope="module")
def release_compiled_programs():
    """After each test module, JAX's in-memory caches of compiled programs are dropped (what is needed again comes
    back from the persistent cache above): otherwise the suite's one process keeps every program it ever compiled.
    On 2026-11-26, on a machine shared with other jobs, XLA aborted writing a cache entry at about 60% of the
    suite, in a test that passes alone."""
    yield
    import gc

    import jax

    jax.clear_caches()
    gc.collect()


def require(module: str):
    """Imports `module`, or skips (locally) / fails (CI) the calling test."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if IN_CI:
            pytest.fail(f"{module} is required in CI but cannot be imported: {e}")
        pytest.skip(f"{module} not installed")


@pytest.fixture(scope="session")
def hf_t5_dirs(tmp_path_factory):
    """Tiny random HF T5 checkpoints written by transformers' save_pretrained: {"1.0": dir, "1.1": dir}."""
    require("torch")
    require("transformers")
    from gr_jax.models import parity

    root = tmp_path_factory.mktemp("hf")
    return {v: parity.write_random_hf_t5(root / f"t5_v{v}", v, seed=3) for v in ("1.0", "1.1")}
