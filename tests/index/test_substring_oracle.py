"""SubstringIndex (`gr_jax.index.substring`) against an independent plain-Python oracle.

The oracle shares no code and no data structure with `gr_jax/index/`: it scans the documents' token lists
directly. An n-gram g *occurs* at (document k, start i) when doc_k[i : i + |g|] == g; F(g) counts those
occurrences, its documents are the rows of the k that have one, and the tokens that *follow* g are the
doc_k[i + |g|] that exist (no n-gram crosses a document boundary). Only the public interface is used:
`SubstringIndex.build / insert / compact / num_documents / num_tokens / device`, and on the device side
`root / children / counts / documents` plus the shared beam search.

* walk: from the root, one token at a time through `children`, every n-gram of ≤ 3 tokens that occurs is
  reached (and every other one is refused: the valid set at each step is compared whole), with `counts` and
  `documents` of each; after build, after one or two inserts (default or explicit rows), after compact, with
  explicit non-contiguous rows, with `prefix=` and with `end_token=`;
* beam search with enough beams holds, at each level, exactly the distinct occurring n-grams of that length,
  each with the score teacher forcing gives with the same step function, and history states whose `counts`
  and `documents` are the oracle's (also with a prefix; with end_token, the finished pool holds exactly the
  occurring n-grams that end with it);
* a hand-worked corpus written out literally, and a corpus of empty documents.

The index compiles its device functions per array shape, so the random corpora come in a few fixed layouts and
state batches are padded to a few sizes (`LAYOUTS`, `_padded`): that keeps the file under a minute on 2 cores.

Integer sets are compared exactly. Scores have a tolerance relative to the magnitude of the values they are
computed from (see `teacher_forced`).
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gr_jax.decoding.beam_search import beam_search
from gr_jax.index.substring import SubstringIndex

START = 0  # the beam search's start token (an input to the scorer only)
SCORE_RTOL = 1e-5  # see `teacher_forced`


# ---------------------------------------------------------------------------------------------------------------
# the oracle: documents as plain lists, every answer by a direct scan
# ---------------------------------------------------------------------------------------------------------------

class Corpus:
    """The documents and their rows, as the index should see them after build / insert."""

    def __init__(self):
        self.docs: list[tuple[int, ...]] = []
        self.rows: list[int] = []

    def add(self, docs, rows=None):
        if rows is None:  # default rows continue after the largest row so far (0, 1, ... on an empty corpus)
            start = max(self.rows) + 1 if self.rows else 0
            rows = range(start, start + len(docs))
        rows = [int(r) for r in rows]
        assert len(rows) == len(docs)
        self.docs += [tuple(int(t) for t in d) for d in docs]
        self.rows += rows
        return self

    @property
    def num_tokens(self):
        return sum(len(d) for d in self.docs)

    def occurrences(self, gram):
        gram = tuple(gram)
        n = len(gram)
        return [(k, i) for k, doc in enumerate(self.docs) for i in range(len(doc) - n + 1) if doc[i:i + n] == gram]

    def F(self, gram):
        return len(self.occurrences(gram))

    def follow(self, gram):
        n = len(gram)
        return {self.docs[k][i + n] for k, i in self.occurrences(gram) if i + n < len(self.docs[k])}

    def doc_rows(self, gram):
        return {self.rows[k] for k, _ in self.occurrences(gram)}

    def distinct(self, n):
        return {doc[i:i + n] for doc in self.docs for i in range(len(doc) - n + 1)}


# ---------------------------------------------------------------------------------------------------------------
# checks of the device view against the oracle
# ---------------------------------------------------------------------------------------------------------------

def _pick(tree, m_idx, v_idx):
    """The child states at (state m, slot v) pairs: `x[..., v]` of each leaf, for many states at once."""
    return jax.tree_util.tree_map(lambda x: x[m_idx, v_idx], tree)


def _padded(tree, n: int):
    """States [n] padded with copies of the first to a power of two (≥ 8): the index compiles its functions
    per shape, so a few bucket sizes keep this test fast. The copies' answers are ignored."""
    size = max(8, 1 << (n - 1).bit_length())
    return jax.tree_util.tree_map(lambda x: jnp.concatenate([x, jnp.repeat(x[:1], size - n)]), tree)


