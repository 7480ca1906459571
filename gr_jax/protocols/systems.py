"""The retrieval systems every protocol runs — BM25, dense retrieval and a trained generative retriever —
behind one interface:

    system.name                      "bm25", "dense" or "gr" (the label of its runs)
    system.search(queries) -> Run     a QuerySet → the system's ranking of each query
    system.add(rows) -> dict          index more corpus rows without refitting anything (dynamic corpora)
    system.estimate_bytes(rows)       the memory the next `add` needs, for the protocol's MemoryGuard
    system.planner                    the model's `Planner` when its capabilities declare one, else None
    system.planner_tokens(queries, ell), system.search_with_plan(queries, plan_queries)   (with a planner)

A system indexes `rows` of `corpus` (default: all of them) and returns documents by their ids. BM25 is
re-indexed over every indexed row at each `add` (as 000 does); dense retrieval encodes new rows with the
embedder fitted on the first ones; a trained retriever gives new documents docids from its frozen scheme (or,
for docids decoded by the model, decodes them with its trained parameters) and inserts them into its prefix tree.
Ties are broken by document id in all three.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from gr_jax.data.pipeline import tokenize
from gr_jax.data.readers import Corpus, QuerySet
from gr_jax.data.trec import Run
from gr_jax.docids.base import DocidTable
from gr_jax.evaluation.retrieval import retrieve
from gr_jax.retriever.contract import Planner, planner_of

log = logging.getLogger(__name__)


class ProtocolError(ValueError):
    """A configuration a protocol cannot run: a system asked for what it cannot do (a planner run of a system
    without a planner, new documents a model cannot take), a step that would not fit in memory."""


class BM25System:
    name = "bm25"
    planner = None

    def __init__(self, corpus: Corpus, depth: int, rows: Optional[Sequence[int]] = None):
        self.corpus, self.depth = corpus, int(depth)
        self.rows = list(range(len(corpus))) if rows is None else [int(r) for r in rows]
        self._build()

    def _build(self) -> None:
        from gr_jax.baselines.bm25 import BM25

        c = self.corpus
        self.bm25 = BM25.build([c.doc_ids[r] for r in self.rows], [c.texts[r] for r in self.rows])

    def search(self, queries: QuerySet) -> Run:
        return self.bm25.search(list(queries.qids), list(queries.texts), k=self.depth)

    def add(self, rows) -> dict:
        self.rows += [int(r) for r in rows]
        self._build()
        return {"documents": len(self.rows)}

    def estimate_bytes(self, rows) -> int:
        texts = self.corpus.texts
        return 8 * sum(len(texts[r]) for r in self.rows) + 8 * sum(len(texts[r]) for r in rows)


class DenseSystem:
    """Exact inner-product search; the embedder is fitted on the first rows (TF-IDF) or frozen (MiniLM, T5)
    and encodes the rows of every `add` without refitting. An embedder that `trains_on_queries` (DPR) is first
    trained on `training` = (dataset of the first rows, its query split, a directory for what it learns)."""

    name = "dense"
    planner = None

    def __init__(self, corpus: Corpus, depth: int, embedder, rows: Optional[Sequence[int]] = None,
                 training: Optional[tuple] = None):
        from gr_jax.baselines.dense import DenseIndex

        self.corpus, self.depth = corpus, int(depth)
        if embedder.trains_on_queries:
            if training is None:
                raise ProtocolError(f"the {embedder.name} embedder trains on judged queries, and this protocol "
                                    f"gives it none; use an embedder without training")
            embedder.train(*training)
        self.index = DenseIndex.build(embedder, corpus, rows=rows)

    @property
    def embedder_name(self) -> str:
        return self.index.embedder.name

    def search(self, queries: QuerySet) -> Run:
        return self.index.search(list(queries.texts), list(queries.qids), k=self.depth)

    def add(self, rows) -> dict:
        self.index.add(self.corpus, rows)
        return {"documents": len(self.index), "index_mb": self.index.matrix.nbytes / 2**20}

    def estimate_bytes(self, rows) -> int:
        return 4 * len(rows) * max(self.index.matrix.shape[1], 1) * 3


class TrainedSystem:
    """A generative retriever built by the composition (`compose.restore` of a MODEL_DIR, or `compose.train`):
    its setup and parameters. `corpus` (default: the setup's) is what the index's rows refer to — the dynamic
    protocol passes the whole growing corpus, whose first rows are the ones the model was trained on."""

    name = "gr"

    def __init__(self, setup, params, num_beams: int, batch_size: int, corpus: Optional[Corpus] = None):
        self.setup, self.params = setup, params
        self.num_beams, self.batch_size = int(num_beams), int(batch_size)
        self.corpus = corpus if corpus is not None else setup.dataset.corpus
        self.table = setup.table  # every docid in the index: the trained ones, then each added part's
        self.documents = len(setup.dataset.corpus)

    @classmethod
    def restore(cls, model_dir: str | Path, num_beams: int, batch_size: int) -> tuple["TrainedSystem", int]:
        """The system trained in MODEL_DIR (its latest checkpoint), as the experiment file configures it →
        (system, step)."""
        from gr_jax.compose import restore

        setup, params, step = restore(model_dir)
        return cls(setup, params, num_beams, batch_size), step

    @property
    def planner(self) -> Optional[Planner]:
        return planner_of(self.setup.model)

    def describe(self) -> str:
        return self.setup.model.describe()

    def with_params(self, params) -> "TrainedSystem":
        """The same system with other parameters (e.g. a planner aligned to another language)."""
        return TrainedSystem(self.setup, params, self.num_beams, self.batch_size, self.corpus)

    def tokens(self, queries: QuerySet) -> np.ndarray:
        s = self.setup
        return tokenize(list(queries.texts), s.vocab, s.feature_lengths["inputs"], what="queries")

    def search(self, queries: QuerySet, plan_tokens: Optional[np.ndarray] = None) -> Run:
        s = self.setup
        return retrieve(s.model, self.params, self.tokens(queries), list(queries.qids), s.index,
                        self.corpus.doc_ids, self.num_beams, self.batch_size, plan_tokens=plan_tokens)

    def search_with_plan(self, queries: QuerySet, plan_queries: QuerySet) -> Run:
        """Each query decoded under the plan of the query at its row of `plan_queries` (a planner's)."""
        self._need_planner("a search under another query's plan")
        return self.search(queries, plan_tokens=self.tokens(plan_queries))

    def planner_tokens(self, queries: QuerySet, ell: int) -> dict:
        """query id → the planner's top-ℓ tokens."""
        planner = self._need_planner("planner tokens")
        tokens, out = self.tokens(queries), {}
        for start in range(0, len(queries), self.batch_size):
            out.update(zip(queries.qids[start:start + self.batch_size],
                           planner.planner_tokens(self.params, tokens[start:start + self.batch_size], ell)))
        return out

    def _need_planner(self, what: str) -> Planner:
        if self.planner is None:
            raise ProtocolError(f"{what} needs a model that plans; {self.describe()} does not (its capabilities)")
        return self.planner

    # -- new documents (dynamic corpora) ---------------------------------------------------------------
    def check_can_add(self) -> None:
        """An error when new documents cannot get docids the trained model knows (the scheme's capability)."""
        s = self.setup
        if s.scheme.adds_tokens_per_document:
            raise ProtocolError(f"docid scheme {s.scheme.name!r} gives every new document a new token that the "
                                f"trained model has no embedding for; new documents need a scheme whose docids "
                                f"reuse the trained token space (naive, title, url, keywords, n-gram, semantic, "
                                f"PQ, RQ, MDGR)")

    def add(self, rows) -> dict:
        s = self.setup
        self.check_can_add()
        if s.scheme.decoded_by_model:
            table = self._decoded(rows)
        else:
            embeddings = None
            if s.scheme.needs_embeddings:
                embeddings = s.document_vectors([self.corpus.texts[r] for r in rows])
            table = s.scheme.assign(self.corpus, rows=rows, embeddings=embeddings)
        if table.space.kind == "text" and table.space.end > s.model.config.vocab_size:
            raise ProtocolError(f"new docids use token ids up to {table.space.end} but the model has "
                               f"{s.model.config.vocab_size}")
        counts = table.insert_into(s.index)
        self.table = DocidTable.concatenate([self.table, table])
        s.model.use_docids(self.table)
        self.documents += len(rows)
        return {"documents": self.documents, "docids_added": counts["docids_added"],
                "index_mb": s.index.nbytes / 2**20}

    def _decoded(self, rows) -> DocidTable:
        """Docids the model decodes from the new documents with its trained parameters (a scheme
        `decoded_by_model`: GLEN, GenRET), tokenized as the composition tokenizes the corpus."""
        s = self.setup
        length = s.feature_lengths.get("documents", s.feature_lengths["inputs"])
        tokens = tokenize([self.corpus.texts[r] for r in rows], s.vocab, length, what="new documents")
        codes, weights = s.model.decode_docids(self.params, tokens)
        return s.scheme.table(codes, weights, np.asarray(rows, np.int64), s.model.config.vocab_size)

    def estimate_bytes(self, rows) -> int:
        per_doc = self.setup.index.nbytes / max(self.documents, 1)
        return int(3 * per_doc * len(rows)) + (64 << 20)


# ----------------------------------------------------------------------------------------------------------
# what a system gives for one query set
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Probe:
    """What a system gives for one query set: named runs, and the planner's view when it has one."""

    runs: dict  # run name → Run
    tokens: Optional[dict] = None  # qid → top-ℓ planner token ids (PAG)


def probe(system, queries: QuerySet, ell: int) -> Probe:
    """The system's run of `queries` (named by `run_names(system)[0]`); a system with a planner adds its
    planning-only run and its planner tokens."""
    primary, planning = run_names(system)
    runs = {primary: system.search(queries)}
    planner = system.planner
    if planner is None:
        return Probe(runs)
    with planner.in_mode(planner.planning_only_mode):
        runs[planning] = system.search(queries)
    return Probe(runs, system.planner_tokens(queries, ell))


def run_names(system) -> tuple[str, Optional[str]]:
    """(the system's end-to-end run, its planning-only run or None): "bm25", "dense", "gr" — or, with a planner,
    its planned and planning-only modes ("pag", "simul_only")."""
    planner = system.planner
    if planner is None:
        return system.name, None
    return planner.planned_mode, planner.planning_only_mode
