"""The composition root: a retrieval system built from gin — data, vocabulary, docid scheme, index, model,
training pairs (`prepare` → `Setup`) —, trained with the trainer's loop (`train`), restored from a trained
MODEL_DIR (`restore`), fine-tuned further (`fine_tune`), and used to retrieve (`retrieve`, `evaluate_split`,
`infer`). Entry points and protocols use these public functions; `training/trainer.py` knows only its loop.

Order of work of `train` (and of resume), in one place:
 0. validate the numeric settings; once everything gin configures is built, every binding must have been used;
 1. the dataset (`data/sources.py`), the vocabulary (VOCABULARY; or MODEL_DIR/vocabulary/, checked against
    what it was trained on; or a SentencePiece model trained now on the corpus and training queries), the
    docid scheme (its state in MODEL_DIR/docid_scheme/, checked against what it was built from, or fitted
    now), the docid table, the prefix tree, the model;
 2. training pairs (`Objectives`: indexing, retrieval, pseudo-query, chunk), tokenized to
    TASK_FEATURE_LENGTHS and mixed in a `MixtureIterator`;
 3. parameters: a random init from the seed, or INITIAL_CHECKPOINT_PATH (checked for NaN/inf; the
    vocabulary grown for docid tokens);
 4. `trainer.fit`: resumes from the newest intact checkpoint whose recorded provenance (vocabulary, corpus,
    docids, network) matches, then runs the loop;
 5. the final evaluation on `EvalConfig.final_split`: run file, metrics JSON, optional BM25 on the same queries.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

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
from gr_jax.data.trec import Run, check_finite, write_run
from gr_jax.docids.atomic import AtomicDocids
from gr_jax.docids.base import DocidTable, FitContext, load_scheme_state, save_scheme, scheme_params
from gr_jax.docids.embed import TfidfSvdEmbedder
from gr_jax.docids.pseudo_query import queries_by_document, read_queries_file
from gr_jax.evaluation.metrics import evaluate
from gr_jax.io_utils import atomic_dir, write_text
from gr_jax.models import convert, llama_io, t5
from gr_jax.models.convert import grow_vocab
from gr_jax.models.heads import head_for_space
from gr_jax.models.retriever import GenerativeRetriever
from gr_jax.training import trainer
from gr_jax.training.trainer import TrainingError, check_provenance
from gr_jax.vocab import load_vocabulary, train_sentencepiece

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------------
# training pairs
# ----------------------------------------------------------------------------------------------------------


@gin.configurable
@dataclasses.dataclass
class Objectives:
    """Which DSI objectives to train and their mixing rates (0 turns one off)."""

    indexing_rate: float = 1.0
    retrieval_rate: float = 1.0
    pseudo_query_rate: float = 0.0
    pseudo_query_split: str = "pseudo"
    pseudo_queries_file: Optional[str] = None  # generated queries (doc → queries) instead of the split
    index_with_title: bool = False
    all_docids: bool = False  # multi-docid schemes (pseudo-query, n-gram): one pair per docid, not per document
    scheme_pairs_rate: float = 0.0  # the scheme's own pairs (MDGR: chunk → its docid), `training_pairs()`

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
            if self.pseudo_queries_file:
                parts.append(dsi_pairs.document_query_pairs(read_queries_file(self.pseudo_queries_file),
                                                            dataset.corpus, name="pseudo-query",
                                                            restrict_rows=rows, source=self.pseudo_queries_file))
            else:
                split = self.pseudo_query_split
                if split not in dataset.queries:
                    raise ValueError(f"pseudo_query_rate > 0 but the dataset has no split {split!r}; bind "
                                     f"Objectives.pseudo_queries_file to generated queries "
                                     f"(python -m gr_jax.pseudo_queries)")
                parts.append(dsi_pairs.query_pairs(dataset.queries[split], dataset.qrels[split], dataset.corpus,
                                                    name="pseudo-query", restrict_rows=rows))
            rates.append(self.pseudo_query_rate)
        if not parts and self.scheme_pairs_rate <= 0:
            raise ValueError("every objective rate is 0: nothing to train on")
        return parts, rates

    refresh_period = 0  # the DSI pairs need docids fixed before training

    def iterator(self, inp: "ObjectiveInputs") -> MixtureIterator:
        """The DSI training batches: the pairs of `build` (and the scheme's own) tokenized and mixed."""
        pairs, rates = self.build(inp.dataset, inp.train_split)
        if self.scheme_pairs_rate > 0:
            extra = inp.scheme.training_pairs()
            if not extra:
                raise ValueError(f"Objectives.scheme_pairs_rate > 0 but docid scheme {inp.scheme.name!r} makes no "
                                 f"training pairs of its own")
            pairs += extra
            rates += [self.scheme_pairs_rate / len(extra)] * len(extra)
        if inp.table is None:
            raise ValueError(f"the DSI objectives need docids before training, but docid scheme "
                             f"{inp.scheme.name!r} is decoded by the model; bind its own objectives config "
                             f"(GLEN: prepare.objectives_config = @GlenPhase2())")
        stores = [_example_store(p, inp.table, inp.vocab, inp.lengths, self.all_docids) for p in pairs]
        log.info("training examples: %s", {p.name: len(s) for p, s in zip(pairs, stores)})
        return MixtureIterator(stores, inp.batch_size, seed=inp.seed, rates=rates, names=[p.name for p in pairs])


@dataclasses.dataclass
class ObjectiveInputs:
    """What an objectives config (`Objectives`, `GlenPhase2`) may build its training batches from. An
    objectives config offers `iterator(inputs)` and `refresh_period` (how often decoded docids are decoded
    again; 0: never after the start). One that accepts docids decoded by the model (`table` None) returns
    batches with `set_docids(docids_by_row)`: the composition calls it whenever the docids are decoded."""

    dataset: Dataset
    train_split: str
    scheme: Any
    table: Optional[DocidTable]  # None when the docids are decoded by the model (GLEN)
    vocab: Any
    lengths: dict
    batch_size: int
    seed: int
    doc_tokens: Callable[[], np.ndarray]  # the corpus tokenized to lengths['documents'], by row

    def bm25_candidates(self, pairs: dsi_pairs.Pairs, depth: int) -> np.ndarray:
        """For each pair, the top-`depth` BM25 documents of its query other than the query's judged positives
        (corpus rows [n, depth], −1 where BM25 returns fewer); equal scores ordered by document id."""
        from gr_jax.baselines.bm25 import BM25

        corpus = self.dataset.corpus
        bm25 = BM25.build(list(corpus.doc_ids), list(corpus.texts))
        positives: dict[str, set] = {}
        text_of = {}
        for q, t, r in zip(pairs.qids, pairs.texts, pairs.rows):
            positives.setdefault(q, set()).add(int(r))
            text_of[q] = t
        qids = sorted(text_of)
        run = bm25.search(qids, [text_of[q] for q in qids], k=depth + max(len(v) for v in positives.values()))
        out = np.full((len(pairs), depth), -1, np.int64)
        for i, (q, r) in enumerate(zip(pairs.qids, pairs.rows)):
            ranked = sorted(run.get(q, {}).items(), key=lambda kv: (-kv[1], kv[0]))
            rows = [corpus.index_of(d) for d, _ in ranked]
            rows = [x for x in rows if x not in positives[q]][:depth]
            out[i, : len(rows)] = rows
        return out


def _example_store(pairs, table: DocidTable, vocab, lengths: dict, all_docids: bool) -> ExampleStore:
    inputs = tokenize(pairs.texts, vocab, lengths["inputs"], what=pairs.name, progress=len(pairs) > 50000)
    if pairs.docid_index is not None:
        return ExampleStore({"inputs": inputs, "targets": table.targets_of(pairs.docid_index, lengths["targets"])})
    if not all_docids:
        return ExampleStore({"inputs": inputs, "targets": table.targets(pairs.rows, lengths["targets"])})
    pos, idx = table.all_docids(pairs.rows)  # each input once per docid of its document
    return ExampleStore({"inputs": inputs[pos], "targets": table.targets_of(idx, lengths["targets"])})


# ----------------------------------------------------------------------------------------------------------
# state reused across runs: vocabulary, docid table digest
# ----------------------------------------------------------------------------------------------------------


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
        if llama_io.is_lm_spec(vocabulary):  # a decoder-only LM's own tokenizer
            return llama_io.lm_vocabulary(vocabulary)
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
    for a in (table.sequences, table.lengths, table.doc_rows) + (() if table.weights is None else (table.weights,)):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]



