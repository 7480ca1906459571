"""The training loop, and only the loop: `fit(model, params, iterator, tx, run_dir=, loop=, meta=, hooks=)` runs
the steps of a model that the composition
(`gr_jax/compose.py`) has built — any model object with `loss_fn(params, batch, rng)` returning
`(loss, {name: (sum, count)})` and `param_axes(params)` (logical sharding axes).

Order of work (and of resume), in one place:
 1. parameters: the newest intact checkpoint in `model_dir/checkpoints` if any (params, optimizer state,
    step, data-iterator state; its recorded provenance `meta` must equal this run's — damaged checkpoints are
    moved to `model_dir/damaged_checkpoints/`), else the `params` given (an initial checkpoint or a random
    init, which the caller made);
 2. loop: one jit-compiled step (data parallel over the mesh: one sharding layout in and out, so it compiles
    once), NaN/Inf guard (the update is skipped and training stops at the next log step with a message),
    scalars every `log_period` steps — whatever (sum, count) pairs the objective returns, plus the gradient
    norm (TensorBoard + `<name>_metrics.jsonl`) —, the caller's hooks (`Hook`: on start, after each step,
    after its log line, at the end — a refresh of state that follows the parameters, a periodic evaluation,
    ...), checkpoints every `checkpoint_period` steps and at the end. The loop's settings are a `LoopConfig`.

Dropout randomness is `fold_in(PRNGKey(seed + 1), step)`, so a resumed run draws what the uninterrupted run
drew; the data order is the iterator's, whose state is saved in every checkpoint.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

from gr_jax.runtime import distributed, host_memory, io_utils, locks, provenance, validation
from gr_jax.runtime.progress import bar as progress_bar
from gr_jax.runtime.errors import UserError
from gr_jax.runtime.io_utils import fault_point, free_space, json_text, no_space, write_text
from gr_jax.runtime.run_dir import RunDir
from gr_jax.training import lora, partitioning
from gr_jax.training.sam import global_norm, sam
from gr_jax.runtime.validation import Positive

log = logging.getLogger(__name__)
io_utils.quiet_orbax_threads()  # orbax worker-thread tracebacks to the debug log (io_utils)


class TrainingError(UserError, RuntimeError):
    """Training cannot go on (non-finite loss, inconsistent resume); the message says what to do."""


# ----------------------------------------------------------------------------------------------------------
# optimizer
# ----------------------------------------------------------------------------------------------------------


@gin.configurable
def make_optimizer(name: str = "adamw", learning_rate: Positive = 1e-3, warmup_steps: int = 0,
                   decay: str = "constant", total_steps: int = 0, end_factor: float = 0.0,
                   weight_decay: float = 0.01, clip_norm: Optional[float] = 1.0,
                   sam_rho: float = 0.0) -> optax.GradientTransformation:
    """AdamW or Adafactor with linear warm-up then constant / linear / cosine / rsqrt decay; `sam_rho` > 0 wraps
    it in sharpness-aware minimisation (`training/sam.py`: the gradient taken at the ascent point)."""
    validation.number("make_optimizer.learning_rate", learning_rate)
    validation.integer("make_optimizer.warmup_steps", warmup_steps, minimum=0)
    validation.integer("make_optimizer.total_steps (TRAIN_STEPS in runs/train.gin)", total_steps, minimum=0)
    validation.number("make_optimizer.weight_decay", weight_decay, positive=False, minimum=0.0)
    validation.number("make_optimizer.end_factor", end_factor, positive=False, minimum=0.0)
    if clip_norm is not None:
        validation.number("make_optimizer.clip_norm", clip_norm)
    validation.number("make_optimizer.sam_rho (0: no SAM)", sam_rho, positive=False, minimum=0.0)
    warm = optax.linear_schedule(0.0, learning_rate, max(warmup_steps, 1)) if warmup_steps else None
    rest = max(total_steps - warmup_steps, 1)
    decays = {
        "constant": lambda: optax.constant_schedule(learning_rate),
        "linear": lambda: optax.linear_schedule(learning_rate, learning_rate * end_factor, rest),
        "cosine": lambda: optax.cosine_decay_schedule(learning_rate, rest, alpha=end_factor),
        "rsqrt": lambda: (lambda s: learning_rate * jax.lax.rsqrt(jnp.maximum(s + warmup_steps, 1.0)
                                                                  / max(warmup_steps, 1))),
    }
    if decay not in decays:
        raise ValueError(f"make_optimizer.decay must be one of {sorted(decays)}, got {decay!r}")
    schedule = decays[decay]()
    if warm is not None:
        schedule = optax.join_schedules([warm, schedule], [warmup_steps])
    optimizers = {
        "adamw": lambda: optax.adamw(schedule, weight_decay=weight_decay),
        "adafactor": lambda: optax.adafactor(schedule, weight_decay_rate=weight_decay or None),
    }
    if name not in optimizers:
        raise ValueError(f"make_optimizer.name must be one of {sorted(optimizers)}, got {name!r}")
    chain = [optax.clip_by_global_norm(clip_norm)] if clip_norm else []
    tx = optax.chain(*chain, optimizers[name]())
    return sam(tx, sam_rho) if sam_rho else tx


# ----------------------------------------------------------------------------------------------------------
# scalars
# ----------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------
# the step
# ----------------------------------------------------------------------------------------------------------


def make_train_step(loss_fn: Callable, tx: optax.GradientTransformation, partition: Optional["Partition"] = None):
    """`step(state, batch, dropout_key[, frozen]) -> (state, metrics)`. `loss_fn(params, batch, rng) -> (loss,
    {name: (sum, count)})`; the metrics are those pairs plus `grad_norm` as (norm, 1). A non-finite loss,
    gradient or update keeps the old parameters and optimizer state and counts in `state["nonfinite"]`. The
    optimizer's update gets `grad_fn(params)`, the gradient of the same batch at other parameters (SAM uses it;
    other transformations ignore it). With a `partition`, `state["params"]` is its trainable part and `frozen`
    the rest: the loss sees them joined, the gradient and the optimizer the trainable part only."""
    tx = optax.with_extra_args_support(tx)

    def step(state, batch, dropout_key, frozen=None):
        rng = jax.random.fold_in(dropout_key, state["step"])
        loss_of = loss_fn if partition is None else (lambda p, b, r: loss_fn(partition.join(p, frozen), b, r))
        (loss, sums), grads = jax.value_and_grad(loss_of, has_aux=True)(state["params"], batch, rng)
        grad_norm = global_norm(grads)
        grad_fn = jax.grad(lambda p: loss_of(p, batch, rng)[0])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"], grad_fn=grad_fn)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(global_norm(updates))
        params = optax.apply_updates(state["params"], updates)
        keep = lambda new, old: jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new, old)
        new_state = {"step": state["step"] + 1, "params": keep(params, state["params"]),
                     "opt_state": keep(opt_state, state["opt_state"]),
                     "nonfinite": state["nonfinite"] + (~finite).astype(jnp.int32)}
        return new_state, {**sums, "grad_norm": (grad_norm, jnp.ones((), jnp.float32))}

    return step


class Partition:
    """Parameters split into the part a run trains (`trainable(name)` of each leaf's key path, e.g.
    `lora.trainable`) and the part it holds fixed. `split(tree)` → (the trainable leaves as a tree of dicts by key
    path, {name: leaf} of the rest); `join` puts them back into the full tree's structure. The trainer keeps the
    frozen part out of the gradient, the optimizer state and the checkpoints, which record its `digest`."""

    def __init__(self, params, trainable: Callable[[str], bool]):
        self.treedef = jax.tree_util.tree_structure(params)
        self.names = lora.leaf_names(params)
        self.trained = [bool(trainable(n)) for n in self.names]
        if not any(self.trained):
            raise ValueError("the trainable part of the parameters is empty: nothing would train (are the adapters "
                             "there? Lora.targets)")

    def split(self, tree) -> tuple[dict, dict]:
        leaves = self.treedef.flatten_up_to(tree)
        train: dict = {}
        frozen = {}
        for name, leaf, t in zip(self.names, leaves, self.trained):
            if t:
                *parents, last = name.split("/")
                node = train
                for k in parents:
                    node = node.setdefault(k, {})
                node[last] = leaf
            else:
                frozen[name] = leaf
        return train, frozen

    def join(self, train: dict, frozen: dict):
        flat = dict(zip(lora.leaf_names(train), jax.tree_util.tree_leaves(train)))
        return self.treedef.unflatten([flat[n] if t else frozen[n] for n, t in zip(self.names, self.trained)])

    @staticmethod
    def digest(frozen: dict) -> str:
        """One digest of the frozen leaves' bytes (with their names, dtypes and shapes)."""
        digests = provenance.array_digests(frozen, distributed.to_host)
        return hashlib.blake2b(json.dumps(digests, sort_keys=True).encode(), digest_size=16).hexdigest()


