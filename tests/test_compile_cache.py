"""The suite's persistent XLA compilation cache (tests/conftest.py) changes no result: a tiny training run cold
(an empty cache, every program compiled and written to it) and run again warm (every program read back from it)
writes the same run file, the same metrics and the same parameters, byte for byte. And the cache folder is keyed
by what decides the programs: the JAX and jaxlib versions and the XLA flags. A process near the memory-mapping
limit drops its compiled programs (past the limit XLA's compiler crashes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import compilation_cache_dir, process_footprint, release_if_over
from tests.test_bad_inputs import TINY

REPO = Path(__file__).resolve().parents[1]


def test_the_cache_folder_is_keyed_by_versions_and_flags(tmp_path):
    from importlib.metadata import version

    env = {"GR_JAX_TEST_CACHE_DIR": str(tmp_path), "XLA_FLAGS": "--a=1 --b=2"}
    folder = compilation_cache_dir(env)
    assert Path(folder).parent == tmp_path
    assert Path(folder).name.startswith(f"jax{version('jax')}-jaxlib{version('jaxlib')}-xla")
    assert compilation_cache_dir({**env, "XLA_FLAGS": "--b=2  --a=1"}) == folder  # the same flags, other order
    assert compilation_cache_dir({**env, "XLA_FLAGS": "--a=1"}) != folder
    assert compilation_cache_dir({**env, "GR_JAX_TEST_CACHE_DIR": "off"}) is None
    home = compilation_cache_dir({"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert Path(home).parent == tmp_path / "xdg" / "gr_jax" / "xla"


def test_programs_are_dropped_past_the_budget_and_kept_below():
    import jax
    import jax.numpy as jnp

    f = jax.jit(lambda x: jnp.sin(x) * 3.0)
    f(jnp.ones(4)).block_until_ready()
    maps, rss = process_footprint()
    assert maps > 0 and rss > 0  # read from /proc: a budget check that reads zeros would never fire
    assert not release_if_over(maps + 10_000, rss + (1 << 30)) and f._cache_size() == 1  # below: kept
    assert release_if_over(0, rss + (1 << 30)) and f._cache_size() == 0  # too many mappings: dropped
    f(jnp.ones(4)).block_until_ready()
    assert release_if_over(maps + 10_000, 0) and f._cache_size() == 0  # too many resident bytes: dropped


def _params(model_dir: Path, step: int) -> dict:
    import jax
    import orbax.checkpoint as ocp

    from gr_jax.training import trainer

    manager = ocp.CheckpointManager((model_dir / "checkpoints").absolute())
    tree = trainer.read_checkpoint(manager, step, model_dir)["state"]["params"]
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _entries(cache: Path) -> set:
    return {p.name for p in cache.iterdir() if p.name.endswith("-cache")}


@pytest.mark.slow
def test_a_warm_cache_gives_the_bytes_of_a_cold_one(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    exp = tmp_path / "tiny.gin"
    exp.write_text(TINY)
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}

    def train(name: str) -> Path:
        model_dir = tmp_path / name
        res = subprocess.run([sys.executable, "-m", "gr_jax.train", f"--gin_file={exp}",
                              f"--gin.MODEL_DIR='{model_dir}'"], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        return model_dir

    cold = train("cold")
    written = _entries(cache)
    assert written, "the cold run wrote no program to the cache"
    warm = train("warm")
    # every program of the warm run was read back: it compiled nothing new, so it wrote nothing new
    assert _entries(cache) == written
    run = "runs/test.step2.run"
    assert (warm / run).read_bytes() == (cold / run).read_bytes()
    assert json.loads((warm / "final_metrics.json").read_text())["metrics"] == \
        json.loads((cold / "final_metrics.json").read_text())["metrics"]
    a, b = _params(cold, 2), _params(warm, 2)
    assert a.keys() == b.keys() and a
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].tobytes() == b[key].tobytes(), key
