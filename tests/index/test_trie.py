"""TrieIndex on the host: layout worked by hand, validation errors, insert/compact, save/load (hypothesis)."""

import json

import chex
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gr_jax.index.trie import TrieIndex

V = 10
EOS = 1


def test_layout_by_hand_with_collisions_and_multi_docids():
    seqs = np.array([[3, 4, 5], [3, 4, 6], [3, 7, 5], [4, 4, 4], [3, 4, 5], [3, 4, 5]])
    docs = [10, 11, 12, 13, 14, 10]  # (345, 10) twice: kept once; 345 → {10, 14}; doc 10 also → nothing else
    t = TrieIndex.build(seqs, docs, vocab_size=V, dense_budget_bytes=0)
    assert t.main_nodes == [1, 2, 3, 4] and t.depth == 3
    np.testing.assert_array_equal(t.offsets[0], [0, 2])  # root → (3), (4)
    np.testing.assert_array_equal(t.tokens[1], [3, 4])
    np.testing.assert_array_equal(t.offsets[1], [0, 2, 3])  # (3) → (3,4), (3,7); (4) → (4,4)
    np.testing.assert_array_equal(t.tokens[2], [4, 7, 4])
    np.testing.assert_array_equal(t.offsets[2], [0, 2, 3, 4])
    np.testing.assert_array_equal(t.tokens[3], [5, 6, 5, 4])
    assert t.max_children == [2, 2, 2]
    assert t.num_leaves == 4
    np.testing.assert_array_equal(t.lookup(np.array([[3, 4, 5], [4, 4, 4], [3, 4, 7], [9, 9, 9]])), [0, 3, -1, -1])
    np.testing.assert_array_equal(t.documents(0), [10, 14])
    np.testing.assert_array_equal(t.documents(3), [13])
    seqs_back, lengths = t.leaf_sequences()
    np.testing.assert_array_equal(seqs_back, [[3, 4, 5], [3, 4, 6], [3, 7, 5], [4, 4, 4]])


def test_ragged_leaves_at_several_depths():
    t = TrieIndex.build([[5, 6, EOS], [5, EOS], [7, EOS], [5, 6, 8, EOS]], [0, 1, 2, 3], vocab_size=V, eos_id=EOS)
    assert t.depth == 4
    ids = t.lookup([[5, EOS], [7, EOS], [5, 6, EOS], [5, 6, 8, EOS], [5, 6]])
    np.testing.assert_array_equal(ids, [0, 1, 2, 3, -1])  # leaves numbered by (depth, node)
    assert [int(t.documents(i)[0]) for i in ids[:4]] == [1, 2, 0, 3]
    # append_eos turns plain token lists into EOS-terminated docids
    u = TrieIndex.build([[5, 6], [5]], vocab_size=V, eos_id=EOS, append_eos=True)
    np.testing.assert_array_equal(u.lookup([[5, EOS], [5, 6, EOS]]), [0, 1])


