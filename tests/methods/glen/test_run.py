"""GLEN's two phases through the composition: phase 1 (keyword docids, L_key), then phase 2 continued from
phase 1's MODEL_DIR (INITIAL_CHECKPOINT_PATH) with docids decoded by the model, re-decoded every R steps,
written in GLEN's docid format, restored by `infer`, and resumed exactly."""

import logging
import textwrap
from pathlib import Path

import gin
import jax
import numpy as np
import pytest

from gr_jax import compose
from gr_jax.runtime import gin_utils
from gr_jax.methods.glen.docids import read_docid_tsv
from gr_jax.data.vocab import load_vocabulary
from tests.conftest import tool

LOOP = """
train.optimizer = @make_optimizer()
train.progress = False
train.log_period = 5
EvalConfig.num_beams = 4
train.eval_config = @EvalConfig()
"""

PHASE1 = """
include 'runs/train.gin'
include 'models/t5_tiny.gin'
MIXTURE_OR_TASK_NAME = 'demo'
load_dataset.demo_docs = 40
BATCH_SIZE = 8
TASK_FEATURE_LENGTHS = {'inputs': 24, 'targets': 2}
TRAIN_STEPS = 10
prepare.vocab_size = 300
prepare.docid_scheme = @KeywordDocids()
KeywordDocids.n = 2
KeywordDocids.fixed_length = True
prepare.model_fn = @GlenRetriever
GlenRetriever.docid_length = 2
GlenRetriever.ranker = @FirstOccurrence()
t5.get_config.dropout_rate = 0.0
make_optimizer.learning_rate = 3e-3
train.checkpoint_period = 10
""" + LOOP

PHASE2 = """
include 'runs/train.gin'
MIXTURE_OR_TASK_NAME = 'demo'
load_dataset.demo_docs = 40
BATCH_SIZE = 4
TASK_FEATURE_LENGTHS = {'inputs': 24, 'targets': 2, 'documents': 24}
TRAIN_STEPS = 10
prepare.docid_scheme = @GlenDocids()
GlenDocids.length = 2
prepare.model_fn = @GlenRetriever
GlenRetriever.docid_length = 2
GlenRetriever.objective = @glen_objective
GlenRetriever.ranker = @CollisionFree()
prepare.objectives_config = @GlenPhase2()
GlenPhase2.num_negatives = 2
GlenPhase2.reassign_every = 5
make_optimizer.learning_rate = 1e-3
train.checkpoint_period = 5
""" + LOOP


def _run(tmp_path, text, bindings):
    gin.clear_config()
    f = tmp_path / "exp.gin"
    f.write_text(textwrap.dedent(text))
    gin_utils.parse([str(f)], list(bindings))
    return gin_utils.call_configured(compose.train)


@pytest.fixture(scope="module")
def phase1(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("glen")
    _run(tmp, PHASE1, [f"MODEL_DIR = '{tmp / 'phase1'}'"])
    return tmp / "phase1"


def _phase2(tmp_path, phase1, model_dir, extra=()):
    return _run(tmp_path, PHASE2, [f"MODEL_DIR = '{model_dir}'", f"INITIAL_CHECKPOINT_PATH = '{phase1}'",
                                   *extra])


def _params(model_dir: Path, step: int):
    import orbax.checkpoint as ocp

    mngr = ocp.CheckpointManager((model_dir / "checkpoints").absolute())
    return mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]["params"]


