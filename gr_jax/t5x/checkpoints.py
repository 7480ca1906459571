"""A t5x checkpoint of a gr_jax model → our checkpoint, which `python -m gr_jax.infer` and every protocol read:

    python -m gr_jax.t5x.checkpoints --gin_file=experiments/demo/dsi_atomic.gin --gin.MODEL_DIR="'runs/t5x_demo'" \
        [--gin.CHECKPOINT_STEP=N]

MODEL_DIR is the t5x run's (it holds t5x's `checkpoint_<N>/` and the vocabulary and docid-scheme state our
model wrote there); the experiment file is the one the t5x gin file includes. The parameters of
`checkpoint_<N>` (default: the newest) are checked against the model the experiment builds (structure, shapes,
dtypes, finite values) and written to MODEL_DIR/checkpoints/<N> with the provenance that `infer` checks; t5x's
optimizer state is not carried over: resume a t5x run with t5x, and to train on with `gr_jax.train` start a new
MODEL_DIR with INITIAL_CHECKPOINT_PATH = this one (a `gr_jax.train` on this MODEL_DIR finds no optimizer state in
the imported checkpoint and sets it aside as damaged). Prints one JSON line; exit 2 with a message on
bad input. The other way needs no conversion: a trained gr_jax MODEL_DIR as INITIAL_CHECKPOINT_PATH starts a t5x
run (the model's initial parameters are read by our loaders).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from gr_jax import compose
from gr_jax.runtime import gin_checks, gin_utils, provenance, validation
from gr_jax.runtime.cli import setup_logging
from gr_jax.runtime.io_utils import abandoned_reads_quiet, orbax_error_line
from gr_jax.t5x.records import SYSTEM_RECORD, T5xAdapterError, _read_record, empty_paths, t5x_steps, with_empty
from gr_jax.training import trainer
from gr_jax.runtime.run_dir import RunDir

log = logging.getLogger(__name__)

def _as_numpy(tree):
    """orbax restore arguments reading every array of a checkpoint's metadata tree as numpy."""
    if hasattr(tree, "items"):
        return {k: _as_numpy(v) for k, v in tree.items()}
    return ocp.RestoreArgs(restore_type=np.ndarray)


def read_t5x_params(path: Path) -> dict:
    """The parameters (`target`) of one t5x checkpoint directory, as numpy arrays."""
    if (path / "state").is_dir():  # orbax layout (t5x's default)
        try:
            # read as numpy, whatever devices wrote it (a checkpoint of a run over several devices names them, and
            # restoring it as device arrays on another machine fails)
            with abandoned_reads_quiet():  # the reads orbax abandons after the first error: debug log
                checkpointer = ocp.PyTreeCheckpointer()
                where = str((path / "state").absolute())
                meta = checkpointer.metadata(where)
                tree = getattr(getattr(meta, "item_metadata", meta), "tree", getattr(meta, "item_metadata", meta))
                if tree is None:
                    raise ValueError("state/_METADATA is missing or unreadable")
                state = checkpointer.restore(where, restore_args=_as_numpy(tree))
        except Exception as e:  # orbax/tensorstore raise many types for unreadable files
            cause = orbax_error_line(e)
            raise T5xAdapterError(f"{path}: cannot read the t5x checkpoint ({type(e).__name__}: {cause}); is it "
                                  f"complete?") from None
    elif (path / "checkpoint").is_file():  # t5x's older layout (msgpack + tensorstore)
        from t5x import checkpoints as t5x_checkpoints

        state = t5x_checkpoints.load_t5x_checkpoint(str(path))
    else:
        raise T5xAdapterError(f"{path}: not a t5x checkpoint (no state/ and no checkpoint file)")
    if "target" not in state:
        raise T5xAdapterError(f"{path}: the t5x checkpoint has no parameters ('target'); has {sorted(state)}")
    return jax.tree_util.tree_map(np.asarray, state["target"])