# ----------------------------------------------------------------------------------------------------------
# evaluation
# ----------------------------------------------------------------------------------------------------------


@gin.configurable
@dataclasses.dataclass
class EvalConfig:
    """How a trained system is evaluated (which documents a beam's docid yields is the model's ranker)."""

    split: str = "dev"
    final_split: Optional[str] = None  # None: same as `split`
    num_beams: int = 10
    batch_size: int = 32
    max_queries: int = 0  # 0: all (periodic evaluation only; the final evaluation uses every query)
    metrics: Sequence[str] = ("Hit@1", "Hit@10", "MRR@10")
    compare_bm25: bool = False
    # binary measures count grades ≥ this as relevant: one value, or {split: value} (others 1; TREC DL: 2)
    rel_threshold: Any = 1

    def threshold(self, split: str) -> int:
        t = self.rel_threshold.get(split, 1) if isinstance(self.rel_threshold, Mapping) else self.rel_threshold
        validation.integer(f"EvalConfig.rel_threshold ({split})", t)
        return int(t)

    def validate(self) -> "EvalConfig":
        validation.integer("EvalConfig.num_beams", self.num_beams)
        if isinstance(self.rel_threshold, Mapping):
            for split in self.rel_threshold:
                self.threshold(split)
        else:
            self.threshold(self.split)
        validation.integer("EvalConfig.batch_size", self.batch_size)
        validation.integer("EvalConfig.max_queries (0: all)", self.max_queries, minimum=0)
        return self


