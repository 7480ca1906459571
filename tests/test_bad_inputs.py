"""Bad input a user would hit: each case ends in one clear message naming the file or setting and the fix,
exit code 2 from entry points (no traceback), and nothing wrong or half-written left behind — never a
result with exit code 0. The list follows the trust issue's "What was seen" and adds what a user would hit
next to it."""

import json
import subprocess
import sys
from pathlib import Path

import gin
import numpy as np
import pytest

from gr_jax import dynamic as dynamic_cmd
from gr_jax import eval as eval_cmd
from gr_jax.runtime import gin_utils
from gr_jax import infer as infer_cmd
from gr_jax import train as train_cmd
from gr_jax.data import readers, sources
from gr_jax.data import trec
from tests.conftest import run_tool
from tests.shared import copy_of

REPO = Path(__file__).resolve().parents[1]

TINY = """
include 'experiments/demo/dsi_naive.gin'
load_dataset.demo_docs = 40
TRAIN_STEPS = 2
BATCH_SIZE = 8
prepare.vocab_size = 200
train.progress = False
train.log_period = 1
EvalConfig.compare_bm25 = False
EvalConfig.num_beams = 3
"""


def _main(entry, argv, capsys) -> tuple[int, str]:
    gin.clear_config()
    rc = entry.main(argv)
    return rc, capsys.readouterr().err


@pytest.fixture
def trained(tiny_dsi):
    """A tiny DSI trained for two steps (config file, MODEL_DIR): the session's shared one (tests/conftest.py),
    read-only."""
    return tiny_dsi


# ---------------------------------------------------------------------------------------------------------------
# 1. the working directory holds folders named like the gin tiers
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_entry_points_run_from_a_directory_with_runs_experiments_and_models_folders(trained, tmp_path, monkeypatch,
                                                                                   capsys):
    for d in ("runs/demo_dsi_url", "experiments", "models"):
        (tmp_path / d).mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    exp = tmp_path / "tiny.gin"
    exp.write_text(TINY)
    copy_of(trained[1], tmp_path / "runs" / "m")  # TINY trained: the command finds it finished and evaluates it
    rc, err = _main(train_cmd, [f"--gin_file={exp}", "--gin.MODEL_DIR='runs/m'"], capsys)
    assert rc == 0, err
    rc, err = _main(infer_cmd, [f"--gin_file={exp}", "--gin_file=runs/eval.gin", "--gin.MODEL_DIR='runs/m'"], capsys)
    assert rc == 0, err
    (tmp_path / "b.gin").write_text("include 'experiments/demo/dynamic_bm25.gin'\nload_dataset.demo_docs = 40\n"
                                    "run_dynamic.progress = False\n")
    rc, err = _main(dynamic_cmd, ["--gin_file=b.gin", "--gin.MODEL_DIR='runs/d'"], capsys)
    assert rc == 0, err
    # a user's own file with the name of a shipped one is not picked up by the shipped includes ...
    (tmp_path / "runs" / "train.gin").write_text("this is not gin\n")
    rc, err = _main(dynamic_cmd, ["--gin_file=b.gin", "--gin.MODEL_DIR='runs/d2'"], capsys)
    assert rc == 0, err
    # ... and one named on the command line wins only when asked for: the search order is written down
    assert gin_utils.resolve("runs/train.gin") == gin_utils.GIN_CONFIGS / "runs" / "train.gin"
    assert gin_utils.resolve("runs/train.gin", [str(tmp_path)]) == tmp_path / "runs" / "train.gin"


