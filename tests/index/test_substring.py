"""The substring index beyond its oracle (tests/index/test_substring_oracle.py): both suffix-array builders give
the same array, segments stay few and geometric, a substring docid table builds and extends it, bad input is
named."""

import numpy as np
import pytest

from gr_jax.docids.base import DocidTable
from gr_jax.runtime.errors import UserError
from gr_jax.index.substring import SubstringIndex, suffix_array, suffix_array_numpy
from gr_jax.data.vocab import DocidTokenSpace
from tests.conftest import sweep


def _naive_sa(text):
    return sorted(range(len(text)), key=lambda i: list(text[i:]))


@pytest.mark.parametrize("alphabet", [1, 2, 5, 70000])
def test_builders_agree_with_sorting_the_suffixes(alphabet):
    """Repeated tokens (alphabet 1, 2) are the hard case of prefix doubling; 70000 is past 16-bit ids."""
    rng = np.random.default_rng(alphabet)
    for n in [1, 2, 3, 17, 64, 200]:
        text = rng.integers(0, alphabet, size=n).astype(np.int32)
        want = _naive_sa(text.tolist())
        assert suffix_array_numpy(text).tolist() == want
        assert suffix_array(text, "divsufsort").tolist() == want


def test_inserts_keep_segments_geometric_and_answers_unchanged():
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 6, size=rng.integers(0, 9)).tolist() for _ in range(300)]
    whole = SubstringIndex.build(docs, 6)
    grown = SubstringIndex.build(docs[:100], 6)
    for lo in range(100, 300, 10):
        report = grown.insert(docs[lo:lo + 10])
        assert report["docids_added"] == 10
        sizes = [len(s.text) for s in grown.segments]
        assert all(2 * b < a for a, b in zip(sizes, sizes[1:])), sizes  # each segment < half the one before
    assert len(grown.segments) <= 1 + int(np.log2(whole.segments[0].text.size))
    assert grown.num_documents == whole.num_documents == 300
    assert grown.num_tokens == whole.num_tokens == sum(map(len, docs))
    for g in [(0,), (1, 2), (3, 3), (5, 0, 1), (2, 2, 2, 2)]:
        assert grown.count(g) == whole.count(g)
    grown.compact()
    assert len(grown.segments) == 1
    assert grown.segments[0].text.tolist() == whole.segments[0].text.tolist()
    assert grown.segments[0].sa.tolist() == whole.segments[0].sa.tolist()
    # int32 text (separators included) and suffix array, and a start and a row per document
    seg = whole.segments[0]
    assert whole.nbytes == 4 * (len(seg.text) + len(seg.sa) + 2 * 300)
    assert whole.num_positions == whole.num_tokens + 300


def test_bad_documents_are_named():
    with pytest.raises(UserError, match=r"document 1 has token ids outside \[0, 4\)"):
        SubstringIndex.build([[1, 2], [3, 4]], 4)
    with pytest.raises(UserError, match="2 rows for 1 documents"):
        SubstringIndex.build([[1]], 4, rows=[0, 1])
    with pytest.raises(UserError, match="max_length must be ≥ 1"):
        SubstringIndex.build([[1]], 4).device(0)
    with pytest.raises(UserError, match="no documents to search"):
        SubstringIndex.build([], 4).device(3)


def test_a_substring_table_builds_and_extends_a_substring_index():
    space = DocidTokenSpace("text", 10)
    table = DocidTable.from_lists([[3, 4, 5], [4, 5]], [7, 9], space, index_kind="substrings")
    assert table.target_length == 1  # any n-gram identifies: the method's pairs set the targets
    index = table.index()
    assert isinstance(index, SubstringIndex) and index.count([4, 5]) == 2
    more = DocidTable.from_lists([[5, 4]], [11], space, index_kind="substrings")
    assert more.insert_into(index)["docids_added"] == 1
    assert index.count([5, 4]) == 1 and index.count([4]) == 3
    both = DocidTable.concatenate([table, more])
    assert both.index_kind == "substrings"
    prefix = DocidTable.from_lists([[3, 4, 5], [4, 5]], [7, 9], space)
    assert prefix.digest() != table.digest()  # the kind of index is part of what a checkpoint records
    with pytest.raises(ValueError, match="different kinds of index"):
        DocidTable.concatenate([table, prefix])
    with pytest.raises(ValueError, match="not targets"):
        table.targets_of([0])


