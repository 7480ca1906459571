"""The composition root: a retrieval system built from gin (`prepare` → `Setup`: data, vocabulary, docid scheme,
index, model, training batches), trained with the trainer's loop (`train`), restored from a trained MODEL_DIR
(`restore`), imported from a network trained elsewhere (`import_checkpoint`), fine-tuned further (`fine_tune`),
and evaluated (`evaluate_split`, `infer`). Entry points and protocols use these public functions; `prepare`,
`Setup` and the starting parameters are built in `run_setup.py` (re-exported here).

It names no method. What differs between methods comes in through gin (the docid scheme, `prepare.model_fn`,
the objectives config, the ranker and decoding hooks) and through declared capabilities: the model contract's
(`retriever/contract.py`), the docid scheme's (`docids/base.py`: e.g. docids `decoded_by_model`), and the
starting-checkpoint loaders a method registers (`training/initial.py`).

Order of work of `train` (and of resume), in one place:
 0. validate the numeric settings; once everything gin configures is built, every binding must have been used;
 1. the dataset (`data/sources.py`), the vocabulary (`training/vocabulary.py`), the docid scheme (its state in
    MODEL_DIR/docid_scheme/, checked against what it was built from, or fitted now), the docid table, the prefix
    tree, the model;
 2. training batches from the objectives config (`training/objectives.py`: indexing, retrieval, pseudo-query,
    the scheme's own pairs; a method's own config), tokenized to TASK_FEATURE_LENGTHS;
 3. parameters: a random init from the seed, or INITIAL_CHECKPOINT_PATH through its loader (checked for NaN/inf;
    the vocabulary grown for docid tokens);
 4. `trainer.fit`: resumes from the newest intact checkpoint whose recorded provenance (vocabulary, corpus,
    docids, network) matches, then runs the loop; docids decoded by the model are decoded again every
    `refresh_period` steps;
 5. the final evaluation on `EvalConfig.final_split`: run file, metrics JSON, optional BM25 on the same queries.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import shutil
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import gin
import jax
import numpy as np
import optax
import orbax.checkpoint as ocp

from gr_jax.runtime import distributed, gin_checks, io_utils, locks, validation
from gr_jax.data import pairs as dsi_pairs
from gr_jax.data.pipeline import MixtureIterator, tokenize
from gr_jax.data.readers import Dataset
from gr_jax.data.trec import write_run
from gr_jax.docids.base import DocidTable
from gr_jax.evaluation.metrics import evaluate
from gr_jax.evaluation.retrieval import EvalConfig, evaluation_settings, retrieve
from gr_jax.runtime.io_utils import json_text, write_text
from gr_jax.runtime.run_dir import RunDir
from gr_jax.training import lora, partitioning, trainer
from gr_jax.training.objectives import Objectives
from gr_jax.training.sam import sam
from gr_jax.training.trainer import TrainingError, check_provenance
from gr_jax.runtime.validation import Count
from gr_jax.run_setup import (  # noqa: F401  (re-exported: compose.prepare, compose.Setup, ...)
    COMMANDS,
    Setup,
    _docid_scheme,
    _network_config,
    decode_model_docids,
    initial_params,
    prepare,
    provenance,
    trainable,
    use_model_docids,
    write_model_docids,
)

log = logging.getLogger(__name__)



# ----------------------------------------------------------------------------------------------------------
# evaluation
# ----------------------------------------------------------------------------------------------------------


def evaluate_split(setup: Setup, params, split: str, eval_config: EvalConfig, max_queries: int = 0):
    """(run, qrels of the evaluated queries, metrics) of the judged queries of `split`, taken by query id (the
    first `max_queries`; 0: all) — never in the order of the query file. In a multi-process run each process
    searches its block of them and every process gets the whole run (`distributed.share`, `gather_json`)."""
    ds = setup.dataset
    if split not in ds.queries:
        raise ValueError(f"evaluation split {split!r} not in the dataset (it has {sorted(ds.queries)})")
    queries, qrels = ds.queries[split], ds.qrels[split]
    qids = sorted(q for q in queries.qids if q in qrels)
    if max_queries:
        qids = qids[:max_queries]
    text_of = dict(zip(queries.qids, queries.texts))
    mine = distributed.share(qids)  # with several processes: this one's block of the queries
    tokens = tokenize([text_of[q] for q in mine], setup.vocab, setup.feature_lengths["inputs"], what=split)
    run = retrieve(setup.model, params, tokens, mine, setup.index, ds.corpus.doc_ids, eval_config.num_beams,
                   eval_config.batch_size)
    run = {q: r for part in distributed.gather_json(run) for q, r in part.items()}
    sub = {q: qrels[q] for q in qids}
    return run, sub, evaluate(run, sub, eval_config.metrics, eval_config.threshold(split), missing_as_zero=True)


def bm25_metrics(dataset: Dataset, split: str, qrels, eval_config: EvalConfig) -> dict[str, float]:
    """BM25 on the same queries, for the table beside the model."""
    from gr_jax.baselines.bm25 import BM25

    bm25 = BM25.build(list(dataset.corpus.doc_ids), list(dataset.corpus.texts))
    queries = dataset.queries[split]
    text_of = dict(zip(queries.qids, queries.texts))
    qids = list(qrels)
    run = bm25.search(qids, [text_of[q] for q in qids], k=max(10, eval_config.num_beams))
    return evaluate(run, qrels, eval_config.metrics, eval_config.threshold(split), missing_as_zero=True)


# ----------------------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------------------


@gin_checks.entry_configurable
def train(model_dir: str = gin.REQUIRED, train_steps: Count = gin.REQUIRED, batch_size: Count = gin.REQUIRED,
          feature_lengths: dict = gin.REQUIRED, task: str = gin.REQUIRED, seed: int = 0,
          initial_checkpoint_path: Optional[str] = None, optimizer: Optional[optax.GradientTransformation] = None,
          log_period: Count = 50, eval_period: int = 0, checkpoint_period: Count = 500, keep_checkpoints: Count = 3,
          eval_config: Optional[EvalConfig] = None, num_partitions: Count = 1, progress: bool = True,
          final_eval: bool = True, step_callback: Optional[Callable[[int], None]] = None,
          dataset: Optional[Dataset] = None) -> dict:
    """Builds the system, trains it (`trainer.fit`), evaluates it; returns a summary (final metrics, paths,
    and the built `setup` and final `state` for callers that go on). `dataset` overrides loading `task`."""
    t_start = time.time()
    trainer.validate_loop(train_steps, batch_size, log_period, eval_period, checkpoint_period, keep_checkpoints,
                          num_partitions, seed)
    validation.feature_lengths("TASK_FEATURE_LENGTHS (train.feature_lengths)", feature_lengths)
    eval_config = (eval_config or EvalConfig()).validate()
    model_dir = Path(model_dir)
    if model_dir.exists() and not model_dir.is_dir():
        raise ValueError(f"MODEL_DIR {model_dir} is a file, not a directory; choose another MODEL_DIR")
    tx = optimizer if optimizer is not None else trainer.make_optimizer(total_steps=train_steps)
    rules = partitioning.logical_rules()  # gin's layout of the parameters on the mesh, read before the check
    with distributed.primary_first("prepare"):  # process 0 writes the vocabulary and docid scheme, the others read
        setup = prepare(model_dir=str(model_dir), batch_size=batch_size, feature_lengths=feature_lengths,
                        task=task, seed=seed, initial_checkpoint_path=initial_checkpoint_path, dataset=dataset)

    decoded = setup.scheme.decoded_by_model

    def periodic(params):
        return _periodic_metrics(setup, params, eval_config)

    def redecode(step, params):
        log.info("step %d: decoding every document's docid with the current parameters", step)
        use_model_docids(setup, decode_model_docids(setup, params))
        new = setup.objectives.on_refresh(step, params, setup.model, setup.table, setup.document_tokens())
        if new is not None:  # the objectives rewrote parameters (GenRET's new codebook): the docids follow them
            use_model_docids(setup, decode_model_docids(setup, new))
        return new

    loop = trainer.LoopConfig(train_steps, batch_size, seed=seed, log_period=log_period,
                              checkpoint_period=checkpoint_period, keep_checkpoints=keep_checkpoints,
                              num_partitions=num_partitions, progress=progress,
                              started_from=initial_checkpoint_path, rules=rules)
    hooks = [trainer.OnStart(lambda: _write(RunDir(model_dir).config, gin.config_str()))]
    if step_callback is not None:
        hooks.append(trainer.EveryStep(step_callback))
    if decoded:
        hooks.append(trainer.Refresh(redecode, setup.refresh_period))
    hooks.append(trainer.Evaluate(periodic, eval_period))
    params = initial_params(setup, seed, initial_checkpoint_path)
    loop = dataclasses.replace(loop, trainable=trainable(setup, params))
    out = trainer.fit(setup.model, params, setup.iterator, tx, run_dir=model_dir, loop=loop,
                      meta=provenance(setup), hooks=hooks)
    state, step = out["state"], out["step"]
    params = distributed.local(state["params"])  # the searches run on this process's devices
    if setup.adapters is not None:  # folded into their kernels: the same function, one product per projection
        params = lora.merge(params)
    summary = {"model_dir": str(model_dir), "steps": step, "checkpoint": out["checkpoint"]}
    if decoded:  # the final docids: decoded with the final parameters, written in the scheme's format
        use_model_docids(setup, decode_model_docids(setup, params))
        if io_utils.writes():  # process 0 of a multi-process run
            summary["docids"] = str(write_model_docids(setup, model_dir, step))
    if final_eval:
        summary.update(_final_evaluation(setup, params, step, eval_config, model_dir))
        _write(RunDir(model_dir).final_metrics, json_text(summary, indent=1))
    summary["train_seconds"] = round(time.time() - t_start, 1)
    summary["resumed_from"] = out["resumed_from"]
    summary["state"] = state
    summary["setup"] = setup  # model, docids, index, vocabulary: callers that go on (dynamic corpora) reuse it
    return summary


def _write(path: Path, text: str) -> None:
    """A result file, kept-previous; written by process 0 only in a multi-process run."""
    if io_utils.writes():
        write_text(path, text, keep_previous=True)


def _periodic_metrics(setup: Setup, params, eval_config: EvalConfig) -> dict:
    """Metrics of a periodic evaluation. Docids decoded by the model are decoded with these parameters for it,
    on a copy: training keeps its own until its next refresh."""
    if not setup.scheme.decoded_by_model:
        return evaluate_split(setup, params, eval_config.split, eval_config, eval_config.max_queries)[2]
    kept = setup.table
    table = decode_model_docids(setup, params)
    evaluator = dataclasses.replace(setup, table=table, index=table.index(vocab_size=setup.model.config.vocab_size),
                                    iterator=None)
    setup.model.use_docids(table)
    try:
        return evaluate_split(evaluator, params, eval_config.split, eval_config, eval_config.max_queries)[2]
    finally:
        setup.model.use_docids(kept)


def _final_evaluation(setup: Setup, params, step: int, eval_config: EvalConfig, model_dir: Path) -> dict:
    """The final evaluation: the same file names as `infer`, and nothing time-dependent, so a re-run writes the
    same files (MODEL_DIR/runs/<split>.step<N>.run, TensorBoard scalars; `train` writes final_metrics.json)."""
    split = eval_config.final_split or eval_config.split
    run, qrels, metrics = evaluate_split(setup, params, split, eval_config)
    run_path = RunDir(model_dir).run(split, step)
    if io_utils.writes():  # process 0 of a multi-process run
        write_run(run_path, run)
    out = {"system": f"GR: {setup.scheme.name} docids, {type(setup.model).__name__}", "split": split,
           "queries": len(qrels), "num_beams": eval_config.num_beams,
           "ranker": _describe(setup.model.ranker), "metrics": metrics,
           "run": str(run_path)}
    if eval_config.compare_bm25:
        out["bm25_metrics"] = bm25_metrics(setup.dataset, split, qrels, eval_config)
    writer = trainer.ScalarWriter(model_dir, "eval", resumed_at=step - 1)  # a re-run replaces its final line
    writer.write(step, {f"final/{k}": v for k, v in metrics.items()})
    writer.close()
    return out


def fine_tune(setup: Setup, params, parts: Sequence[dsi_pairs.Pairs], rates: Sequence[float], table: DocidTable,
              *, model_dir: Path, steps: int, batch_size: int, learning_rate: float, seed: int = 0,
              sam_rho: float = 0.0, meta_extra: Optional[dict] = None) -> dict:
    """More training of a built system on other pairs (DSI++ replay in the dynamic protocol) through the same
    loop — sharding, NaN guard, checkpoints in `model_dir` (a re-run resumes) —; the run's objectives config
    makes the examples (`ObjectivesConfig.examples`: DSI's targets are the rows' docids in `table`). AdamW, inside
    sharpness-aware minimisation when `sam_rho` > 0 (`training/sam.py`). Returns the new parameters."""
    objs = setup.objectives if setup.objectives is not None else Objectives()
    stores = [objs.examples(p, table, setup.vocab, setup.feature_lengths) for p in parts]
    iterator = MixtureIterator(stores, batch_size, seed=seed, rates=list(rates), names=[p.name for p in parts])
    tx = optax.adamw(validation.number("fine_tune learning_rate", learning_rate), weight_decay=0.0)
    if validation.number("fine_tune sam_rho (0: no SAM)", sam_rho, positive=False, minimum=0.0):
        tx = sam(tx, sam_rho)
    loop = trainer.LoopConfig(steps, batch_size, seed=seed, log_period=max(1, min(50, steps)),
                              checkpoint_period=steps, keep_checkpoints=1, progress=False, name="fine_tune")
    out = trainer.fit(setup.model, params, iterator, tx, run_dir=model_dir, loop=loop,
                      meta={**provenance(setup), "docid_table_sha": table.digest(), **(meta_extra or {})})
    return out["state"]["params"]


def restore(model_dir: str | Path, step: Optional[int] = None) -> tuple[Setup, dict, int]:
    """A trained system from MODEL_DIR: (setup for inference, parameters, step) — the checkpoint of `step`
    (default: the latest). The task, feature lengths and starting checkpoint are the run's own (its recorded
    config.gin: `recorded_training`); the rest of the configuration (data files, vocabulary, docid scheme,
    network) comes from gin, as for training, and must match the checkpoint's recorded provenance."""
    model_dir = Path(model_dir)
    ckpt_dir = RunDir(model_dir).checkpoints.absolute()
    if not ckpt_dir.is_dir():
        raise ValueError(f"{model_dir}: no checkpoints/ directory; train first or fix MODEL_DIR")
    manager = ocp.CheckpointManager(ckpt_dir, options=ocp.CheckpointManagerOptions(create=False))  # reads only
    step = manager.latest_step() if step is None else step
    if step is None or step not in manager.all_steps():
        raise ValueError(f"{ckpt_dir}: no checkpoint for step {step} (have {list(manager.all_steps())})")
    run = recorded_training(model_dir)
    setup = gin_checks.call_configured(lambda: prepare(
        model_dir=str(model_dir), batch_size=1, feature_lengths=run["feature_lengths"], task=run["task"],
        with_training_data=False, initial_checkpoint_path=run["initial_checkpoint_path"]))  # as training built it
    where = ckpt_dir / str(step)
    try:
        saved = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:  # orbax/tensorstore raise many types for unreadable files
        raise TrainingError(f"{where}: cannot read the checkpoint's metadata ({type(e).__name__}); choose another "
                            f"CHECKPOINT_STEP (have {list(manager.all_steps())})") from None
    now = provenance(setup)
    base = None
    if lora.FROZEN_DIGEST in saved:  # the checkpoint holds the trained part (LoRA's adapters): the rest is read
        if setup.adapters is None and not setup.frozen:
            raise TrainingError(f"{where}: holds the trained part of the parameters only (a LoRA run, or one with "
                                f"frozen parameters): give the run's prepare.adapters / prepare.frozen "
                                f"(MODEL_DIR/config.gin) to restore it")
        base = initial_params(setup, run["seed"], run["initial_checkpoint_path"])
        partition = trainer.Partition(base, trainable(setup, base))
        base = partition.split(base)[1]  # the frozen part
        now[lora.FROZEN_DIGEST] = partition.digest(base)
    check_provenance(saved, now, str(where))
    try:
        restored = trainer.read_checkpoint(manager, step, where)
    except trainer.DamagedCheckpoint as e:
        raise trainer.DamagedCheckpoint(f"{e}; choose another CHECKPOINT_STEP (have {list(manager.all_steps())})") \
            from None
    params = restored["state"]["params"]
    if base is not None:  # the starting parameters' frozen part with the trained one; adapters folded in
        params = lora.merge(partition.join(params, base))
    if setup.scheme.decoded_by_model:  # the checkpoint's docids are its own decodings
        use_model_docids(setup, decode_model_docids(setup, params))
    return setup, params, step


