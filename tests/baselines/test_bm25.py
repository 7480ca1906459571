"""BM25 baseline: ranking by hand, save/load round trip."""

import pytest

from tests.conftest import require


def test_search_and_save_load(tmp_path):
    require("bm25s")
    from gr_jax.baselines.bm25 import BM25

    ids = ["a", "b", "c"]
    texts = ["red apples and green pears", "blue ocean waves", "green pears grow in orchards"]
    bm = BM25.build(ids, texts)
    run = bm.search(["q1", "q2"], ["green pears orchards", "ocean"], k=3)
    assert max(run["q1"], key=run["q1"].get) == "c" and set(run["q1"]) == {"a", "c"}
    assert list(run["q2"]) == ["b"]  # documents without a matching term are not returned
    bm.save(tmp_path / "bm25")
    again = BM25.load(tmp_path / "bm25")
    assert again.search(["q1"], ["green pears orchards"], k=3) == {"q1": run["q1"]}
    with pytest.raises(ValueError, match="not a saved BM25 index"):
        BM25.load(tmp_path)
    with pytest.raises(ValueError, match="2 ids for 3 texts"):
        BM25.build(ids[:2], texts)


def test_hard_negatives_leave_out_every_positive_of_the_query():
    require("bm25s")
    from gr_jax.baselines.bm25 import hard_negatives
    from gr_jax.data.readers import Corpus

    corpus = Corpus(["d1", "d2", "d3", "d4"], ["apple banana", "apple cherry", "banana cherry", "zebra"])
    got = hard_negatives(corpus, ["q1", "q1"], ["apple banana", "apple banana"], [0, 1], depth=3)
    # q1's positives are d1 and d2; BM25 ranks d3 (banana) next; d4 shares no term; −1 pads
    assert got.tolist() == [[2, -1, -1], [2, -1, -1]]