@functools.partial(jax.jit, static_argnums=1)
def _children_jit(dev, d, state):
    return dev.children(d, state)


def explore(dev, vocab_size: int, max_len: int, occurrence_limits=(), jit=True):
    """Breadth-first from the root through `children`, one token per level: every n-gram of ≤ max_len tokens
    the device view accepts (continuations of its prefix). Returns {gram: facts}: "next" (the valid slots, for
    grams shorter than max_len), "leaf" (their leaf row), "F" (`counts`), and for each m in
    `occurrence_limits` the rows `documents(state, m)` returns ("rows", m), as a list (duplicates kept).

    Each level is one batched `children` call (jitted, as the beam search calls it: compiled once per shape
    instead of dispatched op by op; `jit=False` calls it directly); `counts` and `documents` run once on all
    the grams' states."""
    root = dev.root((1,))
    for x in jax.tree_util.tree_leaves(root):
        assert x.shape == (1,) and jnp.issubdtype(x.dtype, jnp.integer)
    grams, state = [()], root
    facts = {(): {}}
    levels = [root]
    for d in range(max_len):
        M = len(grams)
        tokens, nxt, leaf, valid = (_children_jit if jit else type(dev).children)(dev, d, _padded(state, M))
        assert tokens is None  # dense slots: slot v is token v
        P = jax.tree_util.tree_leaves(_padded(state, M))[0].shape[0]
        assert valid.shape == (P, vocab_size) and valid.dtype == bool
        assert leaf.shape == (P, vocab_size) and jnp.issubdtype(leaf.dtype, jnp.integer)
        for x in jax.tree_util.tree_leaves(nxt):
            assert x.shape == (P, vocab_size)
        valid, leaf = np.asarray(valid)[:M], np.asarray(leaf)[:M]
        for i, g in enumerate(grams):
            facts[g].update(next=set(np.flatnonzero(valid[i]).tolist()), valid=valid[i], leaf=leaf[i])
        m_idx, v_idx = np.nonzero(valid)
        if len(m_idx) == 0:
            break
        grams = [grams[m] + (int(v),) for m, v in zip(m_idx, v_idx)]
        state = _pick(nxt, jnp.asarray(m_idx), jnp.asarray(v_idx))
        levels.append(state)
        facts.update({g: {} for g in grams})
    every = list(facts)  # in level order, as `levels` is
    n = len(every)
    states = _padded(jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *levels), n)
    P = jax.tree_util.tree_leaves(states)[0].shape[0]
    counts = np.asarray(dev.counts(states))
    assert counts.shape == (P,)
    for g, f in zip(every, counts):
        facts[g]["F"] = int(f)
    for m in occurrence_limits:
        rows, ok = dev.documents(states, m)
        rows, ok = np.asarray(rows), np.asarray(ok)
        assert rows.shape[:-1] == (P,) and ok.shape == rows.shape and ok.dtype == bool
        for i, g in enumerate(every):
            facts[g]["rows", m] = rows[i][ok[i]].tolist()
    return facts