@jax.jit
def _accumulate(acc, sums):
    """Running (sum, count) pairs: one dispatch per step instead of one small op per metric."""
    return jax.tree_util.tree_map(jnp.add, acc, sums)


# ----------------------------------------------------------------------------------------------------------
# checkpoints
# ----------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------
# the loop
# ----------------------------------------------------------------------------------------------------------


def validate_loop(train_steps, batch_size, log_period, eval_period, checkpoint_period, keep_checkpoints,
                  num_partitions, seed) -> None:
    validation.integer("TRAIN_STEPS (train.train_steps)", train_steps)
    validation.integer("BATCH_SIZE (train.batch_size)", batch_size)
    validation.integer("train.log_period", log_period)
    validation.integer("train.eval_period (0: no periodic evaluation)", eval_period, minimum=0)
    validation.integer("train.checkpoint_period", checkpoint_period)
    validation.integer("train.keep_checkpoints", keep_checkpoints)
    validation.integer("train.num_partitions", num_partitions)
    validation.integer("SEED (train.seed)", seed, minimum=0)


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """How the loop runs a training (what it trains is the model, the iterator and the optimizer): steps and batch,
    the dropout seed, how often it logs and checkpoints, how many checkpoints it keeps, the mesh's model-parallel
    partitions, a progress bar, the name of its metrics log (`<name>_metrics.jsonl`), where training started
    from (named by a non-finite-loss message), the logical-axis rules that lay the parameters out (default
    `partitioning.logical_rules()`), and which parameters train: `trainable(name)` of a leaf's key path (None:
    all; e.g. `lora.trainable`) — the others are held fixed (`Partition`): out of the gradient, the optimizer
    state and the checkpoints, which record their digest (`lora.FROZEN_DIGEST`) so that a resume over other
    frozen weights is refused."""

    train_steps: int
    batch_size: int
    seed: int = 0
    log_period: int = 50
    checkpoint_period: int = 500
    keep_checkpoints: int = 3
    num_partitions: int = 1
    progress: bool = True
    name: str = "train"
    started_from: Optional[str] = None  # INITIAL_CHECKPOINT_PATH, for messages
    rules: Optional[dict] = None
    trainable: Optional[Callable[[str], bool]] = None

    def validate(self) -> "LoopConfig":
        validate_loop(self.train_steps, self.batch_size, self.log_period, 0, self.checkpoint_period,
                      self.keep_checkpoints, self.num_partitions, self.seed)
        return self


