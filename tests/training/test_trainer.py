"""Trainer: end to end on a small demo corpus, exact resume, SIGKILL during a save, data parallelism,
initial checkpoints, configuration errors, shipped gin files."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import gin
import jax
import numpy as np
import pytest

from gr_jax.runtime import gin_utils
from gr_jax import compose
from tests.conftest import xla_flags


REPO = Path(__file__).resolve().parents[2]

SMALL = """
include 'runs/train.gin'
include 'models/t5_tiny.gin'
MIXTURE_OR_TASK_NAME = 'demo'
BATCH_SIZE = 16
TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 2}
load_dataset.demo_docs = %DOCS
prepare.vocab_size = 300
prepare.docid_scheme = @AtomicDocids()
t5.get_config.dropout_rate = 0.1
make_optimizer.learning_rate = 3e-3
make_optimizer.weight_decay = 0.0
train.optimizer = @make_optimizer()
train.progress = False
train.log_period = 5
EvalConfig.num_beams = 10
EvalConfig.batch_size = 32
train.eval_config = @EvalConfig()
"""


def configure(tmp_path, extra: str = "", docs: int = 40, bindings=()):
    f = tmp_path / "exp.gin"
    f.write_text(SMALL + f"\nDOCS = {docs}\n" + textwrap.dedent(extra))
    gin_utils.parse([str(f)], list(bindings))


def params_of(model_dir: Path, step: int):
    import orbax.checkpoint as ocp

    mngr = ocp.CheckpointManager((model_dir / "checkpoints").absolute())
    restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    return restored["state"]["params"]


def max_abs_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


@pytest.mark.slow
def test_end_to_end_dsi_on_demo_beats_random_by_far(tmp_path):
    configure(tmp_path, """
        TRAIN_STEPS = 600
        TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 24}
        prepare.docid_scheme = @FieldDocids()
        FieldDocids.field = 'url'
        t5.get_config.dropout_rate = 0.0
        train.checkpoint_period = 600
        EvalConfig.split = 'dev'
        """, docs=100, bindings=[f"MODEL_DIR = '{tmp_path / 'run'}'"])
    summary = gin_utils.call_configured(compose.train)
    random_hit1, random_hit10 = 1 / 100, 10 / 100  # dev queries: none was trained on
    assert summary["metrics"]["Hit@10"] > 4 * random_hit10, summary["metrics"]
    assert summary["metrics"]["Hit@1"] > 10 * random_hit1, summary["metrics"]
    run_lines = Path(summary["run"]).read_text().splitlines()
    assert len(run_lines) == 10 * summary["queries"]  # 10 beams → 10 distinct documents per query
    written = json.loads((tmp_path / "run" / "final_metrics.json").read_text())
    assert written["metrics"] == summary["metrics"]
    assert (tmp_path / "run" / "config.gin").read_text().count("train.train_steps") == 1
    log = [json.loads(l) for l in (tmp_path / "run" / "train_metrics.jsonl").read_text().splitlines()]
    assert log[-1]["loss"] < log[0]["loss"]
    assert list((tmp_path / "run" / "tensorboard" / "train").glob("events.out.tfevents.*"))

    # python -m gr_jax.infer with runs/eval.gin reproduces the final evaluation from the saved checkpoint
    from gr_jax import infer as infer_entry

    assert Path(summary["run"]) == tmp_path / "run" / "runs" / "dev.step600.run"  # the name infer uses too
    trained_run = Path(summary["run"]).read_text()
    gin.clear_config()
    assert infer_entry.main([f"--gin_file={tmp_path / 'exp.gin'}", "--gin_file=runs/eval.gin",
                             f"--gin.MODEL_DIR='{tmp_path / 'run'}'", "--gin.EVAL_SPLIT='dev'"]) == 0
    again = json.loads((tmp_path / "run" / "runs" / "dev.step600.metrics.json").read_text())
    assert again["metrics"] == summary["metrics"] and again["step"] == 600
    assert Path(summary["run"]).read_text() == trained_run  # identical, so nothing was set aside
    assert not list((tmp_path / "run" / "runs").glob("*.prev-*"))


@pytest.mark.slow
def test_resume_is_exact_including_data_order(tmp_path):
    common = """
        TRAIN_STEPS = 12
        make_optimizer.total_steps = 12
        make_optimizer.decay = 'linear'
        make_optimizer.warmup_steps = 3
        train.checkpoint_period = 6
        train.final_eval = False
        """
    configure(tmp_path, common, bindings=[f"MODEL_DIR = '{tmp_path / 'full'}'"])
    full = compose.train()
    gin.clear_config()
    configure(tmp_path, common, bindings=[f"MODEL_DIR = '{tmp_path / 'split'}'", "TRAIN_STEPS = 6"])
    compose.train()  # stops after 6 steps (a finished shorter run, or a killed one: same checkpoint)
    gin.clear_config()
    configure(tmp_path, common, bindings=[f"MODEL_DIR = '{tmp_path / 'split'}'"])
    resumed = compose.train()
    assert int(resumed["state"]["step"]) == 12
    assert max_abs_diff(full["state"]["params"], resumed["state"]["params"]) <= 1e-6
    # and the data really moved: parameters after 6 and 12 steps differ
    assert max_abs_diff(params_of(tmp_path / "split", 6), params_of(tmp_path / "split", 12)) > 1e-4


@pytest.mark.slow
def test_sigkill_during_a_save_resumes_from_the_last_good_checkpoint(tmp_path):
    exp = tmp_path / "exp.gin"
    exp.write_text(SMALL + "\nDOCS = 40\nTRAIN_STEPS = 9\nmake_optimizer.total_steps = 9\n"
                   "train.checkpoint_period = 3\ntrain.final_eval = False\n")
    script = tmp_path / "killed.py"
    # The child dies inside the save of step 6, after the parameters are written and before the
    # checkpoint is committed.
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys
        import orbax.checkpoint as ocp
        from gr_jax.runtime import gin_utils
        from gr_jax import compose

        original = ocp.args.JsonSave.__init__
        def dying(self, *a, **k):
            state = a[0] if a else k.get("item")
            if isinstance(state, dict) and state.get("step") == 6:
                os.kill(os.getpid(), signal.SIGKILL)
            original(self, *a, **k)
        ocp.args.JsonSave.__init__ = dying
        gin_utils.parse([{str(exp)!r}], ["MODEL_DIR = {str(tmp_path / 'killed')!r}"])
        compose.train()
        """))
    proc = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    ckpts = tmp_path / "killed" / "checkpoints"
    assert (ckpts / "3").is_dir() and not (ckpts / "6").is_dir()
    configure(tmp_path, "TRAIN_STEPS = 9\nmake_optimizer.total_steps = 9\ntrain.checkpoint_period = 3\n"
                        "train.final_eval = False\n", bindings=[f"MODEL_DIR = '{tmp_path / 'killed'}'"])
    resumed = compose.train()
    gin.clear_config()
    configure(tmp_path, "TRAIN_STEPS = 9\nmake_optimizer.total_steps = 9\ntrain.checkpoint_period = 3\n"
                        "train.final_eval = False\n", bindings=[f"MODEL_DIR = '{tmp_path / 'clean'}'"])
    clean = compose.train()
    assert max_abs_diff(resumed["state"]["params"], clean["state"]["params"]) <= 1e-6