# ---------------------------------------------------------------------------------------------------------------
# 4. wrong results with exit code 0
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_infer_refuses_another_vocabulary_or_corpus_and_keeps_earlier_results(trained, tmp_path, capsys, caplog):
    exp, model = trained[0], copy_of(trained[1], tmp_path / "model")
    from gr_jax.data.vocab import train_sentencepiece

    other = train_sentencepiece(["some other text about rivers", "and bridges of stone"] * 50, tmp_path / "o.model",
                                200)
    base = [f"--gin_file={exp}", "--gin_file=runs/eval.gin", f"--gin.MODEL_DIR='{model}'"]
    before = sorted(p.name for p in (model / "runs").iterdir())
    rc, err = _main(infer_cmd, base + [f"--gin.VOCABULARY='{other.model_file}'"], capsys)
    assert rc == 2 and "vocabulary" in err and "docid_scheme" in err, err  # the saved docids name the fix
    rc, err = _main(infer_cmd, base + ["--gin.load_dataset.demo_docs=50"], capsys)
    assert rc == 2 and "vocabulary: the SentencePiece model there was trained on other texts" in err, err
    own_vocab = f"--gin.VOCABULARY='{model / 'vocabulary' / 'spiece.model'}'"  # past the vocabulary check:
    rc, err = _main(infer_cmd, base + ["--gin.load_dataset.demo_docs=50", own_vocab], capsys)
    assert rc == 2 and "docid scheme was built from another corpus" in err, err
    assert sorted(p.name for p in (model / "runs").iterdir()) == before  # nothing written by refused runs
    # a different result for the same step (other beams) never replaces the earlier one silently
    rc, err = _main(infer_cmd, base + ["--gin.NUM_BEAMS=2"], capsys)
    assert rc == 0, err
    rc, err = _main(infer_cmd, base + ["--gin.NUM_BEAMS=3"], capsys)
    assert rc == 0, err
    kept = sorted(p.name for p in (model / "runs").iterdir() if ".prev-" in p.name)
    assert kept == ["dev.step2.metrics.json.prev-1", "dev.step2.run.prev-1"]
    assert "kept as dev.step2.run.prev-1" in caplog.text


@pytest.mark.slow
def test_state_left_in_model_dir_is_checked_before_reuse(trained, tmp_path, capsys):
    exp, model = trained
    import shutil

    run_dir = tmp_path / "m"
    shutil.copytree(model, run_dir)
    base = [f"--gin_file={exp}", f"--gin.MODEL_DIR='{run_dir}'"]
    # a vocabulary file swapped after training
    from gr_jax.data.vocab import train_sentencepiece

    spiece = run_dir / "vocabulary" / "spiece.model"
    original = spiece.read_bytes()
    train_sentencepiece(["a different vocabulary entirely"] * 40, tmp_path / "x.model", 200)
    spiece.write_bytes((tmp_path / "x.model").read_bytes())
    rc, err = _main(train_cmd, base, capsys)
    assert rc == 2 and "spiece.model: not the file its provenance.json describes" in err, err
    spiece.write_bytes(original)
    # the same MODEL_DIR reused with other data: the vocabulary was trained on other texts
    rc, err = _main(train_cmd, base + ["--gin.load_dataset.demo_docs=30"], capsys)
    assert rc == 2 and "vocabulary: the SentencePiece model there was trained on other texts" in err, err
    # a docid-scheme state without its record of what it was built from (e.g. left by an older run)
    meta = json.loads((run_dir / "docid_scheme" / "scheme.json").read_text())
    del meta["built_from"]
    (run_dir / "docid_scheme" / "scheme.json").write_text(json.dumps(meta))
    rc, err = _main(train_cmd, base, capsys)
    assert rc == 2 and "records nothing of what it was built from" in err, err


@pytest.mark.parametrize("line,message", [
    ("1\tfirst passage\n \tblank id\n", r"collection.tsv:2: empty pid"),
    ("1\tfirst passage\n2\tsecond\n1\tagain\n", r"collection.tsv:3: duplicate pid '1' \(first at line 1\)"),
    ("1\tfirst passage\n\n2\tx\n2\ty\n", r"collection.tsv:4: duplicate pid '2' \(first at line 3\)"),
])
def test_msmarco_collection_blank_or_duplicate_pids(tmp_path, line, message):
    (tmp_path / "collection.tsv").write_text(line)
    with pytest.raises(readers.DataError, match=message):
        readers.read_msmarco_collection(tmp_path / "collection.tsv")