def recorded_training(model_dir: str | Path) -> dict:
    """What a trained MODEL_DIR was trained on, from its recorded config.gin: {'task', 'feature_lengths',
    'initial_checkpoint_path', 'seed'}. A value the record lacks (a run recorded before a setting existed) is the current
    configuration's; a current value that differs from the recorded one is named in a log line, and the
    recorded one is used — a restored system is the one that was trained."""
    rec = RunDir(model_dir).recorded("train.task", "train.feature_lengths", "train.initial_checkpoint_path",
                                     "train.seed")
    out = {}
    for key, macro, default in (("task", "MIXTURE_OR_TASK_NAME", gin_checks.REQUIRED),
                                ("feature_lengths", "TASK_FEATURE_LENGTHS", gin_checks.REQUIRED),
                                ("initial_checkpoint_path", "INITIAL_CHECKPOINT_PATH", None),
                                ("seed", "SEED", 0)):
        current = gin_checks.macro(macro, None if f"train.{key}" in rec else default)
        if f"train.{key}" not in rec:
            out[key] = current
            continue
        out[key] = rec[f"train.{key}"]
        if current is not None and current != out[key]:
            log.info("%s: the run was trained with train.%s = %r (its config.gin); the current %s = %r is not "
                     "used", model_dir, key, out[key], macro, current)
    return out


