"""`python -m t5x.train` with a gr_jax model (gr_jax/t5x/): the same parameters as `python -m gr_jax.train` after the
same steps, a checkpoint that `gr_jax.infer` reads, a resumed run that repeats an uninterrupted one, clear refusals.

Every run is a subprocess from the repository root, as a user types it, on 60 demo documents."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "gr_jax/t5x/configs/dsi_demo.gin"
# a small, fast run: 60 documents, batch 8, no warm-up (the parameters move from the first step)
SMALL = ["load_dataset.demo_docs=60", "prepare.vocab_size=300", "BATCH_SIZE=8", "make_optimizer.warmup_steps=0"]


@pytest.fixture(scope="module", autouse=True)
def t5x_installed():
    try:
        import t5x  # noqa: F401
    except ImportError:
        pytest.skip("t5x is not installed: pip install --no-deps ../shared/wheels/*.whl && pip install -e '.[t5x]' "
                    "(README, 'With t5x itself')")


def run(module: str, *args: str, expect: int = 0, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=900)
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


def test_t5x_trains_what_gr_jax_trains_and_gr_jax_infer_reads_it(tmp_path):
    t5x_dir, gr_dir = tmp_path / "t5x", tmp_path / "gr"
    # from a working directory with a runs/ folder (a user's, after any demo run): our gin files still resolve
    (tmp_path / "runs").mkdir()
    t5x_train(t5x_dir, 3, config=str(ROOT / CONFIG), cwd=tmp_path)
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
    rows = [[line.split() for line in (d / "runs" / "dev.step3.run").read_text().splitlines()]
            for d in (t5x_dir, gr_dir)]
    assert len(rows[0]) == len(rows[1]) > 0
    for a, b in zip(*rows):
        assert a[:4] == b[:4]  # query, Q0, document, rank
        assert abs(float(a[4]) - float(b[4])) <= 1e-5 * max(1.0, abs(float(b[4])))  # log-probability scores

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
    """PAG's own joint objective, and a Llama backbone read as one sequence, through t5x's loop."""
    config = tmp_path / "t5x.gin"
    config.write_text((ROOT / CONFIG).read_text().replace("experiments/demo/dsi_atomic.gin", experiment))
    t5x_train(tmp_path / "t5x", 3, config=str(config), extra=extra)
    gr_train(tmp_path / "gr", 3, experiment=experiment, extra=extra)
    assert_same_params(t5x_params(tmp_path / "t5x", 3), gr_params(tmp_path / "gr", 3), experiment)


@pytest.mark.slow
def test_a_resumed_t5x_run_repeats_an_uninterrupted_one(tmp_path):
    """The data position is saved with each t5x checkpoint (`save_dataset`): 2 steps, then on to 4, ends where 4
    steps in one go end (a constant learning rate: the schedule then does not depend on TRAIN_STEPS)."""
    constant = ["make_optimizer.decay='constant'"]
    t5x_train(tmp_path / "once", 4, extra=constant)
    t5x_train(tmp_path / "twice", 2, extra=constant)
    t5x_train(tmp_path / "twice", 4, extra=constant)
    assert_same_params(t5x_params(tmp_path / "twice", 4), t5x_params(tmp_path / "once", 4), "resumed at step 2")


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
    # checkpoints/<N> holding other parameters (another learning rate) is not overwritten
    gr_train(tmp_path / "gr", 1, extra=["make_optimizer.learning_rate=1e-2"])
    import shutil

    shutil.copytree(tmp_path / "gr" / "checkpoints", t5x_dir / "checkpoints")
    res = run("gr_jax.t5x.checkpoints", "--gin_file=experiments/demo/dsi_atomic.gin", *flags(t5x_dir, 1),
              expect=2)
    assert "already holds other parameters" in res.stderr

