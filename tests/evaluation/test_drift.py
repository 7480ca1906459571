"""Plan-drift diagnostics against hand computations (004 Eqs. 7–12), and plan collapse on a constructed
condition: one query flagged, one unstable but not degraded, one degraded but stable."""

import math

import numpy as np
import pytest

from gr_jax.evaluation import drift


def test_cand_overlap_by_hand():
    clean = {"a": 3.0, "b": 2.0, "c": 1.0, "d": 0.5}
    varied = {"c": 9.0, "a": 8.0, "x": 7.0, "b": 0.1}
    assert drift.cand_overlap(clean, varied, 2) == 0.5  # {a, b} vs {c, a}
    assert drift.cand_overlap(clean, varied, 3) == pytest.approx(2 / 3)  # {a, b, c} vs {c, a, x}
    assert drift.cand_overlap(clean, varied, 10) == 0.3  # 3 shared, divided by K even if fewer retrieved
    # a tie at the cut goes by document id (ranked: ties by decreasing id), not by dict order
    tied = {"p": 1.0, "q": 1.0}
    assert drift.cand_overlap(tied, {"q": 5.0}, 1) == 1.0
    assert drift.cand_overlap(dict(reversed(list(tied.items()))), {"q": 5.0}, 1) == 1.0
    with pytest.raises(ValueError):
        drift.cand_overlap(clean, varied, 0)


def test_tok_jaccard_by_hand():
    assert drift.tok_jaccard([5, 1, 9, 4], [9, 5, 7, 8], 3) == pytest.approx(2 / 4)  # {5,1,9} ∩ {9,5,7}
    assert drift.tok_jaccard([1, 2], [3, 4], 2) == 0.0
    assert drift.tok_jaccard([], [], 100) == 1.0
    assert drift.per_query_jaccard({"q1": [1, 2], "q2": [3]}, {"q1": [2, 1], "q3": [3]}, 5) == {"q1": 1.0}


def test_differences_by_hand():
    simul_clean = {"q1": 1.0, "q2": 0.5}
    simul_var = {"q1": 0.25, "q2": 0.5}
    assert drift.difference(simul_var, simul_clean) == {"q1": -0.75, "q2": 0.0}  # ΔM_SimulOnly (Eq. 9)
    pag_normal, pag_swapped = {"q1": 0.2}, {"q1": 0.5, "q2": 1.0}
    assert drift.difference(pag_normal, pag_swapped) == {"q1": pytest.approx(-0.3)}  # PlanSwapDrop (Eq. 10)


def test_collapse_on_a_constructed_condition():
    # ten queries; CandOverlap 0.0, 0.1, ..., 0.9 → p10 (linear interpolation) = 0.09
    cand = {f"q{i}": i / 10 for i in range(10)}
    tok = {f"q{i}": 1.0 for i in range(10)}
    dm = {f"q{i}": 0.0 for i in range(10)}
    dm["q0"] = -0.2  # unstable (0.0 < 0.09) and degraded by more than δ: collapsed
    dm["q5"] = -0.5  # degraded but stable (0.5 ≥ 0.09): not collapsed
    tok["q7"] = 0.05  # unstable by tokens only, not degraded: not collapsed
    tau, flags = drift.collapse(cand, dm, tok, percentile=10, delta=0.05)
    assert tau == pytest.approx(0.09)
    assert [q for q, f in flags.items() if f] == ["q0"]
    # unstable by tokens and degraded: collapsed too (the ∨ of Eq. 12)
    dm["q7"] = -0.05  # exactly −δ counts (≤ −δ)
    _, flags = drift.collapse(cand, dm, tok, percentile=10, delta=0.05)
    assert sorted(q for q, f in flags.items() if f) == ["q0", "q7"]
    # without a planner: CandOverlap alone
    _, flags = drift.collapse(cand, dm, None, percentile=10, delta=0.05)
    assert [q for q, f in flags.items() if f] == ["q0"]
    # a larger percentile raises τ: q5 (overlap 0.5 < p60 = 0.54) is now unstable and degraded
    rows = drift.collapse_sweep(cand, dm, tok, percentiles=(10, 60), deltas=(0.05, 0.3))
    rate = {(r["percentile"], r["delta"]): r["rate"] for r in rows}
    assert rate[(10, 0.05)] == pytest.approx(0.2) and rate[(60, 0.05)] == pytest.approx(0.3)
    assert rate[(60, 0.3)] == pytest.approx(0.1)  # only q5 drops by ≥ 0.3
    assert math.isnan(drift.collapse({}, {}, None)[0])


def test_over_seeds_by_hand():
    values = {1999: {"a": 0.0, "b": 1.0}, 5: {"a": 1.0, "b": 1.0}}
    s = drift.over_seeds(values)
    assert s["mean"] == pytest.approx(0.75)  # seed means 0.5 and 1.0
    assert s["std"] == pytest.approx(np.sqrt(((0.5 - 0.75) ** 2 + (1.0 - 0.75) ** 2) / 1))  # ddof = 1
    assert s["n"] == 4 and s["seeds"] == 2
    assert s["p50"] == 1.0 and s["p10"] == pytest.approx(0.3)  # pooled [0, 1, 1, 1]: p10 at rank 0.3
    assert drift.over_seeds({7: {"a": 0.4}})["std"] == 0.0


def test_boxplot_is_written(tmp_path):
    groups = {"misspelling": {1: {"a": 0.2, "b": 0.4}, 2: {"a": 0.1, "b": 0.5}},
              "reordering": {1: {"a": 0.9, "b": 0.8}}}
    drift.plot_boxes(groups, tmp_path / "box.png", "CandOverlap@100")
    assert (tmp_path / "box.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