@pytest.mark.slow
def test_phase2_decodes_writes_restores_and_resumes_its_docids(tmp_path, phase1, caplog):
    caplog.set_level(logging.INFO, logger="gr_jax.compose")
    summary = _phase2(tmp_path, phase1, tmp_path / "p2")
    setup = summary["setup"]
    # re-decoded before the first step and after step 5 (not after the last one: the final decode follows)
    steps = [r.getMessage().split(":")[0] for r in caplog.records if "decoding every document" in r.getMessage()]
    assert steps == ["step 0", "step 5"]
    # the vocabulary came from phase 1's MODEL_DIR and the network started from its last checkpoint
    assert setup.vocab.fingerprint == load_vocabulary(phase1 / "vocabulary" / "spiece.model").fingerprint
    assert "pair_loss" in (tmp_path / "p2" / "train_metrics.jsonl").read_text()

    # the docids written are the final parameters' greedy decodings, in GLEN's format
    written = read_docid_tsv(summary["docids"], setup.vocab.piece_to_id)
    params = _params(tmp_path / "p2", 10)
    tokens, logits = setup.model.decode_docids(params, setup.document_tokens())
    rows = [setup.dataset.corpus.index_of(d) for d in written.doc_ids]
    assert np.array_equal(written.tokens, tokens[rows])
    # GLEN's file keeps 4 decimals: within half a unit of the last one (plus float32 rounding of the value)
    assert np.max(np.abs(written.logits - logits[rows])) <= 0.5e-4 + 1e-6 * np.max(np.abs(logits))

    # infer restores the checkpoint, decodes the same docids, and writes the same run as training's final one
    from gr_jax import infer as infer_cmd

    gin.clear_config()
    Path(summary["run"]).rename(tmp_path / "final.run")
    assert infer_cmd.main([f"--gin_file={tmp_path / 'exp.gin'}", "--gin_file=runs/eval.gin",
                           f"--gin.MODEL_DIR='{tmp_path / 'p2'}'", f"--gin.INITIAL_CHECKPOINT_PATH='{phase1}'",
                           "--gin.NUM_BEAMS=4"]) == 0
    assert Path(summary["run"]).read_text() == (tmp_path / "final.run").read_text()

    # tools/glen_ties.py: the collision-free row is infer's evaluation; the random orders differ only where
    # documents share a docid, so every random row lies within [0, 1] and their spread is reported
    glen_ties = tool("glen_ties")
    gin.clear_config()
    assert glen_ties.main(["--seeds", "3", "--split", "dev", "--num_beams", "4", f"--gin_file={tmp_path / 'exp.gin'}",
                           f"--gin.MODEL_DIR='{tmp_path / 'p2'}'", f"--gin.INITIAL_CHECKPOINT_PATH='{phase1}'"]) == 0
    import json

    ties = json.loads((tmp_path / "p2" / "ties" / "dev.step10.json").read_text())
    evaluated = json.loads((tmp_path / "p2" / "runs" / "dev.step10.metrics.json").read_text())["metrics"]
    assert ties["collision_free"] == evaluated and len(ties["random"]) == 3
    assert "| collision-free" in ties["table"] and "3 seeds" in ties["table"]

    # stopping at step 5 and resuming to 10 gives the uninterrupted run's parameters (the docids of step 5
    # are decoded again from the resumed parameters, so the negatives agree)
    _phase2(tmp_path, phase1, tmp_path / "p2b", ["TRAIN_STEPS = 5"])
    _phase2(tmp_path, phase1, tmp_path / "p2b")
    a, b = _params(tmp_path / "p2", 10), _params(tmp_path / "p2b", 10)
    assert all(np.array_equal(np.asarray(x), np.asarray(y))
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


@pytest.mark.slow
def test_phase2_refuses_a_checkpoint_period_that_breaks_exact_resume(tmp_path, phase1):
    with pytest.raises(ValueError, match="must be a multiple of the re-assignment period"):
        _phase2(tmp_path, phase1, tmp_path / "p2", ["train.checkpoint_period = 3"])


@pytest.mark.slow
def test_phase2_refuses_another_vocabulary_than_phase1s(tmp_path, phase1):
    from gr_jax.data.vocab import train_sentencepiece

    other = train_sentencepiece(["a completely different text about zebras"] * 50 + ["and lions"] * 50,
                                tmp_path / "other.model", 40)
    with pytest.raises(ValueError, match="is not the vocabulary INITIAL_CHECKPOINT_PATH"):
        _phase2(tmp_path, phase1, tmp_path / "p2", [f"VOCABULARY = '{tmp_path / 'other.model'}'"])
    assert other is not None


@pytest.mark.slow
def test_dsi_objectives_refuse_docids_decoded_by_the_model(tmp_path, phase1):
    with pytest.raises(ValueError, match="bind its own objectives config"):
        _phase2(tmp_path, phase1, tmp_path / "p2", ["prepare.objectives_config = @Objectives()",
                                                    "GlenRetriever.objective = None"])


@pytest.mark.slow
def test_a_released_glen_model_and_docid_file_import_and_evaluate(tmp_path, capsys):
    """GLEN's released artefacts (an HF T5 directory + their docid TSV), made here from a random tiny model:
    imported into a MODEL_DIR and evaluated by `gr_jax.infer`; the run from their docid file equals the run
    from the model's own decodings (the file was written from them); a phase-1 checkpoint and a changed docid
    file are refused by name."""
    from safetensors.numpy import load_file, save_file

    from gr_jax import infer as infer_cmd
    from gr_jax.data.sources import load_dataset
    from gr_jax.methods.glen.docids import write_docid_tsv
    from gr_jax.backbones import t5, t5_convert
    from gr_jax.methods.glen.model import GlenRetriever
    from gr_jax.data.vocab import train_sentencepiece
    from gr_jax.data.pipeline import tokenize

    import_tool = tool("import_checkpoint")

    gin.clear_config()
    corpus = load_dataset("demo", demo_docs=40).corpus
    vocab = train_sentencepiece(list(corpus.texts), tmp_path / "spiece.model", 300)
    config = t5.get_config("tiny").replace(vocab_size=vocab.size)
    model = GlenRetriever(config, docid_length=2)
    params = model.init_params(3)
    t5_convert.save_hf(params["network"], config, tmp_path / "released")
    tokens, logits = model.decode_docids(params, tokenize(corpus.texts, vocab, 24))
    write_docid_tsv(tmp_path / "docids.tsv", corpus.doc_ids, tokens, logits, corpus.texts, vocab.id_to_piece)

    exp = tmp_path / "released.gin"
    exp.write_text(textwrap.dedent(PHASE2) + f"\nVOCABULARY = '{tmp_path / 'spiece.model'}'\n")
    common = [f"--gin_file={exp}", f"--gin.INITIAL_CHECKPOINT_PATH='{tmp_path / 'released'}'"]
    runs = {}
    for name, extra in (("file", [f"--gin.GlenDocids.docid_file='{tmp_path / 'docids.tsv'}'"]), ("decoded", [])):
        gin.clear_config()
        assert import_tool.main([*common, *extra, f"--gin.MODEL_DIR='{tmp_path / name}'"]) == 0, \
            capsys.readouterr().err
        gin.clear_config()
        assert infer_cmd.main([*common, *extra, "--gin_file=runs/eval.gin", f"--gin.MODEL_DIR='{tmp_path / name}'",
                               "--gin.NUM_BEAMS=4"]) == 0, capsys.readouterr().err
        runs[name] = (tmp_path / name / "runs" / "dev.step0.run").read_text()
    assert runs["file"] == runs["decoded"] and runs["file"]

    # their docid file changed after the import: refused, naming the file
    text = (tmp_path / "docids.tsv").read_text().splitlines()
    (tmp_path / "docids.tsv").write_text("\n".join(text[1:] + text[:1]) + "\n")
    gin.clear_config()
    capsys.readouterr()
    assert infer_cmd.main([*common, f"--gin.GlenDocids.docid_file='{tmp_path / 'docids.tsv'}'",
                           "--gin_file=runs/eval.gin", f"--gin.MODEL_DIR='{tmp_path / 'file'}'"]) == 2
    assert "changed since this MODEL_DIR was built" in capsys.readouterr().err

    # a GLEN phase-1 checkpoint (its decoder block 0 has a cross-attention position bias): refused by name
    tensors = load_file(str(tmp_path / "released" / "model.safetensors"))
    tensors["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"] = np.zeros((32, 4), np.float32)
    save_file(tensors, str(tmp_path / "released" / "model.safetensors"))
    gin.clear_config()
    assert import_tool.main([*common, f"--gin.MODEL_DIR='{tmp_path / 'p1'}'"]) == 2
    assert "GLEN phase-1 checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "p1" / "checkpoints").exists()
