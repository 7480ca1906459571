"""`python -m t5x.train`, `t5x.eval` and `t5x.infer` with a gr_jax model (gr_jax/t5x/): the same parameters as
`python -m gr_jax.train` after the same steps; t5x.eval's metrics and t5x.infer's TREC run equal those `gr_jax.infer`
gives from the converted checkpoint (DSI on one device, PAG on two); a resumed run that repeats an uninterrupted one;
clear refusals.

Every run is a subprocess from the repository root, as a user types it, on 60 demo documents."""

import json
import os
import subprocess
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.conftest import xla_flags
from tests.t5x.forked import Forker

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "gr_jax/t5x/configs/dsi_demo.gin"
# a small, fast run: 60 documents, batch 8, no warm-up (the parameters move from the first step)
SMALL = ["load_dataset.demo_docs=60", "prepare.vocab_size=300", "BATCH_SIZE=8", "make_optimizer.warmup_steps=0"]


# t5x's train step and ours are compared within 1e-6: XLA's default emitters (conftest.xla_flags)
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": xla_flags(across_programs=True)}
# each command a fresh `python -m` process, forked from one that has imported t5x and TensorFlow once
FORKER = Forker(ENV, ROOT)


def run(module: str, *args: str, expect: int = 0, cwd: Path = ROOT, env=None) -> subprocess.CompletedProcess:
    res = FORKER.run(module, args, cwd=cwd, env={**ENV, **(env or {})}, timeout=900)
    assert res.returncode == expect, f"{module} {args}: exit {res.returncode}\n{res.stderr[-3000:]}"
    return res


def flags(model_dir: Path, steps: int, extra=()) -> list[str]:
    return [f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={steps}", *[f"--gin.{b}" for b in SMALL],
            *[f"--gin.{b}" for b in extra]]


def t5x_train(model_dir: Path, steps: int, config: str = CONFIG, extra=(), cwd: Path = ROOT) -> None:
    run("t5x.train", f"--gin_file={config}", *flags(model_dir, steps, extra), cwd=cwd)


def gr_train(model_dir: Path, steps: int, experiment: str = "experiments/demo/dsi_atomic.gin", extra=()) -> None:
    run("gr_jax.train", f"--gin_file={experiment}", *flags(model_dir, steps, ["train.final_eval=False", *extra]))


def flat(tree) -> dict[str, np.ndarray]:
    from gr_jax.training.trainer import _key

    return {_key(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0] if np.size(x)}


def t5x_params(model_dir: Path, step: int) -> dict[str, np.ndarray]:
    from gr_jax.t5x.checkpoints import read_t5x_params

    return flat(read_t5x_params(model_dir / f"checkpoint_{step}"))


def gr_params(model_dir: Path, step: int) -> dict[str, np.ndarray]:
    import orbax.checkpoint as ocp

    from gr_jax.training import trainer

    manager = ocp.CheckpointManager((model_dir / "checkpoints").absolute())
    return flat(trainer.read_checkpoint(manager, step, model_dir)["state"]["params"])


def assert_same_params(a: dict, b: dict, what: str) -> None:
    assert sorted(a) == sorted(b), what
    for k in a:
        # the same computation compiled in two programs (t5x's partitioned step, ours): float32 rounding at most,
        # relative to the tensor's magnitude; a data-order, loss or optimizer difference moves them by far more
        # (the moved-by check below)
        scale = max(float(np.abs(b[k]).max()), 1e-12)
        assert float(np.abs(a[k] - b[k]).max()) <= 1e-6 * scale, f"{what}: {k}"


def data_step(model_dir: Path, step: int) -> int:
    """The step whose data position t5x saved with checkpoint_<step>."""
    return json.loads((model_dir / f"checkpoint_{step}" / "dataset" / "train_ds-000-of-001").read_text())["step"]


