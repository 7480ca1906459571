"""Metrics against pytrec_eval (through ir-measures), run/qrels files, the eval command, dynamic measures."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from gr_jax import eval as eval_cmd
from gr_jax.data import trec
from gr_jax.evaluation import metrics, report
from gr_jax.evaluation import dynamic_measures
from tests.conftest import require

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _random_case(seed: int, n_queries: int = 30, n_docs: int = 40):
    rng = np.random.default_rng(seed)
    qrels, run = {}, {}
    for q in range(n_queries):
        qid = f"q{q}"
        judged = rng.choice(n_docs, size=rng.integers(1, 8), replace=False)
        grades = rng.integers(0, 4, len(judged))
        grades[0] = max(grades[0], 2)  # every query has a document relevant at threshold 2
        qrels[qid] = {f"d{d}": int(g) for d, g in zip(judged, grades)}
        if q % 7 == 3:
            continue  # some qrels queries have no results
        retrieved = rng.choice(n_docs, size=rng.integers(1, 30), replace=False)
        scores = rng.integers(0, 6, len(retrieved)).astype(float)  # many ties
        run[qid] = {f"d{d}": float(s) for d, s in zip(retrieved, scores)}
    run["q_not_judged"] = {"d1": 1.0}
    return run, qrels


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("threshold", [1, 2])
def test_parity_with_pytrec_eval(seed, threshold):
    ir_measures = require("ir_measures")
    require("pytrec_eval")
    run, qrels = _random_case(seed)
    # ir-measures scores qrels queries without results as 0: our missing_as_zero=True
    ours = metrics.per_query(run, qrels, ["Hit@1", "Hit@5", "Recall@10", "MRR@10", "MRR@1000", "nDCG@5",
                                          "nDCG@10"], rel_threshold=threshold, missing_as_zero=True)
    spec = {"Hit@1": ir_measures.Success(rel=threshold) @ 1, "Hit@5": ir_measures.Success(rel=threshold) @ 5,
            "Recall@10": ir_measures.R(rel=threshold) @ 10, "MRR@1000": ir_measures.RR(rel=threshold),
            "nDCG@5": ir_measures.nDCG @ 5, "nDCG@10": ir_measures.nDCG @ 10}
    theirs = {}
    for m in ir_measures.pytrec_eval.iter_calc(list(spec.values()), qrels, run):
        theirs.setdefault(m.query_id, {})[str(m.measure)] = m.value
    assert set(theirs) == set(ours) == set(qrels)
    assert set(metrics.per_query(run, qrels, ["Hit@1"])) == set(qrels) & set(run)  # trec_eval's default
    for qid in ours:
        for name, measure in spec.items():
            assert math.isclose(ours[qid][name], theirs[qid][str(measure)], abs_tol=1e-9), (qid, name)
        # trec_eval's recip_rank has no cutoff (ir-measures' pytrec_eval provider ignores RR@k's): MRR@10 is
        # its value when the first relevant document is within the top 10, else 0.
        rr = theirs[qid][str(spec["MRR@1000"])]
        assert math.isclose(ours[qid]["MRR@10"], rr if rr >= 0.1 else 0.0, abs_tol=1e-9), qid


def test_hand_worked_query():
    qrels = {"q": {"a": 1, "b": 3, "c": 0}}
    run = {"q": {"x": 5.0, "c": 4.0, "b": 4.0, "a": 1.0}}  # tie c/b: decreasing docid puts c first
    assert trec.ranked(run["q"]) == ["x", "c", "b", "a"]
    got = metrics.evaluate(run, qrels, ["Hit@2", "Hit@3", "MRR@10", "Recall@3", "nDCG@4"])
    assert got["Hit@2"] == 0.0 and got["Hit@3"] == 1.0
    assert got["MRR@10"] == pytest.approx(1 / 3) and got["Recall@3"] == pytest.approx(0.5)
    dcg = 3 / math.log2(4) + 1 / math.log2(5)
    idcg = 3 / math.log2(2) + 1 / math.log2(3)
    assert got["nDCG@4"] == pytest.approx(dcg / idcg)


def test_msmarco_official_and_subsets_and_accumulation():
    qrels = {"1": {"a": 1}, "2": {"b": 1}, "3": {"c": 1}}
    run = {"1": {"a": 2.0}, "2": {"x": 1.0, "b": 0.5}}
    assert metrics.evaluate(run, qrels, ["MRR@10"])["MRR@10"] == pytest.approx(0.75)
    assert metrics.evaluate(run, qrels, ["MRR@10"], missing_as_zero=True)["MRR@10"] == pytest.approx(0.5)
    assert metrics.evaluate(run, qrels, ["MRR@10"], queries=["2"])["MRR@10"] == pytest.approx(0.5)
    a = metrics.accumulate(run, qrels, ["MRR@10"], queries=["1"])
    b = metrics.accumulate(run, qrels, ["MRR@10"], queries=["2"])
    assert a.merge(b).means()["MRR@10"] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="unknown metric 'MAP'"):
        metrics.Metric.parse("MAP")
    assert metrics.Metric.parse("Success@5") == metrics.Metric("Hit", 5)


def test_run_from_rankings_dedupes_and_decreases():
    run = trec.run_from_rankings({"q": ["d3", "d1", "d3", "d2"]})
    assert trec.ranked(run["q"]) == ["d3", "d1", "d2"]
    assert list(run["q"].values()) == [3.0, 2.0, 1.0]


def test_run_and_qrels_files(tmp_path):
    run = {"q1": {"d1": 2.5, "d2": 1.0}, "q2": {"d9": 0.1}}
    trec.write_run(tmp_path / "r.txt", run, tag="t")
    assert (tmp_path / "r.txt").read_text().splitlines()[0] == "q1 Q0 d1 1 2.5 t"  # repr: reads back exactly
    assert trec.read_run(tmp_path / "r.txt") == run
    trec.write_qrels(tmp_path / "q.txt", {"q1": {"d1": 2}})
    assert trec.read_qrels(tmp_path / "q.txt") == {"q1": {"d1": 2}}
    (tmp_path / "bad.txt").write_text("q1 Q0 d1 1 2.5 t\nq1 Q0 d2 2\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: expected 6 fields"):
        trec.read_run(tmp_path / "bad.txt")
    (tmp_path / "dup.txt").write_text("q1 Q0 d1 1 2.5 t\nq1 Q0 d1 2 2.0 t\n")
    with pytest.raises(ValueError, match=r"dup.txt:2: document 'd1' appears twice"):
        trec.read_run(tmp_path / "dup.txt")
    (tmp_path / "enc.txt").write_bytes(b"q1 0 d1 1\nq2 0 d\xff 1\n")
    with pytest.raises(ValueError, match=r"enc.txt:2: not valid UTF-8"):
        trec.read_qrels(tmp_path / "enc.txt")
    (tmp_path / "grade.txt").write_text("q1 0 d1 high\n")
    with pytest.raises(ValueError, match=r"grade.txt:1: grade 'high'"):
        trec.read_qrels(tmp_path / "grade.txt")


@pytest.mark.slow
def test_eval_command(tmp_path, capsys):
    trec.write_run(tmp_path / "run.txt", {"1": {"a": 3.0, "b": 2.0}, "2": {"x": 1.0, "c": 0.5}})
    trec.write_qrels(tmp_path / "qrels.txt", {"1": {"b": 2}, "2": {"c": 1}, "3": {"d": 1}})
    out = tmp_path / "m.json"
    assert eval_cmd.main(["--run", str(tmp_path / "run.txt"), "--qrels", str(tmp_path / "qrels.txt"),
                          "--metrics", "Hit@1,Hit@2,MRR@10", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| run | Hit@1 | Hit@2 | MRR@10 | queries |" in table
    assert "| 0.0000 | 1.0000 | 0.5000 | 2 |" in table
    assert json.loads(out.read_text())["runs"][str(tmp_path / "run.txt")]["MRR@10"] == 0.5
    assert eval_cmd.main(["--run", str(tmp_path / "run.txt"), "--qrels", str(tmp_path / "qrels.txt"),
                          "--metrics", "Hit@1", "--msmarco_official", "--rel_threshold", "2"]) == 0
    assert "| 0.0000 | 1 |" not in capsys.readouterr().out  # 3 qrels queries are averaged now
    assert eval_cmd.main(["--run", str(tmp_path / "missing.txt"), "--qrels", str(tmp_path / "qrels.txt")]) == 2


def test_published_forgetting_and_generalization():
    """Every F_5 (Table 1) and GA_5 (Table 2) of the paper recomputed from its published row."""
    tables = json.loads((FIXTURES / "dynamic_corpora_tables.json").read_text())
    n = 0
    for method, by_dataset in tables["table1_P_o0_and_F5"].items():
        for dataset, entry in by_dataset.items():
            assert dynamic_measures.forgetting(entry["hit10_D0_to_D5"]) == pytest.approx(entry["summary"], abs=1e-3), \
                (method, dataset)
            n += 1
    for method, by_dataset in tables["table2_P_oo_and_GA5"].items():
        for dataset, entry in by_dataset.items():
            assert dynamic_measures.generalization(entry["hit10_D0_to_D5"]) == pytest.approx(entry["summary"], abs=1e-3), \
                (method, dataset)
            n += 1
    assert n == 44


def test_from_matrix_and_idbi_by_hand():
    P = [[0.8, np.nan, np.nan], [0.7, 0.5, np.nan], [0.9, 0.4, 0.3]]
    got = dynamic_measures.from_matrix(P)
    assert got["F_1"] == pytest.approx(0.1) and got["GA_1"] == pytest.approx(0.5)
    assert got["F_2"] == pytest.approx((0.1 + 0.0) / 2) and got["GA_2"] == pytest.approx(0.4)
    # |D0| = 50 of 100 documents, K = 4 → E_init = 2. Query a: 4 initial docs → 1; query b: 1 → -0.5.
    initial = {"i1", "i2", "i3", "i4"}
    value = dynamic_measures.idbi({"a": ["i1", "i2", "i3", "i4", "n9"], "b": ["n1", "i1", "n2", "n3"]}, initial, 50, 100, k=4)
    assert value == pytest.approx((1.0 - 0.5) / 2)
    # Short lists are measured on what they return (n = 2 → E_init = 1): two initial documents → (2-1)/(2-1) = 1,
    # one of each → 0 (an unbiased short list is not "biased toward new documents"); an empty list is left out.
    assert dynamic_measures.idbi({"c": ["i1", "i2"]}, initial, 50, 100, k=4) == pytest.approx(1.0)
    assert dynamic_measures.idbi({"c": ["i1", "n1"], "e": []}, initial, 50, 100, k=4) == pytest.approx(0.0)
    # |D0| = 30 of 120 (share 1/4), K = 10, 3 results of which 1 initial: (1 - 0.75) / (3 - 0.75) = 1/9.
    assert dynamic_measures.idbi({"d": ["i1", "n1", "n2"]}, initial, 30, 120, k=10) == pytest.approx(1 / 9)
    assert np.isnan(dynamic_measures.idbi({"e": []}, initial, 50, 100, k=4))
    with pytest.raises(ValueError, match="0 < |D0|"):
        dynamic_measures.idbi({"a": ["x"]}, set(), 0, 10)


def test_markdown_table():
    assert report.metrics_table({"bm25": {"Hit@1": 0.5}, "dsi": {"Hit@1": 0.25, "Hit@10": 1.0}}).splitlines() == [
        "| run | Hit@1 | Hit@10 |", "|---|---|---|", "| bm25 | 0.5000 |  |", "| dsi | 0.2500 | 1.0000 |"]
