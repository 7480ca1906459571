"""`tools/bench_seal_scoring.py` as a user runs it on a trained SEAL model: the device and host scorers agree
(exit 0, one JSON row), and a model that is not SEAL's is refused with exit 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.methods.seal.small import train_small

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_the_bench_compares_both_scorers_on_a_trained_model(tmp_path):
    exp, model_dir = train_small(tmp_path, "seal", "experiments/demo/seal.gin", 4)
    cmd = [sys.executable, str(ROOT / "tools" / "bench_seal_scoring.py"), f"--gin_file={exp}",
           f"--gin.MODEL_DIR='{model_dir}'", "--queries", "6", "--rounds", "1", "--no_write"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["queries"] == 6 and row["same_documents"] and row["max_rel_diff"] <= 1e-5
    assert row["host_ms_per_query"] > 0 and row["device_ms_per_query"] > 0
    bad = subprocess.run([*cmd[:2], f"--gin_file={exp}", f"--gin.MODEL_DIR='{tmp_path / 'nothing'}'", "--no_write"],
                         capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "checkpoints" in bad.stderr
