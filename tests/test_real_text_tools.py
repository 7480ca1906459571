"""The tools of the "real text" tables, in-process: tools/memorisation.py (how much of a query set an LM completes
from memory) and tools/baselines.py (BM25 / MiniLM / DPR on the same queries)."""

from __future__ import annotations

import json

from gr_jax.data.readers import Corpus, Dataset, QuerySet
from tests.conftest import run_tool, tool


def _dataset():
    corpus = Corpus(["json.dumps", "os.path.join"], ["dumps(obj) more words here", "join(a, *p) more words"],
                    titles=["json.dumps", "os.path.join"])
    queries = {"dev": QuerySet(["q2", "q1", "q3"], ["Join one or more path segments intelligently.",
                                                    "Serialize obj to a JSON formatted str.", "Too short."])}
    qrels = {"dev": {"q1": {"json.dumps": 1}, "q2": {"os.path.join": 1}, "q3": {"json.dumps": 1}}}
    return Dataset(corpus, queries, qrels)


def test_memorisation_prompts_split_each_summary_by_hand():
    items = tool("memorisation").prompts_and_targets(_dataset(), "dev", 2)
    # by query id; "Too short." has fewer than 2 · 2 words and is left out
    assert [q for q, _, _ in items] == ["q1", "q2"]
    q1 = items[0]
    assert q1[1] == '# json.dumps\n"""Serialize obj to' and q1[2] == ["a", "JSON"]
    assert items[1][1] == '# os.path.join\n"""Join one or' and items[1][2] == ["more", "path"]  # 7 words: cut at 3
    assert tool("memorisation").prompts_and_targets(_dataset(), "dev", 2, max_queries=1) == items[:1]


def test_memorisation_tool_runs_on_a_tiny_lm(tiny_hf_llama, capsys):
    rc, out, err = run_tool("memorisation", ["--lm", tiny_hf_llama, "--task", "demo", "--split", "dev",
                                             "--words", "2", "--max_queries", "6"], capsys)
    assert rc == 0, err
    res = json.loads(out)
    assert res["queries"] == 6 and 0 <= res["completed"] <= 6 and res["rate"] == round(res["completed"] / 6, 4)
    assert res["floor_task"] == "demo" and 0.0 <= res["floor_rate"] <= 1.0
    rc, _, err = run_tool("memorisation", ["--lm", tiny_hf_llama, "--task", "demo", "--split", "nosuch"], capsys)
    assert rc == 2 and "--split 'nosuch'" in err


def test_baselines_tool_bm25(tmp_path, capsys):
    rc, out, err = run_tool("baselines", ["--task", "demo", "--splits", "dev", "--systems", "bm25",
                                          "--out_dir", tmp_path / "b"], capsys)
    assert rc == 0, err
    res = json.loads((tmp_path / "b" / "baselines.json").read_text())
    m = res["splits"]["dev"]["systems"]["bm25"]
    assert 0 < m["Hit@1"] <= m["Hit@10"] <= 1 and m["Hit@1"] <= m["MRR@10"] <= m["Hit@10"]
    assert (tmp_path / "b" / "runs" / "dev.bm25.run").is_file() and "| bm25 |" in out
    rc, _, err = run_tool("baselines", ["--task", "demo", "--splits", "nosuch", "--systems", "bm25",
                                        "--out_dir", tmp_path / "c"], capsys)
    assert rc == 2 and "--splits ['nosuch']" in err
