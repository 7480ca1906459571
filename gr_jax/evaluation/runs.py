"""TREC run files and qrels: read, write, and turning ranked beam output into a run.

A run is `{qid: {docid: score}}` and qrels are `{qid: {docid: grade}}` (the shapes ir-measures and
pytrec_eval use), with string ids. Files are whitespace-separated TREC formats:
run `qid Q0 docid rank score tag`, qrels `qid iteration docid grade`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable, Mapping, Sequence

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


def ranked(run_for_query: Mapping[str, float]) -> list[str]:
    """Docids by decreasing score; ties by decreasing docid (trec_eval's convention, which ir-measures and
    pytrec_eval follow), so our metrics agree with theirs on runs with ties."""
    return [d for d, _ in sorted(run_for_query.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)]


def _fields(path: Path, line_no: int, line: str, n: int, what: str) -> list[str]:
    parts = line.split()
    if len(parts) != n:
        raise ValueError(f"{path}:{line_no}: expected {n} fields ({what}), found {len(parts)}: {line.strip()!r}")
    return parts


def _lines(path: Path) -> Iterable[tuple[int, str]]:
    try:
        with open(path, "rb") as f:
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
        q = run.setdefault(qid, {})
        if docid in q:
            raise ValueError(f"{path}:{i}: document {docid!r} appears twice for query {qid!r}")
        q[docid] = value
    return run


def write_run(path: str | os.PathLike, run: Mapping[str, Mapping[str, float]], tag: str = "gr_jax") -> None:
    """Writes a TREC run (ranks 1.. in score order); atomic (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            for qid in sorted(run):
                for rank, docid in enumerate(ranked(run[qid]), 1):
                    f.write(f"{qid} Q0 {docid} {rank} {run[qid][docid]:.6f} {tag}\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_qrels(path: str | os.PathLike) -> Qrels:
    """TREC qrels (`qid iteration docid grade`, tabs or spaces; MS MARCO and TREC DL use this)."""
    path = Path(path)
    qrels: Qrels = {}
    for i, line in _lines(path):
        qid, _, docid, grade = _fields(path, i, line, 4, "qid iteration docid grade")
        try:
            g = int(grade)
        except ValueError:
            raise ValueError(f"{path}:{i}: grade {grade!r} is not an integer") from None
        qrels.setdefault(qid, {})[docid] = g
    return qrels


def write_qrels(path: str | os.PathLike, qrels: Mapping[str, Mapping[str, int]]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for qid in sorted(qrels):
            for docid in sorted(qrels[qid]):
                f.write(f"{qid} 0 {docid} {qrels[qid][docid]}\n")
