"""Constrained beam search with a toy step function: exactness against exhaustive scoring, validity, no
duplicates, insert ≡ rebuild, score modes, the bonus hook, shapes with and without jit."""

import functools

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gr_jax.decoding.beam_search import beam_search, beam_search_unconstrained
from gr_jax.decoding.exhaustive import exhaustive_ranking, exhaustive_scores, search_error
from gr_jax.index.trie import TrieIndex
from tests.conftest import sweep

V, H, EOS, B = 9, 12, 1, 3
_rng = np.random.default_rng(0)
_E = jnp.asarray(_rng.normal(size=(V, H)), jnp.float32)
_W = jnp.asarray(_rng.normal(size=(H, H)) / 3, jnp.float32)
_U = jnp.asarray(_rng.normal(size=(H, V)) * 1.5, jnp.float32)


def toy_step(cache, tokens):
    """A tiny recurrent scorer: the next-token logits depend on the query and on the whole prefix."""
    h = jnp.tanh(cache["h"] @ _W + _E[tokens] + cache["q"])
    return h @ _U, {"q": cache["q"], "h": h, "index": cache["index"] + 1}


def toy_cache(seed=1, batch=B):
    q = jax.random.normal(jax.random.PRNGKey(seed), (batch, H))
    return {"q": q, "h": jnp.zeros((batch, H)), "index": jnp.zeros((), jnp.int32)}  # a scalar leaf, like T5's


@functools.lru_cache(maxsize=None)
def _searcher(num_beams, score_mode, length_penalty):
    return jax.jit(lambda cache, trie: beam_search(toy_step, cache, trie, batch_size=B, num_beams=num_beams,
                                                   score_mode=score_mode, length_penalty=length_penalty))


@st.composite
def tries(draw):
    ragged = draw(st.booleans())
    n = draw(st.integers(1, 24))
    alphabet = st.integers(2, 5)
    if ragged:
        seqs = draw(st.lists(st.lists(alphabet, min_size=1, max_size=3), min_size=n, max_size=n, unique_by=tuple))
        seqs = [s + [EOS] for s in seqs]
    else:
        L = draw(st.integers(1, 3))
        seqs = draw(st.lists(st.lists(alphabet, min_size=L, max_size=L), min_size=n, max_size=n, unique_by=tuple))
    dense = draw(st.sampled_from([0, 1 << 20]))
    split = draw(st.integers(1, n))
    return ragged, seqs, dense, split


def _build(seqs, ragged, dense, docs=None):
    return TrieIndex.build(seqs if ragged else np.array(seqs), docs, vocab_size=V, eos_id=EOS if ragged else None,
                           dense_budget_bytes=dense)


def _check_valid(index, res):
    tokens, lengths = np.asarray(res.tokens), np.asarray(res.lengths)
    leaf, valid = np.asarray(res.leaf_ids), np.asarray(res.valid)
    for b in range(tokens.shape[0]):
        got = [tuple(tokens[b, i, :lengths[b, i]]) for i in range(tokens.shape[1]) if valid[b, i]]
        assert len(set(got)) == len(got), "duplicate docid"
        found = index.lookup([list(g) for g in got]) if got else np.zeros(0)
        np.testing.assert_array_equal(found, leaf[b, valid[b]])  # every docid exists and its leaf is right
        assert (found >= 0).all()
    scores = np.asarray(res.prune_scores)
    for b in range(len(scores)):
        n = int(valid[b].sum())
        assert valid[b, :n].all()  # valid results come first ...
        assert (np.diff(scores[b, :n]) <= 1e-6).all()  # ... in decreasing order


