"""The training mesh's `model` axis (`training/partitioning.py`: T5 and Llama parameters split by their logical
axes — vocabulary, MLP, heads — over `model`, the batch over `data`): on 8 host devices the loss and the gradients
equal one device's, for both backbones, two mesh shapes, and with the parameters split over `data` as well
(`logical_rules.parameter_partitioning_dims = 2`). Runs tests/training/model_parallel_check.py in a
process of its own (the device count is fixed when JAX starts), once for the three cases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import xla_flags

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.slow  # a process of its own with 8 host devices
CASES = [(2, ""), (4, ""), (2, "fsdp")]


def _case(partitions: int, mode: str) -> str:
    return f"{partitions}:{mode}" if mode else str(partitions)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    env = {**os.environ, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=8")}
    res = subprocess.run([sys.executable, str(REPO / "tests" / "training" / "model_parallel_check.py"),
                          *[_case(*c) for c in CASES]], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    return [json.loads(line) for line in res.stdout.splitlines()]


@pytest.mark.parametrize("partitions,mode", CASES)
def test_a_data_by_model_mesh_gives_one_devices_loss_and_gradients(rows, partitions, mode):
    rows = {r["name"]: r for r in rows if r["case"] == _case(partitions, mode)}
    assert sorted(rows) == ["llama", "t5"]
    for row in rows.values():
        assert row["devices"] == 8 and row["mesh"] == {"data": 8 // partitions, "model": partitions}
        # the rules split most arrays (every matrix but the layer norms' and relative-position tables'); all of them
        # when `embed` goes to `data` too
        assert row["split_arrays"] >= row["arrays"] // 2, row
        assert mode != "fsdp" or row["split_arrays"] == row["arrays"], row
        assert row["opt_split"] == 2 * row["split_arrays"], row  # the trainer's Adam moments follow their parameters
        # one float32 mean over 16 rows, computed as partial sums over the data shards and the model shards'
        # slices of each matmul: rounding of ~1e-7 per sum (measured 0 and 7e-8 for the loss, ≤ 1.2e-6 of each
        # gradient array's largest entry); a wrong split (a missing psum, a dropped shard) is O(1)
        assert row["loss_rel"] <= 1e-6, row
        assert row["grad_rel"] <= 1e-5, row