def t5x_infer(model_dir: Path, step: int, out: Path, config: str = CONFIG, extra=(), env=None) -> Path:
    run("t5x.infer", f"--gin_file={config}", *flags(model_dir, step, extra),
        f"--gin.CHECKPOINT_PATH='{model_dir / f'checkpoint_{step}'}'", f"--gin.INFER_OUTPUT_DIR='{out}'", env=env)
    return out / f"demo.dev.step{step}.run"


def assert_same_run(path: Path, reference: Path) -> None:
    """Same queries, documents and ranks; scores within float32 rounding of their magnitude (the same search
    compiled in two programs: gr_jax.infer's and t5x's partitioned infer step)."""
    rows = [[line.split() for line in p.read_text().splitlines()] for p in (path, reference)]
    assert len(rows[0]) == len(rows[1]) > 0
    for a, b in zip(*rows):
        assert a[:4] == b[:4]  # query, Q0, document, rank
        assert abs(float(a[4]) - float(b[4])) <= 1e-5 * max(1.0, abs(float(b[4])))


@pytest.mark.slow
def test_t5x_trains_what_gr_jax_trains_and_gr_jax_infer_reads_it(tmp_path):
    t5x_dir, gr_dir = tmp_path / "t5x", tmp_path / "gr"
    # from a working directory with a runs/ folder (a user's, after any demo run): our gin files still resolve;
    # MODEL_DIR relative to it, as a user types it (t5x's orbax takes absolute paths only: the run tier makes it so)
    (tmp_path / "runs").mkdir()
    t5x_train(Path("t5x"), 3, config=str(ROOT / CONFIG), cwd=tmp_path)
    gr_train(gr_dir, 3)
    # each checkpoint holds the data position of its own step (t5x draws the first batch ahead of checkpoint_0)
    assert [data_step(t5x_dir, s) for s in (0, 3)] == [0, 3]
    trained, initial = t5x_params(t5x_dir, 3), t5x_params(t5x_dir, 0)
    # t5x starts from our initial parameters (SEED), and after 3 steps holds what gr_jax.train holds
    assert_same_params(trained, gr_params(gr_dir, 3), "t5x.train vs gr_jax.train after 3 steps")
    moved = max(float(np.abs(trained[k] - initial[k]).max() / max(np.abs(initial[k]).max(), 1e-12))
                for k in trained)
    assert moved > 1e-3, "the parameters hardly moved: the comparison would not see a difference"

    # t5x's checkpoint → ours → gr_jax.infer writes the run gr_jax's own checkpoint gives
    out = json.loads(run("gr_jax.t5x.checkpoints", "--gin_file=experiments/demo/dsi_atomic.gin",
                         *flags(t5x_dir, 3)).stdout.splitlines()[-1])
    assert out["status"] == "imported" and out["step"] == 3
    again = json.loads(run("gr_jax.t5x.checkpoints", "--gin_file=experiments/demo/dsi_atomic.gin",
                           *flags(t5x_dir, 3)).stdout.splitlines()[-1])
    assert again["status"] == "already imported"
    for d in (t5x_dir, gr_dir):
        run("gr_jax.infer", "--gin_file=experiments/demo/dsi_atomic.gin", "--gin_file=runs/eval.gin",
            *flags(d, 3))
    ours = t5x_dir / "runs" / "dev.step3.run"
    assert_same_run(ours, gr_dir / "runs" / "dev.step3.run")

    # t5x.eval on the same checkpoint (the newest of MODEL_DIR) reports gr_jax.infer's metrics, and t5x.infer writes
    # gr_jax.infer's run; both with the one gin file that trained
    run("t5x.eval", f"--gin_file={ROOT / CONFIG}", *flags(Path("t5x"), 3), "--gin.EVAL_OUTPUT_DIR='eval'", cwd=tmp_path)
    reported = json.loads((tmp_path / "eval" / "inference_eval" / "demo-metrics.jsonl").read_text().splitlines()[-1])
    expected = json.loads((t5x_dir / "runs" / "dev.step3.metrics.json").read_text())["metrics"]
    assert reported["step"] == 3 and set(expected) <= set(reported)
    for name, value in expected.items():  # computed by the same code from the same ranking: equal
        assert abs(reported[name] - value) <= 1e-12, name
    assert expected["Hit@10"] > 0  # a ranking that finds something: a wrong one would show
    assert_same_run(t5x_infer(t5x_dir, 3, tmp_path / "infer"), ours)
    # mode 'score': each query's best judged document's log-likelihood, as our model scores it
    run("t5x.infer", f"--gin_file={CONFIG}", *flags(t5x_dir, 3), f"--gin.CHECKPOINT_PATH='{t5x_dir / 'checkpoint_3'}'",
        f"--gin.INFER_OUTPUT_DIR='{tmp_path / 'score'}'", "--gin.infer.mode='score'")
    lines = (tmp_path / "score" / "demo.dev.step3.scores.jsonl").read_text().splitlines()
    scored = [json.loads(line) for line in lines]
    queries = {line.split()[0] for line in ours.read_text().splitlines()}
    assert len(scored) == len({r["qid"] for r in scored}) == len(queries)
    # teacher forcing (score) and the beam search score one docid alike: where the run holds the scored document,
    # its score there is the log-likelihood (atomic docids + EOS, log-softmax), float32 rounding of the magnitude
    in_run = {(q, d): float(s) for q, _, d, _, s, _ in (line.split() for line in ours.read_text().splitlines())}
    both = [(r["log_likelihood"], in_run[r["qid"], r["docid"]]) for r in scored if (r["qid"], r["docid"]) in in_run]
    assert both, "no scored document in the run: the comparison would not see a difference"
    for a, b in both:
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b))

    # the other way: a gr_jax MODEL_DIR as INITIAL_CHECKPOINT_PATH starts a t5x run from its network
    start = tmp_path / "t5x_from_gr"
    t5x_train(start, 1, extra=[f"INITIAL_CHECKPOINT_PATH='{gr_dir}'"])
    ours = gr_params(gr_dir, 3)
    first = t5x_params(start, 0)
    assert_same_params({k: v for k, v in first.items() if k.startswith("network/")},
                       {k: v for k, v in ours.items() if k.startswith("network/")}, "t5x started from gr_jax")


