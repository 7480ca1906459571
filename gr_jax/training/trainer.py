"""The training loop: one linear, gin-configurable `train(...)`.

Order of work (and of resume), in one place:
 0. validate the numeric settings; check that every gin binding has been used once everything is built;
 1. load the dataset (`data/sources.py`), the vocabulary (a file, or a SentencePiece model trained on the
    corpus and kept in MODEL_DIR/vocabulary/ with what it was trained on), fit the docid scheme on the
    corpus — or, when MODEL_DIR already holds them, check what they were built from and load them, so that a
    resumed run sees the same docids;
 2. build training pairs (indexing + retrieval objectives), tokenize them to TASK_FEATURE_LENGTHS and mix
    them in a `MixtureIterator`;
 3. parameters: the newest intact checkpoint in MODEL_DIR/checkpoints if any (params, optimizer state,
    step, data-iterator state; its recorded vocabulary, corpus, docids and network must match — damaged
    ones are moved to MODEL_DIR/damaged_checkpoints/), else INITIAL_CHECKPOINT_PATH (a converted HF
    checkpoint, checked for NaN/inf; the vocabulary is grown for docid tokens), else a random init;
 4. loop: jit train step (data parallel over the mesh), NaN/Inf guard, scalars every `log_period` steps
    (TensorBoard + metrics.jsonl), evaluation every `eval_period` steps, checkpoints every
    `checkpoint_period` steps and at the end;
 5. final evaluation on `final_eval_split`: TREC run file, metrics JSON, optional BM25 on the same queries.

Dropout randomness is `fold_in(seed, step)`, so a resumed run draws what the uninterrupted run drew.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

from gr_jax import gin_checks, validation
from gr_jax.data import pairs as dsi_pairs
from gr_jax.data import sources
from gr_jax.data.pipeline import ExampleStore, MixtureIterator, eval_batches, tokenize
from gr_jax.data.readers import Dataset, fingerprint
from gr_jax.docids.atomic import AtomicDocids
from gr_jax.decoding import rankers
from gr_jax.docids.base import DocidTable, load_scheme_state, save_scheme, scheme_params
from gr_jax.docids.embed import TfidfSvdEmbedder
from gr_jax.docids.pseudo_query import queries_by_document
from gr_jax.errors import UserError
from gr_jax.evaluation.metrics import evaluate
from gr_jax.data.trec import Run, check_finite, write_run
from gr_jax.io_utils import atomic_dir, write_text
from gr_jax.models import convert, t5
from gr_jax.models.heads import TextHead
from gr_jax.models.retriever import GenerativeRetriever
from gr_jax.models.convert import grow_vocab
from gr_jax.vocab import load_vocabulary, train_sentencepiece
from gr_jax.training import partitioning

log = logging.getLogger(__name__)


class TrainingError(UserError, RuntimeError):
    """Training cannot go on (non-finite loss, inconsistent resume); the message says what to do."""


# ----------------------------------------------------------------------------------------------------------
# optimizer
# ----------------------------------------------------------------------------------------------------------


@gin.configurable
def make_optimizer(name: str = "adamw", learning_rate: float = 1e-3, warmup_steps: int = 0,
                   decay: str = "constant", total_steps: int = 0, end_factor: float = 0.0,
                   weight_decay: float = 0.01, clip_norm: Optional[float] = 1.0) -> optax.GradientTransformation:
    """AdamW or Adafactor with linear warm-up then constant / linear / cosine / rsqrt decay."""
    validation.number("make_optimizer.learning_rate", learning_rate)
    validation.integer("make_optimizer.warmup_steps", warmup_steps, minimum=0)
    validation.integer("make_optimizer.total_steps (TRAIN_STEPS in runs/train.gin)", total_steps, minimum=0)
    validation.number("make_optimizer.weight_decay", weight_decay, positive=False, minimum=0.0)
    validation.number("make_optimizer.end_factor", end_factor, positive=False, minimum=0.0)
    if clip_norm is not None:
        validation.number("make_optimizer.clip_norm", clip_norm)
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
    return optax.chain(*chain, optimizers[name]())


# ----------------------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------------------


@gin.configurable
@dataclasses.dataclass
class Objectives:
    """Which DSI objectives to train and their mixing rates (0 turns one off)."""

    indexing_rate: float = 1.0
    retrieval_rate: float = 1.0
    pseudo_query_rate: float = 0.0
    pseudo_query_split: str = "pseudo"
    index_with_title: bool = False
    all_docids: bool = False  # multi-docid schemes (pseudo-query, n-gram): one pair per docid, not per document
    chunk_rate: float = 0.0  # MDGR: chunk text → the docid of that chunk (schemes with `chunk_pairs`)

    def build(self, dataset: Dataset, train_split: str, rows: Optional[np.ndarray] = None):
        parts, rates = [], []
        if self.indexing_rate > 0:
            parts.append(dsi_pairs.indexing_pairs(dataset.corpus, rows, with_title=self.index_with_title))
            rates.append(self.indexing_rate)
        if self.retrieval_rate > 0:
            if train_split not in dataset.queries:
                raise ValueError(f"the dataset has no query split {train_split!r} (TRAIN_SPLIT); "
                                 f"it has {sorted(dataset.queries)}")
            parts.append(dsi_pairs.query_pairs(dataset.queries[train_split], dataset.qrels[train_split],
                                                dataset.corpus, restrict_rows=rows))
            rates.append(self.retrieval_rate)
        if self.pseudo_query_rate > 0:
            split = self.pseudo_query_split
            if split not in dataset.queries:
                raise ValueError(f"pseudo_query_rate > 0 but the dataset has no split {split!r}")
            parts.append(dsi_pairs.query_pairs(dataset.queries[split], dataset.qrels[split], dataset.corpus,
                                                name="pseudo-query", restrict_rows=rows))
            rates.append(self.pseudo_query_rate)
        if not parts:
            raise ValueError("every objective rate is 0: nothing to train on")
        return parts, rates


def _example_store(pairs, table: DocidTable, vocab, lengths: dict, all_docids: bool) -> ExampleStore:
    inputs = tokenize(pairs.texts, vocab, lengths["inputs"], what=pairs.name, progress=len(pairs) > 50000)
    if pairs.docid_index is not None:
        return ExampleStore({"inputs": inputs, "targets": table.targets_of(pairs.docid_index, lengths["targets"])})
    if not all_docids:
        return ExampleStore({"inputs": inputs, "targets": table.targets(pairs.rows, lengths["targets"])})
    pos, idx = table.all_docids(pairs.rows)  # each input once per docid of its document
    return ExampleStore({"inputs": inputs[pos], "targets": table.targets_of(idx, lengths["targets"])})


VOCAB_DIR = "vocabulary"  # MODEL_DIR/vocabulary/{spiece.model, provenance.json}: a vocabulary trained here


def _vocabulary_texts(dataset: Dataset, train_split: str) -> list[Sequence[str]]:
    texts = [dataset.corpus.texts]
    if train_split in dataset.queries:
        texts.append(dataset.queries[train_split].texts)
    return texts


def _vocabulary(vocabulary: Optional[str], model_dir: Path, dataset: Dataset, train_split: str, vocab_size: int,
                may_train: bool = True):
    """VOCABULARY when given; else the SentencePiece model this MODEL_DIR trained earlier — checked against
    what it was trained on — else (training only) a new one trained on the corpus and training queries."""
    if vocabulary:
        return load_vocabulary(vocabulary)
    vdir = model_dir / VOCAB_DIR
    texts = _vocabulary_texts(dataset, train_split)
    built_from = {"texts": fingerprint(*texts), "vocab_size": int(vocab_size)}
    if vdir.exists():
        try:
            saved = json.loads((vdir / "provenance.json").read_text())
        except (OSError, ValueError):
            raise ValueError(f"{vdir}: no readable provenance.json (what the vocabulary was trained on); delete "
                             f"{vdir} to train it again, or use a new MODEL_DIR") from None
        vocab = load_vocabulary(vdir / "spiece.model")
        if saved.get("spiece") != vocab.fingerprint:
            raise ValueError(f"{vdir / 'spiece.model'}: not the file its provenance.json describes (changed after "
                             f"it was trained); delete {vdir} to train it again, or use a new MODEL_DIR")
        differs = [k for k, v in built_from.items() if saved.get(k) != v]
        if differs:
            raise ValueError(f"{vdir}: the SentencePiece model there was trained on other "
                             f"{' and '.join('texts (corpus + training queries)' if k == 'texts' else k for k in differs)}"
                             f" than this run's; use the data and settings it was trained with "
                             f"(MODEL_DIR/config.gin), delete {vdir} to train a new one, or use a new MODEL_DIR")
        return vocab
    if not may_train:
        raise ValueError(f"{model_dir}: no vocabulary ({vdir} is missing and VOCABULARY is not set); point "
                         f"MODEL_DIR at a trained model or set --gin.VOCABULARY")
    log.info("no VOCABULARY given: training a %d-piece SentencePiece model on the corpus → %s", vocab_size, vdir)
    with atomic_dir(vdir) as tmp:
        vocab = train_sentencepiece([t for part in texts for t in part], tmp / "spiece.model", vocab_size)
        (tmp / "provenance.json").write_text(json.dumps({**built_from, "spiece": vocab.fingerprint}, indent=1))
    return load_vocabulary(vdir / "spiece.model")


def _table_digest(table: DocidTable) -> str:
    h = hashlib.sha256()
    for a in (table.sequences, table.lengths, table.doc_rows):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------------------------------------
# evaluation
# ----------------------------------------------------------------------------------------------------------


def retrieve(model: GenerativeRetriever, params, query_tokens: np.ndarray, qids: Sequence[str], index,
             doc_ids: Sequence[str], num_beams: int, batch_size: int, ranker: str = "first",
             mdgr_lambda: float = 1.0) -> Run:
    """Constrained beam search for every query → a run holding the ranker's scores. Documents with equal
    scores (a docid shared by several documents, equal MDGR scores) are ordered by document id as trec_eval
    orders them (`rankers.order`), never by corpus row, so the run does not depend on the corpus order."""
    run: Run = {}
    qid_iter = iter(qids)
    for batch, mask in eval_batches(ExampleStore({"inputs": query_tokens}), batch_size):  # one compiled shape
        for beams, real in zip(model.predict_beams(params, batch["inputs"], index, num_beams), mask):
            if real:
                scored = rankers.rank([docs for docs, _ in beams], [s for _, s in beams], ranker, mdgr_lambda,
                                      keys=doc_ids)
                run[str(next(qid_iter))] = {doc_ids[d]: score for d, score in scored}
    check_finite(run, "beam search")
    return run


@gin.configurable
@dataclasses.dataclass
class EvalConfig:
    split: str = "dev"
    final_split: Optional[str] = None  # None: same as `split`
    num_beams: int = 10
    batch_size: int = 32
    max_queries: int = 0  # 0: all (periodic evaluation only; the final evaluation uses every query)
    metrics: Sequence[str] = ("Hit@1", "Hit@10", "MRR@10")
    compare_bm25: bool = False
    ranker: str = "first"  # decoding/rankers.py: "first" (beam order) or "mdgr" (formula (8) of 000)
    mdgr_lambda: float = 1.0

    def validate(self) -> "EvalConfig":
        validation.integer("EvalConfig.num_beams", self.num_beams)
        validation.integer("EvalConfig.batch_size", self.batch_size)
        validation.integer("EvalConfig.max_queries (0: all)", self.max_queries, minimum=0)
        validation.number("EvalConfig.mdgr_lambda", self.mdgr_lambda, positive=False, minimum=0.0)
        if self.ranker not in rankers.RANKERS:
            raise ValueError(f"EvalConfig.ranker must be one of {rankers.RANKERS}, got {self.ranker!r}")
        return self


# ----------------------------------------------------------------------------------------------------------
# scalars
# ----------------------------------------------------------------------------------------------------------


class ScalarWriter:
    """metrics.jsonl always; TensorBoard event files when tensorboardX is importable."""

    def __init__(self, model_dir: Path, name: str):
        self.path = model_dir / f"{name}_metrics.jsonl"
        self._tb = None
        try:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(model_dir / "tensorboard" / name))
        except ImportError:
            log.info("tensorboardX not installed: scalars go to %s only", self.path)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **scalars}) + "\n")
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self):
        if self._tb is not None:
            self._tb.close()


# ----------------------------------------------------------------------------------------------------------
# the loop
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Setup:
    """Everything `train` builds before the loop; `prepare` returns it so tests and tools can reuse it."""

    model: GenerativeRetriever
    dataset: Dataset
    vocab: Any
    scheme: Any
    table: DocidTable
    index: Any
    iterator: Optional[MixtureIterator]  # None when prepared for inference only
    feature_lengths: dict[str, int]
    embedder: Any = None  # the fitted document embedder of numeric docids (new documents need the same one)


@gin.configurable
def prepare(model_dir: str, batch_size: int, feature_lengths: dict, task: str, seed: int = 0,
            train_split: str = "train", vocabulary: Optional[str] = None, vocab_size: int = 1000,
            network: t5.T5Config | str = "tiny", head=None, docid_scheme=None,
            objectives_config: Optional[Objectives] = None, initial_checkpoint_path: Optional[str] = None,
            score_mode: str = "log_softmax", embedder=None, with_training_data: bool = True,
            dataset: Optional[Dataset] = None) -> Setup:
    """`dataset` overrides loading `task` by name (the dynamic-corpora protocol passes its D0 part).
    `with_training_data=False` (inference): nothing is trained, fitted or written — the vocabulary and the
    docid-scheme state must already be in MODEL_DIR (or VOCABULARY given)."""
    model_dir = Path(model_dir)
    validation.integer("prepare.vocab_size", vocab_size, minimum=8)
    lengths = validation.feature_lengths("TASK_FEATURE_LENGTHS", feature_lengths)
    dataset = dataset if dataset is not None else sources.load_dataset(task)
    gin_checks.check_bindings_used(("train", "infer", "run_dynamic"))  # everything gin configures exists now
    vocab = _vocabulary(vocabulary, model_dir, dataset, train_split, vocab_size, may_train=with_training_data)

    scheme = docid_scheme if docid_scheme is not None else AtomicDocids()
    scheme_dir = model_dir / "docid_scheme"
    built_from = {"corpus": dataset.corpus.fingerprint(), "vocabulary": vocab.fingerprint,
                  "params": scheme_params(scheme)}
    embeddings, emb = None, None
    if getattr(scheme, "needs_embeddings", False):  # numeric docids: embed the corpus (deterministic)
        emb = embedder if embedder is not None else TfidfSvdEmbedder()
        built_from["embedder"] = {"class": type(emb).__name__, **scheme_params(emb)}
        embeddings = emb.fit(dataset.corpus.texts).embed(dataset.corpus.texts)
    extra = {}
    if getattr(scheme, "wants_queries", False) and getattr(scheme, "source", "train") == "train":
        extra["queries"] = queries_by_document(dataset, train_split)  # pseudo-query docids
        built_from["queries"] = fingerprint(sorted(f"{d}\t{q}" for d, qs in extra["queries"].items() for q in qs))
    if scheme_dir.exists():
        load_scheme_state(scheme, scheme_dir, built_from)
        if hasattr(scheme, "bind"):
            scheme.bind(vocab)
    elif not with_training_data:
        raise ValueError(f"{scheme_dir}: missing; inference needs the docid scheme state that training wrote "
                         f"(is MODEL_DIR a trained model?)")
    else:
        scheme.fit(dataset.corpus, embeddings=embeddings, vocab=vocab, **extra)
    table = scheme.assign(dataset.corpus, embeddings=embeddings)
    if not scheme_dir.exists():
        save_scheme(scheme, scheme_dir, built_from)
    head = head if head is not None else TextHead()
    if head.kind != table.space.kind:
        raise ValueError(f"docid scheme {scheme.name!r} makes {table.space.kind} docids but the model has a "
                         f"{head.kind} head; bind train.head to a matching head")

    if initial_checkpoint_path:
        config = convert.load_checkpoint_config(initial_checkpoint_path)
    else:
        config = t5.get_config(network) if isinstance(network, str) else network
        config = config.replace(vocab_size=vocab.size)
    if vocab.size > config.vocab_size:
        raise ValueError(f"vocabulary has {vocab.size} ids but the network's embedding only {config.vocab_size}; "
                         f"VOCABULARY does not belong to this network")
    if table.space.kind == "text" and table.space.end > config.vocab_size:
        config = config.replace(vocab_size=table.space.end)
    model = GenerativeRetriever(config, head, score_mode=score_mode)

    if lengths["targets"] < table.target_length:
        raise ValueError(f"TASK_FEATURE_LENGTHS['targets'] = {lengths['targets']} is shorter than the longest "
                         f"docid ({table.target_length} tokens); raise it")
    iterator = None
    if with_training_data:  # inference needs the docids and the index, not the tokenized training pairs
        validation.integer("BATCH_SIZE (train.batch_size)", batch_size)
        objs = objectives_config if objectives_config is not None else Objectives()
        pairs, rates = objs.build(dataset, train_split)
        if objs.chunk_rate > 0:
            if not hasattr(scheme, "chunk_pairs"):
                raise ValueError(f"Objectives.chunk_rate > 0 but docid scheme {scheme.name!r} has no chunks")
            texts, owners, idx = scheme.chunk_pairs()
            pairs.append(dsi_pairs.Pairs("chunk", list(texts), owners, docid_index=idx))
            rates.append(objs.chunk_rate)
        stores = [_example_store(p, table, vocab, lengths, objs.all_docids) for p in pairs]
        iterator = MixtureIterator(stores, batch_size, seed=seed, rates=rates, names=[p.name for p in pairs])
        log.info("training examples: %s", {p.name: len(s) for p, s in zip(pairs, stores)})
    log.info("docids: %s, %d documents, %s", scheme.name, len(dataset.corpus), table.stats())
    index = table.index(vocab_size=config.vocab_size) if table.space.kind == "text" else table.index()
    return Setup(model, dataset, vocab, scheme, table, index, iterator, lengths, emb)


def provenance(setup: Setup) -> dict:
    """What a checkpoint was trained with, recorded in it and checked on resume and inference."""
    return {"docid_scheme": setup.scheme.name, "docid_table_sha": _table_digest(setup.table),
            "docid_space": setup.table.space.to_json(), "config": json.loads(setup.model.config.to_json()),
            "vocabulary": setup.vocab.fingerprint, "corpus": setup.dataset.corpus.fingerprint()}


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
    """Every recorded item of `saved` must equal `now`; otherwise a TrainingError lists what differs."""
    differs = [k for k in _PROVENANCE_FIXES if k in saved and saved[k] != now.get(k)]
    if differs:
        raise TrainingError(f"{where}: " + "; ".join(_PROVENANCE_FIXES[k] for k in differs)
                            + ". Or use a new MODEL_DIR.")


def _initial_params(setup: Setup, seed: int, initial_checkpoint_path: Optional[str]) -> dict:
    model = setup.model
    params = model.init_params(seed)
    if initial_checkpoint_path:
        ckpt_config, network = convert.load_checkpoint(initial_checkpoint_path)
        for path, leaf in jax.tree_util.tree_leaves_with_path(network):
            if not np.isfinite(np.asarray(leaf)).all():
                raise TrainingError(f"INITIAL_CHECKPOINT_PATH {initial_checkpoint_path}: parameter "
                                    f"{jax.tree_util.keystr(path)} holds NaN/inf values; the checkpoint is "
                                    f"damaged — convert it again (tools/convert_checkpoint.py)")
        if model.config.vocab_size > ckpt_config.vocab_size:
            network, _ = grow_vocab(network, ckpt_config, model.config.vocab_size, seed=seed)
        params["network"] = jax.tree_util.tree_map(jnp.asarray, network)
        log.info("initialised the network from %s", initial_checkpoint_path)
    return params


def _make_train_step(model: GenerativeRetriever, tx: optax.GradientTransformation):
    def step(state, batch, dropout_key):
        rng = jax.random.fold_in(dropout_key, state["step"])
        (loss, sums), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(state["params"], batch, rng)
        grad_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree_util.tree_leaves(grads)))
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        keep = lambda new, old: jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new, old)
        new_state = {"step": state["step"] + 1, "params": keep(params, state["params"]),
                     "opt_state": keep(opt_state, state["opt_state"]),
                     "nonfinite": state["nonfinite"] + (~finite).astype(jnp.int32)}
        return new_state, {**sums, "grad_norm": grad_norm}

    return step


def _checkpoint_manager(model_dir: Path, keep: int) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, cleanup_tmp_directories=True,
                                           enable_async_checkpointing=False)
    return ocp.CheckpointManager((model_dir / "checkpoints").absolute(), options=options)


def _set_aside(model_dir: Path, step: int) -> Path:
    """Moves a damaged checkpoint out of checkpoints/ (kept for inspection, never deleted)."""
    dest_dir = model_dir / "damaged_checkpoints"
    dest_dir.mkdir(exist_ok=True)
    dest, n = dest_dir / str(step), 1
    while dest.exists():
        dest, n = dest_dir / f"{step}-{n}", n + 1
    (model_dir / "checkpoints" / str(step)).rename(dest)
    return dest


def restore_latest_intact(model_dir: Path, keep: int, template, meta: dict):
    """(manager, step, restored items) of the newest checkpoint that restores, or (manager, None, None).

    A checkpoint whose files cannot be read (a truncated array file, a missing metadata file) is moved to
    MODEL_DIR/damaged_checkpoints/ with a warning and the next older one is tried; if checkpoints exist but
    none is intact, a TrainingError. A checkpoint that reads but was trained with other data, vocabulary,
    docids or network (its recorded provenance) stops with a TrainingError: it is not damaged, the run is."""
    manager = _checkpoint_manager(model_dir, keep)
    damaged = []
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            saved = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        except Exception as e:  # orbax/tensorstore raise many types for unreadable files
            saved, error = None, e
        if saved is not None:
            check_provenance(saved, meta, f"{model_dir / 'checkpoints' / str(step)}")
            try:
                restored = manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(template), data=ocp.args.JsonRestore()))
                if damaged:
                    log.warning("resuming from step %d, the newest intact checkpoint", step)
                return manager, step, restored
            except Exception as e:  # as above
                error = e
        where = _set_aside(model_dir, step)
        damaged.append(step)
        log.warning("checkpoint %s is damaged (%s: %s); moved to %s", model_dir / "checkpoints" / str(step),
                    type(error).__name__, str(error).splitlines()[0][:200] if str(error) else "", where)
        manager = _checkpoint_manager(model_dir, keep)  # it caches the list of steps
    set_aside = model_dir / "damaged_checkpoints"
    if damaged or (set_aside.is_dir() and any(set_aside.iterdir())):  # never restart silently over a run
        raise TrainingError(f"{model_dir / 'checkpoints'}: no intact checkpoint (damaged ones are in {set_aside}"
                            f"{f', steps {damaged} moved there now' if damaged else ''}); to start over, use a new "
                            f"MODEL_DIR or delete {model_dir}")
    return manager, None, None


def evaluate_split(setup: Setup, params, split: str, eval_config: EvalConfig, max_queries: int = 0):
    ds = setup.dataset
    if split not in ds.queries:
        raise ValueError(f"evaluation split {split!r} not in the dataset (it has {sorted(ds.queries)})")
    queries, qrels = ds.queries[split], ds.qrels[split]
    qids = [q for q in queries.qids if q in qrels]
    if max_queries:
        qids = qids[:max_queries]
    text_of = dict(zip(queries.qids, queries.texts))
    tokens = tokenize([text_of[q] for q in qids], setup.vocab, setup.feature_lengths["inputs"], what=split)
    run = retrieve(setup.model, params, tokens, qids, setup.index, ds.corpus.doc_ids, eval_config.num_beams,
                   eval_config.batch_size, eval_config.ranker, eval_config.mdgr_lambda)
    sub = {q: qrels[q] for q in qids}
    return run, sub, evaluate(run, sub, eval_config.metrics, missing_as_zero=True)


def _validate_train(train_steps, batch_size, log_period, eval_period, checkpoint_period, keep_checkpoints,
                    num_partitions, seed) -> None:
    validation.integer("TRAIN_STEPS (train.train_steps)", train_steps)
    validation.integer("BATCH_SIZE (train.batch_size)", batch_size)
    validation.integer("train.log_period", log_period)
    validation.integer("train.eval_period (0: no periodic evaluation)", eval_period, minimum=0)
    validation.integer("train.checkpoint_period", checkpoint_period)
    validation.integer("train.keep_checkpoints", keep_checkpoints)
    validation.integer("train.num_partitions", num_partitions)
    validation.integer("SEED (train.seed)", seed, minimum=0)


@gin.configurable
def train(model_dir: str = gin.REQUIRED, train_steps: int = gin.REQUIRED, batch_size: int = gin.REQUIRED,
          feature_lengths: dict = gin.REQUIRED, task: str = gin.REQUIRED, seed: int = 0,
          initial_checkpoint_path: Optional[str] = None, optimizer: Optional[optax.GradientTransformation] = None,
          log_period: int = 50, eval_period: int = 0, checkpoint_period: int = 500, keep_checkpoints: int = 3,
          eval_config: Optional[EvalConfig] = None, num_partitions: int = 1, progress: bool = True,
          final_eval: bool = True, step_callback: Optional[Callable[[int], None]] = None,
          dataset: Optional[Dataset] = None) -> dict:
    """Trains, checkpoints and evaluates; returns a summary (final metrics, paths). `dataset` overrides
    loading `task` by name."""
    t_start = time.time()
    _validate_train(train_steps, batch_size, log_period, eval_period, checkpoint_period, keep_checkpoints,
                    num_partitions, seed)
    validation.feature_lengths("TASK_FEATURE_LENGTHS (train.feature_lengths)", feature_lengths)
    eval_config = (eval_config or EvalConfig()).validate()
    model_dir = Path(model_dir)
    if model_dir.exists() and not model_dir.is_dir():
        raise ValueError(f"MODEL_DIR {model_dir} is a file, not a directory; choose another MODEL_DIR")
    tx = optimizer if optimizer is not None else make_optimizer(total_steps=train_steps)
    setup = prepare(model_dir=str(model_dir), batch_size=batch_size, feature_lengths=feature_lengths, task=task,
                    seed=seed, initial_checkpoint_path=initial_checkpoint_path, dataset=dataset)
    write_text(model_dir / "config.gin", gin.config_str(), keep_previous=True)  # the configuration of this run
    model, iterator = setup.model, setup.iterator

    mesh = partitioning.make_mesh(num_partitions)
    if batch_size % mesh.shape["data"]:
        raise ValueError(f"BATCH_SIZE {batch_size} is not divisible by the {mesh.shape['data']} data-parallel devices")
    params = _initial_params(setup, seed, initial_checkpoint_path)
    p_shard = partitioning.param_shardings(partitioning.retriever_param_specs(model.config, params["head"]), mesh)
    params = jax.device_put(params, p_shard)
    opt_state = jax.jit(tx.init)(params)
    scalar = partitioning.replicated(mesh)
    state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": opt_state,
             "nonfinite": jnp.zeros((), jnp.int32)}
    state_shardings = jax.tree_util.tree_map(lambda x: x.sharding if x.ndim else scalar, state)

    meta = provenance(setup)
    template = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, state)
    manager, latest, restored = restore_latest_intact(model_dir, keep_checkpoints, template, meta)
    resumed_from = latest
    if restored is not None:
        state = restored["state"]
        iterator.set_state(restored["data"])
        log.info("resumed from %s at step %d", model_dir / "checkpoints", latest)

    b_shard = partitioning.batch_sharding(mesh)
    state = jax.device_put(state, state_shardings)  # one layout in and out: the step compiles once
    step_fn = jax.jit(_make_train_step(model, tx), in_shardings=(state_shardings, b_shard, scalar),
                      out_shardings=(state_shardings, scalar), donate_argnums=(0,))
    dropout_key = jax.random.PRNGKey(seed + 1)
    writer = ScalarWriter(model_dir, "train")
    eval_writer = ScalarWriter(model_dir, "eval")
    saved_steps = [latest] if latest is not None else []

    def save(step: int):
        manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                   data=ocp.args.JsonSave(iterator.get_state()),
                                                   meta=ocp.args.JsonSave(meta)), force=True)
        manager.wait_until_finished()
        saved_steps.append(step)

    step = int(state["step"])
    if step > train_steps:
        raise TrainingError(f"{model_dir / 'checkpoints'} holds step {step}, past TRAIN_STEPS = {train_steps}; "
                            f"raise TRAIN_STEPS or use a new MODEL_DIR")
    acc: dict[str, float] = {}
    t_log, steps_since = time.time(), 0
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=train_steps, initial=step, desc="train", unit="step", mininterval=1.0)
    while step < train_steps:
        batch = jax.device_put(next(iterator), b_shard)
        state, sums = step_fn(state, batch, dropout_key)
        step += 1
        steps_since += 1
        for k, v in sums.items():
            acc[k] = acc.get(k, 0.0) + v
        if step_callback is not None:
            step_callback(step)
        if step % log_period == 0 or step == train_steps:
            host = {k: float(v) for k, v in jax.device_get(acc).items()}
            if int(state["nonfinite"]) > 0:
                raise TrainingError(_nonfinite_message(model_dir, step - steps_since, step, saved_steps,
                                                       initial_checkpoint_path))
            dt = time.time() - t_log
            scalars = {"loss": host["loss_sum"] / max(host["tokens"], 1.0),
                       "token_accuracy": host["correct_tokens"] / max(host["tokens"], 1.0),
                       "docid_accuracy": host["correct_docids"] / max(host["docids"], 1.0),
                       "grad_norm": host["grad_norm"] / steps_since, "steps_per_s": steps_since / dt,
                       "epoch": float(np.mean(iterator.epochs()))}
            writer.write(step, scalars)
            if bar is not None:
                bar.set_postfix(loss=f"{scalars['loss']:.3f}", acc=f"{scalars['docid_accuracy']:.2f}")
            acc, t_log, steps_since = {}, time.time(), 0
        if bar is not None:
            bar.update(1)
        if eval_period and step % eval_period == 0 and step < train_steps:
            _, _, m = evaluate_split(setup, state["params"], eval_config.split, eval_config,
                                     eval_config.max_queries)
            eval_writer.write(step, m)
            log.info("step %d %s: %s", step, eval_config.split, m)
        if step % checkpoint_period == 0 or step == train_steps:
            save(step)
    if bar is not None:
        bar.close()
    writer.close()
    log.info("training done: step %d in %.1f s%s", step, time.time() - t_start,
             f" (resumed from step {resumed_from})" if resumed_from is not None else "")
    summary = {"model_dir": str(model_dir), "steps": step, "checkpoint": str(model_dir / "checkpoints" / str(step))}
    if final_eval:  # the same file names as `infer`, and nothing time-dependent: a re-run writes the same files
        split = eval_config.final_split or eval_config.split
        run, qrels, metrics = evaluate_split(setup, state["params"], split, eval_config)
        run_path = model_dir / "runs" / f"{split}.step{step}.run"
        write_run(run_path, run)
        summary.update({"split": split, "queries": len(qrels), "num_beams": eval_config.num_beams,
                        "ranker": eval_config.ranker, "metrics": metrics, "run": str(run_path)})
        if eval_config.compare_bm25:
            summary["bm25_metrics"] = bm25_metrics(setup.dataset, split, qrels, eval_config)
        eval_writer.write(step, {f"final/{k}": v for k, v in metrics.items()})
        write_text(model_dir / "final_metrics.json", json.dumps(summary, indent=1), keep_previous=True)
    eval_writer.close()
    summary["train_seconds"] = round(time.time() - t_start, 1)
    summary["resumed_from"] = resumed_from
    summary["state"] = state
    summary["setup"] = setup  # model, docids, index, vocabulary: callers that go on (dynamic corpora) reuse it
    return summary


def _nonfinite_message(model_dir: Path, first: int, last: int, saved_steps: list, initial: Optional[str]) -> str:
    msg = (f"loss or gradient became NaN/Inf between steps {first} and {last} (updates were skipped); lower "
           f"make_optimizer.learning_rate or check the data")
    if saved_steps:
        return f"{msg}; the last good checkpoint is {model_dir / 'checkpoints' / str(saved_steps[-1])}"
    msg += "; no checkpoint was saved before this"
    if initial:
        msg += f" — the parameters came from INITIAL_CHECKPOINT_PATH {initial}: check that checkpoint"
    return msg


def bm25_metrics(dataset: Dataset, split: str, qrels, eval_config: EvalConfig) -> dict[str, float]:
    from gr_jax.baselines.bm25 import BM25

    bm25 = BM25.build(list(dataset.corpus.doc_ids), list(dataset.corpus.texts))
    queries = dataset.queries[split]
    text_of = dict(zip(queries.qids, queries.texts))
    qids = list(qrels)
    run = bm25.search(qids, [text_of[q] for q in qids], k=max(10, eval_config.num_beams))
    return evaluate(run, qrels, eval_config.metrics, missing_as_zero=True)


@gin.configurable
def infer(model_dir: str = gin.REQUIRED, split: str = "dev", num_beams: int = 10, step: Optional[int] = None,
          evaluate: bool = False, batch_size: int = 32) -> dict:
    """Queries of `split` → TREC run with the checkpoint of `step` (default: latest) in `model_dir`.

    Refuses a vocabulary, corpus or docid table other than the checkpoint's (its recorded provenance). The
    run goes to MODEL_DIR/runs/<split>.step<N>.run (and `.metrics.json` with `evaluate`); an earlier,
    different result there is kept as `.prev-<n>` (io_utils)."""
    validation.integer("NUM_BEAMS (infer.num_beams)", num_beams)
    validation.integer("infer.batch_size", batch_size)
    if step is not None:
        validation.integer("CHECKPOINT_STEP (infer.step)", step, minimum=0)
    cfg = EvalConfig(split=split, num_beams=num_beams, batch_size=batch_size).validate()  # before prepare's
    model_dir = Path(model_dir)                                                          # check of bindings
    ckpt_dir = (model_dir / "checkpoints").absolute()
    if not ckpt_dir.is_dir():
        raise ValueError(f"{model_dir}: no checkpoints/ directory; train first or fix MODEL_DIR")
    manager = ocp.CheckpointManager(ckpt_dir, options=ocp.CheckpointManagerOptions(create=False))  # reads only
    step = manager.latest_step() if step is None else step
    if step is None or step not in manager.all_steps():
        raise ValueError(f"{ckpt_dir}: no checkpoint for step {step} (have {list(manager.all_steps())})")
    setup = gin_checks.call_configured(lambda: prepare(
        model_dir=str(model_dir), batch_size=1, feature_lengths=_macro("TASK_FEATURE_LENGTHS"),
        task=_macro("MIXTURE_OR_TASK_NAME"), with_training_data=False))
    where = ckpt_dir / str(step)
    try:
        saved = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:  # orbax/tensorstore raise many types for unreadable files
        raise TrainingError(f"{where}: cannot read the checkpoint's metadata ({type(e).__name__}); choose another "
                            f"CHECKPOINT_STEP (have {list(manager.all_steps())})") from None
    check_provenance(saved, provenance(setup), str(where))
    try:
        restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    except Exception as e:  # as above
        raise TrainingError(f"{where}: damaged, its parameters cannot be read ({type(e).__name__}); choose "
                            f"another CHECKPOINT_STEP (have {list(manager.all_steps())})") from None
    params = restored["state"]["params"]
    run, qrels, metrics = evaluate_split(setup, params, split, cfg)
    run_path = model_dir / "runs" / f"{split}.step{step}.run"
    write_run(run_path, run)
    out = {"run": str(run_path), "step": step, "split": split, "queries": len(run), "num_beams": num_beams,
           "ranker": cfg.ranker}
    if evaluate:
        out["metrics"] = metrics
        write_text(run_path.with_suffix(".metrics.json"), json.dumps(out, indent=1), keep_previous=True)
    return out


def _macro(name: str):
    return gin.query_parameter(f"{name}/macro.value")