def import_checkpoint(model_dir: str, initial_checkpoint_path: str, feature_lengths: dict, task: str) -> dict:
    """A network trained elsewhere (a method's released HF model, a converted T5) → MODEL_DIR/checkpoints/0 that
    `restore` / `python -m gr_jax.infer` read, with the vocabulary, docid scheme state, docid table and
    prefix tree the experiment file configures (e.g. a released docid file bound on the scheme) for `task` at
    `feature_lengths`. Nothing is trained. The MODEL_DIR is for inference, or as INITIAL_CHECKPOINT_PATH of a
    training run (it holds no optimizer state to resume)."""
    model_dir = Path(model_dir)
    if not initial_checkpoint_path:
        raise ValueError("INITIAL_CHECKPOINT_PATH is not set: name the network to import (an HF T5 directory, a "
                         "converted checkpoint or a trained MODEL_DIR)")
    if RunDir(model_dir).checkpoints.exists():
        raise ValueError(f"MODEL_DIR {model_dir} already holds checkpoints/; import into a new MODEL_DIR")
    before = set(model_dir.iterdir()) if model_dir.is_dir() else set()
    try:
        return _import(model_dir, initial_checkpoint_path, feature_lengths, task)
    except BaseException:
        for made in (set(model_dir.iterdir()) if model_dir.is_dir() else set()) - before:
            log.warning("the import failed: removing %s, which it had written", made)
            if made.is_dir() and not made.is_symlink():
                shutil.rmtree(made)
            else:
                made.unlink()
        raise


