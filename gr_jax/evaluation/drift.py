"""Plan-drift diagnostics of the robustness protocol (004 §3.4, Eqs. 7–12, Table 2) for a clean query q and an
intent-preserving variation q̃ (same query id):

* `cand_overlap` — CandOverlap@K = |D_K(q) ∩ D_K(q̃)| / K (Eq. 7): the top-K planned candidates of a planner
  (PAG's s_simul ranking), or, for a retriever without a planner, its final top-K documents. D_K is the
  ranking's first K in `data.trec.ranked` order (ties by document id, never by position), and the
  denominator is K even when a ranking holds fewer documents.
* `tok_jaccard` — TokJaccard@ℓ = |P_ℓ(q) ∩ P_ℓ(q̃)| / |P_ℓ(q) ∪ P_ℓ(q̃)| (Eq. 8) over the top-ℓ planner tokens
  (given in decreasing weight); 1 when both sets are empty.
* `difference` — per-query differences of a metric between two runs: ΔM_SimulOnly = M_SimulOnly(q̃) −
  M_SimulOnly(q) (Eq. 9), PlanSwapDrop = M_PAG(q̃; normal) − M_PAG(q̃; swapped) (Eq. 10), SeqGain =
  M_PAG(q̃) − M_SimulOnly(q̃) (Eq. 11), and the end-to-end degradation Δ = M(q) − M(q̃) of any retriever.
* `collapse` — Eq. 12: a query collapses when (CandOverlap@K < τ ∨ TokJaccard@ℓ < τ) ∧ ΔM_SimulOnly ≤ −δ,
  with τ the `percentile`-th percentile of the condition's CandOverlap@K values (numpy's linear
  interpolation), per split × variation × seed. Without a planner (no token sets) the test is CandOverlap
  alone and ΔM is the end-to-end change. `collapse_sweep` varies the percentile and δ.
* `over_seeds` — mean ± std over seeds of the per-seed means (std with ddof = 1, 0 for a single seed) and the
  tail quantiles p10/p25/p50/p75/p90 of the per-query values pooled over seeds (the boxplots of Figs. 2–3).
"""

from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import numpy as np

from gr_jax.data.trec import ranked
from gr_jax.runtime.io_utils import atomic_file

QUANTILES = (10, 25, 50, 75, 90)


def cand_overlap(clean: Mapping[str, float], varied: Mapping[str, float], k: int) -> float:
    if k < 1:
        raise ValueError(f"CandOverlap@K needs K ≥ 1, got {k}")
    return len(set(ranked(clean)[:k]) & set(ranked(varied)[:k])) / k


def tok_jaccard(clean: Sequence, varied: Sequence, ell: int) -> float:
    if ell < 1:
        raise ValueError(f"TokJaccard@ℓ needs ℓ ≥ 1, got {ell}")
    a, b = set(list(clean)[:ell]), set(list(varied)[:ell])
    return 1.0 if not (a | b) else len(a & b) / len(a | b)


def per_query_overlap(clean_run: Mapping[str, Mapping[str, float]], varied_run: Mapping[str, Mapping[str, float]],
                      k: int) -> dict[str, float]:
    """CandOverlap@K of every query in both runs (a query missing from one of them has no value)."""
    return {q: cand_overlap(clean_run[q], varied_run[q], k) for q in sorted(set(clean_run) & set(varied_run))}


def per_query_jaccard(clean_tokens: Mapping[str, Sequence], varied_tokens: Mapping[str, Sequence],
                      ell: int) -> dict[str, float]:
    return {q: tok_jaccard(clean_tokens[q], varied_tokens[q], ell)
            for q in sorted(set(clean_tokens) & set(varied_tokens))}


def difference(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
    """a − b per query id (over the ids both hold)."""
    return {q: a[q] - b[q] for q in sorted(set(a) & set(b))}


def collapse(cand: Mapping[str, float], delta_m: Mapping[str, float], tok: Optional[Mapping[str, float]] = None,
             percentile: float = 10.0, delta: float = 0.05) -> tuple[float, dict[str, bool]]:
    """(τ, {qid: collapsed}) for one condition (Eq. 12); queries are those with CandOverlap and ΔM (and a token
    Jaccard when `tok` is given)."""
    qids = sorted(set(cand) & set(delta_m) & (set(tok) if tok is not None else set(cand)))
    if not qids:
        return math.nan, {}
    tau = float(np.percentile([cand[q] for q in qids], percentile))
    flags = {}
    for q in qids:
        unstable = cand[q] < tau or (tok is not None and tok[q] < tau)
        flags[q] = bool(unstable and delta_m[q] <= -delta)
    return tau, flags


def collapse_sweep(cand: Mapping[str, float], delta_m: Mapping[str, float], tok: Optional[Mapping[str, float]] = None,
                   percentiles: Sequence[float] = (5, 10, 25), deltas: Sequence[float] = (0.0, 0.05, 0.1)) -> list[dict]:
    """Collapse rate for every (percentile, δ): rows {"percentile", "delta", "tau", "rate"}."""
    rows = []
    for p in percentiles:
        for d in deltas:
            tau, flags = collapse(cand, delta_m, tok, p, d)
            rows.append({"percentile": p, "delta": d, "tau": tau,
                         "rate": (sum(flags.values()) / len(flags)) if flags else math.nan})
    return rows


def over_seeds(values_by_seed: Mapping[int, Mapping[str, float]]) -> dict:
    """{"mean", "std", "seeds", "n", "p10", …, "p90"} of per-query values under several seeds."""
    means = [float(np.mean(list(v.values()))) for v in values_by_seed.values() if len(v)]
    pooled = [x for v in values_by_seed.values() for x in v.values()]
    out = {"mean": float(np.mean(means)) if means else math.nan,
           "std": float(np.std(means, ddof=1)) if len(means) > 1 else 0.0,
           "seeds": len(means), "n": len(pooled)}
    for p in QUANTILES:
        out[f"p{p}"] = float(np.percentile(pooled, p)) if pooled else math.nan
    return out


def plot_boxes(groups: Mapping[str, Mapping[int, Mapping[str, float]]], path, ylabel: str, title: str = "") -> None:
    """One box per group (e.g. variation) of the per-query values pooled over seeds: whiskers p10–p90, box
    p25–p75, median line, and the mean ± std over seeds as a marker (the convention of 004 Figs. 2–3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(groups)
    fig, ax = plt.subplots(figsize=(1.3 * max(3, len(names)) + 1.5, 3.6))
    for i, name in enumerate(names):
        s = over_seeds(groups[name])
        if not s["n"]:
            continue
        ax.add_patch(plt.Rectangle((i - 0.3, s["p25"]), 0.6, s["p75"] - s["p25"], fill=True, alpha=0.25,
                                   color=f"C{i}"))
        ax.plot([i - 0.3, i + 0.3], [s["p50"]] * 2, color=f"C{i}", linewidth=2)
        ax.plot([i, i], [s["p10"], s["p25"]], color=f"C{i}")
        ax.plot([i, i], [s["p75"], s["p90"]], color=f"C{i}")
        ax.plot([i - 0.12, i + 0.12], [s["p10"]] * 2, color=f"C{i}")
        ax.plot([i - 0.12, i + 0.12], [s["p90"]] * 2, color=f"C{i}")
        ax.errorbar([i + 0.38], [s["mean"]], yerr=[s["std"]], fmt="D", color="black", markersize=4, capsize=3)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, fontsize=8)
    ax.set_xlim(-0.6, len(names) - 0.2)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    with atomic_file(path, "wb") as f:
        fig.savefig(f, format="png", dpi=120)
    plt.close(fig)
