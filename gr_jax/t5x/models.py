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
* `FEATURE_CONVERTER_CLS`: a handle on the built system that `data.get_dataset` reads our batches from, and that
  `t5x.eval` / `t5x.infer` call for the converter of the model's seqio task (`system_task`);
* `predict_batch_with_aux`: our constrained beam search over the docid index (`beam_documents` of the model
  contract, traced inside t5x's partitioned infer step) and the model's ranker (the default one on the device, a
  method's own on the host): ranked corpus rows (+ 1; 0 pads) in trec order with their scores as the aux value
  "scores";
* `score_batch`: the log-likelihood of given docids (the task's targets).

Under `t5x.eval` / `t5x.infer` (the command is read from `__main__`) the model restores the system of MODEL_DIR —
vocabulary and docids as the t5x training run wrote them, checked against the record it left in
MODEL_DIR/t5x_system.json — and registers the task MIXTURE_OR_TASK_NAME over it (`system_task`); the checkpoint
must be one of that MODEL_DIR's. One writer per output directory: training holds MODEL_DIR, evaluation
EVAL_OUTPUT_DIR, inference INFER_OUTPUT_DIR.

Docids that the model decodes (GLEN, GenRET) are re-decoded during training by `gr_jax.train`'s refresh, which
t5x's loop has no place for: such an experiment is refused; so is a model whose ranking is not one traceable
search (SEAL's FM-index keys, Few-Shot GR's prompts) under `t5x.eval` / `t5x.infer`.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Mapping, Optional

try:
    import t5x  # noqa: F401
except ImportError as e:  # the message is the point
    raise ImportError("gr_jax.t5x needs t5x, which is not on PyPI: install it from its repository with --no-deps, "
                      "then what it imports from PyPI (README, 'With t5x itself')") from e

import flax
import gin
import jax
import jax.numpy as jnp
import numpy as np
import seqio
from clu import metrics as clu_metrics
from flax.linen import partitioning as flax_partitioning
from t5x import models as t5x_models
from t5x import optimizers

from gr_jax import compose
from gr_jax.runtime import gin_checks, gin_utils, locks, provenance
from gr_jax.decoding import rankers
from gr_jax.evaluation.retrieval import EvalConfig
from gr_jax.runtime.io_utils import json_text, write_text
from gr_jax.t5x import system_task
from gr_jax.t5x.records import (_STEP_DIR, SYSTEM_RECORD, T5xAdapterError, _read_record, empty_paths, t5x_steps,
                                with_empty, without_empty)
from gr_jax.training import trainer

log = logging.getLogger(__name__)

gin_checks.renamed("EvalConfig.num_beams", "RetrieverModel.num_beams")  # its earlier name under t5x

COMMANDS = {"t5x.train": "train", "t5x.eval": "eval", "t5x.infer": "infer"}
RUN_TIERS = Path(__file__).resolve().parent / "configs" / "runs"


def t5x_command() -> Optional[str]:
    """"train", "eval" or "infer" under `python -m t5x.<that>`, `python .../t5x/<that>.py` or `python -m t5x.main
    --run_mode=<that>`; None elsewhere."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is None:  # run as a script
        found = re.search(r"t5x[/\\](train|eval|infer)\.py$", str(getattr(main, "__file__", "")))
        name = f"t5x.{found.group(1)}" if found else None
    if name == "t5x.main":
        modes = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--run_mode=")]
        name = f"t5x.{modes[-1].lower()}" if modes else None
    return COMMANDS.get(name)


# what `python -m gr_jax.<command>` does before parsing, done when a t5x gin file imports this module: our gin
# configurables registered, and our gin_configs/ searched first (before the working directory, where gin's package
# reader would otherwise look up `runs/...` as a Python package and fail on a plain runs/ folder); and under a t5x
# command, the folder of that command's run tier (configs/runs/<command>/t5x_run.gin, which configs/model.gin
# includes), so one gin file serves t5x.train, t5x.eval and t5x.infer
gin_utils.register_configurables()
for _prefix in [str(RUN_TIERS / (t5x_command() or "none")), str(gin_utils.GIN_CONFIGS)]:
    if _prefix not in gin.config._LOCATION_PREFIXES:  # runs/none/t5x_run.gin: an error naming the commands
        gin.config._LOCATION_PREFIXES.insert(0, _prefix)


class SystemBatches:
    """What t5x passes to `get_dataset_fn` as the feature converter: here, the built system whose iterator gives
    the batches (t5x's call has no other way to reach the model). Called as a converter it refuses: a seqio task
    needs a model that reads seqio's features."""

    def __init__(self, model: "RetrieverModel"):
        self.model = model

    def __call__(self, pack: bool = False, **kwargs):
        """The converter of the model's seqio task (t5x.eval, t5x.infer: `FEATURE_CONVERTER_CLS(pack=False)`)."""
        if pack or self.model.command == "train":  # the task holds evaluation queries, never training examples
            raise T5xAdapterError("a gr_jax RetrieverModel trains on its own batches: set "
                                  "train_script.train.get_dataset_fn = @data.get_dataset (gr_jax/t5x/configs/)")
        return system_task.SystemConverter(self.model.setup.feature_lengths)


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


def _bound(name: str, default=None):
    """The value bound to `configurable.param` with macros resolved (no configurable is called: t5x's `train`
    binds the model itself); `default` when unbound or when the configurable is not registered in this process
    (t5x's, outside its entry points)."""
    try:
        value = gin_utils._bound_value(gin.query_parameter(name))
    except (KeyError, ValueError):
        return default
    return default if value is gin_utils._UNKNOWN else value


def refuse_what_t5x_cannot_run(model_dir: str, command: str = "train") -> None:
    """The settings t5x's loop would run differently from ours, refused before anything is written."""
    scheme = gin.get_bindings("prepare").get("docid_scheme")  # a scheme object: cheap to build, no state
    if scheme is not None and scheme.decoded_by_model:
        raise T5xAdapterError(f"{type(scheme).__name__}: docids decoded by the model are decoded again during "
                              f"training, which t5x's training loop has no place for; train this experiment with "
                              f"python -m gr_jax.train")
    if command != "train":
        return
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
    # t5x's model_dir is absolute_path(MODEL_DIR) in our run tier, unless a gin file binds it to a path itself
    for t5x_dir in (_bound("__main__.train.model_dir"), _bound("MODEL_DIR/macro.value")):
        if t5x_dir is not None and os.path.abspath(str(t5x_dir)) != os.path.abspath(model_dir):
            raise T5xAdapterError(f"t5x's model_dir {t5x_dir!r} and the experiment's train.model_dir {model_dir!r} "
                                  f"differ: set MODEL_DIR only (both read it)")


def absolute_path(path: str) -> str:
    """`path` made absolute against the working directory, for t5x's paths (the run tiers bind it to MODEL_DIR,
    CHECKPOINT_PATH and the output directories): the orbax checkpointer t5x uses refuses relative paths, and our
    commands take them."""
    if path is None:
        raise T5xAdapterError("a t5x path (MODEL_DIR, CHECKPOINT_PATH, EVAL_OUTPUT_DIR, INFER_OUTPUT_DIR) is unset")
    return os.path.abspath(str(path))


class RetrieverModel(t5x_models.BaseModel):
    """A t5x model around our model object (module docstring). It searches (t5x.eval, t5x.infer) with the
    experiment's `EvalConfig.num_beams`, as `gr_jax.infer` does: `num_beams`, its earlier name here, and NUM_BEAMS
    are read as it (`gin_checks.settle_renamed` after t5x's parse; the command line's value over the files').
    `command`: default the t5x command running (`t5x_command`)."""

    FEATURE_CONVERTER_CLS = seqio.EncDecFeatureConverter  # replaced per instance by `SystemBatches`

    def __init__(self, num_beams: Optional[int] = None, command: Optional[str] = None):
        self.command = command or t5x_command() or "train"
        if self.command not in COMMANDS.values():
            raise T5xAdapterError(f"RetrieverModel.command must be one of {sorted(COMMANDS.values())}, got "
                                  f"{self.command!r}")
        bindings = gin.get_bindings(compose.train)  # the experiment's own training settings (runs/train.gin)
        missing = [k for k in ("model_dir", "train_steps", "batch_size", "feature_lengths", "task")
                   if k not in bindings]
        if missing:
            raise T5xAdapterError(f"RetrieverModel builds the system an experiment file configures, and the gin "
                                  f"files bind no train.{', train.'.join(missing)}: include one of our experiment "
                                  f"files (e.g. 'experiments/demo/dsi_atomic.gin') in the t5x gin file")
        self.model_dir = str(bindings["model_dir"])
        refuse_what_t5x_cannot_run(self.model_dir, self.command)  # before anything is written
        self.train_steps = int(bindings["train_steps"])
        self.seed = int(bindings.get("seed", 0))
        self.task = bindings["task"]
        self.batch_size = int(bindings["batch_size"])
        with gin.unlock_config():  # t5x parsed the gin files: earlier names of a setting → its one name
            gin_checks.settle_renamed(gin_utils.split_flags(sys.argv[1:])[1])
        self.eval_config = gin_checks.call_configured(EvalConfig).validate()  # beams, metrics, thresholds (gin)
        self.num_beams = self.eval_config.num_beams
        self._held = contextlib.ExitStack()
        atexit.register(self._held.close)
        self._empty: Optional[list] = None
        self._loaded = None  # the initial parameters read from INITIAL_CHECKPOINT_PATH, on the host
        if self.command == "train":
            tx = self._build_for_training(bindings)
        else:
            tx = None
            self._build_for_inference(bindings)
        self.FEATURE_CONVERTER_CLS = SystemBatches(self)
        # the model's task over the built system (t5x.eval / t5x.infer read it; t5x's vocabulary check compares
        # these with the task's, so another task's examples are refused)
        task = system_task.register(self.task, self.setup, self.eval_config)
        self.input_vocabulary = task.output_features["inputs"].vocabulary
        self.output_vocabulary = task.output_features["targets"].vocabulary
        super().__init__(optimizer_def=None if tx is None else optimizers.OptaxWrapper(tx))

    def _build_for_training(self, bindings):
        ignored = sorted(set(bindings) - {"model_dir", "train_steps", "batch_size", "feature_lengths", "task", "seed",
                                          "initial_checkpoint_path", "optimizer"})
        if ignored:
            log.info("t5x runs the loop: the experiment's train.%s do not apply (t5x's own settings do: "
                     "utils.SaveCheckpointConfig, train_script.train.*)", ", train.".join(ignored))
        # one writer per MODEL_DIR (locks.py), held until the process ends: a second run on it stops at once
        self._held.enter_context(locks.output_lock(self.model_dir, "t5x with a gr_jax model"))
        self.initial_checkpoint_path = bindings.get("initial_checkpoint_path")
        self.setup = gin_checks.call_configured(lambda: compose.prepare(
            model_dir=self.model_dir, batch_size=bindings["batch_size"], feature_lengths=bindings["feature_lengths"],
            task=bindings["task"], seed=self.seed, initial_checkpoint_path=self.initial_checkpoint_path))
        record = Path(self.model_dir) / SYSTEM_RECORD
        built = compose.provenance(self.setup)
        if record.exists():  # a t5x run resumed: the same system, or stop before t5x restores its checkpoint
            trainer.check_provenance(_read_record(record), built, str(record))
        else:
            write_text(record, json_text(built, indent=1, sort_keys=True))
        if self.initial_checkpoint_path:
            self._loaded = jax.device_get(compose.initial_params(self.setup, self.seed, self.initial_checkpoint_path))
        return bindings.get("optimizer") or trainer.make_optimizer(total_steps=self.train_steps)

    def _build_for_inference(self, bindings):
        """t5x.eval / t5x.infer: MODEL_DIR's system, checked against its record; the output directory held."""
        model_dir = Path(self.model_dir)
        record = model_dir / SYSTEM_RECORD
        if not record.is_file():
            raise T5xAdapterError(f"{record} is missing: MODEL_DIR holds no system trained by t5x with a gr_jax "
                                  f"model (python -m t5x.train with gr_jax/t5x/configs/); for a gr_jax.train "
                                  f"MODEL_DIR use python -m gr_jax.infer")
        where = "__main__.evaluate" if self.command == "eval" else "__main__.infer"
        # a path bound to t5x's parameter itself wins over the macro our tiers hand it (made absolute)
        checkpoint = _bound("utils.RestoreCheckpointConfig.path", _bound("CHECKPOINT_PATH/macro.value"))
        mode = _bound("utils.RestoreCheckpointConfig.mode")
        if checkpoint is not None:
            ckpt = Path(str(checkpoint))
            inside = ckpt.resolve() == model_dir.resolve() or ckpt.resolve().parent == model_dir.resolve()
            if not inside:
                raise T5xAdapterError(f"CHECKPOINT_PATH {str(ckpt)!r} is not in MODEL_DIR {self.model_dir!r}: the "
                                      f"vocabulary and docids a checkpoint was trained with are its MODEL_DIR's; "
                                      f"set MODEL_DIR to the run that wrote it")
            one = _STEP_DIR.match(ckpt.name)
            if self.command == "infer" and not one:
                steps = t5x_steps(model_dir) if model_dir.is_dir() else []
                newest = f"{self.model_dir}/checkpoint_{steps[-1]}" if steps else f"{self.model_dir}/checkpoint_<N>"
                raise T5xAdapterError(f"t5x.infer restores one checkpoint: add --gin.CHECKPOINT_PATH=\"'{newest}'\" "
                                      f"(MODEL_DIR has steps {steps})")
            if mode == "latest" and one:
                raise T5xAdapterError(f"CHECKPOINT_PATH {str(ckpt)!r} names one checkpoint but "
                                      f"RestoreCheckpointConfig.mode is 'latest' (the newest in a MODEL_DIR): add "
                                      f"--gin.utils.RestoreCheckpointConfig.mode=\"'specific'\"")
        dtype = _bound("utils.RestoreCheckpointConfig.dtype")
        if dtype not in (None, "float32"):
            raise T5xAdapterError(f"utils.RestoreCheckpointConfig.dtype = {dtype!r} casts the parameters, and the "
                                  f"run would differ from gr_jax.infer's; set 'float32' (configs/runs/*/t5x_run.gin)")
        output_dir = _bound(f"{where}.output_dir",
                            _bound(f"{'EVAL' if self.command == 'eval' else 'INFER'}_OUTPUT_DIR/macro.value"))
        if output_dir is None:
            raise T5xAdapterError(f"{where}.output_dir is not bound: set EVAL_OUTPUT_DIR / INFER_OUTPUT_DIR")
        if self.command == "infer":
            shards = _bound("__main__.infer.num_shards", 1)
            if shards != 1:
                raise T5xAdapterError(f"infer.num_shards = {shards}: a gr_jax run is written by one process for now "
                                      f"(multi-host inference is not written yet); leave num_shards = 1")
            done = sorted(Path(str(output_dir)).glob(f"{self.task}-*.COMPLETED"))
            if done:
                raise T5xAdapterError(f"{done[0]} exists: t5x.infer would skip task {self.task!r} and write nothing "
                                      f"new; choose a new INFER_OUTPUT_DIR (or delete that file to infer again)")
        self.setup = gin_checks.call_configured(lambda: compose.prepare(
            model_dir=self.model_dir, batch_size=1, feature_lengths=bindings["feature_lengths"],
            task=bindings["task"], with_training_data=False,
            initial_checkpoint_path=bindings.get("initial_checkpoint_path")))
        trainer.check_provenance(_read_record(record), compose.provenance(self.setup), str(record))
        if not self.setup.model.capabilities.traced_search:
            raise T5xAdapterError(f"{self.setup.model.describe()}: its ranking is not one traceable search (model "
                                  f"contract: traced_search), which t5x's partitioned infer step needs; convert "
                                  f"the checkpoint (python -m gr_jax.t5x.checkpoints) and run python -m "
                                  f"gr_jax.infer")
        # checked: now the output directory is held (one writer), before t5x writes anything there
        self._held.enter_context(locks.output_lock(str(output_dir), f"t5x.{self.command} with a gr_jax model"))
        if self.command == "infer":  # what t5x.infer's chunks will be of: a folder left by other settings is refused
            split = str(_bound("utils.DatasetConfig.split"))
            stamp = {"checkpoint": str(Path(str(checkpoint)).resolve()), "split": split, "num_beams": self.num_beams,
                     "batch_size": _bound("utils.DatasetConfig.batch_size"), "mode": _bound("__main__.infer.mode"),
                     "checkpoint_period": _bound("__main__.infer.checkpoint_period")}
            try:
                system_task.inference_stamp(Path(str(output_dir)) / f"tmp-{self.task}-00000-of-00001", stamp,
                                            system_task.judged_qids(self.setup.dataset, split))
            except ValueError as e:
                raise T5xAdapterError(str(e)) from None
        # the arrays the traced search reads, on the device before t5x traces it
        self.setup.index.device(), self.setup.index.device_payload()

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

    def _checked_params(self, params) -> dict:
        """t5x's restored parameters as our model's, refused when their dtypes are not those the model was trained
        with (a RestoreCheckpointConfig.dtype cast would change every score)."""
        ours = self.our_params(params)
        want = jax.eval_shape(lambda: self.setup.model.init_params(self.seed))
        got = {provenance.key_path(p): x.dtype for p, x in jax.tree_util.tree_flatten_with_path(ours)[0]}
        for path, x in jax.tree_util.tree_flatten_with_path(want)[0]:
            key = provenance.key_path(path)
            if key in got and got[key] != x.dtype:
                raise T5xAdapterError(f"parameter {key} is {got[key]} but the model holds {x.dtype}: set "
                                      f"utils.RestoreCheckpointConfig.dtype = '{x.dtype}'")
        return ours

    def _ranked_on_host(self, docs, valid, scores):
        """The model's ranker (numpy, as `rank` runs it) → per query the documents in trec order (score descending,
        ties by document id descending: `data.trec.ranked`) as rows + 1 [B, K] (0 pads) and scores [B, K]."""
        docs, valid, scores = np.asarray(docs), np.asarray(valid), np.asarray(scores)
        B, K = docs.shape[0], docs.shape[1] * docs.shape[2]
        q, d, sc = self.setup.model.ranker(docs, valid, scores)
        q, d, sc = np.asarray(q, np.int64), np.asarray(d, np.int64), np.asarray(sc, np.float64)
        order = np.lexsort((-self._doc_keys()[d], -sc, q))
        q, d, sc = q[order], d[order], sc[order]
        start = np.searchsorted(q, np.arange(B))
        place = np.arange(len(q)) - start[q]
        if len(q) and int(place.max()) >= K:
            raise T5xAdapterError(f"the ranker returned {int(place.max()) + 1} documents for a query, more than the "
                                  f"{K} slots of its beams")
        rows = np.zeros((B, K), np.int32)
        out = np.zeros((B, K), np.float32)
        rows[q, place] = d + 1
        out[q, place] = sc
        return rows, out

    def _doc_keys(self) -> np.ndarray:
        """Each corpus row's place among the document ids in string order (the tie key of trec order)."""
        if self._keys is None:
            ids = np.asarray([str(x) for x in self.setup.dataset.corpus.doc_ids], dtype=object)
            keys = np.empty(len(ids), np.int64)
            keys[np.argsort(ids, kind="stable")] = np.arange(len(ids))
            self._keys = keys  # assigned once complete: a callback on another thread never reads a half-filled one
        return self._keys

    _keys: Optional[np.ndarray] = None

    def predict_batch_with_aux(self, params, batch, rng=None, decoder_params=None, return_all_decodes=False,
                               num_decodes=None, prompt_with_targets=False):
        """Constrained beam search over the docid index (traced: t5x partitions this step) and the model's ranker —
        the default one on the device (`rankers.first_occurrence_ranked`), a method's own on the host through
        `jax.pure_callback`: (ranked corpus rows + 1 [B, K], {"scores": [B, K]}), K = beams × the most documents
        one docid holds. t5x's decoding options (`decoder_params`, `num_decodes`) do not apply:
        RetrieverModel.num_beams sets the beams."""
        del rng, decoder_params, return_all_decodes, num_decodes, prompt_with_targets
        model = self.setup.model
        docs, valid, scores = model.beam_documents(self._checked_params(params), batch["inputs"].astype(jnp.int32),
                                                   self.setup.index, self.num_beams)
        if type(model.ranker) is rankers.FirstOccurrence:  # the default ranker: on the device, no host round trip
            with jax.ensure_compile_time_eval():
                keys = jnp.asarray(self._doc_keys().astype(np.int32))
            rows, ranked = rankers.first_occurrence_ranked(docs, valid, scores, keys)
            return rows + 1, {"scores": ranked}
        B, N, P = docs.shape  # a method's own ranker (numpy): on the host, as `rank` runs it
        shapes = (jax.ShapeDtypeStruct((B, N * P), jnp.int32), jax.ShapeDtypeStruct((B, N * P), jnp.float32))
        rows, ranked = jax.pure_callback(self._ranked_on_host, shapes, docs, valid, scores.astype(jnp.float32))
        return rows, {"scores": ranked}

    def score_batch(self, params, batch, return_intermediates: bool = False):
        """log P(targets | inputs) of each example: the sum over the docid's tokens, padding ignored (`score`)."""
        if return_intermediates:
            raise T5xAdapterError("score_batch of a gr_jax model has no intermediates: set "
                                  "return_intermediates = False")
        table = self.setup.table
        if table is None or table.index_kind == "substrings":
            raise T5xAdapterError(f"{self.setup.scheme.name}: its docids are not target sequences to score")
        return self.setup.model.score(self._checked_params(params), batch["inputs"].astype(jnp.int32),
                                      batch["targets"].astype(jnp.int32))