def _import(model_dir: Path, initial_checkpoint_path: str, feature_lengths: dict, task: str) -> dict:
    setup = gin_checks.call_configured(lambda: prepare(
        model_dir=str(model_dir), batch_size=1, feature_lengths=feature_lengths, task=task, with_training_data=False,
        may_fit=True, initial_checkpoint_path=initial_checkpoint_path))
    params = initial_params(setup, 0, initial_checkpoint_path)
    if setup.scheme.decoded_by_model:
        use_model_docids(setup, decode_model_docids(setup, params))
    manager = ocp.CheckpointManager(RunDir(model_dir).checkpoints.absolute(),
                                    options=ocp.CheckpointManagerOptions(create=True))
    state = {"step": np.zeros((), np.int32), "params": jax.device_get(params), "nonfinite": np.zeros((), np.int32)}
    trainer.save_checkpoint(manager, 0, state, meta=provenance(setup))
    locks.accept()
    write_text(RunDir(model_dir).config, gin.config_str(), keep_previous=True)
    out = {"model_dir": str(model_dir), "checkpoint": str(RunDir(model_dir).checkpoint(0)),
           "imported_from": str(initial_checkpoint_path), "docids": setup.table.stats()}
    if setup.scheme.decoded_by_model:
        out["docid_file"] = str(write_model_docids(setup, model_dir, 0))
    write_text(RunDir(model_dir).imported, json_text(out, indent=1), keep_previous=True)
    return out


