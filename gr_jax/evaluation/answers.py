"""Answer accuracy (`Answer@k`): the share of queries with a passage among the first k that contains one of the
query's answer strings — the measure open-domain QA retrieval reports on NQ (DPR's "top-k accuracy", SEAL's A@k).

A passage contains an answer when the answer's tokens occur as a contiguous run of the passage's tokens, both
NFD-normalised and lower-cased, a token being a maximal run of letters, digits and combining marks, or any other
single character that is not a separator or a control character (DPR's simple tokenizer, written here with
`unicodedata`).

Files: `answers.<split>.tsv` beside the dataset, one line per query: `qid \\t ["answer", ...]` (a JSON list; the
qids of queries.<split>.tsv).
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from gr_jax.runtime.io_utils import FileFormatError, open_skipping_bom

ANSWER_METRIC = re.compile(r"^Answer@(\d+)$")


def tokens(text: str) -> list[str]:
    """The lower-cased tokens of `text` after NFD normalisation (module docstring)."""
    out, run = [], []
    for ch in unicodedata.normalize("NFD", text):
        cat = unicodedata.category(ch)
        if cat[0] in "LNM":
            run.append(ch)
            continue
        if run:
            out.append("".join(run).lower())
            run = []
        if cat[0] not in "ZC":
            out.append(ch.lower())
    if run:
        out.append("".join(run).lower())
    return out


def _contains(haystack: Sequence[str], needle: Sequence[str]) -> bool:
    n = len(needle)
    if not n:
        return False
    first = needle[0]
    return any(haystack[i] == first and list(haystack[i:i + n]) == list(needle) for i in range(len(haystack) - n + 1))


def has_answer(passage: str, answers: Iterable[str]) -> bool:
    words = tokens(passage)
    return any(_contains(words, tokens(a)) for a in answers)


def read_answers(path: str | Path) -> dict[str, list[str]]:
    """qid → answer strings from an answers file (module docstring); errors name the file and line."""
    out: dict[str, list[str]] = {}
    with open_skipping_bom(path) as f:
        for i, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise FileFormatError(f"{path}:{i}: not valid UTF-8") from None
            if not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 2:
                raise FileFormatError(f"{path}:{i}: expected 'qid<TAB>[\"answer\", ...]', got {len(parts)} fields")
            try:
                answers = json.loads(parts[1])
            except ValueError:
                answers = None
            if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
                raise FileFormatError(f"{path}:{i}: the answers must be a JSON list of strings")
            if parts[0] in out:
                raise FileFormatError(f"{path}:{i}: query {parts[0]!r} appears twice")
            out[parts[0]] = answers
    return out


def answer_accuracy(run: Mapping[str, Sequence[str]], answers: Mapping[str, Sequence[str]],
                    texts: Mapping[str, str], ks: Sequence[int]) -> dict[str, float]:
    """{"Answer@k": share of the answered queries with an answer-bearing passage among their first k}: `run` is
    qid → documents in rank order, `texts` doc → passage text (those of the run suffice). A query of `answers`
    without a ranking counts 0; queries without answers are not counted."""
    qids = sorted(answers)
    if not qids:
        raise ValueError("answer accuracy: no query has answers")
    first_hit = {}
    for q in qids:
        first_hit[q] = next((r for r, d in enumerate(run.get(q, ())) if has_answer(texts[d], answers[q])), None)
    return {f"Answer@{k}": sum(h is not None and h < k for h in first_hit.values()) / len(qids) for k in ks}


def passage_texts(path: str | Path, wanted: Iterable[str]) -> dict[str, str]:
    """doc → text for the `wanted` documents of a TSV corpus (id, text[, title[, url]]; DPR's header allowed),
    read in one pass without holding the rest (NQ's 21M passages). A wanted id that is missing is an error."""
    from gr_jax.data import readers

    want = set(wanted)
    out: dict[str, str] = {}
    with open_skipping_bom(path) as f:
        first = f.readline().decode("utf-8", "replace").rstrip("\r\n").split("\t")
    n = len(first)
    header = first if [h.lower() for h in first] == ["id", "text", "title"] else None
    for _, fields in readers.iter_tsv(path, n, header=header, names=" (id, text[, title[, url]])"):
        if fields[0] in want:
            out[fields[0]] = fields[1]
    missing = sorted(want - set(out))
    if missing:
        raise FileFormatError(f"{path}: the run retrieves documents that are not in this corpus, e.g. {missing[:3]}")
    return out


def answer_metrics(run_path: str | Path, answers_path: str | Path, corpus_path: str | Path,
                   metrics: Sequence[str]) -> dict[str, float]:
    """`Answer@k` of a TREC run file (module docstring) for the metric names given."""
    from gr_jax.data import trec

    ks = []
    for m in metrics:
        match = ANSWER_METRIC.match(m)
        if not match:
            raise ValueError(f"{m!r} is not an answer metric (Answer@k)")
        ks.append(int(match.group(1)))
    scored = trec.read_run(run_path)
    run = {q: trec.ranked(docs) for q, docs in scored.items()}
    answers = read_answers(answers_path)
    texts = passage_texts(corpus_path, {d for q in answers for d in run.get(q, ())})
    return answer_accuracy(run, answers, texts, ks)