@pytest.mark.slow
def test_data_parallel_step_matches_single_device(tmp_path):
    script = tmp_path / "dp.py"
    script.write_text(textwrap.dedent("""
        import json
        import jax, jax.numpy as jnp, numpy as np
        from gr_jax.backbones import t5
        from gr_jax.retriever.model import GenerativeRetriever
        from gr_jax.training import partitioning, trainer
        assert jax.device_count() == 8, jax.devices()
        model = GenerativeRetriever(t5.get_config("tiny", dropout_rate=0.0))
        params = model.init_params(0)
        rng = np.random.default_rng(0)
        batch = {"inputs": rng.integers(3, 512, (16, 12)).astype(np.int32),
                 "targets": np.concatenate([rng.integers(3, 512, (16, 3)), np.ones((16, 1))], 1).astype(np.int32)}
        import optax
        tx = optax.sgd(0.5)  # plain SGD: Adam would amplify float-rounding differences of near-zero gradients
        def run(mesh):
            p = jax.device_put(params, partitioning.param_shardings(model.param_axes(params), mesh))
            state = {"step": jnp.zeros((), jnp.int32), "params": p, "opt_state": jax.jit(tx.init)(p),
                     "nonfinite": jnp.zeros((), jnp.int32)}
            b = jax.device_put(batch, partitioning.batch_sharding(mesh))
            new, sums = jax.jit(trainer.make_train_step(model.loss_fn, tx))(state, b, jax.random.PRNGKey(1))
            return float(sums["loss"][0] / sums["loss"][1]), new["params"], b["inputs"].sharding
        loss8, p8, sh8 = run(partitioning.make_mesh(1))
        loss1, p1, _ = run(partitioning.make_mesh(1, devices=jax.devices()[:1]))
        diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(jax.tree_util.tree_leaves(p8), jax.tree_util.tree_leaves(p1)))
        print(json.dumps({"loss8": loss8, "loss1": loss1, "param_diff": diff,
                          "shards": len(sh8.device_set)}))
        """))
    env = dict(os.environ, XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=8"), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["shards"] == 8
    assert abs(out["loss8"] - out["loss1"]) <= 1e-5, out
    assert out["param_diff"] <= 1e-5, out


@pytest.mark.slow
def test_initial_checkpoint_from_converted_hf(tmp_path, hf_t5_dirs):
    from gr_jax.backbones import t5_convert

    ckpt = tmp_path / "converted"
    t5_convert.convert_hf_to_checkpoint(hf_t5_dirs["1.0"], ckpt)
    config, converted = t5_convert.load_checkpoint(ckpt)
    configure(tmp_path, """
        TRAIN_STEPS = 1
        train.final_eval = False
        """, docs=300, bindings=[f"MODEL_DIR = '{tmp_path / 'init'}'", f"INITIAL_CHECKPOINT_PATH = '{ckpt}'"])
    setup = compose.prepare(str(tmp_path / "init"), 16, {"inputs": 32, "targets": 2}, "demo",
                            initial_checkpoint_path=str(ckpt))
    net = compose.initial_params(setup, 0, str(ckpt))["network"]  # what training starts from
    # atomic docids start above the text vocabulary: 300 documents need rows past the converted 512, so the
    # embedding grows; the old rows are unchanged
    text_vocab = setup.vocab.size
    assert text_vocab + 300 > config.vocab_size
    assert net["embedding"].shape == (text_vocab + 300, config.d_model)
    np.testing.assert_array_equal(np.asarray(net["embedding"])[: config.vocab_size], converted["embedding"])
    assert max_abs_diff(net["encoder"], converted["encoder"]) == 0.0
    assert int(compose.train()["state"]["step"]) == 1  # and training starts from it


@pytest.mark.slow
def test_configuration_errors_name_what_to_set(tmp_path, capsys):
    from gr_jax import train as entry

    exp = tmp_path / "e.gin"
    exp.write_text("include 'runs/train.gin'\nMIXTURE_OR_TASK_NAME = 'demo'\n")
    assert entry.main([f"--gin_file={exp}"]) == 2
    err = capsys.readouterr().err
    assert "required gin macros not set" in err and "MODEL_DIR" in err and "TRAIN_STEPS" in err
    gin.clear_config()
    assert entry.main(["--gin_file=experiments/demo/dsi_atomic.gin", "--gin.MODEL_DIR='x'",
                       "--gin.train.no_such_option=3"]) == 2
    assert "no_such_option" in capsys.readouterr().err
    gin.clear_config()
    (tmp_path / "empty_data").mkdir()
    assert entry.main(["--gin_file=experiments/nq320k/dsi_atomic.gin", f"--gin.MODEL_DIR='{tmp_path / 'm'}'",
                       f"--gin.DATA_DIR='{tmp_path / 'empty_data'}'", "--gin.VOCABULARY='v.model'"]) == 2
    err = capsys.readouterr().err
    assert "lacks the files of dataset 'nq320k_nci'" in err and "NQ_doc_content.tsv" in err
    gin.clear_config()
    assert entry.main(["--gin_file=no/such/file.gin"]) == 2
    assert "gin file 'no/such/file.gin' not found" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted(p.relative_to(REPO / "gin_configs").as_posix()
                                        for p in (REPO / "gin_configs").rglob("*.gin")))