def check_walk(index, corpus: Corpus, vocab_size: int, max_len: int = 3, prefix=(), end_token=None,
               extra_limits=()):
    """Every n-gram (continuation of `prefix`) of ≤ max_len tokens, walked from the root through `children`:
    exactly the occurring ones are reached (each valid set is the oracle's next-token set), leaf slots follow
    end_token, and `counts` / `documents` are the oracle's."""
    prefix = tuple(prefix)
    assert index.num_documents == len(corpus.docs)
    assert index.num_tokens == corpus.num_tokens
    dev = index.device(max_length=max_len, prefix=prefix, end_token=end_token)
    assert dev.depth == max_len
    big = max(128, corpus.num_tokens + len(corpus.docs))  # ≥ every F, the empty n-gram's under either reading
    limits = (2, big, *extra_limits)  # 2: exact at the boundary for F ≤ 2, a subset above it
    facts = explore(dev, vocab_size, max_len, limits)
    for n in range(1, max_len + 1):  # exactly the continuations of the prefix that occur are reached
        expect = {g[len(prefix):] for g in corpus.distinct(len(prefix) + n) if g[:len(prefix)] == prefix}
        assert {g for g in facts if len(g) == n} == expect, n
    is_end = np.arange(vocab_size) == end_token
    for g, f in facts.items():
        full = prefix + g
        if len(g) < max_len:
            assert f["next"] == corpus.follow(full), (full, sorted(f["next"]), sorted(corpus.follow(full)))
            # leaf: -1 everywhere, except the end_token slot where it is valid (then ≥ 0)
            np.testing.assert_array_equal(f["leaf"] >= 0, f["valid"] & is_end, err_msg=str(full))
            assert (f["leaf"][~(f["valid"] & is_end)] == -1).all(), full
        for m in limits:
            got = f["rows", m]
            assert len(got) == len(set(got)), ("duplicate rows", full, m, got)
        if not full:  # the empty n-gram: start positions 0 .. len-1 or 0 .. len of each document, either reading
            assert f["F"] in (corpus.num_tokens, corpus.num_tokens + len(corpus.docs)), f["F"]
            nonempty = {r for r, d in zip(corpus.rows, corpus.docs) if d}
            assert set(f["rows", big]) in (nonempty, set(corpus.rows)), sorted(f["rows", big])
            continue
        F, rows = corpus.F(full), corpus.doc_rows(full)
        assert f["F"] == F, (full, f["F"], F)
        for m in limits:  # exact when max_occurrences ≥ F; otherwise still rows of documents holding the n-gram
            got = set(f["rows", m])
            assert got == rows if m >= F else got <= rows, (full, m, sorted(got), sorted(rows))
    return facts


# ---------------------------------------------------------------------------------------------------------------
# 4. a hand-worked corpus
# ---------------------------------------------------------------------------------------------------------------

HAND = [[1, 2, 1], [2, 1, 2], [3]]


def _walk(index, max_len=4, jit=True, **kwargs):
    return explore(index.device(max_length=max_len, **kwargs), 4, max_len, (10,), jit=jit)


