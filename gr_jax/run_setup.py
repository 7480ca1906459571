"""One run's `Setup` from gin: `prepare` reads the dataset, fits or reloads the vocabulary and the docid scheme
(each checked against what it was built from), builds the model object through `prepare.model_fn` and its
objectives, and records the provenance every checkpoint is checked against; the starting parameters
(`initial_params`: INITIAL_CHECKPOINT_PATH's loaders, LoRA, frozen parts) and docids decoded by the model. It names
no method: what differs comes in through gin. `compose.py` runs the commands over a Setup and re-exports these
names.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import gin
import numpy as np

from gr_jax.runtime import gin_checks, locks, validation
from gr_jax.data import sources
from gr_jax.data.pipeline import MixtureIterator, tokenize
from gr_jax.data.readers import Dataset, fingerprint
from gr_jax.docids.atomic import AtomicDocids
from gr_jax.docids.base import DocidTable, FitContext, load_scheme_state, save_scheme, scheme_params
from gr_jax.docids.embed import TfidfSvdEmbedder
from gr_jax.docids.pseudo_query import queries_by_document
from gr_jax.docids.vector_cache import document_vectors
from gr_jax.runtime.run_dir import RunDir
from gr_jax.retriever import contract
from gr_jax.backbones import t5
from gr_jax.retriever.heads import head_for_space
from gr_jax.retriever.model import GenerativeRetriever
from gr_jax.training import initial, lora
from gr_jax.training.objectives import ObjectiveInputs, Objectives, Start
from gr_jax.training.vocabulary import run_vocabulary
from gr_jax.runtime.validation import Count


log = logging.getLogger(__name__)

COMMANDS = ("train", "infer", "run_dynamic")  # the configurables whose bindings `prepare` checks for use


# ----------------------------------------------------------------------------------------------------------
# building a system
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Setup:
    """Everything `train` builds before the loop; `prepare` returns it so tests, tools and protocols reuse it."""

    model: contract.Retriever
    dataset: Dataset
    vocab: Any
    scheme: Any
    table: Optional[DocidTable]  # None until decoded when the scheme's docids are decoded by the model
    index: Any
    iterator: Optional[MixtureIterator]  # None when prepared for inference only
    feature_lengths: dict[str, int]
    embedder: Any = None  # the fitted document embedder of numeric docids (new documents need the same one)
    refresh_period: int = 0  # decoded docids: decoded again every this many training steps (0: at the start only)
    objectives: Any = None  # the objectives config (`training.objectives.ObjectivesConfig`): pairs → examples
    adapters: Optional[lora.Lora] = None  # LoRA (`prepare.adapters`): only the adapters train
    frozen: tuple = ()  # key-path prefixes of parameters held fixed (`prepare.frozen`)
    vectors_dir: Optional[Path] = None  # MODEL_DIR/vectors: the embedder's document vectors (`vector_cache`)
    writes_vectors: bool = False  # False for inference, which writes nothing into MODEL_DIR
    _doc_tokens: Optional[np.ndarray] = dataclasses.field(default=None, repr=False)
    # (config, network) of INITIAL_CHECKPOINT_PATH when `prepare` had to read the tensors for the config; handed
    # to `initial_params`, which drops it
    _initial: Optional[tuple] = dataclasses.field(default=None, repr=False)

    def document_vectors(self, texts: Sequence[str], what: str = "new documents") -> np.ndarray:
        """The embedder's vectors of `texts` (documents added later), through MODEL_DIR's vector cache."""
        return document_vectors(self.embedder, texts, self.vectors_dir, write=self.writes_vectors, what=what)

    def document_tokens(self) -> np.ndarray:
        """The corpus tokenized to TASK_FEATURE_LENGTHS['documents'] (else 'inputs'), by row; computed once."""
        if self._doc_tokens is None:
            length = self.feature_lengths.get("documents", self.feature_lengths["inputs"])
            self._doc_tokens = tokenize(self.dataset.corpus.texts, self.vocab, length, what="documents",
                                        progress=len(self.dataset.corpus) > 50000)
        return self._doc_tokens


@gin.configurable
def prepare(model_dir: str, batch_size: Count, feature_lengths: dict, task: str, seed: int = 0,
            train_split: str = "train", vocabulary: Optional[str] = None, vocab_size: int = 1000,
            network: t5.T5Config | str = "tiny", head=None, docid_scheme=None,
            objectives_config: Optional[Objectives] = None, initial_checkpoint_path: Optional[str] = None,
            score_mode: str = "log_softmax", embedder=None, with_training_data: bool = True,
            dataset: Optional[Dataset] = None, model_fn: Optional[Callable] = None, may_fit: bool = False,
            adapters: Optional[lora.Lora] = None, frozen: Sequence[str] = ()) -> Setup:
    """`dataset` overrides loading `task` by name (the dynamic-corpora protocol passes its D0 part). The
    docid head follows from the docid table's token space (`heads.head_for_space`): bind `prepare.head`
    only to override its other settings; a head that disagrees with the space is an error.
    `with_training_data=False` (inference): nothing is trained, fitted or written — the vocabulary and the
    docid-scheme state must already be in MODEL_DIR (or VOCABULARY given); with `may_fit` (importing a
    network trained elsewhere) the docid scheme is fitted and saved when MODEL_DIR has none. `model_fn(config,
    head, score_mode=...)` builds the model object (default `GenerativeRetriever`, whose objective, ranker and
    decoding hooks gin binds); it must follow the model contract (`retriever/contract.py`). `adapters` (e.g.
    `@Lora()`): low-rank adapters beside the network's projections, the only parameters that train
    (`training/lora.py`); its checkpoints hold the adapters, and `restore` adds them to INITIAL_CHECKPOINT_PATH's
    network, merged. `frozen`: key-path prefixes of parameters that do not train (e.g. 'network/encoder/bert',
    a pretrained encoder); its checkpoints hold the rest, and `restore` takes the frozen part from the starting
    parameters again (checked by digest)."""
    if isinstance(frozen, str) or not all(isinstance(f, str) and f.strip("/") for f in frozen):
        raise ValueError(f"prepare.frozen must be a list of parameter key paths (e.g. ['network/encoder/bert']), "
                         f"got {frozen!r}")
    if adapters is not None and frozen:
        raise ValueError("prepare.adapters and prepare.frozen both given: with LoRA everything but the adapters is "
                         "frozen already; drop prepare.frozen")
    if adapters is not None and not initial_checkpoint_path:
        raise ValueError("prepare.adapters (LoRA) trains adapters on a pretrained network: set "
                         "INITIAL_CHECKPOINT_PATH (a random network with frozen weights would learn little)")
    model_dir = Path(model_dir)
    run_dir = RunDir(model_dir)
    validation.integer("prepare.vocab_size", vocab_size, minimum=8)
    lengths = validation.feature_lengths("TASK_FEATURE_LENGTHS", feature_lengths)
    dataset = dataset if dataset is not None else sources.load_dataset(task)
    # everything gin configures exists now, except the model object, built below: checked again then
    gin_checks.check_bindings_used(COMMANDS, allow=("GenerativeRetriever",))
    loader = initial.loader_for(initial_checkpoint_path) if initial_checkpoint_path else None
    if loader is not None and loader.vocabulary is not None:  # a run continued: its vocabulary
        vocabulary = loader.vocabulary(initial_checkpoint_path, vocabulary)
    vocab = run_vocabulary(vocabulary, model_dir, dataset, train_split, vocab_size, may_train=with_training_data)
    scheme = docid_scheme if docid_scheme is not None else AtomicDocids()
    emb, embeddings, built_from = _docid_scheme(scheme, run_dir, dataset, vocab, train_split, embedder,
                                                may_fit=with_training_data or may_fit)
    config, loaded = _network_config(network, loader, initial_checkpoint_path, vocab)
    # docids decoded by the model exist once there are parameters (`decode_model_docids`)
    table = None if scheme.decoded_by_model else scheme.assign(dataset.corpus, embeddings=embeddings)
    if not run_dir.docid_scheme.exists():
        save_scheme(scheme, run_dir.docid_scheme, built_from)
        locks.provisional(run_dir.docid_scheme)  # removed if the run is refused before it is accepted
    space = scheme.space(config.vocab_size) if table is None else table.space
    head = head_for_space(space, head, scheme.name)
    if space.kind == "text" and space.end > config.vocab_size:
        config = config.replace(vocab_size=space.end)
    model = (model_fn or GenerativeRetriever)(config, head, score_mode=score_mode)
    contract.check(model, "prepare.model_fn's model object")
    if table is not None:
        model.use_docids(table)
    gin_checks.check_bindings_used(COMMANDS)
    target_length = space.length if table is None else table.target_length
    if lengths["targets"] < target_length:
        raise ValueError(f"TASK_FEATURE_LENGTHS['targets'] = {lengths['targets']} is shorter than the longest "
                         f"docid ({target_length} tokens); raise it")
    setup = Setup(model, dataset, vocab, scheme, table, None, None, lengths, emb)
    setup.vectors_dir, setup.writes_vectors = run_dir.vectors, with_training_data or may_fit
    setup.objectives = objectives_config if objectives_config is not None else Objectives()
    setup.adapters = adapters
    setup.frozen = tuple(f.strip("/") for f in frozen)
    if with_training_data or may_fit:  # inference restores its own parameters: nothing kept for it
        setup._initial = loaded
    if table is not None:
        log.info("docids: %s, %d documents, %s", scheme.name, len(dataset.corpus), table.stats())
        setup.index = table.index(vocab_size=config.vocab_size) if table.space.kind == "text" else table.index()
    if with_training_data:  # inference needs the docids and the index, not the tokenized training pairs
        validation.integer("BATCH_SIZE (train.batch_size)", batch_size)
        objs = setup.objectives

        def start() -> Start:
            params = initial_params(setup, seed, initial_checkpoint_path, keep_loaded=True)
            return Start(model, params, setup.index, initial_checkpoint_path)

        setup.iterator = objs.iterator(ObjectiveInputs(dataset, train_split, scheme, table, vocab, lengths,
                                                       batch_size, seed, setup.document_tokens, start,
                                                       embeddings, emb))
        setup.refresh_period = objs.refresh_period
    return setup


def _docid_scheme(scheme, run_dir: RunDir, dataset: Dataset, vocab, train_split: str, embedder, may_fit: bool):
    """Loads the scheme's saved state (checked against what it was built from) or fits it on the corpus →
    (the fitted embedder or None, the corpus embeddings or None, what the state is built from). Numeric
    schemes embed the corpus first (a pretrained encoder's vectors are computed once per MODEL_DIR:
    `docids/vector_cache.py`); the scheme's parameters are read before fit / load_state."""
    scheme_dir = run_dir.docid_scheme
    built_from = {"corpus": dataset.corpus.fingerprint(), "vocabulary": vocab.fingerprint,
                  "params": scheme_params(scheme)}
    emb, embeddings, queries = None, None, None
    if scheme.needs_embeddings:  # numeric docids: embed the corpus (deterministic)
        emb = embedder if embedder is not None else TfidfSvdEmbedder()
        built_from["embedder"] = {"class": type(emb).__name__, **scheme_params(emb)}
        embeddings = document_vectors(emb.fit(dataset.corpus.texts), dataset.corpus.texts, run_dir.vectors,
                                      write=may_fit, what="the corpus")
    if scheme.uses_training_queries:  # pseudo-query docids
        queries = queries_by_document(dataset, train_split)
        built_from["queries"] = fingerprint(sorted(f"{d}\t{q}" for d, qs in queries.items() for q in qs))
    if scheme_dir.exists():
        load_scheme_state(scheme, scheme_dir, built_from)
        scheme.bind(vocab)
    elif not may_fit:
        raise ValueError(f"{scheme_dir}: missing; inference needs the docid scheme state that training wrote "
                         f"(is MODEL_DIR a trained model?)")
    else:
        scheme.fit(dataset.corpus, FitContext(vocab=vocab, embeddings=embeddings, queries=queries,
                                              extras=dataset.extras))
    return emb, embeddings, built_from