def test_every_shipped_gin_file_parses(path):
    bindings = ["MODEL_DIR = 'm'", "DATA_DIR = 'd'", "VOCABULARY = 'v'", "TRAIN_STEPS = 1", "BATCH_SIZE = 8",
                "INITIAL_CHECKPOINT_PATH = 'i'", "SEQUENTIAL_DOCIDS = 's'", "SET_DOCIDS = 't'",
                "PSEUDO_QUERIES = 'p'", "OUTPUT_DIR = 'o'", "CROSS_LINGUAL_QUERIES = {'de': 'q'}",
                "MMARCO_TRANSLATIONS = {'de': 't'}", "ALIGNED_DIRS = {'de': 'a'}", "ALIGN_LANGUAGE = 'de'",
                "ALIGN_TRAIN_FILE = 'a'", "ALIGN_DEV_FILE = 'b'",
                "TASK_FEATURE_LENGTHS = {'inputs': 8, 'targets': 4}", "MIXTURE_OR_TASK_NAME = 'demo'"]
    gin_utils.parse([path], bindings, ignore_unused_macros=[b.split(" = ")[0] for b in bindings])
    assert gin.config_str()


@pytest.mark.slow
def test_numeric_docids_with_codebook_head_train_evaluate_and_resume(tmp_path):
    extra = """
        TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 3}
        prepare.docid_scheme = @SemanticDocids()
        SemanticDocids.k = 4
        SemanticDocids.c = 12
        SemanticDocids.depth = 2
        prepare.embedder = @TfidfSvdEmbedder()
        TfidfSvdEmbedder.dim = 16
        make_optimizer.total_steps = 8
        train.checkpoint_period = 4
        EvalConfig.num_beams = 5
        """
    configure(tmp_path, extra + "TRAIN_STEPS = 4\n", bindings=[f"MODEL_DIR = '{tmp_path / 'sem'}'"])
    first = compose.train()
    assert first["queries"] > 0 and 0.0 <= first["metrics"]["Hit@10"] <= 1.0
    assert len(Path(first["run"]).read_text().splitlines()) == 5 * first["queries"]  # 5 beams → 5 documents
    gin.clear_config()
    configure(tmp_path, extra + "TRAIN_STEPS = 8\n", bindings=[f"MODEL_DIR = '{tmp_path / 'sem'}'"])
    resumed = compose.train()  # same docids after reloading the scheme state (else: TrainingError)
    assert int(resumed["state"]["step"]) == 8


