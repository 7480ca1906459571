"""`python -m gr_jax.reproduce`: a small paper of fast systems end to end (reuse, a changed recipe, a failure,
a missing system), the paired randomisation test by hand, and the shipped paper files."""

import json
from pathlib import Path

import numpy as np
import pytest

from gr_jax import reproduce as cmd
from gr_jax.protocols import paper_tables as rp

QUICK = ["load_dataset.demo_docs = 60", "run_dynamic.progress = False"]


def _paper(tmp_path, systems):
    (tmp_path / "papers").mkdir(exist_ok=True)
    published = {"BM25": {"NQ": [0.9, 0.8, 0.8, 0.7, 0.7, 0.6]}}
    spec = {"paper": "a toy paper", "quick": QUICK, "systems": systems,
            "tables": {"table1": {"title": "T1", "measure": "initial", "rows": list(systems),
                                  "published": published},
                       "table2": {"title": "T2", "measure": "new", "rows": list(systems), "published": published}}}
    (tmp_path / "papers" / "toy.json").write_text(json.dumps(spec))


def test_the_paired_randomisation_test_by_hand():
    same = [np.array([1.0, 0.0, 1.0])]
    assert rp.paired_randomisation(same, same, permutations=2000) == (0.0, 1.0)
    # three queries, each a win for a: of the 8 sign patterns only all-+ and all-− reach |d| = 1 → p ≈ 1/4
    diff, p = rp.paired_randomisation([np.ones(3)], [np.zeros(3)], permutations=20000)
    assert diff == 1.0 and p == pytest.approx(0.25, abs=0.01)
    # two groups: the statistic is the mean of the groups' means, not the mean over queries
    a, b = [np.array([1.0]), np.array([1.0, 0.0, 0.0, 0.0])], [np.array([0.0]), np.zeros(4)]
    assert rp.statistic(a) == pytest.approx((1.0 + 0.25) / 2)
    assert rp.paired_randomisation(a, b, permutations=100)[0] == pytest.approx(0.625)
    nan = rp.paired_randomisation([np.zeros(0)], [np.zeros(0)])  # no query: no test, not the smallest p
    assert all(np.isnan(x) for x in nan)
    assert rp.kendall_tau(["a", "b", "c"], ["a", "b", "c"]) == 1.0
    assert rp.kendall_tau(["a", "b", "c"], ["c", "b", "a"]) == -1.0


def test_shipped_papers_load_and_name_existing_experiment_files():
    for path in sorted((Path(rp.gin_utils.GIN_CONFIGS) / "papers").glob("*.json")):
        paper = rp.load_paper(path.stem)
        for name in rp.order(paper, [r for t in paper.tables.values() for r in t["rows"]]):
            for f in paper.systems[name]["gin"]:
                rp.gin_utils.resolve(f)  # raises for a file that does not exist
        argv = rp.command(paper, "LTRGR", Path("out"), [], [], quick=True)
        assert "--gin_bindings=INITIAL_CHECKPOINT_PATH = 'out/systems/MINDER/model'" in argv
        assert rp.order(paper, ["LTRGR"]) == ["MINDER", "LTRGR"]


def test_a_system_is_run_again_when_what_it_starts_from_changes(tmp_path):
    need = tmp_path / "MINDER"
    (need / "dynamic").mkdir(parents=True)
    (need / "recipe.json").write_text("{}")
    (need / "dynamic" / "dynamic.json").write_text('{"P": [[0.5]]}')
    (tmp_path / "x.gin").write_text("A = 1\n")
    argv = [f"--gin_file={tmp_path / 'x.gin'}"]
    before = rp.recipe(argv, (), {"MINDER": need})
    assert rp.recipe(argv, (), {"MINDER": need}) == before
    (need / "dynamic" / "dynamic.json").write_text('{"P": [[0.6]]}')  # MINDER ran again, with other results
    assert rp.recipe(argv, (), {"MINDER": need}) != before


