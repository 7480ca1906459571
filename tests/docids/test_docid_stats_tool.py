import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_docid_stats_tool_on_demo():
    res = subprocess.run([sys.executable, "tools/docid_stats.py", "--scheme", "url", "--corpus", "demo",
                          "--docs", "50"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["documents"] == 50 and out["collision_rate"] == 0.0  # demo URLs are unique
    assert sum(out["length_histogram"].values()) == 50 and out["distinct_tokens"] > 5
    bad = subprocess.run([sys.executable, "tools/docid_stats.py", "--scheme", "pq", "--corpus", "demo",
                          "--docs", "50"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "256 clusters but only 50 points" in bad.stderr


def test_docid_stats_tool_multi_docids():
    res = subprocess.run([sys.executable, "tools/docid_stats.py", "--scheme", "ngram", "--corpus", "demo",
                          "--docs", "50"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["documents"] == 50 and out["docids"] > 50  # several n-grams per document
    assert out["docids_per_document_mean"] == out["docids"] / 50
    assert 0.0 < out["identifying_fraction"] <= 1.0 and out["documents_per_docid_max"] >= 1