def test_hand_worked_corpus():
    index = SubstringIndex.build(HAND, vocab_size=4)
    assert index.num_documents == 3 and index.num_tokens == 7
    w = _walk(index, jit=False)
    nxt = {g: f["next"] for g, f in w.items() if "next" in f}
    assert nxt == {(): {1, 2, 3},
                   (1,): {2},  # the 1 at the end of doc 0 has no successor
                   (2,): {1},  # nor has the 2 at the end of doc 1
                   (3,): set(),  # doc 2 is the single token 3: nothing follows it, nothing precedes it
                   (1, 2): {1}, (2, 1): {2},
                   (1, 2, 1): set(), (2, 1, 2): set()}  # so [1, 3], [3, 1], [2, 3], [1, 1], ... are refused
    F = {g: f["F"] for g, f in w.items() if g}
    assert F == {(1,): 3, (2,): 3, (3,): 1, (1, 2): 2, (2, 1): 2, (1, 2, 1): 1, (2, 1, 2): 1}
    docs = {g: set(f["rows", 10]) for g, f in w.items() if g}
    assert docs == {(1,): {0, 1}, (2,): {0, 1}, (3,): {2}, (1, 2): {0, 1}, (2, 1): {0, 1}, (1, 2, 1): {0},
                    (2, 1, 2): {1}}

    # explicit rows, then an insert with default rows (continuing after the largest row: 31)
    index = SubstringIndex.build(HAND, vocab_size=4, rows=[10, 20, 30])
    index.insert([[3, 1]])
    assert index.num_documents == 4 and index.num_tokens == 9
    for compacted in (False, True):
        if compacted:
            index.compact()
            assert index.num_documents == 4 and index.num_tokens == 9
        w = _walk(index, 3)
        assert w[(3,)]["next"] == {1} and w[(1,)]["next"] == {2} and w[(3, 1)]["next"] == set()
        assert set(w[(1, 2)]["rows", 10]) == {10, 20}
        assert set(w[(3,)]["rows", 10]) == {30, 31} and set(w[(3, 1)]["rows", 10]) == {31}
        assert w[(1,)]["F"] == 4 and w[(3,)]["F"] == 2 and w[(3, 1)]["F"] == 1

    # prefix: n-grams are continuations of [2]
    index = SubstringIndex.build(HAND, vocab_size=4)
    w = _walk(index, 3, prefix=[2])
    assert {g: f["next"] for g, f in w.items()} == {(): {1}, (1,): {2}, (1, 2): set()}
    assert w[()]["F"] == 3 and set(w[()]["rows", 10]) == {0, 1}
    assert w[(1,)]["F"] == 2 and set(w[(1,)]["rows", 10]) == {0, 1}  # [2, 1]
    assert w[(1, 2)]["F"] == 1 and set(w[(1, 2)]["rows", 10]) == {1}  # [2, 1, 2] only in doc 1
    # a prefix that does not occur: nothing follows it, it occurs nowhere
    w = _walk(index, 2, prefix=[1, 3])
    assert list(w) == [()] and w[()]["next"] == set() and w[()]["F"] == 0 and w[()]["rows", 10] == []

    # end_token 2: its slot is a leaf exactly where 2 may follow
    w = _walk(index, 3, end_token=2)
    for gram, is_leaf in (((), True), ((1,), True), ((2,), False), ((3,), False), ((2, 1), True), ((1, 2), False)):
        assert bool(w[gram]["valid"][2]) == is_leaf and (w[gram]["leaf"][2] >= 0) == is_leaf, gram
        assert (w[gram]["leaf"][[0, 1, 3]] == -1).all(), gram

    # root states of any shape
    dev = index.device(max_length=2)
    state = dev.root((2, 3))
    assert all(x.shape == (2, 3) for x in jax.tree_util.tree_leaves(state))
    _, nxt, leaf, valid = dev.children(0, state)
    assert np.asarray(valid).shape == (2, 3, 4) and np.asarray(leaf).shape == (2, 3, 4)
    assert all(x.shape == (2, 3, 4) for x in jax.tree_util.tree_leaves(nxt))
    np.testing.assert_array_equal(np.asarray(valid), np.broadcast_to([False, True, True, True], (2, 3, 4)))
    np.testing.assert_array_equal(np.asarray(dev.counts(jax.tree_util.tree_map(lambda x: x[..., 1], nxt))),
                                  np.full((2, 3), 3))


def test_corpus_of_empty_documents():
    """Documents may be empty; a corpus of nothing but empty ones accepts no token and finds no document."""
    index = SubstringIndex.build([[], []], vocab_size=3)
    assert index.num_documents == 2 and index.num_tokens == 0
    w = explore(index.device(max_length=2), 3, 2, (4,))
    assert list(w) == [()] and w[()]["next"] == set() and w[()]["F"] in (0, 2)
    index.insert([[], [1]])
    w = explore(index.device(max_length=2), 3, 2, (4,))
    assert w[()]["next"] == {1} and w[(1,)]["next"] == set() and w[(1,)]["F"] == 1 and w[(1,)]["rows", 4] == [3]


def test_hand_worked_beam_history():
    index = SubstringIndex.build(HAND, vocab_size=4)
    corpus = Corpus().add(HAND)
    check_beam_history(index, corpus, vocab_size=4, max_len=3, num_beams=4, seed=2)


# ---------------------------------------------------------------------------------------------------------------
# 1–2. random corpora: build, insert(s), compact; explicit rows; prefix; end_token
# ---------------------------------------------------------------------------------------------------------------

# (documents, tokens) of the build and of each insert: the index compiles per array shape, so the drawn corpora
# vary their tokens, document lengths (0 included) and rows within a few fixed layouts, which keeps 30–40 examples fast
LAYOUTS = ((5, 14), (3, 7), (2, 4))
V_WALK = 3  # a small vocabulary: repeated tokens, n-grams occurring many times


