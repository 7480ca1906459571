"""The dynamic-corpora measures of 000_dynamic_corpora.txt (formulas (4), (5), (7) at the top of that file).

P is the performance matrix: P[o][j] = Hit@10 on the test queries Q_j of part D_j, measured after D_1..D_o
have been indexed (o = 0 is the initial state; only j ≤ o is defined).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np


def forgetting(p_o0: Sequence[float]) -> float:
    """F_n = (1/n) Σ_{o=1..n} max(P_{0,0} − P_{o,0}, 0), from the column [P_{0,0}, P_{1,0}, ..., P_{n,0}]."""
    p = np.asarray(p_o0, float)
    if p.ndim != 1 or len(p) < 2:
        raise ValueError("forgetting needs [P_00, P_10, ..., P_n0] with n >= 1")
    return float(np.mean(np.maximum(p[0] - p[1:], 0.0)))


def generalization(p_oo: Sequence[float]) -> float:
    """GA_n = (1/n) Σ_{o=1..n} P_{o,o}, from the diagonal [P_{0,0}, P_{1,1}, ..., P_{n,n}] (P_00 is skipped)."""
    p = np.asarray(p_oo, float)
    if p.ndim != 1 or len(p) < 2:
        raise ValueError("generalization needs [P_00, P_11, ..., P_nn] with n >= 1")
    return float(np.mean(p[1:]))


def from_matrix(P) -> dict[str, float]:
    """F_n and GA_n for n = 1..N from a square matrix (NaN above the diagonal is fine)."""
    P = np.asarray(P, float)
    if P.ndim != 2 or P.shape[0] != P.shape[1] or P.shape[0] < 2:
        raise ValueError(f"P must be square with at least 2 rows, got shape {P.shape}")
    out = {}
    for n in range(1, P.shape[0]):
        out[f"F_{n}"] = forgetting(P[: n + 1, 0])
        out[f"GA_{n}"] = generalization(np.diag(P)[: n + 1])
    return out


def idbi(rankings: Mapping[str, Sequence[str]], initial_docs: set[str], n_initial: int, n_total: int,
         k: int = 10) -> float:
    """Initial-document bias (formula (7)), averaged over queries.

    Per query, over its top n = min(K, length of its ranking) documents: IDBI = (N_init − E_init) /
    (n − E_init), with N_init the initial (D0) documents among them and E_init = n·|D0| / |D0 ∪ D_new| what
    an unbiased ranking of n documents would hold. With n = K this is the paper's formula; a query that
    returns fewer than K documents is measured on what it returns (so a short, unbiased list scores 0, not
    a negative value), and a query that returns nothing carries no evidence and is left out. 0: no bias;
    1: only D0 documents; negative: biased toward new documents. NaN when no query returned a document.
    """
    if not 0 < n_initial < n_total:
        raise ValueError(f"idbi needs 0 < |D0| < |D0 ∪ D_new|, got {n_initial} and {n_total}")
    if not rankings:
        raise ValueError("idbi: no queries")
    share = n_initial / n_total
    values = []
    for docs in rankings.values():
        top = list(docs)[:k]
        if top:
            n_init = sum(d in initial_docs for d in top)
            values.append((n_init - len(top) * share) / (len(top) * (1.0 - share)))
    return float(np.mean(values)) if values else float("nan")
