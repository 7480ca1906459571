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


def test_the_papers_split_pools_the_queries_and_draws_q0_from_d0s_pairs():
    docs, train, test = _data()
    ours = dynamic_split(docs, train, test, seed=3)
    paper = dynamic_split(docs, train, test, seed=3, protocol="paper", test_fraction=0.25)
    assert paper.parts == ours.parts  # the same documents: only the queries are placed otherwise
    part = paper.part_of()
    everything = {**train, **test}
    home = lambda q: min(part[d] for d, g in everything[q].items() if g > 0)  # noqa: E731
    d0 = sorted(q for q in everything if home(q) == 0)
    p0, q0 = paper.train_queries, paper.test_queries[0]
    assert sorted(p0 + q0) == d0 and not set(p0) & set(q0)  # D0's pairs, split in two
    assert len(q0) == round(0.25 * len(d0))
    assert any(q.startswith("v") for q in p0) and any(q.startswith("t") for q in q0)  # from both splits
    for o in range(1, 6):  # every pair of D_o, whichever split it came from
        assert paper.test_queries[o] == sorted(q for q in everything if home(q) == o)
    assert p0 == sorted(p0) and q0 == sorted(q0)


def test_the_papers_split_is_order_free_and_seeded():
    docs, train, test = _data()
    a = dynamic_split(docs, train, test, seed=1, protocol="paper")
    shuffled = dynamic_split(docs[::-1], dict(reversed(list(train.items()))), dict(reversed(list(test.items()))),
                             seed=1, protocol="paper")
    assert (a.parts, a.train_queries, a.test_queries) == (shuffled.parts, shuffled.train_queries,
                                                          shuffled.test_queries)
    other = dynamic_split(docs, train, test, seed=2, protocol="paper")
    assert other.test_queries[0] != a.test_queries[0]


def test_the_papers_split_refuses_a_query_id_judged_twice_differently():
    docs, train, test = _data()
    with pytest.raises(ValueError, match="'t1'.*judged differently"):
        dynamic_split(docs, train, {**test, "t1": {"d5": 1}}, protocol="paper")
    with pytest.raises(ValueError, match="split protocol must be one of"):
        dynamic_split(docs, train, test, protocol="papers")
    with pytest.raises(ValueError, match="test_fraction"):
        dynamic_split(docs, train, test, protocol="paper", test_fraction=1.0)