@pytest.mark.slow  # over 5 s: the default tier keeps within 10 minutes
@settings(max_examples=4, deadline=None)  # each example compiles new searchers; the oracle tests cover more
@given(tries(), st.sampled_from(["log_softmax", "renormalized", "raw"]), st.sampled_from([0.0, 1.0]))
def test_full_beam_equals_exhaustive_and_insert_equals_rebuild(data, mode, lp):
    ragged, seqs, dense, split = data
    full = _build(seqs, ragged, dense)
    M = full.num_leaves
    N = 24  # ≥ every M the strategy draws: no pruning
    cache = toy_cache()
    res = _searcher(N, mode, lp)(cache, full.device())
    _check_valid(full, res)
    assert int(np.asarray(res.valid).sum()) == B * M  # fewer docids than beams: exactly M valid each
    exact = exhaustive_scores(toy_step, cache, full, batch_size=B, score_mode=mode, length_penalty=lp,
                              chunk_size=8)
    order, scores = exhaustive_ranking(exact, M)
    np.testing.assert_array_equal(np.asarray(res.leaf_ids)[:, :M], order)
    np.testing.assert_allclose(np.asarray(res.scores)[:, :M], scores, atol=1e-5, rtol=0)
    # Inserting the last docids into a smaller index decodes exactly like the full build, with a small beam too.
    part = _build(seqs[:split], ragged, dense)
    if split < len(seqs):
        part.insert(seqs[split:] if ragged else np.array(seqs[split:]), list(range(split, len(seqs))))
    for n in (N, 2):
        a = _searcher(n, mode, lp)(cache, full.device())
        b = _searcher(n, mode, lp)(cache, part.device())
        _check_valid(part, b)
        ta, tb = np.asarray(a.tokens), np.asarray(b.tokens)
        np.testing.assert_array_equal(np.where(np.asarray(a.valid)[..., None], ta, -9),
                                      np.where(np.asarray(b.valid)[..., None], tb, -9))
        np.testing.assert_allclose(np.asarray(a.scores), np.asarray(b.scores), atol=1e-5)


def test_small_beam_prunes_and_search_error_measures_it():
    rng = np.random.default_rng(3)
    seqs = np.unique(rng.integers(2, V, (200, 4)), axis=0)
    index = TrieIndex.build(seqs, vocab_size=V)
    cache = toy_cache(seed=5, batch=8)
    exact = exhaustive_scores(toy_step, cache, index, batch_size=8, chunk_size=64)
    res = jax.jit(lambda c, t: beam_search(toy_step, c, t, batch_size=8, num_beams=1))(cache, index.device())
    err = search_error(np.asarray(res.leaf_ids), exact)
    big = jax.jit(lambda c, t: beam_search(toy_step, c, t, batch_size=8, num_beams=40))(cache, index.device())
    assert search_error(np.asarray(big.leaf_ids), exact) <= err
    # beam 1 is greedy: its score can never beat the exact best
    assert (np.asarray(res.scores)[:, 0] <= exact.max(axis=1) + 1e-5).all()


def test_search_error_by_hand():
    exact = np.array([[0.1, 0.9, 0.3], [0.5, 0.2, 0.1]])
    assert search_error(np.array([[1, 0], [1, 2]]), exact) == 0.5


def test_bonus_changes_pruning_not_model_scores():
    seqs = np.array([[2, 3], [2, 4], [5, 3], [5, 6]])
    index = TrieIndex.build(seqs, vocab_size=V, dense_budget_bytes=0)
    cache = toy_cache(batch=B)
    target = int(index.lookup(np.array([[5, 6]]))[0])
    node_56 = int(index.main_nodes[2] - 1)  # (5,6) sorts last at depth 2

    def bonus(level, child, state):
        return jnp.where((level == 1) & (child == node_56), state, 0.0)

    run = jax.jit(lambda c, t, s: beam_search(toy_step, c, t, batch_size=B, num_beams=4, bonus_fn=bonus,
                                              query_state=s))
    plain = run(cache, index.device(), jnp.zeros((B, 1, 1)))
    boosted = run(cache, index.device(), jnp.full((B, 1, 1), 100.0))
    assert (np.asarray(boosted.leaf_ids)[:, 0] == target).all()
    i = np.argmax(np.asarray(plain.leaf_ids) == target, axis=1)
    np.testing.assert_allclose(np.asarray(boosted.scores)[:, 0], np.asarray(plain.scores)[np.arange(B), i], atol=1e-6)
    np.testing.assert_allclose(np.asarray(boosted.prune_scores)[:, 0], np.asarray(boosted.scores)[:, 0] + 100.0,
                               atol=1e-4)