def retrieve(model, params, query_tokens: np.ndarray, qids: Sequence[str], index, doc_ids: Sequence[str],
             num_beams: int, batch_size: int, plan_tokens: Optional[np.ndarray] = None) -> Run:
    """Constrained beam search for every query → a run holding the ranker's scores. The beams' documents are
    gathered on the device and ranked as arrays (`model.rank`); documents with equal scores (a docid shared
    by several documents, equal MDGR scores) are ordered by document id when the run is read, as trec_eval
    orders them — never by corpus row, so the run does not depend on the corpus order. With `plan_tokens`
    (a planning model, row by row with the queries), each query is searched under the plan of its row there
    (`model.rank_with_plan`)."""
    run: Run = {}
    ids = np.asarray(doc_ids, dtype=object)
    qids = [str(q) for q in qids]
    done = 0
    store = {"inputs": query_tokens} if plan_tokens is None else {"inputs": query_tokens, "plan": plan_tokens}
    for batch, mask in eval_batches(ExampleStore(store), batch_size):  # one compiled shape
        if plan_tokens is None:
            q, d, s = model.rank(params, batch["inputs"], index, num_beams)
        else:
            q, d, s = model.rank_with_plan(params, batch["inputs"], batch["plan"], index, num_beams)
        o = np.argsort(q, kind="stable")  # grouped by query (the library's rankers already are)
        q, names, scores = np.asarray(q)[o], ids[np.asarray(d)[o]], np.asarray(s, np.float64)[o].tolist()
        bounds = np.searchsorted(q, np.arange(len(mask) + 1))
        for b in range(int(np.sum(mask))):
            run[qids[done + b]] = dict(zip(names[bounds[b]:bounds[b + 1]], scores[bounds[b]:bounds[b + 1]]))
        done += int(np.sum(mask))
    check_finite(run, "beam search")
    return run


# ----------------------------------------------------------------------------------------------------------
# building a system
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Setup:
    """Everything `train` builds before the loop; `prepare` returns it so tests, tools and protocols reuse it."""

    model: Any  # GenerativeRetriever, or another model object with the same methods
    dataset: Dataset
    vocab: Any
    scheme: Any
    table: Optional[DocidTable]  # None until decoded when the scheme is decoded by the model (GLEN)
    index: Any
    iterator: Optional[MixtureIterator]  # None when prepared for inference only
    feature_lengths: dict[str, int]
    embedder: Any = None  # the fitted document embedder of numeric docids (new documents need the same one)
    refresh_period: int = 0  # decoded docids: re-decoded every this many training steps (0: at the start only)
    _doc_tokens: Optional[np.ndarray] = dataclasses.field(default=None, repr=False)
    # (config, network) of an HF INITIAL_CHECKPOINT_PATH, read once by `prepare` (its config needs the tensors)
    # and handed to `initial_params`, which drops it
    _initial: Optional[tuple] = dataclasses.field(default=None, repr=False)

    def document_tokens(self) -> np.ndarray:
        """The corpus tokenized to TASK_FEATURE_LENGTHS['documents'] (else 'inputs'), by row; computed once."""
        if self._doc_tokens is None:
            length = self.feature_lengths.get("documents", self.feature_lengths["inputs"])
            self._doc_tokens = tokenize(self.dataset.corpus.texts, self.vocab, length, what="documents",
                                        progress=len(self.dataset.corpus) > 50000)
        return self._doc_tokens


