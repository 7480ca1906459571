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


def _same_tree(a, b):
    la, ta = jax_tree(a)
    lb, tb = jax_tree(b)
    return ta == tb and all(x.shape == y.shape and x.dtype == y.dtype for x, y in zip(la, lb))


def jax_tree(x):
    import jax

    return jax.tree_util.tree_flatten(x)


def test_inserts_within_the_reserved_room_keep_the_constraints_shapes_and_one_compiled_program():
    """After `reserve(2, slots=3)`, inserting parts up to twice the documents keeps every array's shape and the
    pytree's structure — a jitted function over the constraint compiles once — and every answer is a fresh
    build's; past the room the capacities double (a new shape, once)."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(11)
    docs = [rng.integers(0, 5, size=rng.integers(1, 12)).tolist() for _ in range(120)]
    index = SubstringIndex.build(docs[:60], 5)
    index.reserve(2.0, slots=3)
    grams = [(0,), (1, 2), (3, 3, 3), (4, 0, 1), (2, 2)]
    padded = jnp.asarray([g + (0,) * (3 - len(g)) for g in grams])
    lengths = jnp.asarray([len(g) for g in grams])
    traced = []

    @jax.jit
    def counts(dev):
        traced.append(1)  # runs once per compilation
        return dev.counts(dev.walk(padded, lengths))

    first = index.device(3)
    for lo in range(60, 120, 12):
        index.insert(docs[lo:lo + 12])
        assert len(index.segments) <= 3
        dev = index.device(3)
        assert _same_tree(dev, first)
        fresh = SubstringIndex.build(docs[:lo + 12], 5)
        assert np.asarray(counts(dev)).tolist() == [fresh.count(g) for g in grams]
        r, p, ok = (np.asarray(a) for a in dev.occurrences(dev.walk(padded, lengths), 256))
        for i, g in enumerate(grams):
            want = sorted((k, s) for k, doc in enumerate(docs[:lo + 12]) for s in range(len(doc) - len(g) + 1)
                          if tuple(doc[s:s + len(g)]) == g)
            assert sorted(zip(r[i][ok[i]].tolist(), p[i][ok[i]].tolist())) == want
    assert len(traced) == 1
    index.insert(docs * 2)  # past the room: capacities double
    assert index.device(3).text.shape[0] > first.text.shape[0]
    with pytest.raises(UserError, match="growth must be ≥ 1"):
        index.reserve(0.5)


def test_the_scanned_levels_equal_the_unrolled_search_over_substrings():
    """Levels 1 .. depth − 2 as one scanned body with a traced column (`level_runs`) give exactly the unrolled
    search's keys, scores and states — for the body view (no prefix, no leaves) and a title view (a prefix, an end
    token), with SEAL's wider history — over an index of two segments in three slots."""
    import jax

    from gr_jax.decoding.beam_search import beam_search
    from tests.decoding.test_beam_search import V as TV, toy_cache, toy_step

    rng = np.random.default_rng(2)
    docs = [np.minimum(rng.zipf(1.5, size=rng.integers(2, 14)) - 1, TV - 1).tolist() for _ in range(80)]
    index = SubstringIndex.build(docs[:60], TV)
    index.reserve(2.0, slots=3)
    index.insert(docs[60:])
    assert len(index.segments) == 2
    for dev in (index.device(6), index.device(7, prefix=(0,), end_token=1)):
        assert dev.level_runs() == ((1, dev.depth - 1),)
        for N, width in ((3, 0), (4, 8)):
            a, b = (jax.jit(lambda c, t, s=scan: beam_search(toy_step, c, t, batch_size=3, num_beams=N,
                                                             keep_history=True, scan_levels=s, history_width=width))(
                toy_cache(seed=5, batch=3), dev) for scan in (False, True))
            hv = np.asarray(a.history.valid)
            assert hv.any()
            np.testing.assert_array_equal(hv, np.asarray(b.history.valid))
            for x, y in ((a.history.tokens, b.history.tokens), (a.history.scores, b.history.scores),
                         (a.valid, b.valid), (a.tokens, b.tokens), (a.scores, b.scores)):
                np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
            for x, y in zip(jax.tree_util.tree_leaves(a.history.states), jax.tree_util.tree_leaves(b.history.states)):
                np.testing.assert_array_equal(np.asarray(x)[hv], np.asarray(y)[hv])