@pytest.mark.slow
@pytest.mark.parametrize("experiment,extra", [("experiments/demo/pag.gin", ["PagDocids.k=8"]),
                                              ("experiments/demo/dsi_url_llama.gin",
                                               ["TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 32}"])])
def test_t5x_trains_pag_and_a_decoder_only_model_as_gr_jax_does(tmp_path, experiment, extra):
    """PAG's own joint objective, and a Llama backbone read as one sequence, through t5x's loop; then t5x.infer
    writes gr_jax.infer's run — PAG's planned search with t5x's step partitioned over two host devices."""
    config = tmp_path / "t5x.gin"
    config.write_text((ROOT / CONFIG).read_text().replace("experiments/demo/dsi_atomic.gin", experiment))
    t5x_train(tmp_path / "t5x", 3, config=str(config), extra=extra)
    gr_train(tmp_path / "gr", 3, experiment=experiment, extra=extra)
    assert_same_params(t5x_params(tmp_path / "t5x", 3), gr_params(tmp_path / "gr", 3), experiment)
    two = ({"XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=2", across_programs=True)}
           if "pag" in experiment else None)
    infer = t5x_infer(tmp_path / "t5x", 3, tmp_path / "infer", config=str(config), extra=extra, env=two)
    run("gr_jax.t5x.checkpoints", f"--gin_file={experiment}", *flags(tmp_path / "t5x", 3, extra))
    run("gr_jax.infer", f"--gin_file={experiment}", "--gin_file=runs/eval.gin", *flags(tmp_path / "t5x", 3, extra))
    assert_same_run(infer, tmp_path / "t5x" / "runs" / "dev.step3.run")