@gin.configurable
def prepare(model_dir: str, batch_size: int, feature_lengths: dict, task: str, seed: int = 0,
            train_split: str = "train", vocabulary: Optional[str] = None, vocab_size: int = 1000,
            network: t5.T5Config | str = "tiny", head=None, docid_scheme=None,
            objectives_config: Optional[Objectives] = None, initial_checkpoint_path: Optional[str] = None,
            score_mode: str = "log_softmax", embedder=None, with_training_data: bool = True,
            dataset: Optional[Dataset] = None, model_fn: Optional[Callable] = None, may_fit: bool = False) -> Setup:
    """`dataset` overrides loading `task` by name (the dynamic-corpora protocol passes its D0 part). The
    docid head follows from the docid table's token space (`heads.head_for_space`): bind `prepare.head`
    only to override its other settings; a head that disagrees with the space is an error.
    `with_training_data=False` (inference): nothing is trained, fitted or written — the vocabulary and the
    docid-scheme state must already be in MODEL_DIR (or VOCABULARY given); with `may_fit` (importing a
    network trained elsewhere) the docid scheme is fitted and saved when MODEL_DIR has none. `model_fn(config, head,
    score_mode=...)` builds the model object (default `GenerativeRetriever`, whose objective, ranker and
    decoding hooks gin binds)."""
    model_dir = Path(model_dir)
    validation.integer("prepare.vocab_size", vocab_size, minimum=8)
    lengths = validation.feature_lengths("TASK_FEATURE_LENGTHS", feature_lengths)
    dataset = dataset if dataset is not None else sources.load_dataset(task)
    # everything gin configures exists now, except the model object, built below: checked again then
    gin_checks.check_bindings_used(("train", "infer", "run_dynamic"), allow=("GenerativeRetriever",))
    pretrained_lm = llama_io.is_lm_spec(initial_checkpoint_path)  # a decoder-only LM (GGUF, HF dir, name)
    if pretrained_lm and model_fn is None:
        raise ValueError(f"INITIAL_CHECKPOINT_PATH {initial_checkpoint_path} is a decoder-only LM: set "
                         f"prepare.model_fn = @DecoderOnlyRetriever (e.g. experiments/demo/dsi_url_smollm2.gin)")
    if initial_checkpoint_path and not pretrained_lm and not Path(initial_checkpoint_path).exists():
        raise ValueError(f"INITIAL_CHECKPOINT_PATH {initial_checkpoint_path} does not exist: point it at a trained "
                         f"MODEL_DIR, an HF T5 directory or a converted checkpoint (GLEN's phase 2 starts from "
                         f"the MODEL_DIR of its phase-1 run: train that first)")
    if initial_checkpoint_path and _is_trained_run(initial_checkpoint_path):
        vocabulary = _initial_run_vocabulary(initial_checkpoint_path, vocabulary)
    vocab = _vocabulary(vocabulary, model_dir, dataset, train_split, vocab_size, may_train=with_training_data)

    scheme = docid_scheme if docid_scheme is not None else AtomicDocids()
    scheme_dir = model_dir / "docid_scheme"
    built_from = {"corpus": dataset.corpus.fingerprint(), "vocabulary": vocab.fingerprint,
                  "params": scheme_params(scheme)}
    embeddings, emb = None, None
    if scheme.needs_embeddings:  # numeric docids: embed the corpus (deterministic)
        emb = embedder if embedder is not None else TfidfSvdEmbedder()
        built_from["embedder"] = {"class": type(emb).__name__, **scheme_params(emb)}
        embeddings = emb.fit(dataset.corpus.texts).embed(dataset.corpus.texts)
    queries = None
    if scheme.uses_training_queries:  # pseudo-query docids
        queries = queries_by_document(dataset, train_split)
        built_from["queries"] = fingerprint(sorted(f"{d}\t{q}" for d, qs in queries.items() for q in qs))
    if scheme_dir.exists():
        load_scheme_state(scheme, scheme_dir, built_from)
        scheme.bind(vocab)
    elif not with_training_data and not may_fit:
        raise ValueError(f"{scheme_dir}: missing; inference needs the docid scheme state that training wrote "
                         f"(is MODEL_DIR a trained model?)")
    else:
        scheme.fit(dataset.corpus, FitContext(vocab=vocab, embeddings=embeddings, queries=queries))

    initial = None
    if pretrained_lm:
        lm_config, lm_params, _, _ = llama_io.load_lm(initial_checkpoint_path)
        initial = (lm_config, lm_params)
        config = lm_config
    elif initial_checkpoint_path:
        initial = _initial_network(initial_checkpoint_path) if _is_hf_dir(initial_checkpoint_path) else None
        config = initial[0] if initial else _initial_config(initial_checkpoint_path)
    else:
        config = t5.get_config(network) if isinstance(network, str) else network
        config = config.replace(vocab_size=vocab.size)
    if vocab.size > config.vocab_size:
        raise ValueError(f"vocabulary has {vocab.size} ids but the network's embedding only {config.vocab_size}; "
                         f"VOCABULARY does not belong to this network")
    # docids decoded by the model (GLEN) exist once there are parameters (`decode_model_docids`)
    table = None if scheme.decoded_by_model else scheme.assign(dataset.corpus, embeddings=embeddings)
    if not scheme_dir.exists():
        save_scheme(scheme, scheme_dir, built_from)
    space = scheme.space(config.vocab_size) if table is None else table.space
    head = head_for_space(space, head, scheme.name)
    if space.kind == "text" and space.end > config.vocab_size:
        config = config.replace(vocab_size=space.end)
    model = (model_fn or GenerativeRetriever)(config, head, score_mode=score_mode)
    if table is not None:
        model.use_docids(table)
    gin_checks.check_bindings_used(("train", "infer", "run_dynamic"))

    target_length = space.length if table is None else table.target_length
    if lengths["targets"] < target_length:
        raise ValueError(f"TASK_FEATURE_LENGTHS['targets'] = {lengths['targets']} is shorter than the longest "
                         f"docid ({target_length} tokens); raise it")
    setup = Setup(model, dataset, vocab, scheme, table, None, None, lengths, emb)
    if with_training_data or may_fit:  # inference restores its own parameters: nothing kept for it
        setup._initial = initial
    if with_training_data:  # inference needs the docids and the index, not the tokenized training pairs
        validation.integer("BATCH_SIZE (train.batch_size)", batch_size)
        objs = objectives_config if objectives_config is not None else Objectives()
        setup.iterator = objs.iterator(ObjectiveInputs(dataset, train_split, scheme, table, vocab, lengths,
                                                       batch_size, seed, setup.document_tokens))
        setup.refresh_period = objs.refresh_period
    if table is not None:
        log.info("docids: %s, %d documents, %s", scheme.name, len(dataset.corpus), table.stats())
        setup.index = table.index(vocab_size=config.vocab_size) if table.space.kind == "text" else table.index()
    return setup