def test_msmarco_duplicate_check_survives_hash_collisions(tmp_path, monkeypatch):
    """Equal hashes are confirmed on the strings: distinct pids that collide are not duplicates."""
    (tmp_path / "collection.tsv").write_text("1\ta\n2\tb\n3\tc\n")
    monkeypatch.setattr(readers, "hash", lambda b: 7, raising=False)
    assert list(readers.read_msmarco_collection(tmp_path / "collection.tsv").doc_ids) == ["1", "2", "3"]
    (tmp_path / "collection.tsv").write_text("1\ta\n2\tb\n1\tc\n")
    with pytest.raises(readers.DataError, match=r"collection.tsv:3: duplicate pid '1'"):
        readers.read_msmarco_collection(tmp_path / "collection.tsv")


@pytest.mark.parametrize("value,kind", [("null", "null"), ('["a"]', "list"), ("12345", "int"), ("1.5", "float"),
                                        ("true", "bool")])
def test_jsonl_text_must_be_a_string(tmp_path, value, kind):
    (tmp_path / "corpus.jsonl").write_text('{"id": "d1", "text": "fine"}\n{"id": "d2", "text": %s}\n' % value)
    with pytest.raises(readers.DataError, match=rf"corpus.jsonl:2: field 'text' \(text\) must be a string, found "
                                                rf"{kind}"):
        readers.read_corpus(tmp_path / "corpus.jsonl")


def test_jsonl_ids_may_be_integers_titles_must_be_strings(tmp_path):
    (tmp_path / "corpus.jsonl").write_text('{"id": 7, "text": "a"}\n{"id": 8, "text": "b", "title": null}\n')
    assert list(readers.read_corpus(tmp_path / "corpus.jsonl").doc_ids) == ["7", "8"]
    (tmp_path / "corpus.jsonl").write_text('{"id": 7, "text": "a", "title": ["x"]}\n')
    with pytest.raises(readers.DataError, match=r"corpus.jsonl:1: field 'title' must be a string"):
        readers.read_corpus(tmp_path / "corpus.jsonl")
    (tmp_path / "corpus.jsonl").write_text('{"id": 7.5, "text": "a"}\n')
    with pytest.raises(readers.DataError, match=r"corpus.jsonl:1: field 'id' \(document id\) must be a string"):
        readers.read_corpus(tmp_path / "corpus.jsonl")


def _jsonl_data(d: Path, dev_qrels: str) -> None:
    d.mkdir()
    (d / "corpus.jsonl").write_text('{"id": "d1", "text": "alpha"}\n{"id": "d2", "text": "beta"}\n')
    (d / "queries.train.jsonl").write_text('{"id": "q1", "text": "alpha?"}\n')
    (d / "qrels.train.tsv").write_text("q1 0 d1 1\n")
    (d / "queries.dev.jsonl").write_text('{"id": "q2", "text": "beta?"}\n{"id": "q3", "text": "gamma?"}\n')
    (d / "qrels.dev.tsv").write_text(dev_qrels)


@pytest.mark.parametrize("qrels,message", [
    ("q2 0 d2 1\nq3 0 d9 1\n", r"qrels.dev.tsv:2: document 'd9' is not in the corpus"),
    ("q2 0 d2 1\nq7 0 d1 1\n", r"qrels.dev.tsv:2: query 'q7' is judged but has no query text"),
    ("q2 0 d2 1\nq2 0 d2 0\n", r"qrels.dev.tsv:2: query 'q2', document 'd2' judged again with grade 0"),
])
def test_qrels_are_checked_in_every_split_with_the_line(tmp_path, qrels, message):
    _jsonl_data(tmp_path / "data", qrels)
    with pytest.raises(readers.DataError, match=message):
        sources.load_dataset("jsonl", str(tmp_path / "data"))


def test_msmarco_dev_qrels_against_unknown_passages(tmp_path):
    d = tmp_path / "msmarco"
    d.mkdir()
    (d / "collection.tsv").write_text("1\talpha\n2\tbeta\n")
    for split in ("train", "dev"):
        (d / f"queries.{split}.tsv").write_text("10\talpha?\n")
    (d / "qrels.train.tsv").write_text("10\t0\t1\t1\n")
    (d / "qrels.dev.tsv").write_text("10\t0\t3\t1\n")
    with pytest.raises(readers.DataError, match=r"qrels.dev.tsv:1: document '3' is not in the corpus"):
        readers.read_msmarco(d)