@pytest.mark.slow
def test_a_resumed_t5x_run_repeats_an_uninterrupted_one(tmp_path):
    """The data position is saved with each t5x checkpoint (`save_dataset`): 2 steps, then on to 4, ends where 4
    steps in one go end (a constant learning rate: the schedule then does not depend on TRAIN_STEPS)."""
    constant = ["make_optimizer.decay='constant'"]
    t5x_train(tmp_path / "once", 4, extra=constant)
    t5x_train(tmp_path / "twice", 2, extra=constant)
    t5x_train(tmp_path / "twice", 4, extra=constant)
    assert_same_params(t5x_params(tmp_path / "twice", 4), t5x_params(tmp_path / "once", 4), "resumed at step 2")


@pytest.mark.slow
def test_refusals_name_the_problem(tmp_path):
    # a model whose docids are decoded by the model: t5x's loop cannot re-decode them
    config = tmp_path / "t5x.gin"
    config.write_text((ROOT / CONFIG).read_text().replace("experiments/demo/dsi_atomic.gin",
                                                          "experiments/demo/genret.gin"))
    res = run("t5x.train", f"--gin_file={config}", *flags(tmp_path / "genret", 3), expect=1)
    assert "decoded by the model" in res.stderr and "gr_jax.train" in res.stderr
    assert not any(p.name in ("vocabulary", "docid_scheme") for p in (tmp_path / "genret").glob("*"))  # nothing built
    # SAM needs our train step's second gradient
    res = run("t5x.train", f"--gin_file={CONFIG}", *flags(tmp_path / "sam", 1, ["make_optimizer.sam_rho=0.05"]),
              expect=1)
    assert "sam_rho" in res.stderr and "gr_jax.train" in res.stderr
    # t5x's and our MODEL_DIR set apart
    res = run("t5x.train", f"--gin_file={CONFIG}", *flags(tmp_path / "a", 1, [f"train.model_dir='{tmp_path / 'b'}'"]),
              expect=1)
    assert "set MODEL_DIR only" in res.stderr
    # a step the t5x run does not have, and a MODEL_DIR without t5x checkpoints: exit 2, one message
    t5x_dir = tmp_path / "t5x"
    t5x_train(t5x_dir, 1)
    res = run("gr_jax.t5x.checkpoints", "--gin_file=experiments/demo/dsi_atomic.gin", *flags(t5x_dir, 1),
              "--gin.CHECKPOINT_STEP=7", expect=2)
    assert "no t5x checkpoint for step 7 (have [0, 1])" in res.stderr and "Traceback" not in res.stderr
    res = run("gr_jax.t5x.checkpoints", "--gin_file=experiments/demo/dsi_atomic.gin", *flags(tmp_path, 1),
              expect=2)
    assert "no t5x checkpoint_<N>/ here" in res.stderr
    # t5x.eval / t5x.infer: the refusals come before anything is written, each names its fix
    out = tmp_path / "out"
    res = run("t5x.infer", f"--gin_file={CONFIG}", *flags(t5x_dir, 1), f"--gin.INFER_OUTPUT_DIR='{out}'", expect=1)
    assert f"--gin.CHECKPOINT_PATH=\"'{t5x_dir}/checkpoint_1'\"" in res.stderr  # the newest, to copy
    res = run("t5x.eval", f"--gin_file={CONFIG}", *flags(t5x_dir, 1), f"--gin.EVAL_OUTPUT_DIR='{out}'",
              f"--gin.CHECKPOINT_PATH='{tmp_path / 'a'}'", expect=1)
    assert "is not in MODEL_DIR" in res.stderr
    res = run("t5x.eval", f"--gin_file={CONFIG}", *flags(t5x_dir, 1), f"--gin.EVAL_OUTPUT_DIR='{out}'",
              "--gin.utils.RestoreCheckpointConfig.dtype='bfloat16'", expect=1)
    assert "RestoreCheckpointConfig.dtype" in res.stderr and "'float32'" in res.stderr
    record = t5x_dir / "t5x_system.json"
    saved = record.read_text()
    record.write_text(saved.replace('"corpus": "', '"corpus": "x'))  # another corpus than MODEL_DIR's docids
    res = run("t5x.eval", f"--gin_file={CONFIG}", *flags(t5x_dir, 1), f"--gin.EVAL_OUTPUT_DIR='{out}'", expect=1)
    assert "t5x_system.json" in res.stderr
    record.write_text(saved)
    # nothing of ours was written (t5x.infer writes its config.gin before it builds the model)
    assert [p.name for p in out.iterdir()] == ["config.gin"]
    t5x_infer(t5x_dir, 1, out)
    res = run("t5x.infer", f"--gin_file={CONFIG}", *flags(t5x_dir, 1),
              f"--gin.CHECKPOINT_PATH='{t5x_dir}/checkpoint_1'", f"--gin.INFER_OUTPUT_DIR='{out}'", expect=1)
    assert "would skip task 'demo'" in res.stderr  # t5x skips a completed task: refused, not a silent no-op
    res = run("t5x.infer", f"--gin_file={CONFIG}", *flags(t5x_dir, 1), "--gin.infer.num_shards=2",
              f"--gin.CHECKPOINT_PATH='{t5x_dir}/checkpoint_1'", f"--gin.INFER_OUTPUT_DIR='{out}3'", expect=1)
    assert "infer.num_shards = 2" in res.stderr  # each shard would write the one run file
    # the t5x gin file outside t5x's commands: one message that names them, exit 2
    res = run("gr_jax.train", f"--gin_file={CONFIG}", *flags(tmp_path / "g", 1), expect=2)
    assert "python -m t5x.train, t5x.eval or t5x.infer" in res.stderr and "Traceback" not in res.stderr

    # checkpoints/<N> holding other parameters (another learning rate) is not overwritten
    gr_train(tmp_path / "gr", 1, extra=["make_optimizer.learning_rate=1e-2"])
    # a gr_jax.train MODEL_DIR is not t5x's: t5x.eval says which command reads it
    res = run("t5x.eval", f"--gin_file={CONFIG}", *flags(tmp_path / "gr", 1), f"--gin.EVAL_OUTPUT_DIR='{out}2'",
              expect=1)
    assert "t5x_system.json is missing" in res.stderr and "gr_jax.infer" in res.stderr
    import shutil

    shutil.copytree(tmp_path / "gr" / "checkpoints", t5x_dir / "checkpoints")
    res = run("gr_jax.t5x.checkpoints", "--gin_file=experiments/demo/dsi_atomic.gin", *flags(t5x_dir, 1),
              expect=2)
    assert "already holds other parameters" in res.stderr