@pytest.mark.parametrize("narrow", sweep("narrow", [4, 32], default=[4]))
def test_children_from_the_child_lists_equal_the_search_over_every_token(narrow):
    """Wide ranges at columns 1..3 find their children in the stored lists (`child_lists`); every state's
    children — at depths 1–4, with and without a prefix, over three segments, at a Python depth and at a traced
    one (the scanned levels' path) — equal the search over all V tokens (`narrow = 0`). Zipf tokens make wide
    ranges; n-grams taken from the documents make live states."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(narrow)
    V = 14
    docs = [np.minimum(rng.zipf(1.3, size=rng.integers(1, 60)) - 1, V - 1).tolist() for _ in range(300)]
    index = SubstringIndex(V, [], narrow=narrow)
    index.reserve(1.0, slots=3)
    for lo, hi in ((0, 240), (240, 280), (280, 300)):
        index.insert(docs[lo:hi])
    assert len(index.segments) >= 2
    listed_wide = 0
    for prefix in ((), (0,)):
        dev = index.device(5, prefix=prefix)
        assert dev._lists() is not None
        searched = dataclasses.replace(dev, narrow=0)
        picks = [d for d in docs if len(d) > 6]
        grams = np.array([d[s: s + 4] for d in picks[:60] for s in [int(rng.integers(0, len(d) - 5))]])
        grams = np.concatenate([grams, np.minimum(rng.zipf(1.3, size=(20, 4)) - 1, V - 1)])
        in_run = jax.jit(lambda state, d, dev=dev: dev.children_in_run(0, d, state))
        for d in (1, 2, 3, 4):
            state = dev.walk(jnp.asarray(grams[:, :d]), jnp.full(len(grams), d))
            if d + len(prefix) <= dev.listed_columns:
                listed_wide += int(np.sum(np.asarray(dev.counts(state)) > narrow))
            want = searched.children(d, state)
            for got in (dev.children(d, state), in_run(state, jnp.int32(d))):
                np.testing.assert_array_equal(np.asarray(got[3]), np.asarray(want[3]))  # allowed tokens
                for (a_lo, a_hi), (b_lo, b_hi) in zip(got[1], want[1]):
                    np.testing.assert_array_equal(np.asarray(a_lo), np.asarray(b_lo))
                    np.testing.assert_array_equal(np.asarray(a_hi), np.asarray(b_hi))
            assert np.asarray(want[3]).any()
    assert listed_wide >= 20  # the lists were read, for many wide ranges


def test_child_lists_by_hand():
    """Documents [1 2 1 3], [1 2 2] (separator 4): the sorted suffixes are 1 2 1 3 | 1 2 2 | 1 3 | 2 1 3 | 2 2 |
    2 4 | 3. With narrow 1, column 1: the range of "1" (indices 0–2) has children 2 (at 0) and 3 (at 2); the range
    of "2" (3–5) has children 1 (3), 2 (4) and the separator (5: listed, never allowed); "3" is narrow. Column 2:
    "1 2" (0–1) has children 1 (0) and 2 (1); every other range of two tokens holds one suffix."""
    from gr_jax.index.substring import child_lists

    seg = SubstringIndex.build([[1, 2, 1, 3], [1, 2, 2]], 4).segments[0]
    assert [seg.text[p: p + 2].tolist() for p in seg.sa] == [[1, 2], [1, 2], [1, 3], [2, 1], [2, 2], [2, 4], [3, 4]]
    lists, most = child_lists(seg.text, seg.sa, [0], 4, 2, narrow=1)
    assert [x.tolist() for x in lists] == [[0, 2, 3, 4, 5], [0, 1]] and most == 3
    lists, most = child_lists(seg.text, seg.sa, [0], 4, 2, narrow=3)  # nothing wider than 3
    assert [x.tolist() for x in lists] == [[], []] and most == 0