@gin_checks.entry_configurable(not_under="t5x.infer")  # t5x.infer looks its own `infer` up by that name
def infer(model_dir: str = gin.REQUIRED, step: Optional[int] = None, evaluate: bool = False,
          split: Optional[str] = None, num_beams: Optional[Count] = None, batch_size: Optional[Count] = None) -> dict:
    """Queries of a split → TREC run with the checkpoint of `step` (default: latest) in `model_dir`.

    The split, the number of beams and the batch size are `EvalConfig`'s, as the experiment binds them (the
    command line's `--gin.EvalConfig.num_beams=…` over the file's); `split`, `num_beams`, `batch_size` are
    their earlier names in gin (read as EvalConfig's) and, from Python, values that replace them.
    Refuses a vocabulary, corpus or docid table other than the checkpoint's (its recorded provenance). The
    run goes to MODEL_DIR/runs/<split>.step<N>.run (and `.metrics.json` with `evaluate`); an earlier,
    different result there is kept as `.prev-<n>` (io_utils)."""
    if step is not None:
        validation.integer("CHECKPOINT_STEP (infer.step)", step, minimum=0)
    cfg = evaluation_settings(split, num_beams, batch_size)  # before prepare's check of bindings
    split, num_beams = cfg.split, cfg.num_beams
    setup, params, step = restore(model_dir, step)
    model_dir = Path(model_dir)
    run, qrels, metrics = evaluate_split(setup, params, split, cfg)  # over several processes: split, gathered
    run_path = RunDir(model_dir).run(split, step)
    if io_utils.writes():  # process 0 of a multi-process run
        write_run(run_path, run)
    out = {"run": str(run_path), "step": step, "split": split, "queries": len(run), "num_beams": num_beams,
           "model": setup.model.describe(), "ranker": _describe(setup.model.ranker)}
    if evaluate:
        out["metrics"] = metrics
        _write(run_path.with_suffix(".metrics.json"), json_text(out, indent=1))
    return out


def _describe(obj) -> str:
    """A stable description for result files (a dataclass's repr; otherwise its type, never an address)."""
    if dataclasses.is_dataclass(obj):
        return repr(obj)
    return obj.__name__ if inspect.isfunction(obj) or inspect.isclass(obj) else type(obj).__name__