def test_the_status_keeps_systems_not_run_yet(tmp_path):
    previous = {"A": {"status": "ran", "seconds": 3.0}, "B": {"status": "ran", "seconds": 5.0}}
    rp.write_status(tmp_path / "out", previous, {"B": {"status": "reused", "seconds": 5.0}})
    rp.write_status(tmp_path / "out", previous, {"B": {"status": "reused", "seconds": 5.0}, "C": {"status": "ran"}})
    assert json.loads((tmp_path / "out" / "reproduce_status.json").read_text()) == {
        "A": {"status": "ran", "seconds": 3.0}, "B": {"status": "reused", "seconds": 5.0}, "C": {"status": "ran"}}


def test_a_result_is_shown_only_while_its_recipe_and_what_it_starts_from_hold(tmp_path):
    systems = {"A": {"gin": ["experiments/demo/dynamic_bm25.gin"]},
               "B": {"gin": ["experiments/demo/dynamic_bm25.gin"], "needs": ["A"]}}
    _paper(tmp_path, systems)
    paper = rp.load_paper("toy", [str(tmp_path)])
    out = tmp_path / "out"

    def finished(name, rec):
        d = out / "systems" / name
        (d / "dynamic").mkdir(parents=True, exist_ok=True)
        (d / "dynamic" / "dynamic.json").write_text("{}")
        (d / "recipe.json").write_text(json.dumps(rec))
        (d / "run_seconds.json").write_text(json.dumps(  # what a run records: its result's digest
            {"seconds": 1.0, "results_digest": rp.file_digest(d / "dynamic" / "dynamic.json")}))

    def rec(name):
        needs = {n: out / "systems" / n for n in systems[name].get("needs", [])}
        return rp.recipe(rp.command(paper, name, out, [], [], False), [str(tmp_path)], needs)

    current = lambda name: rp._current(paper, name, out, [], [], False, [str(tmp_path)])  # noqa: E731
    finished("B", {"stale": True})
    assert not current("B")  # A has no run: B's result is not current (and no error)
    finished("A", rec("A"))
    assert current("A") and not current("B")  # B's recipe is another
    finished("B", rec("B"))
    assert current("B")
    (out / "systems" / "B" / "dynamic" / "dynamic.json").write_text('{"GA_5": 0.999}')  # edited: not shown
    assert not current("B")
    finished("B", rec("B"))
    (out / "systems" / "A" / "dynamic" / "dynamic.json").write_text('{"P": 1}')  # A ran again
    assert not current("B")