def decode_model_docids(setup: Setup, params) -> DocidTable:
    """The docids of a scheme decoded by the model (GLEN): every document decoded greedily with `params`
    (tokenized to TASK_FEATURE_LENGTHS['documents'], else 'inputs') → the scheme's DocidTable."""
    tokens, logits = setup.model.decode_docids(params, setup.document_tokens())
    return setup.scheme.table(tokens, logits, np.arange(len(tokens)), setup.model.config.vocab_size)


def use_model_docids(setup: Setup, table: DocidTable) -> None:
    """Installs decoded docids: the setup's table and prefix tree, the model's docid weights, and the training
    batches' docids (prefix-aware negatives)."""
    setup.table = table
    setup.index = table.index(vocab_size=setup.model.config.vocab_size)
    setup.model.use_docids(table)
    if setup.iterator is not None:  # batches built for decoded docids follow them (`ObjectiveInputs`)
        setup.iterator.set_docids(table.sequences)
    log.info("docids decoded by the model: %s", table.stats())



# ----------------------------------------------------------------------------------------------------------
# starting from another trained run (INITIAL_CHECKPOINT_PATH = a MODEL_DIR: GLEN's phase 2 from phase 1)
# ----------------------------------------------------------------------------------------------------------


def _is_trained_run(path) -> bool:
    return (Path(path) / "checkpoints").is_dir()


def _trained_run(path) -> tuple[ocp.CheckpointManager, int, dict]:
    """(checkpoint manager, latest step, its recorded provenance) of a MODEL_DIR trained here."""
    ckpt_dir = (Path(path) / "checkpoints").absolute()
    manager = ocp.CheckpointManager(ckpt_dir, options=ocp.CheckpointManagerOptions(create=False))
    step = manager.latest_step()
    if step is None:
        raise ValueError(f"INITIAL_CHECKPOINT_PATH {path}: a MODEL_DIR without any checkpoint; train it first")
    try:
        meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:  # orbax/tensorstore raise many types for unreadable files
        raise TrainingError(f"INITIAL_CHECKPOINT_PATH {ckpt_dir / str(step)}: cannot read its metadata "
                            f"({type(e).__name__})") from None
    return manager, step, meta


def _initial_run_vocabulary(path, vocabulary: Optional[str]) -> str:
    """A run continued from a trained MODEL_DIR uses that run's vocabulary: VOCABULARY if it is the same one,
    else the MODEL_DIR's own SentencePiece model."""
    _, step, meta = _trained_run(path)
    chosen = vocabulary or str(Path(path) / VOCAB_DIR / "spiece.model")
    if not Path(chosen).exists():
        raise ValueError(f"INITIAL_CHECKPOINT_PATH {path}: no {VOCAB_DIR}/spiece.model there and no VOCABULARY "
                         f"given; set --gin.VOCABULARY to the vocabulary that run was trained with")
    if load_vocabulary(chosen).fingerprint != meta.get("vocabulary"):
        raise ValueError(f"VOCABULARY {chosen} is not the vocabulary INITIAL_CHECKPOINT_PATH {path} was trained "
                         f"with (its checkpoint {step} records another); leave VOCABULARY unset to use that run's")
    return chosen


def _is_hf_dir(path) -> bool:
    """An HF T5 directory (config.json without our format tag, next to its weights)."""
    try:
        meta = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") != convert.FORMAT_TAG


def _initial_config(path) -> t5.T5Config:
    """The config of a trained MODEL_DIR or a converted checkpoint (an HF directory's needs its tensors:
    `prepare` reads those once with `_initial_network`)."""
    if _is_trained_run(path):
        return t5.T5Config.from_dict(_trained_run(path)[2]["config"])
    return convert.load_checkpoint_config(path)


def _initial_network(path) -> tuple[t5.T5Config, dict]:
    """The network parameters of INITIAL_CHECKPOINT_PATH: a converted checkpoint, an HF T5 directory (GLEN's
    released model is one; GLEN's phase-1 layout is refused by name), or a MODEL_DIR trained here (its latest
    checkpoint)."""
    if _is_hf_dir(path):
        from gr_jax.models.glen import load_glen_hf

        return load_glen_hf(path)
    if not _is_trained_run(path):
        return convert.load_checkpoint(path)
    manager, step, meta = _trained_run(path)
    try:
        state = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    except Exception as e:  # as above
        raise TrainingError(f"INITIAL_CHECKPOINT_PATH {path}: checkpoint {step} is damaged ({type(e).__name__})") \
            from None
    return t5.T5Config.from_dict(meta["config"]), state["params"]["network"]