class LoopContext:
    """What a hook sees of the running loop: the run directory, the loop's settings, the current step, the step
    it resumed from (None: a fresh start), the scalars of the last log line (`logged`), the parameters
    (`params()`: this process's copy) and `replace_params(new)` (same structure, shapes and dtypes; placed as the
    old ones, so the step keeps its one compilation)."""

    def __init__(self, run_dir: RunDir, loop: LoopConfig, state: dict, shardings: dict, resumed_from,
                 partition: Optional[Partition] = None, frozen: Optional[dict] = None):
        self.run_dir, self.loop, self._state, self._shardings = run_dir, loop, state, shardings
        self.resumed_from = resumed_from
        self._partition, self._frozen = partition, frozen  # a run that trains part of the parameters
        self.step = int(state["step"])
        self.logged: dict = {}  # the scalars of the last log line (the objective's names, steps_per_s, epoch)

    def _full(self, params):
        return params if self._partition is None else self._partition.join(params, self._frozen)

    def params(self) -> dict:
        return distributed.local(self._full(self._state["params"]))

    def replace_params(self, new: dict, what: str = "a hook") -> None:
        held = self._full(self._state["params"])
        old = jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), held)
        got = jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), new)
        if jax.tree_util.tree_structure(new) != jax.tree_util.tree_structure(held) or old != got:
            raise TrainingError(f"step {self.step}: {what} returned parameters of another structure, shape or "
                                f"dtype than the model's")
        if self._partition is not None:
            new, frozen = self._partition.split(new)
            changed = [n for n, x in frozen.items() if x is not self._frozen[n]
                       and not bool(jnp.array_equal(x, self._frozen[n]))]
            if changed:
                raise TrainingError(f"step {self.step}: {what} changed frozen parameters ({changed[0]}, …), which "
                                    f"this run does not train")
        self._state["params"] = distributed.put(new, self._shardings["params"])


