"""`load_dataset.query_files`: MS MARCO's collection with query splits from named files (PAG's raw.tsv query
files, TREC DL topics with graded qrels), and the per-split relevance threshold of the evaluation."""

import pytest

from gr_jax.compose import EvalConfig
from gr_jax.data.sources import load_dataset


def _layout(tmp_path):
    (tmp_path / "collection.tsv").write_text("0\tthe cat sat\n1\ta dog ran\n2\tbirds fly\n")
    (tmp_path / "dl").mkdir()
    (tmp_path / "dl" / "raw.tsv").write_text("q1\tcat\nq2\tdog\n")
    (tmp_path / "dl" / "qrels.tsv").write_text("q1 0 0 3\nq1 0 2 1\nq2 0 1 2\n")
    return tmp_path


def test_query_files_name_each_split(tmp_path):
    ds = load_dataset("msmarco", str(_layout(tmp_path)), query_files={"dl19": ["dl/raw.tsv", "dl/qrels.tsv"]})
    assert list(ds.queries) == ["dl19"] and ds.queries["dl19"].qids == ["q1", "q2"]
    assert ds.qrels["dl19"]["q1"] == {"0": 3, "2": 1}


def test_query_files_errors_name_the_file(tmp_path):
    d = _layout(tmp_path)
    with pytest.raises(ValueError, match="dl/missing.tsv does not exist"):
        load_dataset("msmarco", str(d), query_files={"dl19": ["dl/missing.tsv", "dl/qrels.tsv"]})
    with pytest.raises(ValueError, match="must be \\[queries file, qrels file\\]"):
        load_dataset("msmarco", str(d), query_files={"dl19": "dl/raw.tsv"})
    with pytest.raises(ValueError, match="for the msmarco layout"):
        load_dataset("demo", query_files={"dl19": ["a", "b"]})


def test_relevance_threshold_per_split():
    cfg = EvalConfig(rel_threshold={"dl19": 2, "dl20": 2}).validate()
    assert (cfg.threshold("dl19"), cfg.threshold("dev")) == (2, 1)
    assert EvalConfig(rel_threshold=2).validate().threshold("dev") == 2
    with pytest.raises(ValueError, match="EvalConfig.rel_threshold \\(dl19\\)"):
        EvalConfig(rel_threshold={"dl19": 0}).validate()