@st.composite
def documents(draw, num_docs: int, num_tokens: int):
    """`num_docs` documents of `num_tokens` tokens in all, cut anywhere (empty and 1-token documents too)."""
    tokens = draw(st.lists(st.integers(0, V_WALK - 1), min_size=num_tokens, max_size=num_tokens))
    cuts = sorted(draw(st.lists(st.integers(0, num_tokens), min_size=num_docs - 1, max_size=num_docs - 1)))
    bounds = [0, *cuts, num_tokens]
    return [tokens[a:b] for a, b in itertools.pairwise(bounds)]


@st.composite
def corpora(draw, max_parts: int = 3):
    """The build's documents and those of up to two inserts, each with default or explicit rows."""
    layouts = LAYOUTS[:draw(st.integers(1, max_parts))]
    parts = [draw(documents(D, T)) for D, T in layouts]
    n = sum(len(p) for p in parts)
    pool = draw(st.lists(st.integers(0, 500), min_size=n, max_size=n, unique=True))  # non-contiguous rows
    rows, k = [], 0
    for p in parts:
        rows.append(pool[k:k + len(p)] if draw(st.booleans()) else None)
        k += len(p)
    return parts, rows


@pytest.mark.slow  # over 5 s: the default tier keeps within 10 minutes
@settings(max_examples=30, deadline=None)
@given(corpora())
def test_walk_after_build_insert_compact(data):
    parts, rows = data
    V = V_WALK
    corpus = Corpus().add(parts[0], rows[0])
    index = SubstringIndex.build(parts[0], vocab_size=V, rows=rows[0])
    check_walk(index, corpus, V)
    for p, r in zip(parts[1:], rows[1:]):
        index.insert(p, rows=r)
        corpus.add(p, r)
        check_walk(index, corpus, V)
    index.compact()
    check_walk(index, corpus, V)


@pytest.mark.slow  # over 5 s: the default tier keeps within 10 minutes
@settings(max_examples=40, deadline=None)
@given(st.data())
def test_walk_with_prefix_and_end_token(data):
    (docs,), (rows,) = data.draw(corpora(max_parts=1))
    V = V_WALK
    corpus = Corpus().add(docs, rows)
    index = SubstringIndex.build(docs, vocab_size=V, rows=rows)
    occurring = sorted(corpus.distinct(1) | corpus.distinct(2))
    # no prefix, a prefix that occurs (when any does), or any short sequence, occurring or not
    anything = st.lists(st.integers(0, V - 1), min_size=0, max_size=2).map(tuple)
    prefix = data.draw(st.one_of(st.sampled_from(occurring), anything) if occurring else anything)
    # tokens are drawn uniformly: end_token 1 stands for any (fewer static variants to compile)
    end_token = data.draw(st.sampled_from([None, 1]))
    check_walk(index, corpus, V, max_len=2, prefix=prefix, end_token=end_token)


@pytest.mark.slow
def test_seeded_larger_corpora_with_repeats():
    """A few bigger corpora (long runs of one token, many duplicates) than the hypothesis draws."""
    rng = np.random.default_rng(7)
    for trial in range(4):
        V = int(rng.integers(2, 4))
        docs = [rng.integers(0, V, int(rng.integers(0, 12))).tolist() for _ in range(8)]
        docs[0] = [0] * 9  # a run: [0, 0] occurs 8 times, overlapping
        docs[1] = []
        docs[2] = [V - 1]
        rows = rng.choice(1000, size=len(docs), replace=False).tolist() if trial % 2 else None
        corpus = Corpus().add(docs[:5], rows and rows[:5])
        index = SubstringIndex.build(docs[:5], vocab_size=V, rows=rows and rows[:5])
        index.insert(docs[5:], rows=rows and rows[5:])
        corpus.add(docs[5:], rows and rows[5:])
        check_walk(index, corpus, V, extra_limits=(1, 8))  # 8: F([0, 0]) ≥ 8, exact only if it is 8
        index.compact()
        check_walk(index, corpus, V, extra_limits=(1, 8))
        assert corpus.F((0, 0)) >= 8