class Hook:
    """A caller's action at points of the loop (t5x's actions are the model). Each method does nothing unless a
    hook overrides it; hooks act in the order `fit` is given them.

    * `check(loop)` — before anything runs: refuse settings under which a resumed run would differ;
    * `on_start(ctx)` — once the checkpoints in the run directory are accepted (a run refused for another
      provenance has written nothing by then), before the first step; after a resume, at the resumed step;
    * `after_step(ctx)` — right after each step;
    * `after_log(ctx)` — after each step's log line and non-finite check, before its checkpoint;
    * `on_end(ctx)` — after the last step's checkpoint."""

    def check(self, loop: LoopConfig) -> None:
        pass

    def on_start(self, ctx: LoopContext) -> None:
        pass

    def after_step(self, ctx: LoopContext) -> None:
        pass

    def after_log(self, ctx: LoopContext) -> None:
        pass

    def on_end(self, ctx: LoopContext) -> None:
        pass


@dataclasses.dataclass
class OnStart(Hook):
    """`fn()` once the checkpoints are accepted (`compose.train` writes the run's config.gin)."""

    fn: Callable[[], None]

    def on_start(self, ctx: LoopContext) -> None:
        self.fn()


@dataclasses.dataclass
class EveryStep(Hook):
    """`fn(step)` after every step (the fault tests stop a run at a chosen step)."""

    fn: Callable[[int], None]

    def after_step(self, ctx: LoopContext) -> None:
        self.fn(ctx.step)