def _network_config(network, loader: Optional[initial.InitialLoader], path: Optional[str], vocab):
    """(the network config, the (config, parameters) read from INITIAL_CHECKPOINT_PATH when its config needed
    them, else None)."""
    loaded = None
    if loader is None:
        config = t5.get_config(network) if isinstance(network, str) else network
        config = config.replace(vocab_size=vocab.size)
    elif loader.config is not None:
        config = loader.config(path)
    else:
        loaded = loader.load(path)
        config = loaded[0]
    if vocab.size > config.vocab_size:
        raise ValueError(f"vocabulary has {vocab.size} ids but the network's embedding only {config.vocab_size}; "
                         f"VOCABULARY does not belong to this network")
    return config, loaded


# ----------------------------------------------------------------------------------------------------------
# docids decoded by the model (scheme capability `decoded_by_model`, model capability `decodes_docids`)
# ----------------------------------------------------------------------------------------------------------


def decode_model_docids(setup: Setup, params) -> DocidTable:
    """Every document decoded with `params` (tokenized to TASK_FEATURE_LENGTHS['documents'], else 'inputs') →
    the scheme's DocidTable."""
    if not setup.model.capabilities.decodes_docids:
        raise ValueError(f"docid scheme {setup.scheme.name!r} is decoded by the model, but "
                         f"{setup.model.describe()} does not decode docids (its capabilities)")
    tokens, weights = setup.model.decode_docids(params, setup.document_tokens())
    return setup.scheme.table(tokens, weights, np.arange(len(tokens)), setup.model.config.vocab_size)


