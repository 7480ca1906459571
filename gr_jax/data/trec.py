"""TREC run files and qrels — the file formats every layer shares (readers check qrels, baselines and the
trainer write runs, evaluation reads them): read, write, rank in trec_eval's order, cut at k.

A run is `{qid: {docid: score}}` and qrels are `{qid: {docid: grade}}` (the shapes ir-measures and
pytrec_eval use), with string ids. Files are whitespace-separated TREC formats:
run `qid Q0 docid rank score tag`, qrels `qid iteration docid grade`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from gr_jax.runtime.io_utils import atomic_file, open_skipping_bom

Run = dict[str, dict[str, float]]
Qrels = dict[str, dict[str, int]]


def run_from_rankings(rankings: Mapping[str, Sequence[str]]) -> Run:
    """Ranked docids per query → a run with strictly decreasing scores (n, n-1, ..., 1).

    Beam output can rank the same document twice (several docids of one document, or colliding docids);
    the first occurrence is kept, so the scores stay strictly decreasing and ties cannot reorder anything.
    """
    run: Run = {}
    for qid, docs in rankings.items():
        seen: dict[str, float] = {}
        for d in docs:
            if d not in seen:
                seen[d] = 0.0
        n = len(seen)
        run[str(qid)] = {d: float(n - i) for i, d in enumerate(seen)}
    return run


def check_finite(run: Mapping[str, Mapping[str, float]], source: str = "run") -> None:
    """NaN or infinite scores cannot be ranked (NaN compares false with everything): an error naming them."""
    for qid, docs in run.items():
        for doc, score in docs.items():
            if not math.isfinite(score):
                raise ValueError(f"{source}: query {qid!r}, document {doc!r} has score {score}; a run needs finite "
                                 f"scores (a model that produced NaN/inf is broken: check its training)")


def ranked(run_for_query: Mapping[str, float]) -> list[str]:
    """Docids by decreasing score; ties by decreasing docid (trec_eval's convention, which ir-measures and
    pytrec_eval follow), so our metrics agree with theirs on runs with ties."""
    return [d for d, _ in sorted(run_for_query.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)]


def top_k(scores: Mapping[str, float], k: int) -> dict[str, float]:
    """One query's k best documents in `ranked` order: a score tie at the cut goes by docid, never by the
    position a retriever happened to hold the documents in."""
    return {d: scores[d] for d in ranked(scores)[:k]}


def fetch_deciding_ties(fetch, k: int, n_docs: int, margin: int = 100):
    """Runs `fetch(n) -> (result, [descending scores per query])` with n = k + margin, doubling n until the
    top k of every query is decided: its k-th score is above its last fetched score (so no document left out
    can tie with the k-th), or the query has at most k results, or n covers all `n_docs` documents."""
    n = min(k + margin, n_docs)
    while True:
        result, score_rows = fetch(n)
        if n >= n_docs or all(len(r) <= k or r[k - 1] > r[-1] for r in score_rows):
            return result
        n = min(2 * n, n_docs)


def _fields(path: Path, line_no: int, line: str, n: int, what: str) -> list[str]:
    parts = line.split()
    if len(parts) != n:
        raise ValueError(f"{path}:{line_no}: expected {n} fields ({what}), found {len(parts)}: {line.strip()!r}")
    return parts


def _lines(path: Path) -> Iterable[tuple[int, str]]:
    try:
        with open_skipping_bom(path) as f:
            for i, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ValueError(f"{path}:{i}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
                if line.strip():
                    yield i, line
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None


def read_run(path: str | os.PathLike) -> Run:
    path = Path(path)
    run: Run = {}
    for i, line in _lines(path):
        qid, _, docid, rank, score, _tag = _fields(path, i, line, 6, "qid Q0 docid rank score tag")
        try:
            int(rank)
            value = float(score)
        except ValueError:
            raise ValueError(f"{path}:{i}: rank {rank!r} / score {score!r} are not numbers") from None
        if not math.isfinite(value):
            raise ValueError(f"{path}:{i}: score {score!r} is not a finite number; NaN/inf cannot be ranked")
        q = run.setdefault(qid, {})
        if docid in q:
            raise ValueError(f"{path}:{i}: document {docid!r} appears twice for query {qid!r}")
        q[docid] = value
    return run


def write_run(path: str | os.PathLike, run: Mapping[str, Mapping[str, float]], tag: str = "gr_jax",
              keep_previous: bool = True) -> None:
    """Writes a TREC run (ranks 1.. in `ranked` order). Scores are written with `repr`, which reads back to
    the same float, so trec_eval orders the file exactly as we do. Atomic; an earlier, different run file at
    `path` is kept as `<name>.prev-<n>` (io_utils) unless `keep_previous=False`."""
    check_finite(run, str(path))
    with atomic_file(path, "w", keep_previous=keep_previous) as f:
        for qid in sorted(run):
            for rank, docid in enumerate(ranked(run[qid]), 1):
                f.write(f"{qid} Q0 {docid} {rank} {float(run[qid][docid])!r} {tag}\n")


def read_qrels(path: str | os.PathLike, known_docs=None, known_qids=None) -> Qrels:
    """TREC qrels (`qid iteration docid grade`, tabs or spaces; MS MARCO and TREC DL use this). With
    `known_docs` / `known_qids` (containers), a judgement of an unknown document or query is an error naming
    its line; so is a document judged twice with different grades."""
    path = Path(path)
    qrels: Qrels = {}
    for i, line in _lines(path):
        qid, _, docid, grade = _fields(path, i, line, 4, "qid iteration docid grade")
        try:
            g = int(grade)
        except ValueError:
            raise ValueError(f"{path}:{i}: grade {grade!r} is not an integer") from None
        if known_qids is not None and qid not in known_qids:
            raise ValueError(f"{path}:{i}: query {qid!r} is judged but has no query text in the query file")
        if known_docs is not None and docid not in known_docs:
            raise ValueError(f"{path}:{i}: document {docid!r} is not in the corpus")
        judged = qrels.setdefault(qid, {})
        if judged.get(docid, g) != g:
            raise ValueError(f"{path}:{i}: query {qid!r}, document {docid!r} judged again with grade {g} "
                             f"(earlier {judged[docid]})")
        judged[docid] = g
    return qrels


def write_qrels(path: str | os.PathLike, qrels: Mapping[str, Mapping[str, int]]) -> None:
    with atomic_file(path, "w") as f:
        for qid in sorted(qrels):
            for docid in sorted(qrels[qid]):
                f.write(f"{qid} 0 {docid} {qrels[qid][docid]}\n")