@dataclasses.dataclass
class Refresh(Hook):
    """`fn(step, params)` rebuilds state that follows the parameters (GLEN's docids, re-decoded from the corpus):
    once before the first step (after a resume: with the resumed parameters) and, with `period` R > 0, after
    every step that is a multiple of R (not the last). A resumed run repeats an uninterrupted one only if it
    resumes at a multiple of R, hence the loop's `checkpoint_period` must be one. `fn` may return new
    parameters (GenRET's codebook of a new docid position, initialised from the documents), which replace the
    state's before that step's checkpoint is saved; since a resumed run calls it again with the checkpoint's
    parameters, such a rewrite must give the same parameters when applied to its own result."""

    fn: Callable[[int, dict], Optional[dict]]
    period: int = 0

    def check(self, loop: LoopConfig) -> None:
        validation.integer("refresh period", self.period, minimum=0)
        if self.period and loop.checkpoint_period % self.period:
            raise ValueError(f"checkpoint_period {loop.checkpoint_period} must be a multiple of the re-assignment "
                             f"period {self.period} (a resumed run must rebuild the docids an uninterrupted run "
                             f"had); change train.checkpoint_period or the period")

    def _apply(self, ctx: LoopContext) -> None:
        new = self.fn(ctx.step, ctx.params())
        if new is not None:
            ctx.replace_params(new, "the refresh (the objectives config's on_refresh)")

    def on_start(self, ctx: LoopContext) -> None:
        self._apply(ctx)

    def after_step(self, ctx: LoopContext) -> None:
        if self.period and ctx.step % self.period == 0 and ctx.step < ctx.loop.train_steps:
            self._apply(ctx)


@dataclasses.dataclass
class Evaluate(Hook):
    """`fn(params) -> metrics` every `period` steps (not the last: the caller's final evaluation follows), each
    written to the run's `eval_metrics.jsonl` (and TensorBoard) and logged."""

    fn: Callable[[dict], dict]
    period: int

    def check(self, loop: LoopConfig) -> None:
        validation.integer("train.eval_period (0: no periodic evaluation)", self.period, minimum=0)

    def on_start(self, ctx: LoopContext) -> None:
        self._writer = ScalarWriter(ctx.run_dir.root, "eval", ctx.step) if self.period else None

    def after_log(self, ctx: LoopContext) -> None:
        if self._writer is not None and ctx.step % self.period == 0 and ctx.step < ctx.loop.train_steps:
            metrics = self.fn(ctx.params())
            self._writer.write(ctx.step, metrics)
            log.info("step %d: %s", ctx.step, metrics)

    def on_end(self, ctx: LoopContext) -> None:
        if self._writer is not None:
            self._writer.close()