def use_model_docids(setup: Setup, table: DocidTable) -> None:
    """Installs decoded docids: the setup's table and prefix tree, the model's docid weights, and the training
    batches' docids (batches built for decoded docids follow them, `ObjectiveInputs`)."""
    setup.table = table
    setup.index = table.index(vocab_size=setup.model.config.vocab_size)
    setup.model.use_docids(table)
    if setup.iterator is not None:
        setup.iterator.set_docids(table.sequences)
    log.info("docids decoded by the model: %s", table.stats())


def write_model_docids(setup: Setup, model_dir: Path, step: int) -> Path:
    """The decoded docids of checkpoint `step` in the scheme's own file format (`write_decoded`)."""
    return setup.scheme.write_decoded(RunDir(model_dir).docids, step, setup.table, setup.dataset.corpus,
                                      setup.vocab)


# ----------------------------------------------------------------------------------------------------------
# parameters and provenance
# ----------------------------------------------------------------------------------------------------------


def provenance(setup: Setup) -> dict:
    """What a checkpoint was trained with, recorded in it and checked on resume and inference."""
    decoded = setup.scheme.decoded_by_model  # the docids follow the checkpoint's own parameters
    space = setup.scheme.space(setup.model.config.vocab_size) if decoded else setup.table.space
    out = {"docid_scheme": setup.scheme.name,
           "docid_table_sha": "decoded by the model" if decoded else setup.table.digest(),
           "docid_space": space.to_json(), "config": json.loads(setup.model.config.to_json()),
           "vocabulary": setup.vocab.fingerprint, "corpus": setup.dataset.corpus.fingerprint()}
    if setup.adapters is not None:
        out["adapters"] = setup.adapters.settings()
    if setup.frozen:
        out["frozen"] = sorted(setup.frozen)
    return out