def test_saved_substring_tables_keep_their_kind(tmp_path):
    table = DocidTable.from_lists([[3, 4, 5]], [0], DocidTokenSpace("text", 10), index_kind="substrings")
    table.save(tmp_path / "t")
    assert DocidTable.load(tmp_path / "t").index_kind == "substrings"


def test_occurrences_name_the_document_and_the_position_within_it():
    """Every (row, start) where an n-gram occurs, across segments, against a scan of the documents."""
    import jax

    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 3, size=rng.integers(0, 7)).tolist() for _ in range(40)]
    rows = (np.arange(40) * 3 + 5).tolist()
    index = SubstringIndex.build(docs[:32], 3, rows=rows[:32])
    index.insert(docs[32:], rows=rows[32:])
    assert len(index.segments) == 2
    for gram in [(0,), (1, 2), (2, 2, 0), (0, 1, 0, 1)]:
        dev = index.device(len(gram))
        state = dev.root(())
        for d, t in enumerate(gram):
            _, nxt, _, _ = dev.children(d, state)
            state = jax.tree_util.tree_map(lambda x: x[t], nxt)
        r, p, ok = (np.asarray(a) for a in dev.occurrences(state, 64))
        got = sorted(zip(r[ok].tolist(), p[ok].tolist()))
        want = sorted((rows[k], s) for k, doc in enumerate(docs) for s in range(len(doc) - len(gram) + 1)
                      if tuple(doc[s:s + len(gram)]) == gram)
        assert got == want and int(dev.counts(state)) == len(want)


def test_walk_gives_the_state_of_given_ngrams():
    import jax.numpy as jnp

    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 4, size=rng.integers(1, 9)).tolist() for _ in range(30)]
    index = SubstringIndex.build(docs[:20], 4)
    index.insert(docs[20:])
    grams = [(0,), (1, 2), (3, 3, 3), (2, 0, 1), (0, 0, 0)]
    padded = np.array([g + (0,) * (3 - len(g)) for g in grams])
    dev = index.device(3)
    state = dev.walk(jnp.asarray(padded), jnp.asarray([len(g) for g in grams]))
    assert np.asarray(dev.counts(state)).tolist() == [index.count(g) for g in grams]


@pytest.mark.parametrize("narrow, wide_share", sweep("narrow, wide_share", [(4, 4), (4, 1), (32, 2), (32, 1000)],
                                                     default=[(4, 4)]))
def test_children_read_from_narrow_ranges_equal_the_search_over_every_token(narrow, wide_share):
    """The children of every state — narrow ranges read directly, wide ones searched (compacted, or all of them
    when too many are wide) — are the search over all V tokens' sub-ranges (`narrow = 0`): same allowed tokens,
    same ranges, so the same counts. Zipf tokens over a small vocabulary make wide and narrow ranges side by side,
    and a prefix shifts the column read."""
    import dataclasses

    import jax.numpy as jnp

    rng = np.random.default_rng(narrow + wide_share)
    V = 12
    docs = [np.minimum(rng.zipf(1.4, size=rng.integers(1, 40)) - 1, V - 1).tolist() for _ in range(150)]
    index = SubstringIndex.build(docs[:130], V)
    index.insert(docs[130:])  # two segments
    assert len(index.segments) == 2
    for prefix in ((), (0,)):
        dev = index.device(5, prefix=prefix)
        searched = dataclasses.replace(dev, narrow=0)
        fast = dataclasses.replace(dev, narrow=narrow, wide_share=wide_share)
        grams = np.minimum(rng.zipf(1.3, size=(40, 3)) - 1, V - 1)
        for d in (1, 3):
            state = dev.walk(jnp.asarray(grams[:, :d]), jnp.full(40, d))
            want, got = searched.children(d, state), fast.children(d, state)
            np.testing.assert_array_equal(np.asarray(got[3]), np.asarray(want[3]))  # allowed tokens
            for (a_lo, a_hi), (b_lo, b_hi) in zip(got[1], want[1]):
                np.testing.assert_array_equal(np.asarray(a_lo), np.asarray(b_lo))
                np.testing.assert_array_equal(np.asarray(a_hi), np.asarray(b_hi))
            assert np.asarray(want[3]).any()  # states with children were tested