@pytest.mark.slow
@pytest.mark.parametrize("binding,message", [
    ("--gin.TRAIN_STEP=5", "TRAIN_STEP: nothing uses it; did you mean 'TRAIN_STEPS'?"),
    ("--gin.train.train_step=5", "did you mean 'train_steps'?"),
    ("--gin.EvalConfg.num_beams=5", "did you mean 'EvalConfig'?"),
    ("--gin.TRAIN_STEPS=-5", "TRAIN_STEPS (train.train_steps) must be an integer ≥ 1, got -5"),
    ("--gin.TRAIN_STEPS=0", "TRAIN_STEPS (train.train_steps) must be an integer ≥ 1, got 0"),
    ("--gin.TRAIN_STEPS='ten'", "TRAIN_STEPS (train.train_steps) must be an integer ≥ 1, got 'ten'"),
    ("--gin.train.checkpoint_period=0", "train.checkpoint_period must be an integer ≥ 1, got 0"),
    ("--gin.train.log_period=0", "train.log_period must be an integer ≥ 1, got 0"),
    ("--gin.make_optimizer.learning_rate=-1e-3", "make_optimizer.learning_rate must be a finite number > 0, got -0.001"),
    ("--gin.BATCH_SIZE=0", "BATCH_SIZE (train.batch_size) must be an integer ≥ 1, got 0"),
    ("--gin.EvalConfig.num_beams=0", "EvalConfig.num_beams must be an integer ≥ 1, got 0"),
    ("--gin.TASK_FEATURE_LENGTHS={'inputs': 0, 'targets': 12}", "TASK_FEATURE_LENGTHS (train.feature_lengths)"
                                                                "['inputs'] must be ≥ 1, got 0"),
    ("--gin.Replay.steps=5", "gin bindings that this run never used (they would be ignored):\n  Replay.steps"),
    ("--gin.TfidfSvdEmbedder.dim=8", "never used (they would be ignored):\n  TfidfSvdEmbedder.dim"),  # naive
])
def test_bad_settings_stop_before_any_work(tmp_path, capsys, binding, message):
    exp = tmp_path / "tiny.gin"
    exp.write_text(TINY)
    rc, err = _main(train_cmd, [f"--gin_file={exp}", f"--gin.MODEL_DIR='{tmp_path / 'm'}'", binding], capsys)
    assert rc == 2 and message in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "m" / "checkpoints").exists() and not (tmp_path / "m" / "config.gin").exists()


@pytest.mark.slow
def test_model_dir_that_is_a_file(tmp_path, capsys):
    exp = tmp_path / "tiny.gin"
    exp.write_text(TINY)
    (tmp_path / "m").write_text("a file")
    rc, err = _main(train_cmd, [f"--gin_file={exp}", f"--gin.MODEL_DIR='{tmp_path / 'm'}'"], capsys)
    assert rc == 2 and "is a file, not a directory" in err, err
    (tmp_path / "b.gin").write_text("include 'experiments/demo/dynamic_bm25.gin'\n")
    rc, err = _main(dynamic_cmd, [f"--gin_file={tmp_path / 'b.gin'}", f"--gin.MODEL_DIR='{tmp_path / 'm'}'"], capsys)
    assert rc == 2 and "is a file, not a directory" in err, err


