"""The dynamic-corpora split of 000_dynamic_corpora.txt.

D0 = a random 50% of the documents; D1..D5 = the other documents in five parts of (about) 10% each. Every
query follows its relevant document: P0 = the training queries of D0 documents, Q_o = the test queries of
D_o documents. A query judged relevant to documents in several parts follows the earliest part (so a query
answerable from D0 stays a D0 query). Seeded: the same seed gives the same split, and the split depends on
the *set* of document ids, never on their order in the corpus file (the permutation is drawn over the ids
sorted as strings); query lists are sorted.

Two ways to place the queries (`protocol`):
* `'dataset'` keeps the dataset's own query splits: P0 = the *training* queries of D0 documents, Q_o = the
  *test* queries of D_o documents.
* `'paper'` is 000's §3.1 as published: every judged query of both splits is pooled and follows its document;
  the pairs of D0 split into P0 (train) and Q0 (test) — a seeded `test_fraction` of D0's queries drawn over their
  sorted ids —, and Q_o is every pair of D_o (o ≥ 1). The documents D0..Dn are the same as with `'dataset'`.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np


@dataclasses.dataclass
class DynamicSplit:
    parts: list[list[str]]  # D0, D1, ..., Dn: document ids
    train_queries: list[str]  # P0: training queries of D0 documents
    test_queries: list[list[str]]  # Q0, Q1, ..., Qn
    seed: int

    def part_of(self) -> dict[str, int]:
        return {d: o for o, docs in enumerate(self.parts) for d in docs}

    def documents_up_to(self, o: int) -> list[str]:
        """D0 ∪ ... ∪ D_o, the corpus after the o-th incremental step."""
        return [d for part in self.parts[: o + 1] for d in part]


PROTOCOLS = ("dataset", "paper")


def pooled_qrels(train_qrels: Mapping[str, Mapping[str, int]], test_qrels: Mapping[str, Mapping[str, int]],
                 what: str = "the dataset") -> dict:
    """The judgements of both query splits as one; a query id judged in both must have the same judgements."""
    both = sorted(set(train_qrels) & set(test_qrels))
    clash = [q for q in both if dict(train_qrels[q]) != dict(test_qrels[q])]
    if clash:
        raise ValueError(f"{what}: query ids {clash[:3]} are judged differently in the train and the test split; "
                         f"the paper's split pools them, so each id must name one query")
    return {**{q: dict(j) for q, j in train_qrels.items()}, **{q: dict(j) for q, j in test_qrels.items()}}


def dynamic_split(doc_ids: Sequence[str], train_qrels: Mapping[str, Mapping[str, int]],
                  test_qrels: Mapping[str, Mapping[str, int]], seed: int = 0, initial_fraction: float = 0.5,
                  n_parts: int = 5, protocol: str = "dataset", test_fraction: float = 0.2) -> DynamicSplit:
    """Splits documents into D0..Dn and assigns every judged query to the part of its relevant document (see the
    module docstring for `protocol`)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"the split protocol must be one of {PROTOCOLS}, got {protocol!r}")
    if protocol == "paper" and not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if not 0 < initial_fraction < 1:
        raise ValueError(f"initial_fraction must be in (0, 1), got {initial_fraction}")
    canonical = sorted(doc_ids)
    if len(set(canonical)) != len(canonical):
        raise ValueError("dynamic_split: duplicate document ids")
    n = len(canonical)
    if n < n_parts + 1:
        raise ValueError(f"dynamic_split: {n} documents cannot fill D0 and {n_parts} parts")
    order = np.random.default_rng(seed).permutation(n)
    n0 = int(round(n * initial_fraction))
    shuffled = [canonical[i] for i in order]
    parts = [shuffled[:n0]] + [list(p) for p in np.array_split(np.array(shuffled[n0:], dtype=object), n_parts)]
    part = {d: o for o, docs in enumerate(parts) for d in docs}

    def home(qid: str, judged: Mapping[str, int]) -> int:
        rel = [part[d] for d, g in judged.items() if g > 0 and d in part]
        if not rel:
            raise ValueError(f"dynamic_split: query {qid!r} has no relevant document in the corpus")
        return min(rel)

    if protocol == "paper":
        pooled = pooled_qrels(train_qrels, test_qrels)
        homes = {q: home(q, judged) for q, judged in sorted(pooled.items())}
        d0_queries = sorted(q for q, o in homes.items() if o == 0)
        # a stream of its own (seed, 1), so that the documents' permutation above stays the 'dataset' one
        draw = np.random.default_rng([seed, 1]).permutation(len(d0_queries))
        n_test = int(round(len(d0_queries) * test_fraction))
        q0 = {d0_queries[i] for i in draw[:n_test]}
        train = [q for q in d0_queries if q not in q0]
        tests = [sorted(q0)] + [sorted(q for q, o in homes.items() if o == k) for k in range(1, len(parts))]
        return DynamicSplit(parts, train, tests, seed)
    train = sorted(q for q, judged in train_qrels.items() if home(q, judged) == 0)
    tests = [[] for _ in parts]
    for q, judged in test_qrels.items():
        tests[home(q, judged)].append(q)
    return DynamicSplit(parts, train, [sorted(t) for t in tests], seed)
