"""Helpers the method tests share: a small demo run through `gr_jax.train`, then `gr_jax.infer` on its MODEL_DIR."""

import json
from pathlib import Path

import gin

SMALL_RUN = ("load_dataset.demo_docs = 60\nBATCH_SIZE = 16\nprepare.vocab_size = 300\ntrain.progress = False\n"
             "train.log_period = 1\nEvalConfig.num_beams = 4\n")


def train_small(tmp_path: Path, experiment: str, steps: int, extra: str = "") -> tuple[Path, Path, list]:
    """Trains `experiment` (a gin file under gin_configs/) on 60 demo documents for `steps` steps (one checkpoint
    at the end) → (the experiment file written, MODEL_DIR, the training metrics' rows)."""
    from gr_jax import train as train_cmd

    exp = tmp_path / "experiment.gin"
    exp.write_text(f"include '{experiment}'\n{SMALL_RUN}TRAIN_STEPS = {steps}\ntrain.checkpoint_period = {steps}\n"
                   + extra)
    model_dir = tmp_path / "run"
    assert train_cmd.main([f"--gin_file={exp}", f"--gin.MODEL_DIR='{model_dir}'"]) == 0
    metrics = [json.loads(x) for x in (model_dir / "train_metrics.jsonl").read_text().splitlines()]
    return exp, model_dir, metrics


def assert_infer_repeats_the_final_run(tmp_path: Path, exp: Path, model_dir: Path, step: int) -> None:
    """`gr_jax.infer` on the trained MODEL_DIR writes, byte for byte, the test run the training's final evaluation
    wrote (the run restores through its checkpoint alone)."""
    from gr_jax import infer as infer_cmd

    final = model_dir / "runs" / f"test.step{step}.run"
    final.rename(tmp_path / "final.run")
    gin.clear_config()
    assert infer_cmd.main([f"--gin_file={exp}", "--gin_file=runs/eval.gin", f"--gin.MODEL_DIR='{model_dir}'",
                           "--gin.NUM_BEAMS=4", "--gin.EVAL_SPLIT='test'"]) == 0
    assert final.read_text() == (tmp_path / "final.run").read_text()