# ---------------------------------------------------------------------------------------------------------------
# 3. beam search: the history holds every occurring n-gram with its teacher-forced score
# ---------------------------------------------------------------------------------------------------------------

H, B = 8, 2


@functools.cache
def toy_scorer(V: int, seed: int):
    """A tiny recurrent scorer whose next-token logits depend on the query and the whole generated prefix."""
    rng = np.random.default_rng(seed)
    E = jnp.asarray(rng.normal(size=(V, H)), jnp.float32)
    W = jnp.asarray(rng.normal(size=(H, H)) / 3, jnp.float32)
    U = jnp.asarray(rng.normal(size=(H, V)) * 1.5, jnp.float32)
    q = jnp.asarray(rng.normal(size=(B, H)), jnp.float32)

    def step(cache, tokens):
        h = jnp.tanh(cache["h"] @ W + E[tokens] + cache["q"])
        return h @ U, {"q": cache["q"], "h": h}

    return step, {"q": q, "h": jnp.zeros((B, H), jnp.float32)}


def teacher_forced(step, cache, b: int, grams):
    """Score of each n-gram for query b: the step function fed START then the n-gram's tokens, the log-softmax
    over the full vocabulary (float64 here) of each token summed; and a tolerance for it.

    The beam search runs the same float32 step function (under jit, maybe fused differently) and its own
    float32 log-softmax, so the two differ by a few float32 ulps of the values involved: logits and their
    log-sum-exp at each step. The tolerance is SCORE_RTOL (≈ 100 float32 ulps) times the sum over steps of
    max |logit| + |logsumexp| — relative to those magnitudes; a wrong token or a missing step is off by O(1)."""
    G = np.asarray(grams, np.int64)
    M, n = G.shape
    c = jax.tree_util.tree_map(lambda x: jnp.repeat(x[b:b + 1], M, axis=0), cache)
    logits, c = step(c, jnp.full((M,), START, jnp.int32))
    score, mag = np.zeros(M), np.zeros(M)
    for j in range(n):
        lg = np.asarray(logits, np.float64)
        lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
        score += lg[np.arange(M), G[:, j]] - lse
        mag += np.abs(lg).max(-1) + np.abs(lse)
        logits, c = step(c, jnp.asarray(G[:, j], jnp.int32))
    return score, SCORE_RTOL * mag


