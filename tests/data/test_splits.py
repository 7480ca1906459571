"""Dynamic-corpora split invariants."""

import pytest

from gr_jax.data.splits import dynamic_split


def _data(n_docs=103):
    docs = [f"d{i}" for i in range(n_docs)]
    train = {f"t{i}": {f"d{i % n_docs}": 1} for i in range(300)}
    test = {f"v{i}": {f"d{(7 * i) % n_docs}": 1} for i in range(120)}
    test["multi"] = {"d1": 1, "d2": 1, "d3": 0}
    return docs, train, test


def test_sizes_disjoint_and_queries_follow_documents():
    docs, train, test = _data()
    s = dynamic_split(docs, train, test, seed=3)
    sizes = [len(p) for p in s.parts]
    assert sizes[0] == 52 and sum(sizes) == 103 and all(10 <= n <= 11 for n in sizes[1:])
    assert len({d for p in s.parts for d in p}) == 103  # disjoint and complete
    part = s.part_of()
    for q in s.train_queries:
        assert part[next(iter(train[q]))] == 0
    assert sum(len(t) for t in s.test_queries) == len(test)
    for o, qs in enumerate(s.test_queries):
        for q in qs:
            if q != "multi":
                assert part[next(iter(test[q]))] == o
    home = next(o for o, qs in enumerate(s.test_queries) if "multi" in qs)
    assert home == min(part["d1"], part["d2"])  # the earliest part among relevant documents
    assert len(s.documents_up_to(2)) == sum(sizes[:3])


def test_seed_stable():
    docs, train, test = _data()
    a, b, c = (dynamic_split(docs, train, test, seed=s) for s in (1, 1, 2))
    assert a.parts == b.parts and a.test_queries == b.test_queries
    assert a.parts != c.parts


def test_bad_input():
    docs, train, test = _data()
    with pytest.raises(ValueError, match="duplicate document ids"):
        dynamic_split(docs + ["d0"], train, test)
    with pytest.raises(ValueError, match="query 'x' has no relevant document"):
        dynamic_split(docs, train, {"x": {"nope": 1}})