def fit(model, params, iterator, tx: optax.GradientTransformation, *, run_dir, loop: LoopConfig, meta: dict,
        hooks: Sequence[Hook] = ()) -> dict:
    """Trains `model` from `params` (or from the newest intact checkpoint in `run_dir`, a `RunDir` or its path)
    to `loop.train_steps`, drawing batches from `iterator` (resumable: `state()` / `set_state()`, `epochs()`).
    `meta` (what the run was built from) is saved in every checkpoint and must match on resume. `hooks` act at
    points of the loop (`Hook`). With `loop.trainable` only those parameters train (`Partition`). Returns
    {"state" (its params whole), "step", "resumed_from", "checkpoint"}."""
    loop = loop.validate()
    for hook in hooks:
        hook.check(loop)
    t_start = time.time()
    run_dir = RunDir(run_dir)
    model_dir = run_dir.root
    mesh = partitioning.make_mesh(loop.num_partitions)
    if loop.batch_size % mesh.shape["data"]:
        raise ValueError(f"BATCH_SIZE {loop.batch_size} is not divisible by the {mesh.shape['data']} data-parallel "
                         f"devices")
    partition = Partition(params, loop.trainable) if loop.trainable is not None else None
    state, state_shardings, frozen = _initial_state(model, params, tx, mesh, loop.rules, partition)
    if partition is not None:
        meta = {**meta, lora.FROZEN_DIGEST: Partition.digest(frozen)}
    # restored straight into the run's layout (on every process's devices, with several)
    template = jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state,
                                      state_shardings)
    manager, latest, restored = restore_latest_intact(model_dir, loop.keep_checkpoints, template, meta)
    if restored is not None:
        state = restored["state"]
        iterator.set_state(restored["data"])
        log.info("resumed from %s at step %d", run_dir.checkpoints, latest)
    b_shard, scalar = partitioning.batch_sharding(mesh), partitioning.replicated(mesh)
    state = distributed.put(state, state_shardings)  # one layout in and out: the step compiles once
    if partition is None:
        step_fn = jax.jit(make_train_step(model.loss_fn, tx), in_shardings=(state_shardings, b_shard, scalar),
                          out_shardings=(state_shardings, scalar), donate_argnums=(0,))
    else:  # the frozen part is an argument (never a constant of the program), not donated
        frozen_shardings = jax.tree_util.tree_map(lambda x: x.sharding, frozen)
        step_fn = jax.jit(make_train_step(model.loss_fn, tx, partition),
                          in_shardings=(state_shardings, b_shard, scalar, frozen_shardings),
                          out_shardings=(state_shardings, scalar), donate_argnums=(0,))
        step_fn = _with_frozen(step_fn, frozen)
    dropout_key = jax.random.PRNGKey(loop.seed + 1)
    saver = _Saver(manager, iterator, meta, latest, int(state["nonfinite"]))
    step = int(state["step"])
    if step > loop.train_steps:
        raise TrainingError(f"{run_dir.checkpoints} holds step {step}, past TRAIN_STEPS = {loop.train_steps}; "
                            f"raise TRAIN_STEPS or use a new MODEL_DIR")
    locks.accept()  # what preparing wrote (vocabulary, docid scheme) stays from here on
    ctx = LoopContext(run_dir, loop, state, state_shardings, latest, partition, frozen)
    for hook in hooks:
        hook.on_start(ctx)
    state = ctx._state
    scalars = _Scalars(model_dir, loop.name, loop.progress and distributed.is_primary(), loop.train_steps, step)
    # The step's temporaries are allocated afresh on every call: keep the freed blocks (host_memory).
    with host_memory.reuse_freed_memory():
        while step < loop.train_steps:
            state, sums = step_fn(state, distributed.global_batch(next(iterator), b_shard), dropout_key)
            step += 1
            scalars.add(sums)
            ctx._state, ctx.step = state, step
            for hook in hooks:
                hook.after_step(ctx)
            state = ctx._state
            if step % loop.log_period == 0 or step == loop.train_steps:
                if int(state["nonfinite"]) > 0:
                    raise TrainingError(_nonfinite_message(model_dir, step - scalars.since + 1, step, saver.steps,
                                                           loop.started_from, latest))
                ctx.logged = scalars.write(step, float(np.mean(iterator.epochs())))
            scalars.tick()
            for hook in hooks:
                hook.after_log(ctx)
            state = ctx._state
            if step % loop.checkpoint_period == 0 or step == loop.train_steps:
                saver.save(step, state)
    scalars.close()
    ctx._state, ctx.step = state, step
    for hook in hooks:
        hook.on_end(ctx)
    log.info("%s done: step %d in %.1f s%s", loop.name, step, time.time() - t_start,
             f" (resumed from step {latest})" if latest is not None else "")
    if partition is not None:
        state = {**state, "params": partition.join(state["params"], frozen)}
    return {"state": state, "step": step, "resumed_from": latest, "checkpoint": str(run_dir.checkpoint(step))}


def _with_frozen(step_fn, frozen):
    return lambda state, batch, key: step_fn(state, batch, key, frozen)