def check_beam_history(index, corpus: Corpus, vocab_size: int, max_len: int, num_beams: int, seed: int,
                       prefix=(), end_token=None):
    prefix = tuple(prefix)
    step, cache = toy_scorer(vocab_size, seed)
    dev = index.device(max_length=max_len, prefix=prefix, end_token=end_token)
    assert dev.depth == max_len
    run = jax.jit(lambda c, t: beam_search(step, c, t, batch_size=B, num_beams=num_beams, keep_history=True))
    res = run(cache, dev)
    hist = res.history
    tokens, scores, valid = np.asarray(hist.tokens), np.asarray(hist.scores), np.asarray(hist.valid)
    assert tokens.shape == (B, max_len, num_beams, max_len) and valid.shape == (B, max_len, num_beams)
    counts = np.asarray(dev.counts(hist.states))
    assert counts.shape == (B, max_len, num_beams)
    big = corpus.num_tokens + 1  # ≥ every F
    doc_rows, doc_ok = (np.asarray(x) for x in dev.documents(hist.states, big))

    def continuations(n):  # distinct occurring prefix + g, |g| = n, as g
        return {g[len(prefix):] for g in corpus.distinct(len(prefix) + n) if g[:len(prefix)] == prefix}

    end = end_token
    for d in range(max_len):
        expect = continuations(d + 1)
        if end is not None:  # beams that generate end_token finish: the alive ones never hold it
            expect = {g for g in expect if end not in g}
        assert len(expect) <= num_beams  # the premise: beams enough for every n-gram, no pruning
        for b in range(B):
            live = np.flatnonzero(valid[b, d])
            got = [tuple(tokens[b, d, i, :d + 1].tolist()) for i in live]
            assert len(got) == len(set(got)), ("duplicate n-gram", d, got)
            assert set(got) == expect, (b, d, sorted(got), sorted(expect))
            assert (tokens[b, d, live, d + 1:] == -1).all()
            assert np.isneginf(scores[b, d, ~valid[b, d]]).all()
            if not got:
                continue
            want, tol = teacher_forced(step, cache, b, got)
            np.testing.assert_array_less(np.abs(scores[b, d, live] - want), tol)
            np.testing.assert_array_equal(counts[b, d, live], [corpus.F(prefix + g) for g in got])
            for i, g in zip(live, got):
                assert sorted(doc_rows[b, d, i][doc_ok[b, d, i]].tolist()) == sorted(corpus.doc_rows(prefix + g)), g
    if end is not None:
        # finished: the occurring continuations whose only end_token is their last token
        expect = {g for n in range(1, max_len + 1) for g in continuations(n) if g[-1] == end and end not in g[:-1]}
        assert len(expect) <= num_beams
        ft, fl, fv = np.asarray(res.tokens), np.asarray(res.lengths), np.asarray(res.valid)
        fs, leaf = np.asarray(res.scores), np.asarray(res.leaf_ids)
        for b in range(B):
            live = np.flatnonzero(fv[b])
            got = [tuple(ft[b, i, :fl[b, i]].tolist()) for i in live]
            assert len(got) == len(set(got)) and set(got) == expect, (b, sorted(got), sorted(expect))
            assert (leaf[b, live] >= 0).all()
            for i, g in zip(live, got):  # finished n-grams have several lengths: teacher-forced one by one
                w, t = teacher_forced(step, cache, b, [g])
                assert abs(fs[b, i] - w[0]) < t[0], (g, fs[b, i], w[0])  # length_penalty 0: the plain sum


def _random_corpus(rng, V, n_docs, max_len_doc):
    return [rng.integers(0, V, int(rng.integers(0, max_len_doc + 1))).tolist() for _ in range(n_docs)]


def _beams_for(corpus, max_len, prefix=()):
    return max([1] + [sum(1 for g in corpus.distinct(len(prefix) + n) if g[:len(prefix)] == tuple(prefix))
                      for n in range(1, max_len + 1)]) + 3  # + 3 dead beams: padding must stay invalid


@pytest.mark.slow
def test_beam_history_holds_every_ngram_with_teacher_forced_scores():
    rng = np.random.default_rng(11)
    V = 5
    for trial in range(2):  # explicit rows after an insert; default rows, compacted
        docs = _random_corpus(rng, V, 6, 7) + [[], [int(rng.integers(0, V))]]
        rows = rng.choice(100, size=len(docs), replace=False).tolist() if trial == 0 else None
        corpus = Corpus().add(docs[:4], rows and rows[:4])
        index = SubstringIndex.build(docs[:4], vocab_size=V, rows=rows and rows[:4])
        index.insert(docs[4:], rows=rows and rows[4:])
        corpus.add(docs[4:], rows and rows[4:])
        if trial == 1:
            index.compact()
        check_beam_history(index, corpus, V, max_len=3, num_beams=_beams_for(corpus, 3), seed=trial)


@pytest.mark.slow
def test_beam_history_with_prefix_and_end_token():
    rng = np.random.default_rng(12)
    V = 5
    docs = _random_corpus(rng, V, 7, 8) + [[1, 2, 3, 4, 2, 3, 0], [2, 3]]
    corpus = Corpus().add(docs)
    index = SubstringIndex.build(docs, vocab_size=V)
    check_beam_history(index, corpus, V, max_len=3, num_beams=_beams_for(corpus, 3, (2, 3)), seed=5, prefix=(2, 3))
    # end_token: n-grams ending with it finish; beams enough for every finished one too
    N = _beams_for(corpus, 3) + sum(len(corpus.distinct(n)) for n in (1, 2, 3))
    check_beam_history(index, corpus, V, max_len=3, num_beams=N, seed=6, end_token=4)
