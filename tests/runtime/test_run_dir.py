"""`RunDir`: the run directory's layout in one place, and what a run recorded (its config.gin, read by gin's
parser alone). Hand-worked cases on files the test writes."""

import logging

import gin
import pytest

from gr_jax import compose
from gr_jax.runtime import gin_utils
from gr_jax.runtime.run_dir import RunDir


def test_the_layout_by_hand(tmp_path):
    run = RunDir(tmp_path / "m")
    assert run.checkpoint(12) == tmp_path / "m" / "checkpoints" / "12"
    assert run.run("test", 3) == tmp_path / "m" / "runs" / "test.step3.run"
    assert run.metrics_log("dpr") == tmp_path / "m" / "dpr_metrics.jsonl"
    assert run.train_metrics.name == "train_metrics.jsonl"
    assert run.model.model.root == tmp_path / "m" / "model" / "model" and RunDir(run) == run
    assert str(run) == str(tmp_path / "m") and run.aligned("de") == tmp_path / "m" / "aligned" / "de"
    assert not (tmp_path / "m").exists()  # a value: it names places and creates nothing


RECORDED = """MIXTURE_OR_TASK_NAME = 'demo'
TASK_FEATURE_LENGTHS = {'inputs': 24, 'targets': 3}
INNER = %TASK_FEATURE_LENGTHS
train.task = %MIXTURE_OR_TASK_NAME
train.feature_lengths = %INNER
train.optimizer = @make_optimizer()
scope/train.seed = 4
"""


def test_what_a_run_recorded_is_read_with_macros_resolved(tmp_path):
    run = RunDir(tmp_path)
    (tmp_path / "config.gin").write_text(RECORDED)
    got = run.recorded("train.task", "train.feature_lengths", "train.optimizer", "train.initial_checkpoint_path")
    # a macro through a macro resolved; a configurable reference and an unbound setting left out
    assert got == {"train.task": "demo", "train.feature_lengths": {"inputs": 24, "targets": 3}}
    (tmp_path / "config.gin").write_text("train.task = [\n")
    with pytest.raises(ValueError, match="config.gin: cannot parse"):
        run.recorded("train.task")
    with pytest.raises(OSError, match="none/config.gin"):  # entry points report it as one message, exit code 2
        RunDir(tmp_path / "none").recorded("train.task")


def test_a_restored_run_uses_its_recorded_task_and_lengths(tmp_path, caplog):
    (tmp_path / "config.gin").write_text(RECORDED)
    gin.clear_config()
    try:
        gin_utils.parse(["experiments/demo/dsi_url.gin"],
                        ["MODEL_DIR = 'x'", "TASK_FEATURE_LENGTHS = {'inputs': 8, 'targets': 4}"])
        with caplog.at_level(logging.INFO, logger="gr_jax.compose"):
            got = compose.recorded_training(tmp_path)
    finally:
        gin.clear_config()
    # the seed too: a run with frozen parameters (LoRA's base, `prepare.frozen`) rebuilds them from its own seed
    assert got == {"task": "demo", "feature_lengths": {"inputs": 24, "targets": 3}, "initial_checkpoint_path": None,
                   "seed": 4}
    assert "train.seed = 4 (its config.gin)" in caplog.text
    assert "train.feature_lengths = {'inputs': 24, 'targets': 3} (its config.gin)" in caplog.text