@pytest.mark.slow
def test_multi_docid_scheme_trains_on_every_docid_and_retrieves(tmp_path):
    extra = """
        TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 12}
        prepare.docid_scheme = @PseudoQueryDocids()
        PseudoQueryDocids.per_document = 2
        PseudoQueryDocids.max_tokens = 10
        Objectives.all_docids = True
        prepare.objectives_config = @Objectives()
        TRAIN_STEPS = 3
        EvalConfig.num_beams = 4
        """
    configure(tmp_path, extra, bindings=[f"MODEL_DIR = '{tmp_path / 'pq'}'"])
    setup = compose.prepare(str(tmp_path / "pq"), 16, {"inputs": 32, "targets": 12}, "demo")
    table = setup.table
    assert len(table) > len(setup.dataset.corpus)  # several docids for some documents
    n_index = len(table)  # indexing: every document once per docid
    sizes = [len(s) for s in setup.iterator.sources]
    assert sizes[0] == n_index
    queries = setup.dataset.queries["train"]
    # the first docid of a document is the text of its first judged training query
    first_doc = setup.dataset.corpus.doc_ids[0]
    qid = next(q for q, judged in setup.dataset.qrels["train"].items() if first_doc in judged)
    text = dict(zip(queries.qids, queries.texts))[qid]
    assert table.sequence(int(table.primary([0])[0])) == setup.vocab.encode(text)[:10]
    summary = compose.train()
    assert summary["queries"] > 0
    lines = Path(summary["run"]).read_text().splitlines()
    per_query = {}
    for line in lines:
        qid_, _, doc, *_ = line.split()
        per_query.setdefault(qid_, []).append(doc)
    assert all(len(d) == len(set(d)) for d in per_query.values())  # a document once per query