def provenance(setup: Setup) -> dict:
    """What a checkpoint was trained with, recorded in it and checked on resume and inference."""
    decoded = setup.scheme.decoded_by_model  # the docids follow the checkpoint's own parameters
    space = setup.scheme.space(setup.model.config.vocab_size) if decoded else setup.table.space
    return {"docid_scheme": setup.scheme.name,
            "docid_table_sha": "decoded by the model" if decoded else _table_digest(setup.table),
            "docid_space": space.to_json(), "config": json.loads(setup.model.config.to_json()),
            "vocabulary": setup.vocab.fingerprint, "corpus": setup.dataset.corpus.fingerprint()}


def initial_params(setup: Setup, seed: int, initial_checkpoint_path: Optional[str]) -> dict:
    model = setup.model
    params = model.init_params(seed)
    if initial_checkpoint_path:
        initial, setup._initial = setup._initial, None
        ckpt_config, network = initial if initial is not None else _initial_network(initial_checkpoint_path)
        for path, leaf in jax.tree_util.tree_leaves_with_path(network):
            if not np.isfinite(np.asarray(leaf)).all():
                raise TrainingError(f"INITIAL_CHECKPOINT_PATH {initial_checkpoint_path}: parameter "
                                    f"{jax.tree_util.keystr(path)} holds NaN/inf values; the checkpoint is "
                                    f"damaged — convert it again (tools/convert_checkpoint.py)")
        if model.config.vocab_size > ckpt_config.vocab_size:
            if not isinstance(ckpt_config, t5.T5Config):
                raise ValueError(f"INITIAL_CHECKPOINT_PATH {initial_checkpoint_path}: the docids need "
                                 f"{model.config.vocab_size} token ids, the LM has {ckpt_config.vocab_size}; use a "
                                 f"docid scheme written in its vocabulary (text docids) or a codebook scheme")
            network, _ = grow_vocab(network, ckpt_config, model.config.vocab_size, seed=seed)
        params["network"] = jax.tree_util.tree_map(jnp.asarray, network)
        log.info("initialised the network from %s", initial_checkpoint_path)
    return params



def evaluate_split(setup: Setup, params, split: str, eval_config: EvalConfig, max_queries: int = 0):
    ds = setup.dataset
    if split not in ds.queries:
        raise ValueError(f"evaluation split {split!r} not in the dataset (it has {sorted(ds.queries)})")
    queries, qrels = ds.queries[split], ds.qrels[split]
    qids = sorted(q for q in queries.qids if q in qrels)  # by id: the subset and the batches never follow the
    if max_queries:                                        # order of the query file
        qids = qids[:max_queries]
    text_of = dict(zip(queries.qids, queries.texts))
    tokens = tokenize([text_of[q] for q in qids], setup.vocab, setup.feature_lengths["inputs"], what=split)
    run = retrieve(setup.model, params, tokens, qids, setup.index, ds.corpus.doc_ids, eval_config.num_beams,
                   eval_config.batch_size)
    sub = {q: qrels[q] for q in qids}
    return run, sub, evaluate(run, sub, eval_config.metrics, eval_config.threshold(split), missing_as_zero=True)


def bm25_metrics(dataset: Dataset, split: str, qrels, eval_config: EvalConfig) -> dict[str, float]:
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