def test_unconstrained_matches_enumeration():
    """With beams ≥ all prefixes, the unconstrained search finds the exact best EOS-terminated sequence."""
    cache = toy_cache(batch=2)
    L = 3
    res = jax.jit(lambda c: beam_search_unconstrained(toy_step, c, batch_size=2, num_beams=V ** 2, max_length=L,
                                                      eos_id=EOS, vocab_size=V))(cache)
    # enumerate every sequence of ≤ L tokens ending with EOS
    seqs = [[EOS]] + [[a, EOS] for a in range(V) if a != EOS] + \
        [[a, b, EOS] for a in range(V) for b in range(V) if EOS not in (a, b)]
    index = TrieIndex.build(seqs, vocab_size=V, eos_id=EOS)
    exact = exhaustive_scores(toy_step, cache, index, batch_size=2, chunk_size=128)
    best = exact.max(axis=1)
    np.testing.assert_allclose(np.asarray(res.scores)[:, 0], best, atol=1e-5)
    lengths = np.asarray(res.lengths)[:, 0]
    toks = np.asarray(res.tokens)[:, 0]
    assert all(toks[b, lengths[b] - 1] == EOS for b in range(2))


class TestShapes(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_result_shapes(self):
        index = TrieIndex.build([[2, 3, EOS], [2, EOS], [4, EOS]], vocab_size=V, eos_id=EOS)
        fn = self.variant(lambda c, t: beam_search(toy_step, c, t, batch_size=B, num_beams=5, score_mode="raw"))
        res = fn(toy_cache(), index.device())
        chex.assert_shape(res.tokens, (B, 5, 3))
        chex.assert_shape([res.scores, res.prune_scores, res.leaf_ids, res.lengths, res.valid], (B, 5))
        chex.assert_tree_all_finite(jnp.where(res.valid, res.scores, 0.0))
        assert int(np.asarray(res.valid).sum()) == 3 * B


    @chex.variants(with_jit=True, without_jit=True)
    def test_the_same_beams_jitted_or_not(self):
        """The search's steps (scoring, pruning, the constraint's step) compiled and eager: the same beams, scores
        within float32 rounding of their magnitude."""
        index = TrieIndex.build([[2, 3, EOS], [2, EOS], [4, EOS], [4, 2, EOS]], vocab_size=V, eos_id=EOS)
        for mode in ("raw", "log_softmax"):
            def search(c, t, mode=mode):
                return beam_search(toy_step, c, t, batch_size=B, num_beams=3, score_mode=mode)
            got = self.variant(search)(toy_cache(), index.device())
            with jax.disable_jit():
                want = search(toy_cache(), index.device())
            chex.assert_trees_all_equal(got.tokens, want.tokens)
            chex.assert_trees_all_equal(got.valid, want.valid)
            chex.assert_trees_all_close(jnp.where(got.valid, got.scores, 0.0), jnp.where(want.valid, want.scores, 0.0),
                                        rtol=1e-6)


def test_unknown_score_mode():
    index = TrieIndex.build(np.array([[2, 3]]), vocab_size=V)
    with pytest.raises(ValueError, match="score_mode"):
        beam_search(toy_step, toy_cache(), index.device(), batch_size=B, num_beams=2, score_mode="softmax")


@flax.struct.dataclass
class _TwoTokens:
    """A constraint written outside the library: any sequence over the tokens {2, 3}, ended by 4 (a complete
    docid, not extended); a state is the sequence in base 4 (digit = token - 1), the leaf id too."""

    depth: int = flax.struct.field(pytree_node=False, default=3)
    vocab_size: int = flax.struct.field(pytree_node=False, default=V)

    def root(self, shape):
        return jnp.zeros(shape, jnp.int32)

    def children(self, d, state):
        tokens = jnp.broadcast_to(jnp.array([2, 3, 4], jnp.int32), (*state.shape, 3))
        child = state[..., None] * 4 + (tokens - 1)
        return tokens, child, jnp.where(tokens == 4, child, -1), jnp.ones(tokens.shape, bool)

    def has_leaves(self, d):
        return True


def _teacher_forced(cache, seq):
    """log-softmax score of `seq` per query, fed token by token (start token 0)."""
    total, last = 0.0, jnp.zeros((B,), jnp.int32)
    for t in seq:
        logits, cache = toy_step(cache, last)
        total = total + jax.nn.log_softmax(logits)[:, t]
        last = jnp.full((B,), t, jnp.int32)
    return np.asarray(total)


def _code(seq):
    return int("".join(str(t - 1) for t in seq), 4)


def test_a_constraint_from_outside_drives_the_search_and_keeps_its_history():
    """The shared search takes any object with the constraint interface: with N ≥ 2**T beams the history of
    level d holds all 2**(d+1) prefixes over {2, 3}, each with its teacher-forced score, in decreasing order;
    the finished pool holds every sequence ended by 4 (7 of them) in score order, with the constraint's
    leaf ids and states."""
    import itertools

    cache = toy_cache()
    res = jax.jit(lambda c: beam_search(toy_step, c, _TwoTokens(), batch_size=B, num_beams=8,
                                        keep_history=True))(cache)
    h = res.history
    for d in range(3):
        seqs = list(itertools.product([2, 3], repeat=d + 1))
        for b in range(B):
            got = {tuple(t[: d + 1]): s for t, s, ok in zip(np.asarray(h.tokens[b, d]).tolist(),
                                                            np.asarray(h.scores[b, d]), np.asarray(h.valid[b, d]))
                   if ok}
            assert set(got) == set(seqs)
            for seq in seqs:
                want = _teacher_forced(cache, seq)[b]
                # float32 sums of ≤ 3 log-softmax terms of magnitude ≤ ~10: 1e-5 relative covers the rounding
                assert abs(got[seq] - want) <= 1e-5 * max(1.0, abs(want))
            assert list(np.asarray(h.scores[b, d])[: len(seqs)]) == sorted(got.values(), reverse=True)
            assert [_code(s) for s in got] == [int(x) for x, ok in zip(np.asarray(h.states[b, d]),
                                                                     np.asarray(h.valid[b, d])) if ok]
    ended = [s + (4,) for n in (0, 1, 2) for s in itertools.product([2, 3], repeat=n)]
    for b in range(B):
        exact = sorted(((_teacher_forced(cache, s)[b], s) for s in ended), reverse=True)
        ok = np.asarray(res.valid[b])
        got = [tuple(t[:n]) for t, n, v in zip(np.asarray(res.tokens[b]).tolist(), np.asarray(res.lengths[b]), ok)
               if v]
        assert got == [s for _, s in exact]
        codes = [_code(s) for s in got]
        assert np.asarray(res.leaf_ids[b])[ok].tolist() == codes == np.asarray(res.states[b])[ok].tolist()


@pytest.mark.slow  # the default tier checks the scanned search against the oracle (tests/decoding/test_oracle.py)
@pytest.mark.parametrize("mode", ["log_softmax", "renormalized", "raw"])
def test_scanned_levels_equal_the_unrolled_search_bit_for_bit(mode):
    """The toy step's arithmetic does not depend on the level, so the search with its runs of levels scanned
    (`scan_levels`) returns exactly the unrolled search's docids, leaves, scores (length penalty 1: the same
    float32 reciprocal at a traced depth) and history, at beams that prune and at a full beam. "renormalized"
    normalises over a level's slots, which a run pads to its C (invalid slots): the same ranking, and scores
    within float32 rounding of that longer sum (1e-6 of their magnitude, ~O(1) here)."""
    r = np.random.default_rng(7)
    seqs: set = set()
    while len(seqs) < 150:
        seqs.add(tuple(int(x) for x in r.integers(2, 6, r.integers(1, 8))) + (EOS,))
    index = TrieIndex.build([list(s) for s in sorted(seqs)], vocab_size=V, eos_id=EOS, dense_budget_bytes=0)
    trie = index.device()
    assert any(b - a >= 3 for a, b in trie.level_runs())
    cache = toy_cache(seed=9, batch=4)
    for N, width in ((1, 0), (4, 0), (4, 8), (len(seqs), 0)):  # width: SEAL's wider history (top 2N)
        a, b = (jax.jit(lambda c, t, s=scan: beam_search(toy_step, c, t, batch_size=4, num_beams=N, score_mode=mode,
                                                         length_penalty=1.0, keep_history=True, scan_levels=s,
                                                         history_width=width))(
            cache, trie) for scan in (False, True))
        valid = np.asarray(a.valid)
        np.testing.assert_array_equal(valid, np.asarray(b.valid))
        exact = np.testing.assert_array_equal
        close = exact if mode != "renormalized" else functools.partial(np.testing.assert_allclose, rtol=1e-6)
        for check, x, y in ((exact, a.tokens, b.tokens), (exact, a.leaf_ids, b.leaf_ids), (close, a.scores, b.scores),
                            (close, a.prune_scores, b.prune_scores)):
            check(np.asarray(x)[valid], np.asarray(y)[valid])
        hv = np.asarray(a.history.valid)
        exact(hv, np.asarray(b.history.valid))
        for check, x, y in ((exact, a.history.tokens, b.history.tokens), (close, a.history.scores, b.history.scores),
                            (exact, a.history.states, b.history.states), (exact, a.history.leaf, b.history.leaf)):
            check(np.asarray(x)[hv], np.asarray(y)[hv])


@flax.struct.dataclass
class _FlatPrefixes:
    """Every prefix of a docid list as flat candidates (test-only, built from Python lists): state = a prefix's
    number; level d lists every prefix of d + 1 tokens with its parent's number, whichever beams hold them."""

    parent_id: jax.Array  # [T, F] number of each candidate's d-token prefix (-1: padding)
    token: jax.Array  # [T, F]
    own_id: jax.Array  # [T, F]
    leaf: jax.Array  # [T, F]
    bonus: jax.Array  # [T, F]
    depth: int = flax.struct.field(pytree_node=False)
    vocab_size: int = flax.struct.field(pytree_node=False)
    leaf_levels: tuple = flax.struct.field(pytree_node=False)

    def root(self, shape):
        return jnp.zeros(shape, jnp.int32)  # the empty prefix is number 0

    def has_leaves(self, d):
        return d in self.leaf_levels

    def candidates(self, d, state, valid):
        from gr_jax.decoding.beam_search import Candidates

        held = (state[:, None, :] == self.parent_id[d][None, :, None]) & valid[:, None, :]  # [B, F, n]
        parent = jnp.where(held.any(-1), jnp.argmax(held, axis=-1), -1)
        shape = parent.shape
        return Candidates(parent=parent, tokens=jnp.broadcast_to(self.token[d], shape),
                          state=jnp.broadcast_to(self.own_id[d], shape), leaf=jnp.broadcast_to(self.leaf[d], shape),
                          valid=(parent >= 0) & (self.parent_id[d] >= 0), bonus=jnp.broadcast_to(self.bonus[d], shape))


def _flat_prefixes(seqs, index, bonus_of):
    number = {(): 0}
    for s in seqs:
        for d in range(1, len(s) + 1):
            number.setdefault(tuple(s[:d]), len(number))
    T = max(len(s) for s in seqs)
    by_level = [sorted(p for p in number if len(p) == d + 1) for d in range(T)]
    F = max(len(x) for x in by_level)
    arr = np.full((5, T, F), -1, np.int64)
    bonus = np.zeros((T, F), np.float32)
    whole = {tuple(s) for s in seqs}
    for d, prefixes in enumerate(by_level):
        for i, p in enumerate(prefixes):
            leaf = index.lookup([list(p)])[0] if p in whole else -1
            arr[:, d, i] = (number[p[:-1]], p[-1], number[p], leaf, 0)
            bonus[d, i] = bonus_of(p)
    leaf_levels = tuple(sorted({len(s) - 1 for s in seqs}))
    return _FlatPrefixes(*(jnp.asarray(a, jnp.int32) for a in arr[:4]), bonus=jnp.asarray(bonus), depth=T,
                         vocab_size=V, leaf_levels=leaf_levels)


@pytest.mark.parametrize("guided,mode,ragged", sweep("guided,mode,ragged", ((False, True), ("raw", "log_softmax"),
                                                                          (False, True)),
                                                     [(True, "log_softmax", True), (False, "raw", False)]))
def test_flat_candidates_search_as_the_trie_search_does(ragged, mode, guided):
    """`beam_search_flat` over every prefix of a docid list, given flat (each candidate naming its beam), finds
    what `beam_search` finds over the trie of the same docids — docids, scores and order, at every beam size —
    with a look-ahead bonus on the pruning score (from the docid prefix; PAG's form: not accumulated) or none."""
    from gr_jax.decoding.beam_search import beam_search_flat

    rng = np.random.default_rng(3)
    if ragged:
        seqs = sorted({tuple(rng.integers(2, 6, rng.integers(1, 4)).tolist()) + (EOS,) for _ in range(30)})
    else:
        seqs = sorted({tuple(rng.integers(2, 6, 3).tolist()) for _ in range(30)})
    index = _build([list(s) for s in seqs], ragged, 0)
    bonus_of = (lambda p: float(np.sin(7.0 * sum((i + 1) * t for i, t in enumerate(p))))) if guided else (
        lambda p: 0.0)
    flat = _flat_prefixes([list(s) for s in seqs], index, bonus_of)
    trie = index.device()
    paths = index.path_nodes(np.array([list(s) + [0] * (flat.depth - len(s)) for s in seqs]),
                             np.array([len(s) for s in seqs]))
    node_bonus = np.zeros((flat.depth, index.num_nodes + 1), np.float32)  # node ids are numbered per depth
    for s, nodes in zip(seqs, paths):
        for d in range(1, len(s) + 1):
            node_bonus[d - 1, nodes[d]] = bonus_of(s[:d])
    table = jnp.asarray(node_bonus)
    bonus_fn = lambda d, child, _: table[d, jnp.maximum(child, 0)]  # noqa: E731
    for N in (1, 3, len(seqs)):
        kw = dict(batch_size=B, num_beams=N, score_mode=mode, accumulate_bonus=False)
        want = jax.jit(lambda c: beam_search(toy_step, c, trie, bonus_fn=bonus_fn, **kw))(toy_cache())
        got = jax.jit(lambda c: beam_search_flat(toy_step, c, flat, **kw))(toy_cache())
        np.testing.assert_array_equal(np.asarray(got.valid), np.asarray(want.valid))
        v = np.asarray(want.valid)
        np.testing.assert_array_equal(np.asarray(got.leaf_ids)[v], np.asarray(want.leaf_ids)[v])
        np.testing.assert_array_equal(np.asarray(got.tokens)[v], np.asarray(want.tokens)[v])
        # the same float ops on each candidate's row, gathered in another layout: equal to rounding
        for name in ("scores", "prune_scores"):
            a, b = np.asarray(getattr(got, name))[v], np.asarray(getattr(want, name))[v]
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * max(1.0, np.abs(b).max()))
    assert int(v.sum()) == B * len(seqs)  # at the full beam every docid is found