@pytest.mark.parametrize("seqs, kwargs, match", [
    (np.array([[1, 2], [3, 10]]), {}, r"token 10 at sequence 1, position 1 is outside the vocabulary \[0, 10\)"),
    (np.array([[1, -2]]), {}, "token -2"),
    ([[4, 5], []], {}, "sequence 1 is empty"),
    ([[4, 5], [4]], {}, r"docid \[4\] is a strict prefix of \[4, 5\]"),
    ([[4, EOS, 5, EOS]], {"eos_id": EOS}, "EOS .* inside sequence 0 at position 1"),
    (np.zeros((0, 3), int), {}, "no docids"),
])
def test_bad_input(seqs, kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrieIndex.build(seqs, vocab_size=V, **kwargs)


def test_doc_ids_length_mismatch_and_range():
    with pytest.raises(ValueError, match="2 document ids for 3 sequences"):
        TrieIndex.build(np.array([[1], [2], [3]]), [0, 1], vocab_size=V)
    with pytest.raises(ValueError, match=r"document id -4 \(row 1\)"):
        TrieIndex.build(np.array([[1], [2]]), [0, -4], vocab_size=V)
    t = TrieIndex.build(np.array([[1], [2]]), vocab_size=V)
    with pytest.raises(ValueError, match="document id"):
        t.insert(np.array([[3]]), [2**40])


def test_insert_existing_pair_is_noop_and_new_doc_extends_payload():
    t = TrieIndex.build(np.array([[2, 3], [2, 4]]), [0, 1], vocab_size=V)
    before = t.nbytes
    assert t.insert(np.array([[2, 3]]), [0]) == {"pairs_added": 0, "docids_added": 0, "nodes_added": 0}
    assert t.nbytes == before
    assert t.insert(np.array([[2, 3]]), [7])["pairs_added"] == 1
    np.testing.assert_array_equal(t.documents(0), [0, 7])
    r = t.insert(np.array([[2, 5], [6, 6], [6, 6]]), [2, 3, 4])
    assert r == {"pairs_added": 3, "docids_added": 2, "nodes_added": 3}
    np.testing.assert_array_equal(t.lookup(np.array([[2, 5], [6, 6]])), [2, 3])
    np.testing.assert_array_equal(t.documents(3), [3, 4])


def test_failed_insert_leaves_index_unchanged():
    t = TrieIndex.build([[5, 6, EOS], [7, EOS]], vocab_size=V, eos_id=EOS)
    t.insert([[8, EOS]], [9])
    state = (t.num_leaves, t.num_nodes, [len(x) for x in t.extras], t.extra_pairs.copy())
    t2 = TrieIndex.build(np.array([[1, 2]]), vocab_size=V)
    with pytest.raises(ValueError, match="extends an existing docid"):
        t2.insert(np.array([[1, 2, 3]]), [1])
    with pytest.raises(ValueError, match="strict prefix of an existing docid"):
        TrieIndex.build(np.array([[1, 2, 3]]), vocab_size=V).insert(np.array([[1, 2]]), [5])
    with pytest.raises(ValueError, match="strict prefix of another inserted docid"):
        TrieIndex.build(np.array([[1, 2]]), vocab_size=V).insert([[4, 5], [4]], [5, 6])
    with pytest.raises(ValueError, match="EOS"):
        t.insert([[9, EOS, 9, EOS]], [1])
    assert (t.num_leaves, t.num_nodes, [len(x) for x in t.extras]) == state[:3]
    np.testing.assert_array_equal(t.extra_pairs, state[3])


def _canonical(index):
    seqs, lengths, docs = index.pairs()
    return sorted((tuple(s[:n].tolist()), d) for s, n, d in zip(seqs, lengths, docs.tolist()))


@st.composite
def docid_sets(draw):
    ragged = draw(st.booleans())
    n = draw(st.integers(1, 40))
    alphabet = st.integers(2, 5)  # a small alphabet forces shared prefixes
    if ragged:
        seqs = draw(st.lists(st.lists(alphabet, min_size=1, max_size=4), min_size=n, max_size=n))
        seqs = [s + [EOS] for s in seqs]
    else:
        L = draw(st.integers(1, 4))
        seqs = draw(st.lists(st.lists(alphabet, min_size=L, max_size=L), min_size=n, max_size=n))
    docs = draw(st.lists(st.integers(0, 15), min_size=n, max_size=n))
    split = draw(st.integers(0, n))
    return ragged, seqs, docs, split


def _build(seqs, docs, ragged, **kw):
    return TrieIndex.build(seqs if ragged else np.array(seqs), docs, vocab_size=V,
                           eos_id=EOS if ragged else None, **kw)


@settings(max_examples=60, deadline=None)
@given(docid_sets(), st.sampled_from([0, 1 << 20]))
def test_insert_equals_build_and_lookup_is_exact(data, dense_budget):
    ragged, seqs, docs, split = data
    full = _build(seqs, docs, ragged, dense_budget_bytes=dense_budget)
    expected = sorted(set((tuple(s), d) for s, d in zip(seqs, docs)))
    assert _canonical(full) == expected
    leaf = full.lookup(seqs if ragged else np.array(seqs))
    assert (leaf >= 0).all()
    for d, lf in zip(docs, leaf):
        assert d in full.documents(lf)
    if split == 0:
        return
    part = _build(seqs[:split], docs[:split], ragged, dense_budget_bytes=dense_budget)
    rest = seqs[split:]
    if rest:
        part.insert(rest if ragged else np.array(rest), docs[split:])
    assert _canonical(part) == expected
    assert part.num_leaves == full.num_leaves
    compacted = part.compact()
    assert _canonical(compacted) == expected
    assert compacted.num_nodes == full.num_nodes and all(len(x) == 0 for x in compacted.extras)


@settings(max_examples=25, deadline=None)
@given(docid_sets())
def test_save_load_round_trip(tmp_path_factory, data):
    ragged, seqs, docs, split = data
    t = _build(seqs[:max(split, 1)], docs[:max(split, 1)], ragged)
    if split < len(seqs):
        t.insert(seqs[split:] if ragged else np.array(seqs[split:]), docs[split:])
    path = tmp_path_factory.mktemp("trie") / "index"
    t.save(path)
    u = TrieIndex.load(path)
    assert _canonical(u) == _canonical(t)
    a, b = t._arrays(), u._arrays()
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert u.max_children == t.max_children and u.leaf_base == t.leaf_base


def test_corrupt_saved_index(tmp_path):
    t = TrieIndex.build(np.array([[1, 2], [3, 4]]), vocab_size=V)
    t.save(tmp_path / "idx")
    data = bytearray((tmp_path / "idx" / "index.npz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "idx" / "index.npz").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"index\.npz: checksum mismatch"):
        TrieIndex.load(tmp_path / "idx")
    (tmp_path / "idx" / "index.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="format 'other'"):
        TrieIndex.load(tmp_path / "idx")
    with pytest.raises(ValueError, match="not a saved TrieIndex"):
        TrieIndex.load(tmp_path / "nothing")


def _prefix_oracle(seqs, docs):
    """The layout from its definition, in plain Python: the depth-d nodes are the distinct length-d prefixes in
    lexicographic order, a node's children are its one-token extensions, a leaf is a whole docid (numbered by
    depth, then node), and a leaf's documents are sorted."""
    seqs = [tuple(s) for s in seqs]
    D = max(map(len, seqs))
    nodes = [[()]] + [sorted({s[:d] for s in seqs if len(s) >= d}) for d in range(1, D + 1)]
    offsets = []
    for d in range(D):
        counts = [sum(1 for c in nodes[d + 1] if c[:d] == p) for p in nodes[d]]
        offsets.append([0] + list(np.cumsum(counts)))
    tokens = [[c[-1] for c in nodes[d]] for d in range(1, D + 1)]
    whole = set(seqs)
    leaves = [p for d in range(1, D + 1) for p in nodes[d] if p in whole]
    payload = [sorted({doc for s, doc in zip(seqs, docs) if s == leaf}) for leaf in leaves]
    return offsets, tokens, leaves, payload


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_layout_equals_the_prefix_oracle_with_several_sort_keys(data):
    """A vocabulary of 40000 packs three tokens per sort key, so docids of up to 8 tokens span three keys; the
    few distinct tokens make rows tie on the first key and differ in later ones (the build's tie path), and
    repeated sequences make collisions and duplicate pairs. The input order must not matter."""
    big_v = 40000
    ragged = data.draw(st.booleans())
    alphabet = st.sampled_from([2, 3, 17, 39999])
    n = data.draw(st.integers(1, 30))
    if ragged:
        seqs = data.draw(st.lists(st.lists(alphabet, min_size=1, max_size=7), min_size=n, max_size=n))
        seqs = [s + [EOS] for s in seqs]
    else:
        L = data.draw(st.integers(1, 8))
        seqs = data.draw(st.lists(st.lists(alphabet, min_size=L, max_size=L), min_size=n, max_size=n))
    docs = data.draw(st.lists(st.integers(0, 2**32 - 1) | st.integers(0, 5), min_size=n, max_size=n))
    build = lambda s, d: TrieIndex.build(s if ragged else np.array(s), d, vocab_size=big_v,  # noqa: E731
                                         eos_id=EOS if ragged else None, dense_budget_bytes=0)
    t = build(seqs, docs)
    offsets, tokens, leaves, payload = _prefix_oracle(seqs, docs)
    assert [o.tolist() for o in t.offsets] == offsets
    assert [x.tolist() for x in t.tokens[1:]] == tokens
    assert [t.documents(i).tolist() for i in range(t.num_leaves)] == payload
    assert [int(i) for i in t.lookup([list(x) for x in leaves])] == list(range(len(leaves)))
    perm = data.draw(st.permutations(range(n)))
    u = build([seqs[i] for i in perm], [docs[i] for i in perm])
    a, b = t._arrays(), u._arrays()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


class TestTrieStepVariants(chex.TestCase):
    """The trie step the search calls (`index.device.level_candidates`), jitted and not: the children of each node
    by hand, for a three-docid trie (tokens, leaf ids, validity), and the same arrays on both paths."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_children_by_hand(self):
        import jax.numpy as jnp

        from gr_jax.index.device import level_candidates

        index = TrieIndex.build([[2, 3, 1], [2, 4, 1], [5, 1]], vocab_size=8, eos_id=1)
        trie = index.device()
        seen = {}
        for d in range(3):  # the docids' length with the end token
            nodes = jnp.arange(-1, 3, dtype=jnp.int32)  # node −1: no node, nothing valid
            tokens, child, leaf, valid = self.variant(lambda t, n, d=d: level_candidates(t, d, n))(trie, nodes)
            chex.assert_equal_shape([child, leaf, valid])
            chex.assert_rank(child, 2)
            valid = np.asarray(valid)
            assert not valid[0].any()
            toks = (np.broadcast_to(np.arange(child.shape[-1]), child.shape) if tokens is None
                    else np.asarray(tokens))
            seen[d] = {int(n): sorted(int(t) for t in toks[i][valid[i]]) for i, n in enumerate(np.asarray(nodes))
                       if valid[i].any()}
            leaves = np.asarray(leaf)[valid]
            assert ((leaves >= -1) & (leaves < 3)).all()
        assert seen[0] == {0: [2, 5]}
        assert sorted(seen[1].values()) == [[1], [3, 4]]  # below 2: 3 and 4; below 5: the end token
        assert sorted(seen[2].values()) == [[1], [1]]
