"""tools/docid_stats.py, in-process: a scheme's statistics on the demo corpus, and a refusal with exit code 2."""

import json

from tests.conftest import run_tool


def test_docid_stats_tool_on_demo(capsys):
    rc, out, err = run_tool("docid_stats", ["--scheme", "url", "--corpus", "demo", "--docs", "50"], capsys)
    assert rc == 0, err
    out = json.loads(out)
    assert out["documents"] == 50 and out["collision_rate"] == 0.0  # demo URLs are unique
    assert sum(out["length_histogram"].values()) == 50 and out["distinct_tokens"] > 5
    rc, _, err = run_tool("docid_stats", ["--scheme", "pq", "--corpus", "demo", "--docs", "50"], capsys)
    assert rc == 2 and "256 clusters but only 50 points" in err


def test_docid_stats_tool_multi_docids(capsys):
    rc, out, err = run_tool("docid_stats", ["--scheme", "ngram", "--corpus", "demo", "--docs", "50"], capsys)
    assert rc == 0, err
    out = json.loads(out)
    assert out["documents"] == 50 and out["docids"] > 50  # several n-grams per document
    assert out["docids_per_document_mean"] == out["docids"] / 50
    assert 0.0 < out["identifying_fraction"] <= 1.0 and out["documents_per_docid_max"] >= 1