@pytest.mark.slow
def test_a_checkpoint_of_a_run_over_two_devices_converts_on_one(tmp_path):
    """t5x.train data parallel over two host devices, then its checkpoint read here on one (orbax would restore the
    arrays onto the devices that wrote them): the conversion and gr_jax.infer work. One step of Adam from the same
    start: the two programs reduce the gradient in another order, so a parameter whose gradient is within rounding
    of 0 may step the other way (Adam's first step is ±lr): a few elements, never more."""
    two = {"XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=2", across_programs=True)}
    run("t5x.train", f"--gin_file={CONFIG}", *flags(tmp_path / "two", 1), env=two)
    t5x_train(tmp_path / "one", 1)
    a, b = t5x_params(tmp_path / "two", 1), t5x_params(tmp_path / "one", 1)
    assert sorted(a) == sorted(b)
    flipped = sum(int((np.abs(a[k] - b[k]) > 1e-5).sum()) for k in a)
    assert flipped <= 1e-3 * sum(v.size for v in a.values()), flipped
    out = json.loads(run("gr_jax.t5x.checkpoints", "--gin_file=experiments/demo/dsi_atomic.gin",
                         *flags(tmp_path / "two", 1)).stdout.splitlines()[-1])
    assert out["status"] == "imported"
    run("gr_jax.infer", "--gin_file=experiments/demo/dsi_atomic.gin", "--gin_file=runs/eval.gin",
        *flags(tmp_path / "two", 1))
    assert (tmp_path / "two" / "runs" / "dev.step1.run").read_text().strip()
