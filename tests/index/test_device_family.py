"""The device copy of a trie with inserted docids (`index.device.to_device`): inserted children are read in token
order, as the rebuilt trie reads them, and further inserts keep the shapes, so a compiled search is reused."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.decoding.beam_search import beam_search
from gr_jax.index.device import DevicePayload, leaf_documents, level_candidates
from gr_jax.index.trie import TrieIndex

V = 10
DENSE = {"csr": 0, "dense": 1 << 20}


def _slots(trie, d, node):
    tokens, child, leaf, valid = (np.asarray(a) if a is not None else None
                                  for a in level_candidates(trie, d, jnp.asarray([node], jnp.int32)))
    if tokens is None:  # a dense level: slot = token
        tokens = np.arange(V)[None]
    return [(int(t), int(c), int(lf)) for t, c, lf, ok in zip(tokens[0], child[0], leaf[0], valid[0]) if ok]


@pytest.mark.parametrize("layout", ["csr", "dense"])
def test_inserted_children_sit_at_their_tokens_by_hand(layout):
    index = TrieIndex.build(np.array([[2, 5], [2, 7], [3, 4]]), [0, 1, 2], vocab_size=V,
                            dense_budget_bytes=DENSE[layout])
    index.insert(np.array([[2, 6], [3, 2], [4, 4]]), [3, 4, 5])
    trie = index.device()
    root = _slots(trie, 0, 0)
    assert [t for t, _, _ in root] == [2, 3, 4]  # 4 was inserted: after 3, not after the main children
    assert all(lf == -1 for _, _, lf in root)
    by_token = {t: c for t, c, _ in root}
    below_2 = _slots(trie, 1, by_token[2])
    assert [t for t, _, _ in below_2] == [5, 6, 7]
    docs = {t: index.documents(lf).tolist() for t, _, lf in below_2}
    assert docs == {5: [0], 6: [3], 7: [1]}
    assert [(t, index.documents(lf).tolist()) for t, _, lf in _slots(trie, 1, by_token[3])] == [(2, [4]), (4, [2])]
    assert [(t, index.documents(lf).tolist()) for t, _, lf in _slots(trie, 1, by_token[4])] == [(4, [5])]
    if layout == "csr":  # slots: a power of two ≥ the children (3) and ≥ twice the built K (2 → 4)
        assert trie.specs[1].max_children == 4 and trie.specs[0].max_children == 4


def _flat_step(cache, tokens):
    """Every token scores the same: every docid ties, so the order is the slots' order alone."""
    return jnp.zeros((tokens.shape[0], V)), cache


@pytest.mark.parametrize("layout", ["csr", "dense"])
def test_ties_follow_the_rebuilt_tries_order(layout):
    rng = np.random.default_rng(3)
    seqs = np.unique(rng.integers(2, V, size=(40, 3)), axis=0)
    rng.shuffle(seqs)
    index = TrieIndex.build(seqs[:25], list(range(25)), vocab_size=V, dense_budget_bytes=DENSE[layout])
    index.insert(seqs[25:], list(range(25, len(seqs))))
    rebuilt = index.compact()
    search = jax.jit(lambda t: beam_search(_flat_step, {"x": jnp.zeros((2, 1))}, t, batch_size=2, num_beams=8,
                                           score_mode="raw"))
    a, b = search(index.device()), search(rebuilt.device())
    # all scores are 0: beam search keeps the first slots in (beam, slot) order, lexicographic in both tries
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    got = np.asarray(a.tokens)[0]
    assert [tuple(s) for s in got] == sorted(map(tuple, seqs.tolist()))[:8]


@pytest.mark.parametrize("layout", ["csr", "dense"])
def test_inserts_within_capacity_reuse_the_compiled_search(layout):
    every = np.stack(np.meshgrid(*[np.arange(V)] * 3, indexing="ij"), -1).reshape(-1, 3)
    seqs = np.random.default_rng(0).permutation(every)[:260]
    index = TrieIndex.build(seqs[:200], list(range(200)), vocab_size=V, dense_budget_bytes=DENSE[layout])
    search = jax.jit(lambda t: beam_search(_flat_step, {"x": jnp.zeros((2, 1))}, t, batch_size=2, num_beams=4,
                                           score_mode="raw"))
    search(index.device())
    index.insert(seqs[200:220], list(range(200, 220)))
    first = index.device()
    search(first)
    assert search._cache_size() == 2  # the compact trie, then the trie with inserted nodes
    index.insert(seqs[220:240], list(range(220, 240)))
    second = index.device()
    assert jax.tree_util.tree_structure(first) == jax.tree_util.tree_structure(second)  # same static facts
    assert [x.shape for x in jax.tree_util.tree_leaves(first)] == [x.shape for x in jax.tree_util.tree_leaves(second)]
    res = search(second)
    assert search._cache_size() == 2  # reused
    expected = search(index.compact().device())
    np.testing.assert_array_equal(np.asarray(res.tokens), np.asarray(expected.tokens))
    for b in range(2):  # the leaves name the right documents
        for row, leaf in zip(np.asarray(res.tokens)[b], np.asarray(res.leaf_ids)[b]):
            assert index.documents(int(leaf)).tolist() == index.documents(int(index.lookup(row[None])[0])).tolist()


def test_payload_padding_holds_no_document():
    payload = DevicePayload.build(np.array([0, 2, 3]), np.array([5, 6, 7]))
    assert payload.offsets.shape == (4,) and payload.docs.shape == (4,) and payload.max_docs == 2
    docs, valid = leaf_documents(payload, jnp.array([0, 1, 2, -1]))
    np.testing.assert_array_equal(np.where(np.asarray(valid), np.asarray(docs), -9),
                                  [[5, 6], [7, -9], [-9, -9], [-9, -9]])