@pytest.mark.slow
def test_a_small_paper_end_to_end(tmp_path, capsys):
    (tmp_path / "dense16.gin").write_text("include 'experiments/demo/dynamic_dense.gin'\nTfidfSvdEmbedder.dim = 16\n")
    systems = {"BM25": {"gin": ["experiments/demo/dynamic_bm25.gin"]},
               "Dense": {"gin": ["dense16.gin"]},
               "Alias": {"same_as": "BM25"},
               "Later": {"missing": "not built yet"}}
    _paper(tmp_path, systems)
    out = tmp_path / "out"
    argv = ["--paper", "toy", f"--gin.OUTPUT_DIR='{out}'", "--quick", f"--gin_search_paths={tmp_path}"]
    assert cmd.main(argv) == 0
    md = (out / "paper" / "tables.md").read_text()
    assert "| Later | ours | no run: not built yet |" in md
    assert "| BM25 | published NQ | 0.900 | 0.800 |" in md
    bm25 = json.loads((out / "systems" / "BM25" / "dynamic" / "dynamic.json").read_text())
    assert "| BM25 | ours | " + " | ".join(f"{x:.3f}" for x in bm25["initial_P_o0"]) in md
    assert "| Alias | ours | " + " | ".join(f"{x:.3f}" for x in bm25["initial_P_o0"]) in md  # same_as: one run
    assert not (out / "systems" / "Alias").exists()
    tests = json.loads((out / "paper" / "significance.json").read_text())["tables"]
    pairs = {(t["a"], t["b"]) for t in tests["table1"]}
    assert pairs == {("BM25", "Dense"), ("Dense", "Alias")}  # Alias and BM25 are one run: no test
    for t in tests["table1"] + tests["table2"]:
        assert 0 < t["p"] <= 1
    assert (out / "paper" / "tables.png").stat().st_size > 5000
    status = json.loads((out / "reproduce_status.json").read_text())
    assert {k: v["status"] for k, v in status.items()} == {"BM25": "ran", "Dense": "ran"}

    # each system's times (tools/bench_systems.py)
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "tools/bench_systems.py", str(out), "--no_write"], cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    rows = {r["system"]: r for r in map(json.loads, res.stdout.splitlines())}
    assert sorted(rows) == ["BM25", "Dense"] and all(float(r["D0: train + index s"]) > 0 for r in rows.values())

    # again: both reused, the same tables (replaced quietly)
    assert cmd.main(argv) == 0
    first = status
    status = json.loads((out / "reproduce_status.json").read_text())
    assert {k: v["status"] for k, v in status.items()} == {"BM25": "reused", "Dense": "reused"}
    assert all(status[k]["seconds"] == first[k]["seconds"] for k in status)  # the times of the runs reused
    assert not (out / "paper.prev-1").exists()
    # one system asked for: the tables still hold every current result (the same tables again)
    assert cmd.main(argv + ["--only", "Dense"]) == 0
    assert (out / "paper" / "tables.md").read_text() == md and not (out / "paper.prev-1").exists()

    # a changed experiment file: that system runs again, its earlier run kept aside
    (tmp_path / "dense16.gin").write_text("include 'experiments/demo/dynamic_dense.gin'\nTfidfSvdEmbedder.dim = 12\n")
    assert cmd.main(argv) == 0
    status = json.loads((out / "reproduce_status.json").read_text())
    assert {k: v["status"] for k, v in status.items()} == {"BM25": "reused", "Dense": "ran"}
    assert (out / "systems" / "Dense.prev-1" / "dynamic" / "dynamic.json").is_file()

    # a system that fails: the others are reported, the command exits 1 naming its log
    systems["Broken"] = {"gin": ["experiments/demo/dynamic_bm25.gin"], "bindings": ["run_dynamic.k = -3"]}
    _paper(tmp_path, systems)
    capsys.readouterr()
    assert cmd.main(argv) == 1
    err = capsys.readouterr().err
    assert "Broken: error: bad gin binding: run_dynamic.k must be an integer ≥ 1, got -3 (log: " in err
    assert "| Broken | ours | failed (exit 2;" in (out / "paper" / "tables.md").read_text()

    assert cmd.main(["--paper", "nope", f"--gin.OUTPUT_DIR='{tmp_path / 'x'}'"]) == 2
    assert "no paper 'nope'" in capsys.readouterr().err


def test_every_system_process_shares_one_compilation_cache(tmp_path, monkeypatch):
    """`reproduce` gives each system's process OUTPUT_DIR/xla_cache (programs common to systems of one architecture
    compile once), unless the caller chose a cache; the process itself is not started here."""
    seen = []

    class Done:
        returncode = 1

    def fake_run(argv, stdout=None, stderr=None, env=None):
        seen.append(env)
        return Done()

    monkeypatch.setattr(rp.subprocess, "run", fake_run)
    monkeypatch.delenv(rp.CACHE_VARIABLE, raising=False)
    cache = rp.RunDir(tmp_path / "out").compilation_cache
    (tmp_path / "x.gin").write_text("A = 1\n")
    out = rp.run_system("X", [f"--gin_file={tmp_path / 'x.gin'}"], tmp_path / "out" / "systems" / "X", (),
                        compilation_cache=cache)
    assert out["status"] == "failed" and seen[-1][rp.CACHE_VARIABLE] == str(cache)
    monkeypatch.setenv(rp.CACHE_VARIABLE, str(tmp_path / "mine"))
    rp.run_system("Y", [f"--gin_file={tmp_path / 'x.gin'}"], tmp_path / "out" / "systems" / "Y", (),
                  compilation_cache=cache)
    assert seen[-1][rp.CACHE_VARIABLE] == str(tmp_path / "mine")