@pytest.mark.slow
def test_eval_command_bad_inputs(tmp_path, capsys):
    trec.write_run(tmp_path / "run.txt", {"1": {"a": 3.0}})
    trec.write_qrels(tmp_path / "qrels.txt", {"7": {"a": 1}})
    argv = ["--run", str(tmp_path / "run.txt"), "--qrels", str(tmp_path / "qrels.txt")]
    assert eval_cmd.main(argv) == 2  # no query in common: not a table of zeros
    assert "no query of the run is judged" in capsys.readouterr().err
    assert eval_cmd.main(argv + ["--msmarco_official"]) == 2
    capsys.readouterr()
    (tmp_path / "nan.txt").write_text("7 Q0 a 1 nan t\n")
    assert eval_cmd.main(["--run", str(tmp_path / "nan.txt"), "--qrels", str(tmp_path / "qrels.txt")]) == 2
    assert "nan.txt:1: score 'nan' is not a finite number" in capsys.readouterr().err
    with pytest.raises(ValueError, match="has score inf"):
        trec.write_run(tmp_path / "inf.txt", {"7": {"a": float("inf")}})
    trec.write_run(tmp_path / "ok.txt", {"7": {"a": 1.0}})
    (tmp_path / "file").write_text("x")
    assert eval_cmd.main(["--run", str(tmp_path / "ok.txt"), "--qrels", str(tmp_path / "qrels.txt"),
                          "--out", str(tmp_path / "file" / "m.json")]) == 2  # --out under a file
    assert f"{tmp_path / 'file'} is a file, not a directory" in capsys.readouterr().err


