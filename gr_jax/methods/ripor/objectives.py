"""RIPOR's training data for its prefix-oriented ranking phase (`lng_knp`): (query, positive docid, negative
docid, the dense teacher's margin) examples, batched for `model.RiporRetriever.loss_fn`'s ranking loss.

As RIPOR builds them (its `aq_preprocess` scripts): each training query's candidates are the teacher's top
`candidates` documents with the judged documents added when missing; they are sorted by the teacher's score, the
positive is the first (the teacher's best, not necessarily the judged document), and each example's negative is
drawn uniformly from the rest (`negatives_per_query` examples a query, drawn once from the seed: RIPOR draws one
anew each epoch). The teacher is the dense retriever the docids were built from: the cosine of the query's and the
document's vectors (`ObjectiveInputs.embeddings`, the vectors the scheme quantised, and the same embedder on the
query text). RIPOR's teacher is a cross-encoder over its dense model's candidates; offline there is none, and the
issue that specifies this route asks for the dense model as the teacher.

Ties of teacher scores are broken by document id (ascending), never by corpus row. Margins are stored as integers
of `MARGIN_UNIT` (training batches hold integer features) and divided back in the loss."""

from __future__ import annotations

import dataclasses
from typing import Optional

import gin
import numpy as np

from gr_jax.methods.api import (Count, ExampleStore, MixtureIterator, ObjectiveInputs, ObjectivesConfig,
                                tokenize)

MARGIN_UNIT = 1e-6  # a stored margin m means m * MARGIN_UNIT of the teacher's score


def teacher_examples(query_vectors, doc_vectors, judged_rows, doc_ids, candidates: int, negatives: int,
                     seed: int):
    """(query index, positive row, negative row, teacher margin) arrays: for each query, its candidates (the
    teacher's top `candidates` plus its judged rows), sorted by the teacher's score (ties: document id), the
    first positive, `negatives` draws from the rest."""
    rng = np.random.default_rng(seed)
    scores = np.asarray(query_vectors, np.float64) @ np.asarray(doc_vectors, np.float64).T  # [Q, N]
    id_rank = np.argsort(np.argsort(np.asarray(doc_ids, dtype=str), kind="stable"), kind="stable")
    qi, pos, neg, margin = [], [], [], []
    for i in range(scores.shape[0]):
        order = np.lexsort((id_rank, -scores[i]))  # score descending, then document id
        cands = list(order[:candidates])
        cands += [r for r in sorted(judged_rows[i], key=lambda r: id_rank[r]) if r not in cands]
        cands.sort(key=lambda r: (-scores[i, r], id_rank[r]))
        if len(cands) < 2:
            continue
        for j in rng.integers(1, len(cands), size=negatives):
            qi.append(i)
            pos.append(cands[0])
            neg.append(cands[j])
            margin.append(scores[i, cands[0]] - scores[i, cands[j]])
    return (np.asarray(qi, np.int64), np.asarray(pos, np.int64), np.asarray(neg, np.int64),
            np.asarray(margin, np.float64))


@gin.configurable
@dataclasses.dataclass
class RiporRankData(ObjectivesConfig):
    """`candidates`: the teacher's top documents per query (RIPOR: 100); `negatives_per_query`: examples per
    query."""

    candidates: Count = 100
    negatives_per_query: Count = 8

    def iterator(self, inp: ObjectiveInputs) -> MixtureIterator:
        if inp.embeddings is None or inp.embedder is None or inp.table is None:
            raise ValueError("RiporRankData needs the dense teacher: a docid scheme built from document vectors "
                             "(prepare.docid_scheme = @RiporDocids(), prepare.embedder = ...)")
        ds = inp.dataset
        queries = ds.queries[inp.train_split]
        qrels = ds.qrels.get(inp.train_split, {})
        row_of = {d: r for r, d in enumerate(ds.corpus.doc_ids)}
        judged = [[row_of[d] for d, g in qrels.get(q, {}).items() if g >= 1 and d in row_of] for q in queries.qids]
        qv = np.asarray(inp.embedder.embed_queries(list(queries.texts)), np.float32)
        qi, pos, neg, margin = teacher_examples(qv, inp.embeddings, judged, list(ds.corpus.doc_ids),
                                                self.candidates, self.negatives_per_query, inp.seed)
        M = inp.table.space.length
        inputs = tokenize([queries.texts[i] for i in qi], inp.vocab, inp.lengths["inputs"], what="rank queries")
        store = ExampleStore({"inputs": inputs, "targets": inp.table.targets(pos, inp.lengths["targets"]),
                              "negatives": inp.table.targets(neg, M),
                              "margin": np.round(margin / MARGIN_UNIT).astype(np.int64)[:, None]})
        return MixtureIterator([store], inp.batch_size, seed=inp.seed, names=["rank"])


class Phases:
    """Batches of `first` for `switch` steps, then of `second`: RIPOR's seq2seq phase, then its ranking phase, in
    one run (one schedule; the train step compiles once more at the switch, where the batch gains `negatives` and
    `margin`). Resumable as the trainer resumes a `MixtureIterator`."""

    def __init__(self, first: MixtureIterator, second: MixtureIterator, switch: int):
        self.first, self.second, self.switch, self.step = first, second, int(switch), 0

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        batch = next(self.first) if self.step < self.switch else next(self.second)
        self.step += 1
        return batch

    def get_state(self) -> dict:
        return {"step": self.step, "switch": self.switch, "first": self.first.get_state(),
                "second": self.second.get_state()}

    def set_state(self, state) -> None:
        if int(state.get("switch", -1)) != self.switch:
            raise ValueError(f"data iterator state: the seq2seq phase was {state.get('switch')} steps, now "
                             f"{self.switch}; resuming would change the data order")
        self.first.set_state(state["first"])
        self.second.set_state(state["second"])
        self.step = int(state["step"])

    def epochs(self) -> list[float]:
        return self.first.epochs() if self.step < self.switch else self.second.epochs()


@gin.configurable
@dataclasses.dataclass
class RiporPhases(ObjectivesConfig):
    """RIPOR's training as one run: `seq2seq_steps` steps of `seq2seq` (an objectives config: (document or query)
    → docid, e.g. @Objectives()), then `rank` (@RiporRankData()) for the rest of TRAIN_STEPS."""

    seq2seq: Optional[ObjectivesConfig] = None
    rank: Optional[ObjectivesConfig] = None
    seq2seq_steps: int = 0

    def iterator(self, inp: ObjectiveInputs) -> Phases:
        if self.seq2seq is None or self.rank is None:
            raise ValueError("RiporPhases needs both phases: RiporPhases.seq2seq = @Objectives(), "
                             "RiporPhases.rank = @RiporRankData()")
        return Phases(self.seq2seq.iterator(inp), self.rank.iterator(inp), self.seq2seq_steps)

    def examples(self, pairs, table, vocab, lengths: dict):
        return self.seq2seq.examples(pairs, table, vocab, lengths)
