"""Retrieval metrics that agree with trec_eval / ir-measures (tested to 1e-9 against pytrec_eval).

Names: `Hit@k` (= Success@k; what GR papers call Recall@k on NQ320k), `Recall@k`, `MRR@k`, `nDCG@k`.
Conventions:
* ranking: decreasing score, ties by decreasing docid (trec_eval's order; `runs.ranked`);
* binary measures count a document as relevant when its grade ≥ `rel_threshold` (1 by default; TREC DL
  passage uses 2); nDCG uses the grades themselves as linear gains (grades below 1 count 0), with the ideal
  ranking taken from all judged documents, as trec_eval's ndcg_cut;
* queries: by default the queries present in both qrels and run are averaged (trec_eval without -c);
  `missing_as_zero=True` averages over every qrels query, scoring a query without results 0 — the official
  MS MARCO MRR@10, which divides by the number of qrels queries;
* per-query values are accumulated as (sum, count) pairs, so results of shards can be merged exactly.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Iterable, Mapping, Optional

import numpy as np

from gr_jax.data.trec import Qrels, Run, check_finite, ranked

_NAME = re.compile(r"^(Hit|Success|Recall|MRR|RR|nDCG)@(\d+)$")
_ALIASES = {"Success": "Hit", "RR": "MRR"}


@dataclasses.dataclass(frozen=True)
class Metric:
    kind: str  # "Hit" | "Recall" | "MRR" | "nDCG"
    k: int

    @property
    def name(self) -> str:
        return f"{self.kind}@{self.k}"

    @classmethod
    def parse(cls, name: str) -> "Metric":
        m = _NAME.match(name.strip())
        if not m:
            raise ValueError(f"unknown metric {name!r}; expected Hit@k, Recall@k, MRR@k or nDCG@k")
        kind = _ALIASES.get(m.group(1), m.group(1))
        k = int(m.group(2))
        if k <= 0:
            raise ValueError(f"metric {name!r}: k must be positive")
        return cls(kind, k)

    def per_query(self, ranking: list[str], judged: Mapping[str, int], rel_threshold: int) -> float:
        top = ranking[: self.k]
        if self.kind == "nDCG":
            gains = [max(judged.get(d, 0), 0) for d in top]
            dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains))
            ideal = sorted((max(g, 0) for g in judged.values()), reverse=True)[: self.k]
            idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
            return dcg / idcg if idcg > 0 else 0.0
        hits = [judged.get(d, 0) >= rel_threshold for d in top]
        if self.kind == "Hit":
            return 1.0 if any(hits) else 0.0
        if self.kind == "MRR":
            return next((1.0 / (i + 1) for i, h in enumerate(hits) if h), 0.0)
        n_rel = sum(1 for g in judged.values() if g >= rel_threshold)
        return sum(hits) / n_rel if n_rel else 0.0


@dataclasses.dataclass
class MeanAccumulator:
    """(sum, count) per metric; `merge` combines shards, `means` gives the averages."""

    sums: dict[str, float] = dataclasses.field(default_factory=dict)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + value
        self.counts[name] = self.counts.get(name, 0) + 1

    def merge(self, other: "MeanAccumulator") -> "MeanAccumulator":
        out = MeanAccumulator(dict(self.sums), dict(self.counts))
        for name in other.sums:
            out.sums[name] = out.sums.get(name, 0.0) + other.sums[name]
            out.counts[name] = out.counts.get(name, 0) + other.counts[name]
        return out

    def means(self) -> dict[str, float]:
        return {n: self.sums[n] / self.counts[n] for n in self.sums if self.counts[n]}


def per_query(run: Run, qrels: Qrels, metrics: Iterable[str | Metric], rel_threshold: int = 1,
              queries: Optional[Iterable[str]] = None, missing_as_zero: bool = False) -> dict[str, dict[str, float]]:
    """{qid: {metric name: value}} over the evaluated queries (see the module docstring)."""
    ms = [m if isinstance(m, Metric) else Metric.parse(m) for m in metrics]
    check_finite(run)
    qids = set(qrels) if queries is None else set(queries) & set(qrels)
    if not missing_as_zero:
        qids &= set(run)
    out = {}
    for qid in sorted(qids):
        ranking = ranked(run.get(qid, {}))
        out[qid] = {m.name: m.per_query(ranking, qrels[qid], rel_threshold) for m in ms}
    return out


def evaluate(run: Run, qrels: Qrels, metrics: Iterable[str | Metric], rel_threshold: int = 1,
             queries: Optional[Iterable[str]] = None, missing_as_zero: bool = False) -> dict[str, float]:
    """Mean of each metric; `queries` restricts to a subset (e.g. NQ320k seen / unseen)."""
    ms = [m if isinstance(m, Metric) else Metric.parse(m) for m in metrics]
    means = accumulate(run, qrels, ms, rel_threshold, queries, missing_as_zero).means()
    return {m.name: means.get(m.name, 0.0) for m in ms}


def accumulate(run: Run, qrels: Qrels, metrics: Iterable[str | Metric], rel_threshold: int = 1,
               queries: Optional[Iterable[str]] = None, missing_as_zero: bool = False) -> MeanAccumulator:
    acc = MeanAccumulator()
    for values in per_query(run, qrels, metrics, rel_threshold, queries, missing_as_zero).values():
        for name, v in values.items():
            acc.add(name, v)
    return acc


def metric_values(run: Run, qrels: Qrels, metric: str, rel_threshold: int = 1) -> dict[str, float]:
    """query id → the value of one metric, a query missing from the run counting 0 (MS MARCO's convention)."""
    return {q: v[metric] for q, v in per_query(run, qrels, [metric], rel_threshold, missing_as_zero=True).items()}


def mean_metric(run: Run, qrels: Qrels, metric: str, rel_threshold: int = 1) -> float:
    """The mean of `metric_values` over the judged queries."""
    return float(np.mean(list(metric_values(run, qrels, metric, rel_threshold).values())))
