"""Training data of the DSI family: which pairs a run trains on and how they become batches.

* `Objectives` (gin) — the DSI objectives and their mixing rates: indexing (document text → docid), retrieval
  (training query → docid), pseudo-query (generated query → docid), and the scheme's own pairs (MDGR's chunks);
* `ObjectiveInputs` — what any objectives config builds its batches from (a method's own objectives config, in
  its folder under methods/, offers the same `iterator(inputs)` and `refresh_period`);
* `example_store` — pairs tokenized to TASK_FEATURE_LENGTHS with their docids as targets.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Optional

import gin
import numpy as np

from gr_jax.data import pairs as dsi_pairs
from gr_jax.data.pipeline import ExampleStore, MixtureIterator, tokenize
from gr_jax.data.readers import Dataset
from gr_jax.docids.base import DocidTable
from gr_jax.docids.pseudo_query import read_queries_file

log = logging.getLogger(__name__)


class ObjectivesConfig:
    """What the composition asks of an objectives config (`prepare.objectives_config`): `iterator(inputs)` (the
    training batches, `ObjectiveInputs`), `refresh_period` (how often docids decoded by the model are decoded
    again; 0: never after the start), and `examples(pairs, table, vocab, lengths)`: given pairs (`data.pairs.Pairs`:
    texts → corpus rows, e.g. the new and replayed documents of DSI++'s continued training) as training
    examples. The default makes DSI's (the text → the row's docid); a method whose targets are not the table's
    rows (SEAL: n-grams of them) makes its own.

    `on_refresh(step, params, model, table, doc_tokens)` runs after each decoding of docids decoded by the model
    (before the first step and every `refresh_period` steps, `table` the docids just decoded, `doc_tokens` the
    corpus by row) and may return new parameters (GenRET initialises a new position's codebook from the documents);
    default: None, the parameters stay. A rewrite must give the same parameters when applied to its own result (a
    resumed run applies it again to the checkpoint saved after it)."""

    refresh_period = 0

    def iterator(self, inp: "ObjectiveInputs") -> MixtureIterator:
        raise NotImplementedError

    def on_refresh(self, step: int, params, model, table: DocidTable, doc_tokens):
        return None

    def examples(self, pairs, table: DocidTable, vocab, lengths: dict) -> ExampleStore:
        return example_store(pairs, table, vocab, lengths, all_docids=False)


@gin.configurable
@dataclasses.dataclass
class Objectives(ObjectivesConfig):
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

    # examples(): the default's, primary docids only even with all_docids (what DSI++ replay has always trained on)

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
                             f"(prepare.objectives_config: the method's own, e.g. @GlenPhase2())")
        stores = [example_store(p, inp.table, inp.vocab, inp.lengths, self.all_docids) for p in pairs]
        log.info("training examples: %s", {p.name: len(s) for p, s in zip(pairs, stores)})
        return MixtureIterator(stores, inp.batch_size, seed=inp.seed, rates=rates, names=[p.name for p in pairs])


@dataclasses.dataclass
class ObjectiveInputs:
    """What an objectives config (`Objectives`, `GlenPhase2`) may build its training batches from. An
    objectives config offers `iterator(inputs)` and `refresh_period` (how often decoded docids are decoded
    again; 0: never after the start). One that accepts docids decoded by the model (`table` None) returns
    batches with `set_docids(docids_by_row)`: the composition calls it whenever the docids are decoded.
    `doc_tokens()` gives the corpus tokenized to TASK_FEATURE_LENGTHS['documents'] (else 'inputs'), computed once
    for every user. `start()` gives what training starts from, for data made by the model itself (LTRGR's rank
    data): a `Start` (the model object, its initial parameters, the docid index, INITIAL_CHECKPOINT_PATH);
    computed only when called. `embeddings` / `embedder`: the document vectors the docid scheme was built from and
    their embedder (a dense teacher: RIPOR's rank data)."""

    dataset: Dataset
    train_split: str
    scheme: Any
    table: Optional[DocidTable]  # None when the docids are decoded by the model (`decoded_by_model`)
    vocab: Any
    lengths: dict
    batch_size: int
    seed: int
    doc_tokens: Callable[[], np.ndarray]  # the corpus tokenized to lengths['documents'], by row
    start: Optional[Callable[[], "Start"]] = None
    # the corpus's vectors [N, D] by row and the fitted embedder that made them, when the docid scheme
    # `needs_embeddings` (RIPOR's rank data: the dense teacher's scores); else None
    embeddings: Optional[np.ndarray] = None
    embedder: Any = None


@dataclasses.dataclass
class Start:
    """What training starts from (`ObjectiveInputs.start`)."""

    model: Any
    params: dict
    index: Any  # None when the docids are decoded by the model
    initial_checkpoint_path: Optional[str]  # None: the parameters are a random initialisation


def example_store(pairs, table: DocidTable, vocab, lengths: dict, all_docids: bool) -> ExampleStore:
    """Pairs tokenized to `lengths` with their docids as targets (one row per docid of a multi-docid document
    when `all_docids`)."""
    inputs = tokenize(pairs.texts, vocab, lengths["inputs"], what=pairs.name, progress=len(pairs) > 50000)
    if pairs.docid_index is not None:
        return ExampleStore({"inputs": inputs, "targets": table.targets_of(pairs.docid_index, lengths["targets"])})
    if not all_docids:
        return ExampleStore({"inputs": inputs, "targets": table.targets(pairs.rows, lengths["targets"])})
    pos, idx = table.all_docids(pairs.rows)  # each input once per docid of its document
    return ExampleStore({"inputs": inputs[pos], "targets": table.targets_of(idx, lengths["targets"])})
