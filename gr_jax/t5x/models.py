"""`RetrieverModel`: the model object one of our experiment files builds, as a t5x model.

The t5x gin file includes one of our experiment files and sets `MODEL = @models.RetrieverModel()`. The model reads
the experiment's own training bindings (`train.*` of runs/train.gin: MODEL_DIR, TASK_FEATURE_LENGTHS,
MIXTURE_OR_TASK_NAME, BATCH_SIZE, SEED, INITIAL_CHECKPOINT_PATH, `train.optimizer`), builds the system with
`compose.prepare` as `python -m gr_jax.train` does (vocabulary, docid scheme and its state in MODEL_DIR, the
index, the training examples), and gives t5x:

* `loss_fn`: our model's loss (the experiment's objective: DSI's docid cross-entropy, PAG's joint objectives, ...),
  its (sum, count) metrics as clu averages;
* `get_initial_variables`: our initial parameters (seeded by SEED, or read from INITIAL_CHECKPOINT_PATH; t5x's
  rng is not used, so a t5x run and a gr_jax run start from the same parameters) and their logical axes under
  `params_axes`, which t5x's `PjitPartitioner` maps to the mesh with its rules (our axis names are t5x's);
* `optimizer_def`: the experiment's optax optimizer inside t5x's `OptaxWrapper`;
* `FEATURE_CONVERTER_CLS`: a handle on the built system that `data.get_dataset` reads our batches from.

Docids that the model decodes (GLEN, GenRET) are re-decoded during training by `gr_jax.train`'s refresh, which
t5x's loop has no place for: such an experiment is refused.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
from typing import Any, Mapping, Optional

try:
    import t5x  # noqa: F401
except ImportError as e:  # the message is the point
    raise ImportError("gr_jax.t5x needs t5x, which is not on PyPI: install it from its repository with --no-deps, "
                      "then what it imports from PyPI (README, 'With t5x itself')") from e

import flax
import gin
import jax
import seqio
from clu import metrics as clu_metrics
from flax.linen import partitioning as flax_partitioning
from t5x import models as t5x_models
from t5x import optimizers

from gr_jax import compose, gin_checks, gin_utils, locks
from gr_jax.errors import UserError
from gr_jax.training import trainer

log = logging.getLogger(__name__)

# what `python -m gr_jax.<command>` does before parsing, done when a t5x gin file imports this module: our gin
# configurables registered, and our gin_configs/ searched first (before the working directory, where gin's package
# reader would otherwise look up `runs/...` as a Python package and fail on a plain runs/ folder)
gin_utils.register_configurables()
if str(gin_utils.GIN_CONFIGS) not in gin.config._LOCATION_PREFIXES:
    gin.config._LOCATION_PREFIXES.insert(0, str(gin_utils.GIN_CONFIGS))


class T5xAdapterError(UserError, ValueError):
    pass


class SystemBatches:
    """What t5x passes to `get_dataset_fn` as the feature converter: here, the built system whose iterator gives
    the batches (t5x's call has no other way to reach the model). Called as a converter it refuses: a seqio task
    needs a model that reads seqio's features."""

    def __init__(self, model: "RetrieverModel"):
        self.model = model

    def __call__(self, *args, **kwargs):
        raise T5xAdapterError("a gr_jax RetrieverModel trains on its own batches: set "
                              "train_script.train.get_dataset_fn = @data.get_dataset (gr_jax/t5x/configs/)")


def axes_collection(axes) -> dict:
    """Our logical axes ({..., "kernel": PartitionSpec}) as flax's `params_axes` collection, which t5x's
    partitioner reads ({..., "kernel_axes": AxisMetadata(names)})."""
    def convert(tree):
        out = {}
        for key, value in tree.items():
            if isinstance(value, Mapping):
                out[key] = convert(value)
            else:
                out[f"{key}_axes"] = flax_partitioning.AxisMetadata(names=tuple(value))
        return out
    return convert(axes)


def all_empty(tree: Mapping) -> bool:
    """A mapping with no array under it (a head without parameters)."""
    return all(isinstance(v, Mapping) and all_empty(v) for v in tree.values())


def empty_paths(tree: Mapping, prefix: tuple = ()) -> list[tuple]:
    """(path, subtree) of each subtree without arrays: flax's axis names drop them, so t5x's train state holds the
    parameters without them (`without_empty`) and `with_empty` puts them back, as they were, for our model."""
    out = []
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out += ([(prefix + (key,), _plain(value))] if all_empty(value)
                    else empty_paths(value, prefix + (key,)))
    return out


def _plain(tree: Mapping) -> dict:
    return {k: _plain(v) for k, v in tree.items()}


def without_empty(tree: Mapping) -> dict:
    return {k: without_empty(v) if isinstance(v, Mapping) else v for k, v in tree.items()
            if not (isinstance(v, Mapping) and all_empty(v))}


def with_empty(tree: Mapping, paths: list[tuple]) -> dict:
    out = {k: with_empty(v, []) if isinstance(v, Mapping) else v for k, v in tree.items()}
    for path, subtree in paths:
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node.setdefault(path[-1], _plain(subtree))
    return out


def _bound(name: str, default=None):
    """The value bound to `configurable.param` with macros resolved (no configurable is called: t5x's `train`
    binds the model itself); `default` when unbound or when the configurable is not registered in this process
    (t5x's, outside its entry points)."""
    try:
        value = gin_utils._bound_value(gin.query_parameter(name))
    except (KeyError, ValueError):
        return default
    return default if value is gin_utils._UNKNOWN else value


def refuse_what_t5x_cannot_run(model_dir: str) -> None:
    """The settings t5x's loop would run differently from ours, refused before anything is written."""
    scheme = gin.get_bindings("prepare").get("docid_scheme")  # a scheme object: cheap to build, no state
    if scheme is not None and scheme.decoded_by_model:
        raise T5xAdapterError(f"{type(scheme).__name__}: docids decoded by the model are decoded again during "
                              f"training, which t5x's training loop has no place for; train this experiment with "
                              f"python -m gr_jax.train")
    optimizer = gin.get_bindings(trainer.make_optimizer)
    if optimizer.get("sam_rho", 0.0):
        raise T5xAdapterError("make_optimizer.sam_rho > 0: sharpness-aware minimisation needs the gradient at a "
                              "second point, which our train step passes and t5x's OptaxWrapper does not; train "
                              "with python -m gr_jax.train, or set make_optimizer.sam_rho = 0")
    if optimizer.get("name") == "adafactor":
        raise T5xAdapterError("make_optimizer.name = 'adafactor': t5x cannot partition optax's factored state; use "
                              "'adamw' under t5x, or train with python -m gr_jax.train")
    microbatches = _bound("t5x.trainer.Trainer.num_microbatches")
    if microbatches and microbatches > 1:
        raise T5xAdapterError(f"trainer.Trainer.num_microbatches = {microbatches}: t5x sums the microbatches' "
                              f"gradients of our mean loss ({microbatches}× ours, and clipped differently); leave "
                              f"it None")
    t5x_dir = _bound("__main__.train.model_dir")
    if t5x_dir is not None and str(t5x_dir) != model_dir:
        raise T5xAdapterError(f"t5x's model_dir {t5x_dir!r} and the experiment's train.model_dir {model_dir!r} "
                              f"differ: set MODEL_DIR only (both read it)")


class RetrieverModel(t5x_models.BaseModel):
    """A t5x model around our model object (module docstring)."""

    FEATURE_CONVERTER_CLS = seqio.EncDecFeatureConverter  # replaced per instance by `SystemBatches`

    def __init__(self):
        bindings = gin.get_bindings(compose.train)  # the experiment's own training settings (runs/train.gin)
        missing = [k for k in ("model_dir", "train_steps", "batch_size", "feature_lengths", "task")
                   if k not in bindings]
        if missing:
            raise T5xAdapterError(f"RetrieverModel builds the system an experiment file configures, and the gin "
                                  f"files bind no train.{', train.'.join(missing)}: include one of our experiment "
                                  f"files (e.g. 'experiments/demo/dsi_atomic.gin') in the t5x gin file")
        self.model_dir = str(bindings["model_dir"])
        refuse_what_t5x_cannot_run(self.model_dir)  # before anything is written
        ignored = sorted(set(bindings) - {"model_dir", "train_steps", "batch_size", "feature_lengths", "task", "seed",
                                          "initial_checkpoint_path", "optimizer"})
        if ignored:
            log.info("t5x runs the loop: the experiment's train.%s do not apply (t5x's own settings do: "
                     "utils.SaveCheckpointConfig, train_script.train.*)", ", train.".join(ignored))
        # one writer per MODEL_DIR (locks.py), held until the process ends: a second run on it stops at once
        self._held = contextlib.ExitStack()
        self._held.enter_context(locks.output_lock(self.model_dir, "t5x with a gr_jax model"))
        atexit.register(self._held.close)
        self.train_steps = int(bindings["train_steps"])
        self.seed = int(bindings.get("seed", 0))
        self.initial_checkpoint_path = bindings.get("initial_checkpoint_path")
        self.setup = gin_checks.call_configured(lambda: compose.prepare(
            model_dir=self.model_dir, batch_size=bindings["batch_size"], feature_lengths=bindings["feature_lengths"],
            task=bindings["task"], seed=self.seed, initial_checkpoint_path=self.initial_checkpoint_path))
        tx = bindings.get("optimizer") or trainer.make_optimizer(total_steps=self.train_steps)
        self.task = bindings["task"]
        self.batch_size = int(bindings["batch_size"])
        self.FEATURE_CONVERTER_CLS = SystemBatches(self)
        self._empty: Optional[list] = None
        self._loaded = None  # the initial parameters read from INITIAL_CHECKPOINT_PATH, on the host
        if self.initial_checkpoint_path:
            self._loaded = jax.device_get(compose.initial_params(self.setup, self.seed, self.initial_checkpoint_path))
        super().__init__(optimizer_def=optimizers.OptaxWrapper(tx))

    # -- t5x's model interface ---------------------------------------------------------------------------
    def get_initial_variables(self, rng: jax.Array, input_shapes: Mapping[str, Any],
                              input_types: Optional[Mapping[str, Any]] = None):
        """Our initial parameters (t5x's `rng` unused: SEED or INITIAL_CHECKPOINT_PATH decide them, as in
        `gr_jax.train`) and their logical axes."""
        del rng, input_shapes, input_types
        if self._loaded is not None:  # INITIAL_CHECKPOINT_PATH, read in __init__ (t5x traces this function)
            params = jax.tree_util.tree_map(jax.numpy.asarray, self._loaded)
        else:
            params = self.setup.model.init_params(self.seed)
        self._empty = empty_paths(params)
        axes = axes_collection(without_empty(self.setup.model.param_axes(params)))
        return flax.core.freeze({"params": without_empty(params), "params_axes": axes})

    def our_params(self, params) -> dict:
        """t5x's parameter tree as our model's (the subtrees without arrays put back)."""
        return with_empty(flax.core.unfreeze(params) if isinstance(params, flax.core.FrozenDict) else params,
                          self.empty_paths())

    def empty_paths(self) -> list[tuple]:
        if self._empty is None:
            self._empty = empty_paths(jax.eval_shape(lambda: self.setup.model.init_params(self.seed)))
        return self._empty

    def loss_fn(self, params, batch: Mapping[str, Any], dropout_rng: Optional[jax.Array]):
        """Our model's loss of the batch; each (sum, count) metric as a clu average over the step."""
        loss, sums = self.setup.model.loss_fn(self.our_params(params), batch, dropout_rng)
        return loss, {name: clu_metrics.Average(total=s, count=c) for name, (s, c) in sums.items()}

    def predict_batch_with_aux(self, params, batch, rng=None, **kwargs):
        raise T5xAdapterError("t5x.infer and t5x.eval with a gr_jax model are not supported yet: convert the "
                              "checkpoint (python -m gr_jax.t5x.checkpoints) and run python -m gr_jax.infer")

    def score_batch(self, params, batch, return_intermediates: bool = False):
        raise T5xAdapterError("t5x's scoring of a gr_jax model is not supported yet: convert the checkpoint "
                              "(python -m gr_jax.t5x.checkpoints) and run python -m gr_jax.infer")