def test_flat_search_refuses_renormalized_scores():
    from gr_jax.decoding.beam_search import beam_search_flat

    index = _build([[2, 3], [2, 4]], False, 0)
    flat = _flat_prefixes([[2, 3], [2, 4]], index, lambda p: 0.0)
    with pytest.raises(ValueError, match="renormalized"):
        beam_search_flat(toy_step, toy_cache(), flat, batch_size=B, num_beams=2, score_mode="renormalized")


def test_a_wider_history_keeps_the_best_candidates_of_every_level_finished_ones_too():
    """`history_width` W (SEAL's top 2N): level d's history is the W best of all the candidates the N alive
    beams make there — finished ones (token 4, a leaf) included, marked by their leaf — while only N unfinished
    ones go on; worked out by brute force from teacher-forced scores."""
    cache = toy_cache()
    N, W = 2, 4
    res = jax.jit(lambda c: beam_search(toy_step, c, _TwoTokens(), batch_size=B, num_beams=N, keep_history=True,
                                        history_width=W))(cache)
    h = res.history
    for b in range(B):
        alive = [()]
        for d in range(3):
            cands = [p + (t,) for p in alive for t in (2, 3, 4)]
            scored = sorted(((_teacher_forced(cache, c)[b], c) for c in cands), reverse=True)
            want = [c for _, c in scored[:W]]
            got = [tuple(t[: d + 1]) for t, ok in zip(np.asarray(h.tokens[b, d]).tolist(), np.asarray(h.valid[b, d]))
                   if ok]
            assert got == want
            leaves = [int(x) for x, ok in zip(np.asarray(h.leaf[b, d]), np.asarray(h.valid[b, d])) if ok]
            assert [x >= 0 for x in leaves] == [c[-1] == 4 for c in want]
            alive = [c for _, c in scored if c[-1] != 4][:N]