def _initial_state(model, params, tx: optax.GradientTransformation, mesh, rules=None,
                   partition: Optional[Partition] = None) -> tuple[dict, dict, Optional[dict]]:
    """The train state {step, params, opt_state, nonfinite} placed by the model's logical axes (adapters as their
    kernels, `lora.complete_axes`), its shardings (scalars replicated), and with a `partition` the frozen
    parameters, placed ({name: array}; the state's params are then the trainable part)."""
    shardings = partitioning.param_shardings(lora.complete_axes(model.param_axes(params), params), mesh, rules)
    frozen = None
    if partition is not None:
        (params, frozen), (shardings, frozen_shardings) = partition.split(params), partition.split(shardings)
        frozen = distributed.put(frozen, frozen_shardings)
    # a copy: the step donates its state, and the caller's arrays stay theirs (DPR mines with its start, the
    # dual encoder's caller compares with the untrained encoder)
    params = distributed.put(jax.tree_util.tree_map(lambda x: jnp.copy(x) if isinstance(x, jax.Array) else x,
                                                    params), shardings)
    scalar = partitioning.replicated(mesh)
    opt_state = jax.jit(tx.init, out_shardings=_optimizer_shardings(tx, params, shardings, scalar))(params)
    state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": opt_state,
             "nonfinite": jnp.zeros((), jnp.int32)}
    return state, jax.tree_util.tree_map(lambda x: x.sharding if x.ndim else scalar, state), frozen


def _optimizer_shardings(tx: optax.GradientTransformation, params, param_shardings, replicated):
    """The optimizer state's layout: a leaf that mirrors a parameter (Adam's moments) is laid out as that
    parameter, anything else (counts, Adafactor's factored rows) is replicated."""
    shapes = jax.eval_shape(tx.init, params)
    try:
        return optax.tree_map_params(tx, lambda leaf, sharding, p: sharding if leaf.shape == p.shape else replicated,
                                     shapes, param_shardings, params, transform_non_params=lambda _: replicated)
    except (TypeError, ValueError):  # a transformation whose state optax cannot walk: every leaf replicated
        return jax.tree_util.tree_map(lambda _: replicated, shapes)


class _Saver:
    """Synchronous orbax saves of the composite checkpoint: state, the data iterator's position, the provenance."""

    def __init__(self, manager, iterator, meta: dict, latest: Optional[int], latest_nonfinite: int = 0):
        self.manager, self.iterator, self.meta = manager, iterator, meta
        self.steps = [latest] if latest is not None and not latest_nonfinite else []  # saved before any NaN

    def save(self, step: int, state) -> None:
        save_checkpoint(self.manager, step, state, data=self.iterator.get_state(), meta=self.meta)
        if not int(state["nonfinite"]):  # a save between a NaN step and the next log step is not a good one
            self.steps.append(step)


class _Scalars:
    """The loop's metrics: the objective's (sum, count) pairs accumulated on the device between log steps, then
    written (sum / count, steps/s, epoch) and shown on the progress bar (a terminal) or logged."""

    def __init__(self, model_dir: Path, name: str, progress: bool, total: int, initial: int):
        self.writer = ScalarWriter(model_dir, name, initial)
        self.acc: dict = {}
        self.t, self.since = time.time(), 0
        self.bar = None
        if progress:
            self.bar = progress_bar(total=total, initial=initial, desc=name, unit="step", mininterval=1.0)

    def add(self, sums) -> None:
        if self.acc and set(sums) != set(self.acc):  # a training whose phases report other metrics (RIPOR's)
            zero = lambda pair: jax.tree_util.tree_map(jnp.zeros_like, pair)  # noqa: E731
            self.acc = {**{k: zero(v) for k, v in sums.items()}, **self.acc}
            sums = {**{k: zero(v) for k, v in self.acc.items()}, **sums}
        self.acc = sums if not self.acc else _accumulate(self.acc, sums)
        self.since += 1

    def write(self, step: int, epoch: float) -> dict:
        host = jax.device_get(self.acc)
        scalars = {k: float(s) / max(float(c), 1e-12) for k, (s, c) in host.items()}
        scalars.update(steps_per_s=self.since / (time.time() - self.t), epoch=epoch)
        self.writer.write(step, scalars)
        if self.bar is not None:
            shown = sorted(host, key=lambda k: (k != "loss", k))[:3]  # the loss first, if there is one
            self.bar.set_postfix({k: f"{scalars[k]:.3f}" for k in shown})
        self.acc, self.t, self.since = {}, time.time(), 0
        return scalars

    def tick(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.writer.close()
