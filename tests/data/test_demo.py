"""The embedded demo corpus: deterministic, well-formed, and neither trivial nor hopeless for BM25."""

import pytest

from gr_jax.data import demo
from gr_jax.evaluation import metrics
from tests.conftest import require


def test_deterministic_and_well_formed():
    a, b, c = demo.generate(300, seed=1), demo.generate(300, seed=1), demo.generate(300, seed=2)
    assert list(a.corpus.texts) == list(b.corpus.texts) and a.queries["test"].texts == b.queries["test"].texts
    assert list(a.corpus.texts) != list(c.corpus.texts)
    assert len(a.corpus) == 300 and len(set(a.corpus.doc_ids)) == 300
    assert all(a.corpus.titles) and all("/" in u for u in a.corpus.urls)
    assert [len(a.queries[s]) for s in ("train", "dev", "test")] == [600, 300, 300]
    for split in ("train", "dev", "test"):
        assert set(a.qrels[split]) == set(a.queries[split].qids)
        for judged in a.qrels[split].values():
            assert len(judged) == 1 and next(iter(judged)) in a.corpus
        assert all(t.strip() for t in a.queries[split].texts)
    with pytest.raises(ValueError, match="at least 10"):
        demo.generate(5)


def test_bm25_is_non_trivial_on_it():
    require("bm25s")
    from gr_jax.baselines.bm25 import BM25

    ds = demo.generate(1000, seed=0)
    bm = BM25.build(ds.corpus.doc_ids, ds.corpus.texts)
    run = bm.search(ds.queries["test"].qids, ds.queries["test"].texts, k=10)
    got = metrics.evaluate(run, ds.qrels["test"], ["Hit@1", "Hit@10"], missing_as_zero=True)
    assert 0.15 < got["Hit@1"] < 0.7, got
    assert 0.5 < got["Hit@10"] < 0.95, got
