"""Evaluation curves of trained runs: read by hand-written eval_metrics.jsonl files, compared by
tools/compare_runs.py (table by hand, one PNG per metric, bad input → exit 2)."""

import json
from pathlib import Path

import pytest

from gr_jax.evaluation.report import read_eval_curve
from tests.conftest import tool as tool_module


def _write(d: Path, records):
    d.mkdir(parents=True)
    (d / "eval_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_read_eval_curve_orders_steps_keeps_the_last_record_and_separates_the_final(tmp_path):
    _write(tmp_path / "a", [{"step": 200, "Hit@1": 0.2}, {"step": 100, "Hit@1": 0.1},
                            {"step": 200, "Hit@1": 0.25},  # a resumed run evaluated step 200 again
                            {"step": 300, "final/Hit@1": 0.3}])
    curve, final = read_eval_curve(tmp_path / "a")
    assert curve == [{"step": 100, "Hit@1": 0.1}, {"step": 200, "Hit@1": 0.25}]
    assert final == {"Hit@1": 0.3}
    (tmp_path / "a" / "eval_metrics.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match=r"eval_metrics.jsonl:1: not an evaluation record"):
        read_eval_curve(tmp_path / "a")


@pytest.mark.slow  # runs a command's entry point (tools/compare_runs.py main, plots included)
def test_compare_runs_table_and_plots(tmp_path, capsys):
    _write(tmp_path / "p", [{"step": 100, "Hit@1": 0.2}, {"step": 200, "Hit@1": 0.2}, {"step": 200, "final/Hit@1": 0.3}])
    _write(tmp_path / "r", [{"step": 100, "Hit@1": 0.1}, {"step": 200, "Hit@1": 0.15}])
    tool = tool_module("compare_runs")
    assert tool.main([f"prefix={tmp_path / 'p'}", f"random={tmp_path / 'r'}", "--metrics", "Hit@1",
                      "--out", str(tmp_path / "out")]) == 0
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| prefix | 0.3000 | 0.2000 (100) |" in table  # best periodic: the earliest of equal values
    assert "| random |  | 0.1500 (200) |" in table  # no final evaluation: empty cell
    assert (tmp_path / "out" / "curves_Hit_at_1.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    assert tool.main(["prefix", "--out", str(tmp_path / "o2")]) == 2
    assert "expected LABEL=MODEL_DIR" in capsys.readouterr().err
    assert tool.main([f"x={tmp_path / 'missing'}", "--out", str(tmp_path / "o3")]) == 2
    assert "cannot read it" in capsys.readouterr().err
