"""What a training run keeps on disk and reads back: its checkpoints (orbax, with per-array checksums and a
format item; `read_checkpoint` checks both and the parameters' finiteness), their acceptance on resume
(`restore_latest_intact`: the newest intact checkpoint whose provenance matches, a damaged one set aside), and
its scalar log (`ScalarWriter`: one JSON line per log step, cut back to the resumed step). `training/trainer.py`
runs the loop and re-exports these names.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from gr_jax.runtime import distributed, io_utils, locks, provenance
from gr_jax.runtime.errors import UserError
from gr_jax.runtime.io_utils import fault_point, free_space, json_text, no_space, write_text
from gr_jax.runtime.run_dir import RunDir

log = logging.getLogger(__name__)


class TrainingError(UserError, RuntimeError):
    """Training cannot go on (non-finite loss, inconsistent resume); the message says what to do."""


def _line_step(line: str) -> float:
    try:
        return float(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return float("inf")  # a torn last line of a killed run


class ScalarWriter:
    """metrics.jsonl always; TensorBoard event files when tensorboardX is importable."""

    def __init__(self, model_dir: Path, name: str, resumed_at: Optional[int] = None):
        self.path = RunDir(model_dir).metrics_log(name)
        self._tb = None
        self.enabled = io_utils.writes()  # one writer: process 0 of a multi-process run
        if not self.enabled:
            return
        if resumed_at is not None:
            self._forget_after(resumed_at)
        try:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(RunDir(model_dir).tensorboard / name))
        except ImportError:
            log.info("tensorboardX not installed: scalars go to %s only", self.path)

    def _forget_after(self, step: int) -> None:
        """A resumed run logs again the steps after its checkpoint: the lines an interrupted run wrote for them
        are dropped, so that each step appears once."""
        if not self.path.exists():
            return
        lines = self.path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if _line_step(line) <= step]
        if len(kept) != len(lines):
            write_text(self.path, "".join(kept))

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json_text({"step": step, **scalars}) + "\n")
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self):
        if self._tb is not None:
            self._tb.close()


def _checkpoint_manager(model_dir: Path, keep: int) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, cleanup_tmp_directories=True,
                                           enable_async_checkpointing=False)
    return ocp.CheckpointManager(RunDir(model_dir).checkpoints.absolute(), options=options)


class DamagedCheckpoint(TrainingError):
    """A checkpoint that cannot be read, whose arrays differ from the checksums recorded when it was saved, or
    whose parameters are not finite."""


def array_digests(tree) -> dict[str, str]:
    """The checksums of a checkpoint's state (`provenance.array_digests`), saved beside it, so that a restore
    notices an array that changed on disk (a flipped bit is not NaN); arrays gathered from every process."""
    return provenance.array_digests(tree, distributed.to_host)


_key = provenance.key_path


def nonfinite_arrays(params) -> list[str]:
    """Key paths of the floating-point arrays of `params` that hold a NaN or an infinity."""
    bad = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if jnp.issubdtype(leaf.dtype, jnp.floating) and not bool(jnp.isfinite(leaf).all()):
            bad.append(_key(path))
    return bad


def read_checkpoint(manager: ocp.CheckpointManager, step: int, where, template=None, with_data: bool = False) -> dict:
    """The checkpoint's items (`state`, and `data` with `with_data`), checked: its arrays against the checksums
    recorded at save (checkpoints written before checksums were recorded are read unchecked, with a note) and
    its parameters for finite values. Anything else → `DamagedCheckpoint` naming the checkpoint and the array."""
    error = None
    try:
        with io_utils.abandoned_reads_quiet():
            if template is None:  # onto this process's first device, whatever layout saved it (devices, processes)
                template = _local_template(Path(manager.directory) / str(step) / "state")
            items = {"state": ocp.args.StandardRestore(template)}
            if with_data:
                items["data"] = ocp.args.JsonRestore()
            restored = manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:  # orbax/tensorstore raise many types for unreadable files
        detail = io_utils.orbax_error_line(e)
        error = DamagedCheckpoint(f"{where}: damaged, its arrays cannot be read ({type(e).__name__}: {detail})")
    # several processes decide together (the checks below are collectives where the state spans processes)
    failed = [i for i, bad in enumerate(distributed.gather_json(error is not None)) if bad]
    if failed and error is None:
        error = DamagedCheckpoint(f"{where}: damaged, process {failed[0]} cannot read its arrays")
    if error is not None:
        raise error
    recorded = _recorded_digests(manager, step, where)
    if recorded is None:
        log.info("%s: written before checksums were recorded (no checksum record and none listed in its "
                 "_CHECKPOINT_METADATA): its arrays are read unchecked", where)
    else:
        changed = provenance.changed_arrays(array_digests(restored["state"]), recorded)
        if changed:
            raise DamagedCheckpoint(f"{where}: damaged, {len(changed)} array(s) differ from the checksums recorded "
                                    f"when it was saved (first: {changed[0]})")
    bad = nonfinite_arrays({"params": restored["state"]["params"]})
    if bad:
        raise DamagedCheckpoint(f"{where}: its parameters hold NaN or infinite values ({len(bad)} array(s), first: "
                                f"{bad[0]}); it cannot give a meaningful result")
    return restored


# the checkpoint's format, saved as its own item: version 2 records the arrays' checksums (`digests`)
CHECKPOINT_FORMAT = {"version": 2, "checksums": "digests"}


def _recorded_digests(manager: ocp.CheckpointManager, step: int, where) -> Optional[dict]:
    """The checksums recorded when checkpoint `step` was saved; None only for a checkpoint written before
    checksums existed: orbax's own list of the checkpoint's items (`_CHECKPOINT_METADATA`, written at save)
    names neither `digests` nor `format`, and neither folder is there. A checksum record that is missing or
    unreadable otherwise (cut, emptied, deleted) is damage, never a reason to read the arrays unchecked."""
    step_dir = Path(manager.directory) / str(step)
    try:
        recorded = manager.restore(step, args=ocp.args.Composite(digests=ocp.args.JsonRestore()))["digests"]
    except Exception as e:  # orbax raises many types for a missing or unreadable item
        recorded, error = None, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
    else:
        error = None if isinstance(recorded, dict) and recorded else "empty or not an object"
    if error is None:
        return recorded
    try:
        items = set(json.loads((step_dir / "_CHECKPOINT_METADATA").read_text())["item_handlers"])
    except (OSError, ValueError, KeyError, TypeError):
        items = None
    older = (items is not None and not items & {"digests", "format"}
             and not (step_dir / "digests").exists() and not (step_dir / "format").exists())
    if older:
        return None
    raise DamagedCheckpoint(f"{where}: damaged, its checksum record cannot be read ({error}); a checkpoint "
                            f"written with checksums is never read unchecked")


def _local_template(state_dir: Path):
    """The saved state's shapes and dtypes, placed on this process's first device: a checkpoint saved over
    several devices or processes restores without its saving topology (orbax needs a target layout then)."""
    tree = ocp.StandardCheckpointHandler().metadata(state_dir)
    tree = getattr(tree, "tree", tree)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), tree)


def save_checkpoint(manager: ocp.CheckpointManager, step: int, state, **json_items) -> None:
    """A synchronous orbax save of `state` with its array checksums and the given JSON items. A full disk
    is an OSError naming the checkpoint folder and the space left there."""
    items = {k: ocp.args.JsonSave(v) for k, v in
             {**json_items, "digests": array_digests(state), "format": CHECKPOINT_FORMAT}.items()}
    try:
        fault_point("checkpoint", manager.directory)
        manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), **items), force=True)
        manager.wait_until_finished()
    except Exception as e:
        free = free_space(manager.directory)  # before the partial save is removed: what the save ran out of
        _remove_partial_save(Path(manager.directory), step)
        if not no_space(e):
            raise
        raise OSError(errno.ENOSPC, f"no space left on the device while saving checkpoint {step} in "
                      f"{manager.directory} ({free} free there); free some space and run "
                      f"the same command again: it resumes from the last complete checkpoint") from None


def _remove_partial_save(directory: Path, step: int) -> None:
    """A save that failed leaves orbax's temporary folder (`<step>.orbax-checkpoint-tmp…`): removed (process 0),
    so the directory holds complete checkpoints only; a re-run resumes from the last of them."""
    if not io_utils.writes():
        return
    for tmp in directory.glob(f"{int(step)}.orbax-checkpoint-tmp*"):
        shutil.rmtree(tmp, ignore_errors=True)
        log.info("removed %s, the checkpoint whose save failed", tmp)


def _set_aside(model_dir: Path, step: int) -> Path:
    """Moves a damaged checkpoint out of checkpoints/ (kept for inspection, never deleted); process 0 moves it
    for every process of a run."""
    dest_dir = RunDir(model_dir).damaged_checkpoints
    if not io_utils.writes():
        return dest_dir / str(step)
    dest_dir.mkdir(exist_ok=True)
    dest, n = dest_dir / str(step), 1
    while dest.exists():
        dest, n = dest_dir / f"{step}-{n}", n + 1
    RunDir(model_dir).checkpoint(step).rename(dest)
    return dest


_PROVENANCE_FIXES = {
    "vocabulary": "the vocabulary (VOCABULARY, or MODEL_DIR/vocabulary) is not the one the checkpoint was "
                  "trained with: use the VOCABULARY of MODEL_DIR/config.gin",
    "corpus": "the corpus (MIXTURE_OR_TASK_NAME / DATA_DIR) is not the one the checkpoint was trained on: use "
              "the data of MODEL_DIR/config.gin",
    "docid_table_sha": "the docids differ from the ones the checkpoint was trained with: use the docid scheme "
                       "and data of MODEL_DIR/config.gin",
    "docid_scheme": "the docid scheme differs from the checkpoint's",
    "config": "the network configuration differs from the checkpoint's (model gin file / INITIAL_CHECKPOINT_PATH)",
}


def check_provenance(saved: dict, now: dict, where: str) -> None:
    """Every recorded item of `saved` must equal `now`; otherwise a TrainingError lists what differs (items
    without a known fix are compared too, and named)."""
    differs = [k for k in saved if saved[k] != now.get(k)]
    if differs:
        raise TrainingError(f"{where}: " + "; ".join(_PROVENANCE_FIXES.get(k, f"its {k!r} differs") for k in differs)
                            + ". Or use a new MODEL_DIR.")


def restore_latest_intact(model_dir: Path, keep: int, template, meta: dict):
    """(manager, step, restored items) of the newest checkpoint that restores, or (manager, None, None).

    A checkpoint whose files cannot be read (a truncated array file, a missing metadata file) is moved to
    MODEL_DIR/damaged_checkpoints/ with a warning and the next older one is tried; if checkpoints exist but
    none is intact, a TrainingError. A checkpoint that reads but was trained with other data, vocabulary,
    docids or network (its recorded provenance) stops with a TrainingError: it is not damaged, the run is."""
    distributed.barrier("restore")  # every process lists the same checkpoints
    manager = _checkpoint_manager(model_dir, keep)
    damaged = []
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            saved = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        except Exception as e:  # orbax/tensorstore raise many types for unreadable files
            saved, error = None, e
        unread = [i for i, bad in enumerate(distributed.gather_json(saved is None)) if bad]  # decided together
        if saved is not None and unread:
            saved, error = None, DamagedCheckpoint(f"process {unread[0]} cannot read its metadata")
        if saved is not None:
            check_provenance(saved, meta, f"{RunDir(model_dir).checkpoint(step)}")
            try:
                restored = read_checkpoint(manager, step, RunDir(model_dir).checkpoint(step), template,
                                           with_data=True)
                if damaged:
                    log.warning("resuming from step %d, the newest intact checkpoint", step)
                return manager, step, restored
            except DamagedCheckpoint as e:
                error = e
        distributed.barrier(f"damaged {step}")  # every process has done reading it before process 0 moves it
        where = _set_aside(model_dir, step)
        damaged.append(step)
        log.warning("checkpoint %s is damaged (%s: %s); moved to %s", RunDir(model_dir).checkpoint(step),
                    type(error).__name__, str(error).splitlines()[0][:200] if str(error) else "", where)
        manager = _checkpoint_manager(model_dir, keep)  # it caches the list of steps
    set_aside = RunDir(model_dir).damaged_checkpoints
    if damaged or (set_aside.is_dir() and any(set_aside.iterdir())):  # never restart silently over a run
        raise TrainingError(f"{RunDir(model_dir).checkpoints}: no intact checkpoint (damaged ones are in {set_aside}"
                            f"{f', steps {damaged} moved there now' if damaged else ''}); to start over, use a new "
                            f"MODEL_DIR or delete {model_dir}")
    return manager, None, None


def _nonfinite_message(model_dir: Path, first: int, last: int, saved_steps: list, initial: Optional[str],
                       resumed_from: Optional[int] = None) -> str:
    msg = (f"loss or gradient became NaN/Inf between steps {first} and {last} (updates were skipped)")
    if resumed_from is not None and first <= resumed_from + 1:
        # the first steps after a resume: the restored state is the likelier cause than the learning rate
        ckpt = RunDir(model_dir).checkpoint(resumed_from)
        return (f"{msg}, the first steps after resuming from {ckpt}: the state came from that checkpoint, so check "
                f"it first (a checkpoint written before checksums were recorded is read unchecked); to resume from "
                f"an earlier one, move {ckpt} out of checkpoints/, else lower make_optimizer.learning_rate or check "
                f"the data")
    msg += "; lower make_optimizer.learning_rate or check the data"
    if saved_steps:
        return (f"{msg}; the last checkpoint saved before it is {RunDir(model_dir).checkpoint(saved_steps[-1])} "
                f"(resuming from it repeats the same steps: change the settings or data first)")
    msg += "; no checkpoint was saved before this"
    if initial:
        msg += f" — the parameters came from INITIAL_CHECKPOINT_PATH {initial}: check that checkpoint"
    return msg
