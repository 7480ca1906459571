"""Ultron's three training stages as one run (`UltronStages`, `prepare.objectives_config`).

1. General pre-training — a document's passages → its docid (the title, then consecutive sentences up to
   `passage_words` words; up to `passages_per_document` passages, each starting with the title) and its terms →
   its docid (its distinct words whose TF-IDF over the training corpus is at least the `max_terms`-th highest of
   the document, in document order). Mixed by their counts, as Ultron concatenates them.
2. Search-oriented pre-training — pseudo-queries → docid: a file of generated queries (`pseudo_queries_file`,
   e.g. of `python -m gr_jax.pseudo_queries`), or with `pseudo_queries = 'sentences'` the document's own
   sentences (up to `queries_per_document`) standing in for them where no query generator is at hand.
3. Supervised fine-tuning — the training queries → docid.

The stages take `stage_fractions` of TRAIN_STEPS (Ultron's 10 / 20 / 10 epochs: ¼, ½, ¼ by default). The batches
come from `StagedIterator`: one resumable iterator per stage, switched at the stage boundaries; its state (the
global step and every stage's position) is saved in each checkpoint, so a run killed in any stage resumes into
the batches an uninterrupted run would have drawn.

Not built: Ultron's third general task (the other docid scheme's docid → this docid).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections import Counter
from typing import Optional, Sequence

import gin
import numpy as np

from gr_jax.methods.api import (
    Count,
    dsi_pairs,
    example_store,
    MixtureIterator,
    ObjectiveInputs,
    ObjectivesConfig,
    read_queries_file,
)

log = logging.getLogger(__name__)

STAGES = ("general", "search", "supervised")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"\w+", re.UNICODE)


class StagedIterator:
    """Batches from `stages[k]` for global steps in [bounds[k-1], bounds[k]); the last stage runs on."""

    def __init__(self, stages: Sequence, bounds: Sequence[int], names: Sequence[str] = STAGES):
        if len(bounds) != len(stages) - 1 or list(bounds) != sorted(bounds) or (bounds and bounds[0] < 0):
            raise ValueError(f"StagedIterator: {len(stages)} stages need {len(stages) - 1} increasing bounds, "
                             f"got {list(bounds)}")
        self.stages, self.bounds, self.names = list(stages), [int(b) for b in bounds], list(names)
        self.step = 0

    def stage(self, step: Optional[int] = None) -> int:
        step = self.step if step is None else step
        return int(np.searchsorted(self.bounds, step, side="right"))

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        k = self.stage()
        if k > 0 and self.step == self.bounds[k - 1]:
            log.info("step %d: stage %d (%s) begins", self.step, k + 1, self.names[k])
        batch = next(self.stages[k])
        self.step += 1
        return batch

    def get_state(self) -> dict:
        return {"step": self.step, "bounds": self.bounds, "stages": [s.get_state() for s in self.stages]}

    def set_state(self, state: dict) -> None:
        if list(state.get("bounds", [])) != self.bounds or len(state.get("stages", [])) != len(self.stages):
            raise ValueError(f"data iterator state does not match this pipeline: saved stage bounds "
                             f"{state.get('bounds')}, now {self.bounds}; resuming would change the data order")
        for s, st in zip(self.stages, state["stages"]):
            s.set_state(st)
        self.step = int(state["step"])

    def epochs(self) -> list[float]:
        return self.stages[self.stage()].epochs()


def passages(title: str, text: str, words: int, limit: int) -> list[str]:
    """The title then consecutive sentences, `words` words in all (a sentence longer than the room left starts
    the next passage; one longer than a passage is cut), at most `limit` passages."""
    head = title.split() if title else []
    room = max(words - len(head), 1)
    out: list[list[str]] = []
    current: list[str] = []
    for sentence in (s for s in _SENTENCE.split(text.strip()) if s):
        tokens = sentence.split()
        if current and len(current) + len(tokens) > room:
            out.append(current)
            current = []
            if len(out) == limit:
                break
        current += tokens
    if current and len(out) < limit:
        out.append(current)
    return [" ".join(head + p[:room]) for p in out]


def top_terms(texts: Sequence[str], max_terms: int) -> list[str]:
    """Per text: its distinct words (lower-cased) whose TF-IDF is at least its `max_terms`-th highest, in the
    order they first appear (ties at the cut all kept); idf = log(N / df) over `texts`."""
    words = [[w.lower() for w in _WORD.findall(t)] for t in texts]
    df = Counter(w for ws in words for w in set(ws))
    n = len(texts)
    out = []
    for ws in words:
        tf = Counter(ws)
        score = {w: c * math.log(n / df[w]) for w, c in tf.items()}
        if not score:
            out.append("")
            continue
        cut = sorted(score.values(), reverse=True)[min(max_terms, len(score)) - 1]
        seen, kept = set(), []
        for w in ws:
            if w not in seen and score[w] >= cut:
                kept.append(w)
            seen.add(w)
        out.append(" ".join(kept))
    return out


@gin.configurable
@dataclasses.dataclass
class UltronStages(ObjectivesConfig):
    train_steps: Count = gin.REQUIRED  # bind to %TRAIN_STEPS
    stage_fractions: tuple = (0.25, 0.5, 0.25)
    passage_words: Count = 100
    passages_per_document: Count = 10
    max_terms: Count = 64
    pseudo_queries: str = "file"  # 'file' (pseudo_queries_file) or 'sentences'
    pseudo_queries_file: Optional[str] = None
    queries_per_document: Count = 10

    def __post_init__(self):
        f = [float(x) for x in self.stage_fractions]
        if len(f) != 3 or min(f) < 0 or abs(sum(f) - 1) > 1e-6 or f[2] <= 0:
            raise ValueError(f"UltronStages.stage_fractions must be three shares of TRAIN_STEPS summing to 1 (the "
                             f"last > 0), got {self.stage_fractions}")
        if self.pseudo_queries not in ("file", "sentences"):
            raise ValueError(f"UltronStages.pseudo_queries must be 'file' or 'sentences', got {self.pseudo_queries!r}")
        if self.pseudo_queries == "file" and not self.pseudo_queries_file:
            raise ValueError("UltronStages.pseudo_queries = 'file' needs UltronStages.pseudo_queries_file (python -m "
                             "gr_jax.pseudo_queries writes one), or pseudo_queries = 'sentences'")

    def bounds(self) -> list[int]:
        a = int(round(self.train_steps * self.stage_fractions[0]))
        b = int(round(self.train_steps * (self.stage_fractions[0] + self.stage_fractions[1])))
        if b >= self.train_steps:
            raise ValueError(f"UltronStages: with TRAIN_STEPS {self.train_steps} the supervised stage gets no step; "
                             f"raise TRAIN_STEPS or its share")
        return [a, b]

    def stage_pairs(self, dataset, train_split: str, rows=None) -> list[list]:
        """The pairs of each stage (lists of `data.pairs.Pairs`), for the corpus rows being trained."""
        corpus = dataset.corpus
        rows = np.arange(len(corpus)) if rows is None else np.asarray(rows, np.int64)
        titles = corpus.titles or [""] * len(corpus)
        texts, prow = [], []
        for r in rows:
            for p in passages(titles[int(r)], corpus.texts[int(r)], self.passage_words, self.passages_per_document):
                texts.append(p)
                prow.append(int(r))
        general = [dsi_pairs.Pairs("passage", texts, np.asarray(prow, np.int64))]
        terms = top_terms([corpus.texts[int(r)] for r in rows], self.max_terms)
        keep = [i for i, t in enumerate(terms) if t]
        general.append(dsi_pairs.Pairs("terms", [terms[i] for i in keep], rows[keep]))
        if self.pseudo_queries == "file":
            search = dsi_pairs.document_query_pairs(read_queries_file(self.pseudo_queries_file), corpus,
                                                    name="pseudo-query", restrict_rows=rows,
                                                    source=self.pseudo_queries_file)
        else:
            q_texts, q_rows = [], []
            for r in rows:
                for s in [s for s in _SENTENCE.split(corpus.texts[int(r)].strip()) if s][: self.queries_per_document]:
                    q_texts.append(s)
                    q_rows.append(int(r))
            search = dsi_pairs.Pairs("sentence-query", q_texts, np.asarray(q_rows, np.int64))
        if train_split not in dataset.queries:
            raise ValueError(f"the dataset has no query split {train_split!r} (TRAIN_SPLIT); it has "
                             f"{sorted(dataset.queries)}")
        supervised = dsi_pairs.query_pairs(dataset.queries[train_split], dataset.qrels[train_split], corpus,
                                           restrict_rows=rows)
        stages = [[p for p in general if len(p)], [search] if len(search) else [], [supervised]]
        for name, ps in zip(STAGES, stages):
            if not ps:
                raise ValueError(f"Ultron's {name} stage has no training pairs; check the data and UltronStages")
        return stages

    def iterator(self, inp: ObjectiveInputs) -> StagedIterator:
        if inp.table is None:
            raise ValueError(f"Ultron's stages need docids before training; docid scheme {inp.scheme.name!r} is "
                             f"decoded by the model")
        stages = []
        for k, pairs in enumerate(self.stage_pairs(inp.dataset, inp.train_split)):
            stores = [example_store(p, inp.table, inp.vocab, inp.lengths, all_docids=False) for p in pairs]
            log.info("Ultron stage %d (%s): %s", k + 1, STAGES[k], {p.name: len(s) for p, s in zip(pairs, stores)})
            stages.append(MixtureIterator(stores, inp.batch_size, seed=inp.seed + 1000 * k,
                                          rates=[len(s) for s in stores], names=[p.name for p in pairs]))
        return StagedIterator(stages, self.bounds())
