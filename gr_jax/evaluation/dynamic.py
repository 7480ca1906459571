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

    IDBI = (N_init − E_init) / (K − E_init), N_init = initial (D0) documents among a query's top K,
    E_init = K·|D0| / |D0 ∪ D_new| (what an unbiased ranking would hold). 0: no bias; 1: only D0 documents;
    negative: biased toward new documents. Queries with fewer than K results count the documents present.
    """
    if not 0 < n_initial < n_total:
        raise ValueError(f"idbi needs 0 < |D0| < |D0 ∪ D_new|, got {n_initial} and {n_total}")
    e_init = k * n_initial / n_total
    values = [(sum(d in initial_docs for d in list(docs)[:k]) - e_init) / (k - e_init)
              for docs in rankings.values()]
    if not values:
        raise ValueError("idbi: no queries")
    return float(np.mean(values))
