"""Beam search against an independent oracle.

The oracle shares no code with `gr_jax/decoding/` or `gr_jax/index/`: the allowed children come from Python
sets of docid prefixes built here, the step scores from its own numpy formulas (float64), the model from a
numpy re-implementation of the toy scorer (or, for T5, the full-sequence forward pass `T5.__call__`, which
does not use the decode cache), and the search is a plain Python loop over candidates.

* beam ≥ #docids: beam search returns every docid, in the oracle's exhaustive order, with its score — for
  the three score modes and several length penalties;
* smaller beams: it returns what the canonical algorithm documented in `beam_search.py` returns (per trie
  level: candidates = alive beams × allowed children; candidates that complete a docid enter a finished
  pool of N, kept by score / len**lp; the best N of the others stay alive; no early stop).

Rankings are compared exactly. Scores are compared with a relative tolerance of 1e-5: the search runs in
float32 and the oracle in float64, and the scores are sums of a few log-probabilities of magnitude 1–30.
Where two oracle scores lie within 1e-4 of each other, float32 may order them either way, so those cases are
skipped (each test asserts that enough cases were checked).
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.decoding import beam_search as bs_module
from gr_jax.decoding.beam_search import beam_search
from gr_jax.index.trie import TrieIndex
from tests.conftest import sweep

V, H, EOS, START = 9, 12, 1, 0
rng = np.random.default_rng(0)
E = rng.normal(size=(V, H))
W = rng.normal(size=(H, H)) / 3
U = rng.normal(size=(H, V)) * 1.5
NEAR = 1e-4  # oracle scores closer than this may be ordered either way by float32
MODES = ("log_softmax", "renormalized", "raw")


# ---------------------------------------------------------------------------------------------------------------
# the model under test (JAX, float32) and the oracle's own copy of it (numpy, float64)
# ---------------------------------------------------------------------------------------------------------------

def jax_step(cache, tokens):
    h, cache = jax_step_hidden(cache, tokens)
    return h @ jnp.asarray(U, jnp.float32), cache


def jax_step_hidden(cache, tokens):
    h = jnp.tanh(cache["h"] @ jnp.asarray(W, jnp.float32) + jnp.asarray(E, jnp.float32)[tokens] + cache["q"])
    return h, {"q": cache["q"], "h": h}


def jax_project(h_BxNxH, tokens_BxNxC):
    """The candidates' logits alone: the output matrix's columns of those tokens (all columns for None)."""
    u = jnp.asarray(U, jnp.float32)
    if tokens_BxNxC is None:
        return h_BxNxH @ u
    return jnp.einsum("bnh,bnch->bnc", h_BxNxH, u.T[tokens_BxNxC])


def oracle_logits(q: np.ndarray, prefix: tuple) -> np.ndarray:
    """Next-token logits after `prefix` (the start token is fed first), recomputed from scratch."""
    h = np.zeros(H)
    for tok in (START, *prefix):
        h = np.tanh(h @ W + E[tok] + q)
    return h @ U


def oracle_step_scores(logits: np.ndarray, allowed: list[int], mode: str) -> dict[int, float]:
    if mode == "log_softmax":  # over the full vocabulary
        m = logits.max()
        lse = m + math.log(np.exp(logits - m).sum())
        return {t: float(logits[t] - lse) for t in allowed}
    if mode == "renormalized":  # over the allowed children only
        sub = np.array([logits[t] for t in allowed])
        m = sub.max()
        lse = m + math.log(np.exp(sub - m).sum())
        return {t: float(logits[t] - lse) for t in allowed}
    assert mode == "raw"
    return {t: float(logits[t]) for t in allowed}


class Oracle:
    """Docids as Python tuples; children of a prefix = the next tokens of docids that extend it."""

    def __init__(self, docids, logits_fn):
        self.docids = {tuple(int(t) for t in d) for d in docids}
        self.children: dict[tuple, set] = {}
        for d in self.docids:
            for i in range(len(d)):
                self.children.setdefault(d[:i], set()).add(d[i])
        self.logits_fn = logits_fn  # (query b, prefix) -> logits

    def steps(self, b, prefix, mode):
        allowed = sorted(self.children.get(prefix, ()))
        return oracle_step_scores(self.logits_fn(b, prefix), allowed, mode)

    def exhaustive(self, b, mode, lp) -> dict[tuple, float]:
        out = {}
        for d in self.docids:
            total = sum(self.steps(b, d[:i], mode)[d[i]] for i in range(len(d)))
            out[d] = total / len(d) ** lp
        return out

    def beam(self, b, mode, lp, N):
        """The canonical algorithm; also returns whether a decision had a near tie at its cut."""
        alive, finished, near = [((), 0.0)], [], False
        depth = max(len(d) for d in self.docids)

        def cut(items, n):
            nonlocal near
            items = sorted(items, key=lambda x: -x[1])
            if len(items) > n and items[n - 1][1] - items[n][1] < NEAR:
                near = True
            return items[:n]

        for level in range(depth):
            cands = [(p + (t,), s + step) for p, s in alive for t, step in self.steps(b, p, mode).items()]
            done = [(c, s / len(c) ** lp) for c, s in cands if c in self.docids]
            finished = cut(finished + done, N)
            alive = cut([(c, s) for c, s in cands if c not in self.docids], N)
        return finished, near


def _index(docids, ragged):
    return TrieIndex.build([list(d) for d in docids] if ragged else np.array(docids), vocab_size=V,
                           eos_id=EOS if ragged else None, dense_budget_bytes=0)


def _docids(seed, ragged, n):
    r = np.random.default_rng(seed)
    out = set()
    while len(out) < n:
        if ragged:
            out.add(tuple(int(x) for x in r.integers(2, 6, r.integers(1, 4))) + (EOS,))
        else:
            out.add(tuple(int(x) for x in r.integers(2, 6, 3)))
    return sorted(out)


def _run(index, q, N, mode, lp, candidates=False, scan=False):
    B = q.shape[0]
    cache = {"q": jnp.asarray(q, jnp.float32), "h": jnp.zeros((B, H), jnp.float32)}
    step, project = (jax_step_hidden, jax_project) if candidates else (jax_step, None)
    res = jax.jit(lambda c, t: beam_search(step, c, t, batch_size=B, num_beams=N, score_mode=mode,
                                           length_penalty=lp, start_token=START, project_fn=project,
                                           scan_levels=scan))(cache, index.device())
    tokens, lengths, valid = (np.asarray(x) for x in (res.tokens, res.lengths, res.valid))
    out = []
    for b in range(B):
        out.append([(tuple(int(t) for t in tokens[b, i, :lengths[b, i]]), float(res.scores[b, i]))
                    for i in range(N) if valid[b, i]])
    return out


# the default tier: each mode once, ragged and fixed-length docids, the candidates-only path on and off
@pytest.mark.parametrize("mode,ragged,candidates",
                         sweep("mode,ragged,candidates", (MODES, (False, True), (False, True)),
                               [("log_softmax", True, False), ("renormalized", False, True), ("raw", True, True)]))
def test_full_beam_equals_the_oracles_exhaustive_ranking(ragged, mode, candidates, monkeypatch):
    """`candidates`: the step returns hidden states and the search asks for the logits it needs; the ratio set
    to 1 makes every level with fewer slots than V take the candidates-only path ("renormalized", "raw")."""
    monkeypatch.setattr(bs_module, "CANDIDATE_RATIO", 1)
    checked = 0
    for seed, lp in itertools.product(range(2), (0.0, 0.5)):
        docids = _docids(seed, ragged, n=14)
        q = np.random.default_rng(100 + seed).normal(size=(8, H))
        oracle = Oracle(docids, lambda b, p: oracle_logits(q[b], p))
        got = _run(_index(docids, ragged), q, N=len(docids), mode=mode, lp=lp, candidates=candidates)
        for b in range(len(q)):
            scores = oracle.exhaustive(b, mode, lp)
            exact = sorted(scores.items(), key=lambda x: -x[1])
            assert len(got[b]) == len(docids)
            # float32 sums of per-step scores: the slack follows the largest score's size (see `_canonical`)
            scale = max(1.0, max(abs(s) for s in scores.values()))
            np.testing.assert_allclose([s for _, s in got[b]], [scores[d] for d, _ in got[b]], rtol=1e-5,
                                       atol=1e-6 * scale)
            if (np.abs(np.diff([s for _, s in exact])) < NEAR).any():
                continue
            assert [d for d, _ in got[b]] == [d for d, _ in exact], (seed, lp, b)
            checked += 1
    assert checked >= 24


def _canonical(oracle, got, mode, lp, N, tag) -> list:
    """Asserts that each query's search result is the oracle's canonical beam search (docids in order, scores to
    1e-5 relative) where no near tie decides it; returns (query, the oracle's [(docid, score)]) of those checked."""
    checked = []
    for b in range(len(got)):
        want, near = oracle.beam(b, mode, lp, N)
        if near:
            continue
        assert [d for d, _ in got[b]] == [d for d, _ in want], (*tag, b)
        # a score is a float32 sum of per-step scores: its rounding error follows the size of those terms (of the
        # order of the query's largest score), not its own, so a near-zero sum gets that absolute slack
        scale = max(1.0, max(abs(s) for _, s in want))
        np.testing.assert_allclose([s for _, s in got[b]], [s for _, s in want], rtol=1e-5, atol=1e-6 * scale)
        checked.append((b, want))
    return checked


@pytest.mark.parametrize("mode,candidates", sweep("mode,candidates", (MODES, (False, True)),
                                                  [("log_softmax", True), ("renormalized", False)]))
def test_small_beams_follow_the_canonical_algorithm(mode, candidates, monkeypatch):
    monkeypatch.setattr(bs_module, "CANDIDATE_RATIO", 1)
    checked = pruned = 0
    for seed, lp, N in itertools.product(range(2), (0.0, 1.0), (1, 3)):
        docids = _docids(seed, True, n=20)
        q = np.random.default_rng(200 + seed).normal(size=(8, H))
        oracle = Oracle(docids, lambda b, p: oracle_logits(q[b], p))
        got = _run(_index(docids, True), q, N=N, mode=mode, lp=lp, candidates=candidates)
        for b, want in _canonical(oracle, got, mode, lp, N, (seed, lp, N)):
            best = max(oracle.exhaustive(b, mode, lp).items(), key=lambda x: x[1])[0]
            pruned += best not in {d for d, _ in want}  # the search error the canonical algorithm commits
            checked += 1
    assert checked >= 40
    assert pruned > 0  # the cases include beams that prune the exact best docid away


@pytest.mark.parametrize("mode,candidates", sweep("mode,candidates", (MODES, (False, True)),
                                                  [("raw", False), ("renormalized", True)]))
def test_scanned_levels_follow_the_canonical_algorithm(mode, candidates, monkeypatch):
    """Docids of 1–7 tokens + EOS: the trie's middle levels form runs, searched as one `lax.scan` body each
    (`scan_levels`); beam 1, 3 and every docid against the oracle's canonical algorithm."""
    monkeypatch.setattr(bs_module, "CANDIDATE_RATIO", 1)
    checked = 0
    for seed, lp in ((0, 0.0), (1, 0.5)):
        r = np.random.default_rng(300 + seed)
        docids = sorted({tuple(int(x) for x in r.integers(2, 6, r.integers(1, 8))) + (EOS,) for _ in range(60)})
        index = _index(docids, True)
        assert any(b - a >= 2 for a, b in index.device().level_runs())  # the scan is exercised
        q = np.random.default_rng(400 + seed).normal(size=(6, H))
        oracle = Oracle(docids, lambda b, p: oracle_logits(q[b], p))
        for N in (1, 3, len(docids)):
            got = _run(index, q, N=N, mode=mode, lp=lp, candidates=candidates, scan=True)
            checked += len(_canonical(oracle, got, mode, lp, N, (seed, lp, N)))
    assert checked >= 20


@pytest.mark.parametrize("longest,scan", sweep("longest,scan", [(3, False), (7, False), (7, True)], [(7, True)]))
def test_t5_full_beam_equals_teacher_forced_oracle(longest, scan):
    """The Flax T5 under beam search vs an oracle that scores every docid with the full-sequence forward pass
    (no decode cache, no trie): the same ranking and scores, in every score mode. `scan`: the trie's runs of
    levels as `lax.scan` bodies, the growing decode cache padded for each run (`scan_levels`); docids of up
    to 7 tokens + EOS give runs of several levels."""
    from gr_jax.retriever.search import T5Searcher
    from gr_jax.backbones import t5

    config = t5.get_config("tiny", dropout_rate=0.0)
    params = t5.init_params(config, seed=11)
    model = t5.T5(config)
    r = np.random.default_rng(4)
    alphabet = 30 if longest == 3 else 8  # a few tokens: deep levels with several children
    docids = sorted({tuple(int(x) for x in r.integers(3, alphabet, r.integers(1, longest + 1))) + (EOS,)
                     for _ in range(40)})
    queries = r.integers(3, config.vocab_size, (3, 10))
    queries[1, 6:] = 0  # a padded query
    index = TrieIndex.build([list(d) for d in docids], vocab_size=config.vocab_size, eos_id=EOS)
    if longest > 3:
        assert any(b - a >= 3 for a, b in index.device().level_runs())
    longest = max(len(d) for d in docids)
    prefixes = sorted({d[:i] for d in docids for i in range(len(d))})
    dec_in = np.zeros((len(prefixes), longest), np.int32)  # start token 0, then the prefix
    for j, p in enumerate(prefixes):
        dec_in[j, 1:len(p) + 1] = p
    logits = {}
    for b in range(len(queries)):
        enc = np.repeat(queries[b:b + 1], len(prefixes), axis=0)
        out = np.asarray(model.apply({"params": params}, jnp.asarray(enc), jnp.asarray(dec_in)), np.float64)
        for j, p in enumerate(prefixes):
            logits[b, p] = out[j, len(p)]
    oracle = Oracle(docids, lambda b, p: logits[b, p])
    checked = 0
    for mode in ("log_softmax", "renormalized", "raw"):
        res = T5Searcher(model, num_beams=len(docids), score_mode=mode, length_penalty=1.0,
                         scan_levels=scan).search(params, queries, index.device())
        for b in range(len(queries)):
            scores = oracle.exhaustive(b, mode, 1.0)
            exact = sorted(scores.items(), key=lambda x: -x[1])
            got = [tuple(int(t) for t in np.asarray(res.tokens)[b, i, :int(res.lengths[b, i])])
                   for i in range(len(docids))]
            assert sorted(got) == sorted(scores)  # every docid once
            np.testing.assert_allclose(np.asarray(res.scores)[b], [scores[d] for d in got], rtol=1e-5, atol=1e-5)
            if (np.abs(np.diff([s for _, s in exact])) < NEAR).any():
                continue
            assert got == [d for d, _ in exact], (mode, b)
            checked += 1
    assert checked >= 6