def test_two_systems_at_a_time_and_a_system_waits_for_the_one_it_starts_from(tmp_path, monkeypatch):
    """`jobs=2`: B and C run beside each other, D (which starts from B) waits for B's outcome; the status file lists
    the systems in the paper's order whatever order they finish in. (Processes are replaced by a failing stub.)"""
    import threading
    import time

    _paper(tmp_path, {"B": {"gin": ["experiments/demo/dynamic_bm25.gin"]},
                      "C": {"gin": ["experiments/demo/dynamic_bm25.gin"]},
                      "D": {"gin": ["experiments/demo/dynamic_bm25.gin"], "needs": ["B"]}})
    events, lock = [], threading.Lock()

    def fake(name, argv, model_dir, search_paths, needs=None, compilation_cache=None, shared=False):
        with lock:
            events.append(("start", name, shared))
        time.sleep({"B": 0.3, "C": 0.1, "D": 0.0}[name])
        with lock:
            events.append(("end", name, shared))
        return {"status": "failed", "exit_code": 1, "log": "x", "last_line": "stub", "seconds": 0.0}

    monkeypatch.setattr(rp, "run_system", fake)
    rec = rp.reproduce("toy", str(tmp_path / "out"), search_paths=[str(tmp_path)], jobs=2)
    starts = [e[1] for e in events if e[0] == "start"]
    assert starts[:2] == ["B", "C"] and all(e[2] for e in events)  # sharing the cache …
    assert events.index(("start", "C", True)) < events.index(("end", "B", True))  # … side by side
    # D waited for B (0.3 s, while C's worker was free after 0.1 s): it saw B fail and was skipped, never started
    assert "D" not in starts and rec["status"]["D"] == {"status": "skipped", "why": "['B'] failed"}
    assert list(rec["status"]) == ["B", "C", "D"]
    assert list(json.loads((tmp_path / "out" / "reproduce_status.json").read_text())) == ["B", "C", "D"]


def test_a_reused_system_result_is_checked_against_its_digest(tmp_path, monkeypatch, caplog):
    """A system whose recipe holds is reused only while its dynamic.json is the file its run wrote: an edited one
    is run again (named in a warning; the system's own run keeps the edited file as dynamic.json.prev-<n>)."""
    import json
    import logging

    runs = []

    class Done:
        returncode = 0

    def fake_run(argv, stdout=None, stderr=None, env=None):  # the system's process: writes its result
        model_dir = Path(next(a for a in argv if a.startswith("--gin.MODEL_DIR=")).split("=", 1)[1].strip("'"))
        (model_dir / "dynamic").mkdir(parents=True, exist_ok=True)
        rp.write_text(model_dir / "dynamic" / "dynamic.json", json.dumps({"GA_5": 0.5}), keep_previous=True)
        runs.append(argv)
        return Done()

    monkeypatch.setattr(rp.subprocess, "run", fake_run)
    (tmp_path / "x.gin").write_text("A = 1\n")
    model_dir = tmp_path / "out" / "systems" / "X"
    args = ("X", [f"--gin_file={tmp_path / 'x.gin'}"], model_dir, ())
    assert rp.run_system(*args)["status"] == "ran" and len(runs) == 1
    assert rp.run_system(*args)["status"] == "reused" and len(runs) == 1
    (model_dir / "dynamic" / "dynamic.json").write_text(json.dumps({"GA_5": 0.999}))  # edited, recipe unchanged
    with caplog.at_level(logging.WARNING, logger="gr_jax.protocols.paper_tables"):
        assert rp.run_system(*args)["status"] == "ran" and len(runs) == 2
    assert "dynamic.json is not the result its run wrote" in caplog.text
    assert json.loads((model_dir / "dynamic" / "dynamic.json").read_text()) == {"GA_5": 0.5}
    assert (model_dir / "dynamic" / "dynamic.json.prev-1").is_file()
    assert rp.run_system(*args)["status"] == "reused"
    for damaged in ('{"seconds": 1', "[]", '{"seconds": 1}'):  # cut off, not a record, no digest: run again
        (model_dir / "run_seconds.json").write_text(damaged)
        assert rp.run_system(*args)["status"] == "ran"