def trainable(setup: Setup, params) -> Optional[Callable[[str], bool]]:
    """Which parameters train (by key path), or None for all: LoRA's adapters (`prepare.adapters`), or all but
    the `prepare.frozen` prefixes — each of which must name some parameter of `params`."""
    if setup.adapters is not None:
        return lora.trainable
    if not setup.frozen:
        return None
    names = lora.leaf_names(params)
    unknown = [p for p in setup.frozen if not any(n == p or n.startswith(p + "/") for n in names)]
    if unknown:
        raise ValueError(f"prepare.frozen {unknown} names no parameter of this model (its top-level paths: "
                         f"{sorted({'/'.join(n.split('/')[:2]) for n in names})[:8]})")
    return lambda name: not any(name == p or name.startswith(p + "/") for p in setup.frozen)


def initial_params(setup: Setup, seed: int, initial_checkpoint_path: Optional[str], keep_loaded: bool = False) -> dict:
    """A random init from `seed`, with the network from INITIAL_CHECKPOINT_PATH when given (the tensors `prepare`
    read are dropped after use unless `keep_loaded`), and fresh adapters when the setup has them."""
    params = setup.model.init_params(seed)
    if initial_checkpoint_path:
        loaded = setup._initial
        if not keep_loaded:
            setup._initial = None
        params["network"] = initial.initial_network(initial_checkpoint_path, loaded, setup.model.config.vocab_size,
                                                    seed)
        loader = initial.loader_for(initial_checkpoint_path)
        if loader.head is not None:  # a checkpoint that holds the docid head too
            params["head"] = loader.head(initial_checkpoint_path, setup.model)
    if setup.adapters is not None:
        params = setup.adapters.add(params)
    return params