def _shapes(tree) -> dict[str, tuple]:
    return {provenance.key_path(p): (tuple(np.shape(x)), np.dtype(x.dtype).name)
            for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def import_t5x(model_dir: str, step: Optional[int], feature_lengths: dict, task: str,
               initial_checkpoint_path: Optional[str] = None) -> dict:
    """Module docstring: the t5x run's checkpoint of `step` (None: the newest) of the system an experiment file
    builds for `task` at `feature_lengths`. Returns what was written."""
    model_dir = Path(model_dir)
    if step is not None:
        validation.integer("CHECKPOINT_STEP", step, minimum=0)
    steps = t5x_steps(model_dir) if model_dir.is_dir() else []
    if not steps:
        raise T5xAdapterError(f"{model_dir}: no t5x checkpoint_<N>/ here; pass the MODEL_DIR of the t5x run")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise T5xAdapterError(f"{model_dir}: no t5x checkpoint for step {step} (have {steps})")
    source = model_dir / f"checkpoint_{step}"
    setup = gin_checks.call_configured(lambda: compose.prepare(
        model_dir=str(model_dir), batch_size=1, feature_lengths=feature_lengths, task=task,
        with_training_data=False, initial_checkpoint_path=initial_checkpoint_path))
    record = model_dir / SYSTEM_RECORD  # what the t5x run built: the system here must be that one
    if record.is_file():
        trainer.check_provenance(_read_record(record), compose.provenance(setup), str(record))
    template = jax.eval_shape(lambda: setup.model.init_params(0))
    params = with_empty(read_t5x_params(source), empty_paths(template))
    want, got = _shapes(template), _shapes(params)
    if want != got:
        diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        raise T5xAdapterError(f"{source}: its parameters are not those of the model this experiment builds "
                              f"({len(diff)} differ, first {diff[0]}: checkpoint {got.get(diff[0])}, model "
                              f"{want.get(diff[0])}); pass the experiment file the t5x gin file includes")
    bad = trainer.nonfinite_arrays(params)
    if bad:
        raise T5xAdapterError(f"{source}: its parameters hold NaN or infinite values (first: {bad[0]})")
    state = {"step": np.asarray(step, np.int32), "params": params, "nonfinite": np.zeros((), np.int32)}
    target = RunDir(model_dir).checkpoint(step)
    manager = ocp.CheckpointManager(RunDir(model_dir).checkpoints.absolute(),
                                    options=ocp.CheckpointManagerOptions(create=True))
    out = {"model_dir": str(model_dir), "checkpoint": str(target), "imported_from": str(source), "step": step}
    if step in manager.all_steps():
        held = trainer.read_checkpoint(manager, step, target)["state"]
        if trainer.array_digests(held.get("params")) != trainer.array_digests(params):
            raise T5xAdapterError(f"{target} already holds other parameters (a gr_jax run in this MODEL_DIR?); "
                                  f"move it aside or keep t5x and gr_jax runs in separate MODEL_DIRs")
        log.info("%s already holds these parameters", target)
        return {**out, "status": "already imported"}
    trainer.save_checkpoint(manager, step, state, meta=compose.provenance(setup))
    return {**out, "status": "imported"}


def main(argv=None) -> int:
    setup_logging()

    def configured():
        return lambda: import_t5x(gin_checks.macro("MODEL_DIR"), gin_checks.macro("CHECKPOINT_STEP", None),
                                  gin_checks.macro("TASK_FEATURE_LENGTHS"), gin_checks.macro("MIXTURE_OR_TASK_NAME"),
                                  gin_checks.macro("INITIAL_CHECKPOINT_PATH", None))

    rc, out = gin_utils.run_entry(argv, __doc__, configured, ["TRAIN_STEPS = 1", "BATCH_SIZE = 1",
                                                              "CHECKPOINT_STEP = None"],
                                  root="infer", allow_unused=("train", "make_optimizer", "EvalConfig"))
    if rc or out is None:  # (None: --help)
        return rc
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
