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
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax

from gr_jax.runtime import distributed, host_memory, io_utils, locks, provenance, validation
from gr_jax.runtime.progress import bar as progress_bar
from gr_jax.runtime.run_dir import RunDir
from gr_jax.training import lora, partitioning
from gr_jax.training.run_state import (  # noqa: F401  (re-exported: trainer.read_checkpoint, ...)
    _key,
    CHECKPOINT_FORMAT,
    DamagedCheckpoint,
    ScalarWriter,
    TrainingError,
    _PROVENANCE_FIXES,
    _checkpoint_manager,
    _line_step,
    _local_template,
    _nonfinite_message,
    _recorded_digests,
    _remove_partial_save,
    _set_aside,
    array_digests,
    check_provenance,
    nonfinite_arrays,
    read_checkpoint,
    restore_latest_intact,
    save_checkpoint,
)
from gr_jax.training.sam import global_norm, sam
from gr_jax.runtime.validation import Positive

log = logging.getLogger(__name__)
io_utils.quiet_orbax_threads()  # orbax worker-thread tracebacks to the debug log (io_utils)


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