@gin.configurable
def train(model_dir: str = gin.REQUIRED, train_steps: int = gin.REQUIRED, batch_size: int = gin.REQUIRED,
          feature_lengths: dict = gin.REQUIRED, task: str = gin.REQUIRED, seed: int = 0,
          initial_checkpoint_path: Optional[str] = None, optimizer: Optional[optax.GradientTransformation] = None,
          log_period: int = 50, eval_period: int = 0, checkpoint_period: int = 500, keep_checkpoints: int = 3,
          eval_config: Optional[EvalConfig] = None, num_partitions: int = 1, progress: bool = True,
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
    setup = prepare(model_dir=str(model_dir), batch_size=batch_size, feature_lengths=feature_lengths, task=task,
                    seed=seed, initial_checkpoint_path=initial_checkpoint_path, dataset=dataset)
    write_text(model_dir / "config.gin", gin.config_str(), keep_previous=True)  # the configuration of this run

    decoded = setup.scheme.decoded_by_model

    def periodic(params):
        if not decoded:
            return evaluate_split(setup, params, eval_config.split, eval_config, eval_config.max_queries)[2]
        kept = setup.table  # evaluate with the docids of these parameters; training keeps its own
        table = decode_model_docids(setup, params)
        evaluator = dataclasses.replace(setup, table=table, index=table.index(vocab_size=setup.model.config.vocab_size),
                                        iterator=None)
        setup.model.use_docids(table)
        try:
            return evaluate_split(evaluator, params, eval_config.split, eval_config, eval_config.max_queries)[2]
        finally:
            setup.model.use_docids(kept)

    def redecode(step, params):
        log.info("step %d: decoding every document's docid with the current parameters", step)
        use_model_docids(setup, decode_model_docids(setup, params))

    out = trainer.fit(setup.model, initial_params(setup, seed, initial_checkpoint_path), setup.iterator, tx,
                      model_dir=model_dir, train_steps=train_steps, batch_size=batch_size, meta=provenance(setup),
                      seed=seed, log_period=log_period, eval_period=eval_period,
                      checkpoint_period=checkpoint_period, keep_checkpoints=keep_checkpoints,
                      num_partitions=num_partitions, progress=progress, evaluate=periodic,
                      step_callback=step_callback, initial_checkpoint_path=initial_checkpoint_path,
                      refresh=redecode if decoded else None, refresh_period=setup.refresh_period)
    state, step = out["state"], out["step"]
    summary = {"model_dir": str(model_dir), "steps": step, "checkpoint": out["checkpoint"]}
    if decoded:  # the final docids: decoded with the final parameters, written in GLEN's format
        use_model_docids(setup, decode_model_docids(setup, state["params"]))
        summary["docids"] = str(write_model_docids(setup, model_dir, step))
    if final_eval:  # the same file names as `infer`, and nothing time-dependent: a re-run writes the same files
        split = eval_config.final_split or eval_config.split
        run, qrels, metrics = evaluate_split(setup, state["params"], split, eval_config)
        run_path = model_dir / "runs" / f"{split}.step{step}.run"
        write_run(run_path, run)
        summary.update({"split": split, "queries": len(qrels), "num_beams": eval_config.num_beams,
                        "ranker": _describe(setup.model.ranker), "metrics": metrics, "run": str(run_path)})
        if eval_config.compare_bm25:
            summary["bm25_metrics"] = bm25_metrics(setup.dataset, split, qrels, eval_config)
        writer = trainer.ScalarWriter(model_dir, "eval")
        writer.write(step, {f"final/{k}": v for k, v in metrics.items()})
        writer.close()
        write_text(model_dir / "final_metrics.json", json.dumps(summary, indent=1), keep_previous=True)
    summary["train_seconds"] = round(time.time() - t_start, 1)
    summary["resumed_from"] = out["resumed_from"]
    summary["state"] = state
    summary["setup"] = setup  # model, docids, index, vocabulary: callers that go on (dynamic corpora) reuse it
    return summary


def fine_tune(setup: Setup, params, parts: Sequence[dsi_pairs.Pairs], rates: Sequence[float], table: DocidTable,
              *, model_dir: Path, steps: int, batch_size: int, learning_rate: float, seed: int = 0,
              meta_extra: Optional[dict] = None, all_docids: bool = False) -> dict:
    """More training of a built system on other pairs (DSI++ replay in the dynamic protocol) through the same
    loop — sharding, NaN guard, checkpoints in `model_dir` (a re-run resumes) —; `table` gives the targets.
    Returns the new parameters."""
    stores = [_example_store(p, table, setup.vocab, setup.feature_lengths, all_docids) for p in parts]
    iterator = MixtureIterator(stores, batch_size, seed=seed, rates=list(rates), names=[p.name for p in parts])
    tx = optax.adamw(validation.number("fine_tune learning_rate", learning_rate), weight_decay=0.0)
    out = trainer.fit(setup.model, params, iterator, tx, model_dir=model_dir, train_steps=steps,
                      batch_size=batch_size, meta={**provenance(setup), "docid_table_sha": _table_digest(table),
                                                   **(meta_extra or {})},
                      seed=seed, log_period=max(1, min(50, steps)), checkpoint_period=steps, keep_checkpoints=1,
                      progress=False, name="fine_tune")
    return out["state"]["params"]


def restore(model_dir: str | Path, step: Optional[int] = None) -> tuple[Setup, dict, int]:
    """A trained system from MODEL_DIR: (setup for inference, parameters, step) — the checkpoint of `step`
    (default: the latest). The configuration (data, vocabulary, docid scheme, network) comes from gin, as for
    training, and must match the checkpoint's recorded provenance."""
    model_dir = Path(model_dir)
    ckpt_dir = (model_dir / "checkpoints").absolute()
    if not ckpt_dir.is_dir():
        raise ValueError(f"{model_dir}: no checkpoints/ directory; train first or fix MODEL_DIR")
    manager = ocp.CheckpointManager(ckpt_dir, options=ocp.CheckpointManagerOptions(create=False))  # reads only
    step = manager.latest_step() if step is None else step
    if step is None or step not in manager.all_steps():
        raise ValueError(f"{ckpt_dir}: no checkpoint for step {step} (have {list(manager.all_steps())})")
    setup = gin_checks.call_configured(lambda: prepare(
        model_dir=str(model_dir), batch_size=1, feature_lengths=_macro("TASK_FEATURE_LENGTHS"),
        task=_macro("MIXTURE_OR_TASK_NAME"), with_training_data=False,
        initial_checkpoint_path=_macro("INITIAL_CHECKPOINT_PATH", None)))  # the network as training built it
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
    if setup.scheme.decoded_by_model:  # GLEN: the checkpoint's docids are its own greedy decodings
        use_model_docids(setup, decode_model_docids(setup, params))
    return setup, params, step


def import_checkpoint(model_dir: str = gin.REQUIRED, initial_checkpoint_path: str = gin.REQUIRED) -> dict:
    """A network trained elsewhere (GLEN's released HF model, a converted T5) → MODEL_DIR/checkpoints/0 that
    `restore` / `python -m gr_jax.infer` read, with the vocabulary, docid scheme state, docid table and
    prefix tree the experiment file configures (e.g. GLEN's docid file as `GlenDocids.docid_file`). Nothing is
    trained. The MODEL_DIR is for inference, or as INITIAL_CHECKPOINT_PATH of a training run (it holds no
    optimizer state to resume)."""
    model_dir = Path(model_dir)
    if not initial_checkpoint_path:
        raise ValueError("INITIAL_CHECKPOINT_PATH is not set: name the network to import (an HF T5 directory, a "
                         "converted checkpoint or a trained MODEL_DIR)")
    if (model_dir / "checkpoints").exists():
        raise ValueError(f"MODEL_DIR {model_dir} already holds checkpoints/; import into a new MODEL_DIR")
    setup = gin_checks.call_configured(lambda: prepare(
        model_dir=str(model_dir), batch_size=1, feature_lengths=_macro("TASK_FEATURE_LENGTHS"),
        task=_macro("MIXTURE_OR_TASK_NAME"), with_training_data=False, may_fit=True,
        initial_checkpoint_path=initial_checkpoint_path))
    params = initial_params(setup, 0, initial_checkpoint_path)
    if setup.scheme.decoded_by_model:
        use_model_docids(setup, decode_model_docids(setup, params))
    manager = ocp.CheckpointManager((model_dir / "checkpoints").absolute(),
                                    options=ocp.CheckpointManagerOptions(create=True))
    state = {"step": np.zeros((), np.int32), "params": jax.device_get(params), "nonfinite": np.zeros((), np.int32)}
    manager.save(0, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                            meta=ocp.args.JsonSave(provenance(setup))))
    manager.wait_until_finished()
    write_text(model_dir / "config.gin", gin.config_str(), keep_previous=True)
    out = {"model_dir": str(model_dir), "checkpoint": str(model_dir / "checkpoints" / "0"),
           "imported_from": str(initial_checkpoint_path), "docids": setup.table.stats()}
    if setup.scheme.decoded_by_model:
        out["docid_file"] = str(write_model_docids(setup, model_dir, 0))
    write_text(model_dir / "imported.json", json.dumps(out, indent=1), keep_previous=True)
    return out


