"""A benchmark tool replaces its own section of BENCHMARKS.md (`evaluation.report.replace_benchmark_section`): run
twice it leaves one section, with the second run's figure and command; other sections, and a hand-written section
of the same tool, are kept or replaced as the heading says; the earlier file is kept aside when it differs."""

import re

from gr_jax.evaluation.report import benchmark_writer, replace_benchmark_section
from tests.conftest import REPO, run_tool


def _sections(text: str) -> list[str]:
    return re.findall(r"(?m)^## (\S+)", text)


def test_replacing_keeps_one_section_per_tool(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# Benchmarks\n\n## bench_other: kept\n\nother\n\n## bench_x — 2026-01-01\n\nold figure\n\n"
                    "## bench_y\n\ny\n")
    replace_benchmark_section(path, "bench_x", "\n## anything the tool wrote\n\n| a |\n|---|\n| 1 |\n")
    text = path.read_text()
    assert _sections(text) == ["bench_other:", "bench_x", "bench_y"]
    assert "old figure" not in text and "| 1 |" in text and "other" in text and "\ny\n" in text
    assert list(tmp_path.glob("BENCHMARKS.md.prev-*"))  # the earlier file, kept aside
    with benchmark_writer(path, "bench_z") as f:  # a tool without a section yet: appended
        f.write("## bench_z\n\nz\n")
    assert _sections(path.read_text()) == ["bench_other:", "bench_x", "bench_y", "bench_z"]


def test_a_tool_run_twice_leaves_one_section(tmp_path, capsys, monkeypatch):
    tool_root = tmp_path / "root"
    tool_root.mkdir()
    (tool_root / "BENCHMARKS.md").write_text("# Benchmarks\n\n## bench_data — 2020-01-01\n\nstale\n")
    from tests.conftest import tool

    module = tool("bench_data")
    monkeypatch.setattr(module, "ROOT", tool_root)
    for rows in ("2000", "3000"):
        code, _, _ = run_tool("bench_data", ["--rows", rows], capsys)
        assert code == 0
    text = (tool_root / "BENCHMARKS.md").read_text()
    assert _sections(text) == ["bench_data"]
    assert "--rows 3000" in text and "--rows 2000" not in text and "stale" not in text
    assert (REPO / "BENCHMARKS.md").exists()
