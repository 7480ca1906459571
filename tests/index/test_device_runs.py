"""Runs of trie levels stored together (`index.device._plan_runs`, `DeviceTrie.children_in_run`): which levels
form runs, the slots a traced depth reads, and a scanned search that survives inserts without recompiling."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.decoding.beam_search import beam_search
from gr_jax.index.device import _plan_runs
from gr_jax.index.trie import TrieIndex

V, EOS = 10, 1


def test_runs_by_hand():
    """Capacities (K rounded up to a power of two) join a run while its largest is ≤ RUN_PADDING (16) × its
    smallest; the first and the last level are never in one. (Runs of 2 levels allowed here; the default
    minimum is 3, below.)"""
    csr = lambda *ks: [(False, k) for k in ks]  # noqa: E731
    two = lambda levels: _plan_runs(levels, min_levels=2)  # noqa: E731
    # capacities 64 16 4 | 2 1 1, then the last level: 64 ≤ 16 · 4, but 64 > 16 · 2
    assert two(csr(37, 37, 10, 3, 2, 1, 1, 1)) == [(1, 4), (4, 7)]
    assert two(csr(5, 9, 3, 1, 1)) == [(1, 4)]  # 16 4 1: 16 ≤ 16 · 1
    assert two(csr(5, 2, 8, 8, 1)) == [(1, 4)]  # a run's C grows (2 → 8) within the limit
    assert two(csr(1, 64, 2, 2, 1)) == [(2, 4)]  # 64 > 16 · 2: level 1 alone (no run of one level)
    assert two(csr(1, 1, 16, 32, 1)) == [(1, 3)]  # 32 > 16 · 1: a new run at 3, which the last level ends
    assert two(csr(5, 4, 4)) == []  # one middle level: nothing to scan
    assert two([(False, 4), (False, 4), (True, 0), (False, 4), (False, 4), (False, 1)]) == [(3, 5)]
    assert two(csr(4, 4, 0, 4, 4, 4, 2)) == [(3, 6)]  # a level without children breaks a run
    assert _plan_runs(csr(37, 37, 10, 3, 2, 1, 1, 1)) == [(1, 4), (4, 7)]  # 3 levels each: kept by default
    assert _plan_runs(csr(5, 2, 8, 8, 1)) == [(1, 4)]
    assert _plan_runs(csr(4, 4, 0, 4, 4, 4, 2)) == [(3, 6)]
    assert _plan_runs(csr(1, 64, 2, 2, 1)) == [] and _plan_runs(csr(9, 4, 4, 1)) == []  # 2 levels: unrolled


def _docids(seed: int, n: int):
    r = np.random.default_rng(seed)
    out: set = set()
    while len(out) < n:
        out.add(tuple(int(x) for x in r.integers(2, 6, r.integers(1, 7))) + (EOS,))
    ordered = sorted(out)
    return [list(ordered[i]) for i in r.permutation(len(ordered))]  # inserts land all over the trie


def _slots(children, d, nodes):
    """(token, child, leaf) of each valid slot, per node, in slot order."""
    tokens, child, leaf, valid = (np.asarray(a) for a in children(d, jnp.asarray(nodes, jnp.int32)))
    return [[(int(t), int(c), int(lf)) for t, c, lf, ok in zip(*row) if ok]
            for row in zip(tokens, child, leaf, valid)]


@pytest.mark.parametrize("inserted", [False, True])
def test_a_traced_depth_reads_each_levels_own_children(inserted):
    """The slots of a run's level read at a traced depth are the level's children read at a static one (and the
    padding slots invalid); every child's token follows its parent's prefix and its leaf names the document of
    that docid (checked against the host trie's lookup). Where a level claims consecutive children
    (`consecutive_children`), every node's child ids are its first child's + slot; a trie with inserts has a level
    where they are not, which must not claim it."""
    docids = _docids(0, 120)
    index = TrieIndex.build([list(d) for d in docids[:80]], list(range(80)), vocab_size=V, eos_id=EOS,
                            dense_budget_bytes=0)
    if inserted:
        index.insert([list(d) for d in docids[80:]], list(range(80, len(docids))))
    else:
        index = TrieIndex.build([list(d) for d in docids], list(range(len(docids))), vocab_size=V, eos_id=EOS,
                                dense_budget_bytes=0)
    trie = index.device()
    assert trie.level_runs(), "the trie has no run: nothing is tested"
    by_prefix = {(): 0}  # prefix → node id at its depth, followed down the static reads
    claimed, broken = 0, 0
    for d in range(trie.depth):
        prefixes = sorted(p for p in by_prefix if len(p) == d)
        nodes = [by_prefix[p] for p in prefixes]
        static = _slots(trie.children, d, nodes)
        ids = [[c for _, c, _ in row] for row in static if row]
        holds = all(r == list(range(r[0], r[0] + len(r))) for r in ids)
        if trie.consecutive_children(d):
            assert holds, f"depth {d} claims consecutive children: {ids}"
            claimed += 1
        broken += not holds
        run = next((r for r, (a, b) in enumerate(trie.level_runs()) if a <= d < b), None)
        if run is not None:
            traced = jax.jit(lambda dd, n, t, r=run: t.children_in_run(r, dd, n))
            assert _slots(lambda dd, n: traced(jnp.int32(dd), n, trie), d, nodes) == static
            assert traced(jnp.int32(d), jnp.asarray(nodes, jnp.int32), trie)[0].shape[-1] == \
                trie.run_specs[run].slots
        for p, row in zip(prefixes, static):
            want = sorted({doc[d] for doc in docids if len(doc) > d and tuple(doc[:d]) == p})
            assert [t for t, _, _ in row] == want, (d, p)
            for t, child, leaf in row:
                q = p + (t,)
                by_prefix[q] = child
                if leaf >= 0:
                    assert list(q) in docids and index.documents(leaf).tolist() == [docids.index(list(q))]
                else:
                    assert list(q) not in docids
    if inserted:
        assert broken > 0  # the inserted children follow their level's main ones: a claim there would be wrong
    else:
        assert claimed >= 2 and broken == 0  # every CSR level of a built trie claims it


def _flat_step(cache, tokens):
    """Every token scores the same: every docid ties, so the order is the slots' order alone."""
    return jnp.zeros((tokens.shape[0], V)), {"x": cache["x"]}


def test_inserts_within_capacity_reuse_the_scanned_search():
    docids = _docids(1, 400)
    index = TrieIndex.build([list(d) for d in docids[:300]], list(range(300)), vocab_size=V, eos_id=EOS,
                            dense_budget_bytes=0)
    search = jax.jit(lambda t: beam_search(_flat_step, {"x": jnp.zeros((2, 1))}, t, batch_size=2, num_beams=16,
                                           score_mode="raw", scan_levels=True))
    index.insert([list(d) for d in docids[300:310]], list(range(300, 310)))
    first = index.device()
    assert first.level_runs()
    search(first)
    index.insert([list(d) for d in docids[310:320]], list(range(310, 320)))
    second = index.device()
    assert jax.tree_util.tree_structure(first) == jax.tree_util.tree_structure(second)
    res = search(second)
    assert search._cache_size() == 1  # reused
    expected = jax.jit(lambda t: beam_search(_flat_step, {"x": jnp.zeros((2, 1))}, t, batch_size=2, num_beams=16,
                                             score_mode="raw"))(index.compact().device())
    valid = np.asarray(res.valid)
    np.testing.assert_array_equal(valid, np.asarray(expected.valid))
    np.testing.assert_array_equal(np.asarray(res.tokens)[valid], np.asarray(expected.tokens)[valid])