def test_tools_report_bad_paths_with_exit_code_2(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    cases = [
        ("convert_checkpoint", ["--hf_dir", tmp_path / "nothing", "--out", tmp_path / "file" / "ckpt"], "config.json"),
        ("dynamic_report", [tmp_path, "--out", tmp_path / "r"], "not a dynamic-corpora result"),
    ]
    for name, argv, message in cases:
        rc, _, err = run_tool(name, argv, capsys)
        assert rc == 2 and message in err, (name, err[-2000:])
        assert "Traceback" not in err, err


@pytest.mark.slow
def test_a_command_reports_a_bad_path_with_exit_code_2_and_no_traceback(tmp_path):
    """As a user types it: one line on stderr, exit code 2, nothing printed at the interpreter's exit."""
    (tmp_path / "file").write_text("x")
    proc = subprocess.run([sys.executable, "-m", "gr_jax.train", "--gin_file=experiments/demo/dsi_url.gin",
                           f"--gin.MODEL_DIR='{tmp_path / 'file'}'"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and "is a file, not a directory" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------------------------
# 5. damaged checkpoints
# ---------------------------------------------------------------------------------------------------------------

def _largest_array_file(step_dir: Path) -> Path:
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    return max(files, key=lambda p: p.stat().st_size)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated array file", "missing data/metadata"])
def test_resume_falls_back_to_the_newest_intact_checkpoint(tmp_path, capsys, caplog, damage):
    exp = tmp_path / "tiny.gin"
    exp.write_text(TINY + "train.checkpoint_period = 1\ntrain.final_eval = False\n")
    model = tmp_path / "m"
    assert _main(train_cmd, [f"--gin_file={exp}", f"--gin.MODEL_DIR='{model}'"], capsys)[0] == 0
    latest = model / "checkpoints" / "2"
    if damage == "truncated array file":
        f = _largest_array_file(latest)
        f.write_bytes(f.read_bytes()[:100])
    else:
        (latest / "data" / "metadata").unlink()
    rc, err = _main(train_cmd, [f"--gin_file={exp}", f"--gin.MODEL_DIR='{model}'"], capsys)
    assert rc == 0, err
    assert f"checkpoint {latest} is damaged" in caplog.text and "resuming from step 1" in caplog.text
    assert (model / "damaged_checkpoints" / "2").is_dir()  # kept for inspection, not deleted
    assert (model / "checkpoints" / "2").is_dir()  # trained again from step 1
    # every checkpoint damaged: a clear error, not a fresh start over the user's run
    for step in (1, 2):
        (model / "checkpoints" / str(step) / "data" / "metadata").unlink()
    rc, err = _main(train_cmd, [f"--gin_file={exp}", f"--gin.MODEL_DIR='{model}'"], capsys)
    assert rc == 2 and "no intact checkpoint" in err and "steps [2, 1] moved there now" in err, err
    rc, err = _main(train_cmd, [f"--gin_file={exp}", f"--gin.MODEL_DIR='{model}'"], capsys)  # and again:
    assert rc == 2 and "no intact checkpoint (damaged ones are in" in err, err  # no silent fresh start


@pytest.mark.slow
def test_infer_names_a_damaged_checkpoint(trained, tmp_path, capsys):
    import shutil

    exp, model = trained
    copy = tmp_path / "m"
    shutil.copytree(model, copy)
    f = _largest_array_file(copy / "checkpoints" / "2")
    f.write_bytes(f.read_bytes()[:50])
    rc, err = _main(infer_cmd, [f"--gin_file={exp}", "--gin_file=runs/infer.gin", f"--gin.MODEL_DIR='{copy}'"],
                    capsys)
    assert rc == 2 and "checkpoints/2: damaged, its arrays cannot be read" in err, err


@pytest.mark.slow
def test_a_damaged_initial_checkpoint_is_named(tmp_path, capsys):
    from gr_jax.backbones import t5, t5_convert

    config = t5.get_config("tiny", vocab_size=300, dropout_rate=0.0)
    params = t5.init_params(config, seed=0)
    params["encoder"]["layers_0"]["mlp"]["wo"]["kernel"] = np.asarray(
        params["encoder"]["layers_0"]["mlp"]["wo"]["kernel"]).copy()
    params["encoder"]["layers_0"]["mlp"]["wo"]["kernel"][3, 5] = np.nan  # a flipped exponent bit reads as NaN/inf
    t5_convert.save_checkpoint(params, config, tmp_path / "ckpt")
    exp = tmp_path / "tiny.gin"
    exp.write_text(TINY)
    rc, err = _main(train_cmd, [f"--gin_file={exp}", f"--gin.MODEL_DIR='{tmp_path / 'm'}'",
                                f"--gin.INITIAL_CHECKPOINT_PATH='{tmp_path / 'ckpt'}'"], capsys)
    assert rc == 2, err
    assert f"INITIAL_CHECKPOINT_PATH {tmp_path / 'ckpt'}: parameter ['encoder']['layers_0']['mlp']['wo']['kernel'] " \
           "holds NaN/inf values" in err, err
    assert not (tmp_path / "m" / "checkpoints").exists()


@pytest.mark.slow
def test_glen_phase2_before_phase1_is_named_and_writes_nothing(tmp_path, capsys):
    rc, err = _main(train_cmd, ["--gin_file=experiments/demo/glen.gin", f"--gin.MODEL_DIR='{tmp_path / 'm'}'",
                                f"--gin.INITIAL_CHECKPOINT_PATH='{tmp_path / 'no_phase1'}'"], capsys)
    assert rc == 2, err
    assert f"INITIAL_CHECKPOINT_PATH {tmp_path / 'no_phase1'} does not exist" in err
    assert "GLEN's phase 2, starts from the MODEL_DIR of the first: train that first" in err
    assert not (tmp_path / "m").exists()  # not even a vocabulary trained for nothing


def test_nonfinite_message_points_to_a_checkpoint_only_when_one_exists(tmp_path):
    from gr_jax.training.trainer import _nonfinite_message

    assert "last checkpoint saved before it is" in _nonfinite_message(tmp_path, 0, 50, [50], None)
    msg = _nonfinite_message(tmp_path, 0, 50, [], "ckpt/t5")
    assert "no checkpoint was saved before this" in msg and "INITIAL_CHECKPOINT_PATH ckpt/t5" in msg
    assert "checkpoint saved before it" not in msg


# ---------------------------------------------------------------------------------------------------------------
# 7. benchmarks compare warm with warm
# ---------------------------------------------------------------------------------------------------------------

def test_benchmark_timing_excludes_the_first_call():
    import importlib.util
    import time

    spec = importlib.util.spec_from_file_location("bench_decoding", REPO / "tools" / "bench_decoding.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    calls = []

    def slow_first():
        calls.append(1)
        time.sleep(0.5 if len(calls) == 1 else 0.001)
        return 0

    assert bench.timed(slow_first, repeats=3, sync=lambda x: x) < 0.1
    assert len(calls) == 4  # one warm-up call, then three timed ones
