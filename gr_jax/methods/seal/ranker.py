"""SEAL's LM+FM intersective scoring: from generated n-grams (keys) to a ranking of documents.

A key n has the model's score s = log P(n | q) (the sum of its tokens' log-probabilities, not length
normalised) and its corpus frequency F(n). With P(n) = (F(n) + smoothing) / (N + smoothing), N the number of
positions of the index (every token and one end per document, as SEAL's `len(index)`), its weight is the
squared, clipped log-odds

    w(n) = max(0, log[ P(n|q) (1 − P(n)) / ( P(n) (1 − P(n|q)) ) ]) ** exponent        (exponent 2)

(s is lowered by 1e-10 so that P(n|q) = 1 stays finite, as SEAL does). A document's score sums the weights of
its keys, each counted once, over *non-overlapping* occurrences taken greedily by weight, each discounted by
how much of it is new: with C the token types of the keys already taken for this document,

    cover(n, C) = 1 − β + β · |types(n) \\ C| / |types(n)|          (β = repetition_penalty, 0.8)

Ties in the greedy order are broken by the key's tokens, then the position: the result never depends on the
order keys arrive in. Candidates are the documents of the keys that occur at most `max_hits` times (SEAL's
"rare" keys; their occurrences come from the index); every key with w > 0, frequent ones included (found by
scanning the candidate), then scores each candidate (SEAL's full scoring; here every candidate is fully scored,
SEAL scores the best 1500 of a first pass). Left out: SEAL's unigram bonus (the query-span keys are
`model._SealRanking._query_keys`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Key:
    tokens: tuple  # the key's token ids (a title key includes its DOC_START prefix)
    score: float  # log P(n | q)
    count: int  # F(n)


def weight(score: float, count: int, positions: int, smoothing: float = 5.0, exponent: float = 2.0) -> float:
    """w(n) of the module docstring; 0 for a key that does not occur."""
    if count <= 0 or not math.isfinite(score):
        return 0.0
    sr = min(score, 0.0) - 1e-10
    snr = math.log((count + smoothing) / (positions + smoothing))
    odds = (sr + math.log1p(-math.exp(snr))) - (snr + math.log1p(-math.exp(sr)))
    return max(0.0, odds) ** exponent


def cover(tokens: Sequence[int], taken: set, beta: float) -> float:
    types = set(tokens)
    return 1.0 - beta + beta * len(types - taken) / len(types)


def occurrences(document: Sequence[int], key: Sequence[int]) -> np.ndarray:
    """Start positions of `key` in `document` (overlapping occurrences included): the positions of its first
    token, narrowed token by token."""
    doc, k = np.asarray(document), np.asarray(key)
    if len(k) == 0 or len(k) > len(doc):
        return np.zeros(0, np.int64)
    at = np.flatnonzero(doc[: len(doc) - len(k) + 1] == k[0])
    for j in range(1, len(k)):
        at = at[doc[at + j] == k[j]]
    return at


def document_score(keys: Sequence[Key], weights: Sequence[float], found: dict, beta: float = 0.8,
                   matched: bool = False):
    """One document's score. `found[i]`: the start positions of key i in the document (keys absent: no
    entry). With `matched`: (score, the indices of the keys that counted, in the greedy order)."""
    order = sorted(((-weights[i], keys[i].tokens, int(p), i) for i, ps in found.items() if weights[i] > 0
                    for p in ps))
    used, taken_keys, types, total, taken = set(), set(), set(), 0.0, []
    for _, tokens, p, i in order:
        span = range(p, p + len(tokens))
        if any(q in used for q in span):
            continue
        used.update(span)
        if i not in taken_keys:
            taken_keys.add(i)
            taken.append(i)
            total += weights[i] * cover(tokens, types, beta)
            types.update(tokens)
    return (total, taken) if matched else total


def rank_documents(keys: Sequence[Key], found: Sequence, documents: Callable[[np.ndarray], np.ndarray],
                   positions: int,
                   max_hits: int = 1500, smoothing: float = 5.0, exponent: float = 2.0,
                   beta: float = 0.8, matched: bool = False) -> list[tuple]:
    """(row, score) of every candidate document with a positive score, best first (ties: row ascending); with
    `matched`, (row, score, the indices of the keys that counted for it, in the greedy order): LTRGR's stored
    keys.

    keys: the query's distinct keys; found[i]: (rows, start positions) arrays of every occurrence of key i
    (from the index; needed for the keys with count ≤ max_hits, None for the others); documents(rows): the
    candidates' identifier tokens as one array [len(rows), W], −1 past each one's end (scanned for the frequent
    keys); positions: N.

    The greedy runs key by key (in `document_score`'s order) over every candidate at once: positions are
    global over the candidates laid end to end, `used` marks taken positions, `types` the token types taken
    per document. `document_score` is the same computation for one document, written plainly (tests compare).
    """
    w = np.array([weight(k.score, k.count, positions, smoothing, exponent) for k in keys])
    live = [i for i in range(len(keys)) if w[i] > 0]
    rare = [i for i in live if keys[i].count <= max_hits]
    for i in rare:
        if len(found[i][0]) != keys[i].count:
            raise ValueError(f"SEAL scoring: key {keys[i].tokens} occurs {keys[i].count} times but "
                             f"{len(found[i][0])} occurrences were given")
    candidates = np.unique(np.concatenate([np.asarray(found[i][0], np.int64) for i in rare])) if rare else []
    if not len(candidates):
        return []
    texts = np.asarray(documents(candidates), np.int32)
    texts = np.concatenate([texts, np.full((len(texts), 1), -1, np.int32)], axis=1)  # -1: no key crosses
    offsets = np.arange(len(texts) + 1, dtype=np.int64) * texts.shape[1]
    joined = texts.ravel()
    used = np.zeros(len(joined), bool)
    vocab = {t: u for u, t in enumerate(sorted({t for i in live for t in keys[i].tokens}))}
    types = np.zeros((len(candidates), len(vocab)), bool)
    score = np.zeros(len(candidates))
    taken = [[] for _ in candidates] if matched else None
    for i in sorted(live, key=lambda i: (-w[i], keys[i].tokens)):
        L = len(keys[i].tokens)
        if keys[i].count <= max_hits:
            doc = np.searchsorted(candidates, np.asarray(found[i][0], np.int64))
            at = offsets[doc] + np.asarray(found[i][1], np.int64)
        else:
            at = occurrences(joined, keys[i].tokens)
        at = np.sort(at)
        span = at[:, None] + np.arange(L)
        free = ~used[span].any(axis=1)
        at, span = at[free], span[free]
        if len(at) > 1 and (np.diff(at) < L).any():  # occurrences of this key overlap each other: left first
            keep, last = [], -L
            for a in at.tolist():
                if a >= last + L:
                    keep.append(True)
                    last = a
                else:
                    keep.append(False)
            at, span = at[keep], span[keep]
        if not len(at):
            continue
        used[span.ravel()] = True
        hit = np.unique(np.searchsorted(offsets, at, side="right") - 1)
        cols = np.array(sorted({vocab[t] for t in keys[i].tokens}))
        new = (~types[hit][:, cols]).sum(axis=1)
        score[hit] += w[i] * (1.0 - beta + beta * new / len(cols))
        types[np.ix_(hit, cols)] = True
        if matched:
            for h in hit.tolist():
                taken[h].append(i)
    if matched:
        out = [(int(r), float(v), taken[j]) for j, (r, v) in enumerate(zip(candidates, score)) if v > 0]
        out.sort(key=lambda x: (-x[1], x[0]))
        return out
    out = [(int(r), float(v)) for r, v in zip(candidates, score) if v > 0]
    out.sort(key=lambda x: (-x[1], x[0]))
    return out