def write_model_docids(setup: Setup, model_dir: Path, step: int) -> Path:
    """The decoded docids of checkpoint `step` as GLEN's docid file: MODEL_DIR/docids/step<N>.tsv."""
    from gr_jax.docids.glen import write_docid_tsv

    corpus, table = setup.dataset.corpus, setup.table
    path = Path(model_dir) / "docids" / f"step{step}.tsv"
    write_docid_tsv(path, [corpus.doc_ids[r] for r in table.doc_rows], table.sequences, table.weights,
                    [" ".join(corpus.texts[r].split()) for r in table.doc_rows], setup.vocab.id_to_piece,
                    keep_previous=True)
    return path


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
    setup, params, step = restore(model_dir, step)                                       # check of bindings
    model_dir = Path(model_dir)
    run, qrels, metrics = evaluate_split(setup, params, split, cfg)
    run_path = model_dir / "runs" / f"{split}.step{step}.run"
    write_run(run_path, run)
    out = {"run": str(run_path), "step": step, "split": split, "queries": len(run), "num_beams": num_beams,
           "model": setup.model.describe(), "ranker": _describe(setup.model.ranker)}
    if evaluate:
        out["metrics"] = metrics
        write_text(run_path.with_suffix(".metrics.json"), json.dumps(out, indent=1), keep_previous=True)
    return out


def _describe(obj) -> str:
    """A stable description for result files (a dataclass's repr; otherwise its type, never an address)."""
    return repr(obj) if dataclasses.is_dataclass(obj) else getattr(obj, "__name__", type(obj).__name__)


_NO_DEFAULT = object()


def _macro(name: str, default=_NO_DEFAULT):
    try:
        return gin.query_parameter(f"{name}/macro.value")
    except ValueError:
        if default is _NO_DEFAULT:
            raise
        return default
