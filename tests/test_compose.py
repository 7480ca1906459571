"""A method is a folder: the toy method of `tests/toy_method/` — a package outside the library with a docid
scheme, an objective with metric keys of its own, a ranker, a decoding bonus and a starting-checkpoint loader,
registered by its gin file's `import` — is trained, restored by `infer`, and run in the dynamic-corpora and
robustness protocols, with no library file knowing about it."""

import json
import pathlib

import gin
import pytest

from gr_jax import dynamic as dynamic_cmd
from gr_jax.runtime import gin_utils
from gr_jax import infer as infer_cmd
from gr_jax import robustness as robustness_cmd
from gr_jax import train as train_cmd

TOY_DIR = pathlib.Path(__file__).resolve().parent / "toy_method"
TOY = TOY_DIR / "toy.gin"
PIECES = ("ToyDocids", "toy_objective", "ToyRanker", "toy_bonus", "toy_query_state", "toy_title_prefix",
          "toy-init", "toy_method")


@pytest.mark.slow
def test_a_toy_method_package_trains_evaluates_and_runs_in_the_protocols(tmp_path, capsys):
    from tests.toy_method import loader, model

    model_dir = tmp_path / "toy"
    assert train_cmd.main([f"--gin_file={TOY}", f"--gin.MODEL_DIR='{model_dir}'"]) == 0, capsys.readouterr().err
    logged = [json.loads(line) for line in (model_dir / "train_metrics.jsonl").read_text().splitlines()]
    assert {"toy_weighted_nll", "toy_first_token_hit", "grad_norm"} <= set(logged[-1])  # the objective's keys
    assert "loss" not in logged[-1]  # the trainer logs what the objective returns, nothing hard-wired
    final = json.loads((model_dir / "final_metrics.json").read_text())
    assert final["ranker"] == "ToyRanker"
    assert 0.0 <= final["metrics"]["Hit@10"] <= 1.0 and final["queries"] > 0
    assert model.CALLS["bonus"] > 0 and model.CALLS["state"] > 0  # the decoding hooks were used
    assert loader.LOADS["count"] == 1  # the network started from the toy's own loader
    # the ranker's scores are what the run holds: minus the first beam's rank, so at most 5 distinct values
    run = [line.split() for line in open(final["run"])]
    assert {float(r[4]) for r in run} <= {0.0, -1.0, -2.0, -3.0, -4.0}
    assert json.loads((model_dir / "docid_scheme" / "scheme.json").read_text())["name"] == "toy_title_prefix"

    gin.clear_config()  # restored by infer from the same gin file
    assert infer_cmd.main([f"--gin_file={TOY}", "--gin_file=runs/eval.gin", f"--gin.MODEL_DIR='{model_dir}'",
                           "--gin.NUM_BEAMS=5"]) == 0, capsys.readouterr().err
    again = json.loads((model_dir / "runs" / "dev.step4.metrics.json").read_text())
    assert again["metrics"] == final["metrics"]

    gin.clear_config()  # the dynamic-corpora protocol, the same pieces trained on D0
    dyn = tmp_path / "dyn.gin"
    dyn.write_text(f"include 'runs/dynamic.gin'\ninclude '{TOY}'\nrun_dynamic.method = 'gr'\n"
                   f"run_dynamic.progress = False\n")
    assert dynamic_cmd.main([f"--gin_file={dyn}", f"--gin.MODEL_DIR='{tmp_path / 'dyn'}'"]) == 0, \
        capsys.readouterr().err
    result = json.loads((tmp_path / "dyn" / "dynamic" / "dynamic.json").read_text())
    assert result["method"] == "gr-toy_title_prefix" and len(result["P"]) == 6
    assert all(v is None or -3 <= v <= 1 for v in result["idbi"])

    gin.clear_config()  # and the robustness protocol on the trained MODEL_DIR
    rob = tmp_path / "rob.gin"
    rob.write_text(f"include '{TOY}'\ninclude 'runs/robustness.gin'\nROBUSTNESS_SPLITS = ['dev']\n"
                   f"run_robustness.variations = ['reordering', 'naturality']\nrun_robustness.seeds = [5, 27]\n"
                   f"run_robustness.max_queries = 12\nrun_robustness.k = 10\nrun_robustness.ell = 10\n"
                   f"run_robustness.progress = False\n")
    assert robustness_cmd.main([f"--gin_file={rob}", f"--gin.MODEL_DIR='{model_dir}'",
                                f"--gin.OUTPUT_DIR='{tmp_path / 'rob'}'"]) == 0, capsys.readouterr().err
    rob_result = json.loads((tmp_path / "rob" / "robustness.json").read_text())
    assert rob_result["system_runs"] == {"primary": "gr", "planning": None}  # no planner declared
    dev = rob_result["splits"]["dev"]
    assert dev["queries"] == 12 and set(dev["variations"]) == {"reordering", "naturality"}
    assert 0.0 <= dev["variations"]["reordering"]["diagnostics"]["cand_overlap"]["mean"] <= 1.0
    assert (tmp_path / "rob" / "runs" / "dev.clean.gr.run").is_file()


def test_the_library_does_not_know_the_toy_method():
    root = pathlib.Path(gin_utils.__file__).parents[1]  # gr_jax/
    files = [*root.rglob("*.py"), *(root.parent / "gin_configs").rglob("*.gin")]
    assert len(files) > 40
    assert not [(p, n) for p in files for n in PIECES if n in p.read_text()]
    toy = [p.read_text() for p in TOY_DIR.iterdir() if p.suffix in (".py", ".gin")]
    assert all(any(n in text for text in toy) for n in PIECES)  # the names checked are the toy's own


@pytest.mark.slow
def test_our_train_and_infer_bindings_stay_ours_beside_t5x_entry_points():
    """t5x's `python -m t5x.train` / `t5x.infer` register their own `train` / `infer` in `__main__` before they
    parse gin; our experiment files bind `train.x`, which must still reach `compose.train` (not be ambiguous)."""
    import subprocess
    import sys

    code = r"""
import gin
def train(total_steps=0): return total_steps
def infer(mode=''): return mode
t5x_train, t5x_infer = gin.configurable(train), gin.configurable(infer)  # as t5x's mains do, in __main__
from gr_jax import compose
from gr_jax.runtime import gin_utils
gin_utils.register_configurables()
gin_utils.parse(["experiments/demo/dsi_atomic.gin"], ["MODEL_DIR = 'x'", "infer.evaluate = True",
                                                     "__main__.train.total_steps = 7"])
ours = gin.get_bindings(compose.train)
print(ours["checkpoint_period"], gin.get_bindings(compose.infer)["evaluate"], t5x_train(), t5x_infer())
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=pathlib.Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["1000", "True", "7"]


@pytest.mark.slow
def test_the_core_registers_its_gin_configurables_without_importing_t5x():
    """gr_jax/t5x/ is skipped by gin registration before anything of it is imported: every gr_jax command starts
    without t5x (and without its TensorFlow), installed or not."""
    code = r"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('t5x', 'tensorflow'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
from gr_jax.runtime import gin_utils
gin_utils.register_configurables()
gin_utils.parse(["experiments/demo/dsi_atomic.gin"], ["MODEL_DIR = 'x'"])
print(sorted(m for m in sys.modules if m.split('.')[0] in ('t5x', 'tensorflow')))
"""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", code], cwd=pathlib.Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[]"

