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
"rare" keys; their occurrences come from the index). SEAL's first pass scores each candidate by the rare keys
it holds (each key once, discounted by `cover` in the greedy's key order), and only the best `fully_score`
(1500) go on; the full scoring then takes every key with w > 0, frequent ones included (found by scanning the
candidate).

The unigram bonus (SEAL's `unigram_scores`): each token type t has a score u(t), the log-odds above with
P(t|q) the model's first-step probability of t (no exponent, no 1e-10), for the `top_k_unigrams` most probable
types only and 0 for the special ids and the tokens of one-token keys (`type_scores`). After the greedy, every
distinct type at a position no key took adds u(t) · cover((t,), C). The best `len(keys)` types by u also join
the keys as one-token keys of weight u (`best_unigrams`; SEAL's add_best_unigrams_to_ngrams).

Where SEAL's own code (seal/keys.py `aggregate_evidence`, which tests/fixtures/seal_scoring.json records)
differs, on purpose: its first pass keeps one set of covered positions across all documents and marks the
positions *after* each occurrence (its index stores documents reversed), so which documents reach the full
scoring depends on the suffix array's row order; here the first pass is per document and depends on nothing
but the keys. And SEAL keeps equal scores in the order documents reached the full scoring; here ties are broken
by row. With at most `fully_score` candidates, both give the same scores.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Key:
    tokens: tuple  # the key's token ids (a title key includes its DOC_START prefix)
    score: float  # log P(n | q)
    count: int  # F(n)
    weight: Optional[float] = None  # given instead of w(score, count): a best unigram's u(t)


def type_scores(unigram_log_probs: np.ndarray, counts: np.ndarray, positions: int, excluded, top_k: int = 5000,
                smoothing: float = 5.0) -> np.ndarray:
    """u(t) for every token id (module docstring): `unigram_log_probs` [V] the model's first-step log P(t|q),
    `counts` [V] each type's occurrences in the index, `excluded` ids that score 0 (the special ids and the
    tokens of one-token keys)."""
    lp = np.asarray(unigram_log_probs, np.float64)
    V = len(lp)
    order = np.lexsort((np.arange(V), -lp))  # most probable first, ties by id
    keep = np.zeros(V, bool)
    keep[order[:top_k]] = True
    out = np.zeros(V)
    for t in np.flatnonzero(keep & (np.asarray(counts[:V]) > 0)).tolist():
        if t in excluded or not math.isfinite(lp[t]) or lp[t] >= 0.0:
            continue
        snr = math.log((int(counts[t]) + smoothing) / (positions + smoothing))
        out[t] = max(0.0, (lp[t] + math.log1p(-math.exp(snr))) - (snr + math.log1p(-math.exp(lp[t]))))
    return out


def best_unigrams(types: np.ndarray, n: int) -> list[int]:
    """The n types of highest u(t) (ties by id), SEAL's add_best_unigrams_to_ngrams: they join the keys."""
    return np.lexsort((np.arange(len(types)), -np.asarray(types)))[:n].tolist()


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
                   beta: float = 0.8, matched: bool = False, types: Optional[np.ndarray] = None,
                   fully_score: Optional[int] = None) -> list[tuple]:
    """(row, score) of every candidate document with a positive score, best first (ties: row ascending); with
    `matched`, (row, score, the indices of the keys that counted for it, in the greedy order): LTRGR's stored
    keys.

    keys: the query's distinct keys; found[i]: (rows, start positions) arrays of every occurrence of key i
    (from the index; needed for the keys with count ≤ max_hits, None for the others); documents(rows): the
    candidates' identifier tokens as one array [len(rows), W], −1 past each one's end (scanned for the frequent
    keys); positions: N; types: u(t) of every token id (`type_scores`; None: no unigram bonus); fully_score: how
    many candidates of the first pass are scored fully (None: all).

    The greedy runs key by key (in `document_score`'s order) over every candidate at once: positions are
    global over the candidates laid end to end, `used` marks taken positions, `types` the token types taken
    per document. `document_score` is the same computation for one document, written plainly (tests compare).
    """
    w = np.array([weight(k.score, k.count, positions, smoothing, exponent) if k.weight is None else k.weight
                  for k in keys])
    live = [i for i in range(len(keys)) if w[i] > 0]
    rare = [i for i in live if keys[i].count <= max_hits]
    for i in rare:
        if len(found[i][0]) != keys[i].count:
            raise ValueError(f"SEAL scoring: key {keys[i].tokens} occurs {keys[i].count} times but "
                             f"{len(found[i][0])} occurrences were given")
    candidates = np.unique(np.concatenate([np.asarray(found[i][0], np.int64) for i in rare])) if rare else []
    if not len(candidates):
        return []
    if fully_score is not None and len(candidates) > fully_score:
        candidates = _first_pass(keys, w, rare, found, candidates, beta, fully_score)
    texts = np.asarray(documents(candidates), np.int32)
    texts = np.concatenate([texts, np.full((len(texts), 1), -1, np.int32)], axis=1)  # -1: no key crosses
    offsets = np.arange(len(texts) + 1, dtype=np.int64) * texts.shape[1]
    joined = texts.ravel()
    used = np.zeros(len(joined), bool)
    vocab = {t: u for u, t in enumerate(sorted({t for i in live for t in keys[i].tokens}))}
    types_ = np.zeros((len(candidates), len(vocab)), bool)
    score = np.zeros(len(candidates))
    taken = [[] for _ in candidates] if matched else None
    width = texts.shape[1]
    by_token = np.argsort(joined, kind="stable")  # the positions of each token, ascending: a frequent key's
    sorted_tokens = joined[by_token]              # occurrences from its first token's, not a scan of the texts
    for i in sorted(live, key=lambda i: (-w[i], keys[i].tokens)):
        L = len(keys[i].tokens)
        if keys[i].count <= max_hits:
            rows, starts = np.asarray(found[i][0], np.int64), np.asarray(found[i][1], np.int64)
            kept = np.isin(rows, candidates)  # all of them, unless the first pass left documents out
            at = np.sort(offsets[np.searchsorted(candidates, rows[kept])] + starts[kept])
        else:
            k = keys[i].tokens
            at = by_token[np.searchsorted(sorted_tokens, k[0], "left"): np.searchsorted(sorted_tokens, k[0], "right")]
            for j in range(1, L):  # -1 ends every text, so a key never runs past one and at + j stays inside
                at = at[joined[np.minimum(at + j, len(joined) - 1)] == k[j]]
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
        hit = np.unique(at // width)
        cols = np.array(sorted({vocab[t] for t in keys[i].tokens}))
        new = (~types_[hit][:, cols]).sum(axis=1)
        score[hit] += w[i] * (1.0 - beta + beta * new / len(cols))
        types_[np.ix_(hit, cols)] = True
        if matched:
            for h in hit.tolist():
                taken[h].append(i)
    if types is not None:
        score += _unigram_bonus(joined, used, texts.shape[1], len(candidates), types, vocab, types_taken=types_,
                                beta=beta)
    if matched:
        out = [(int(r), float(v), taken[j]) for j, (r, v) in enumerate(zip(candidates, score)) if v > 0]
        out.sort(key=lambda x: (-x[1], x[0]))
        return out
    out = [(int(r), float(v)) for r, v in zip(candidates, score) if v > 0]
    out.sort(key=lambda x: (-x[1], x[0]))
    return out


def _first_pass(keys, w, rare, found, candidates, beta: float, keep: int) -> np.ndarray:
    """The `keep` best candidates by SEAL's first pass: the rare keys each document holds, once each, in the
    greedy's key order, discounted by `cover`; ties by row. Sorted by row again."""
    first = np.zeros(len(candidates))
    vocab = {t: u for u, t in enumerate(sorted({t for i in rare for t in keys[i].tokens}))}
    seen = np.zeros((len(candidates), len(vocab)), bool)
    for i in sorted(rare, key=lambda i: (-w[i], keys[i].tokens)):
        hit = np.unique(np.searchsorted(candidates, np.asarray(found[i][0], np.int64)))
        cols = np.array(sorted({vocab[t] for t in keys[i].tokens}))
        new = (~seen[hit][:, cols]).sum(axis=1)
        first[hit] += w[i] * (1.0 - beta + beta * new / len(cols))
        seen[np.ix_(hit, cols)] = True
    best = np.lexsort((candidates, -first))[:keep]
    return np.sort(candidates[best])


def _unigram_bonus(joined: np.ndarray, used: np.ndarray, width: int, n: int, types: np.ndarray, vocab: dict,
                   types_taken: np.ndarray, beta: float) -> np.ndarray:
    """Per candidate, Σ over the distinct types at the positions no key took of u(t) · cover((t,), C)."""
    at = np.flatnonzero(~used & (joined >= 0))
    tokens = joined[at].astype(np.int64)
    doc = at // width
    pairs = np.unique(doc * (len(types) + 1) + np.minimum(tokens, len(types)))
    doc, tokens = pairs // (len(types) + 1), pairs % (len(types) + 1)
    inside = tokens < len(types)
    doc, tokens = doc[inside], tokens[inside]
    u = np.asarray(types, np.float64)[tokens]
    col = np.array([vocab.get(int(t), -1) for t in tokens], np.int64)
    taken = np.zeros(len(tokens), bool)
    known = col >= 0
    taken[known] = types_taken[doc[known], col[known]]
    bonus = np.zeros(n)
    np.add.at(bonus, doc, np.where(u > 0, u * np.where(taken, 1.0 - beta, 1.0), 0.0))
    return bonus
