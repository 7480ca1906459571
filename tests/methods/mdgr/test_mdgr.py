"""MDGR (000_dynamic_corpora.txt §6.1): its ranker (formula (8)) by hand and against a per-query oracle, and its
chunk docids (sliding windows, constrained expansion, state)."""

import numpy as np
import pytest

from gr_jax.data import demo
from gr_jax.data.readers import Corpus
from gr_jax.decoding import rankers
from gr_jax.docids.base import FitContext, load_scheme_state, save_scheme
from gr_jax.docids.embed import TfidfSvdEmbedder
from gr_jax.methods.mdgr import ranker as mdgr_ranker
from gr_jax.methods.mdgr.docids import ChunkedPQDocids


def test_mdgr_ranker_by_hand():
    # beams best first; each beam's docid leads to the documents listed (a chunk code shared by documents)
    beams = [[7, 3], [3], [5], [7]]
    got = mdgr_ranker.mdgr(beams, lam=1.0)
    # doc 7: coverage 2, 1/1 + 1/4 → 3.25; doc 3: coverage 2, 1/1 + 1/2 → 3.5; doc 5: 1 + 1/3 → 1.333
    assert [d for d, _ in got] == [3, 7, 5]
    assert [s for _, s in got] == pytest.approx([3.5, 3.25, 1 + 1 / 3])
    # λ = 0: coverage only; a tie (7 and 3 both cover 2) goes by the document key, descending (trec_eval's order)
    assert mdgr_ranker.mdgr(beams, lam=0.0) == [(7, 2.0), (3, 2.0), (5, 1.0)]
    keys = {3: "doc-b", 7: "doc-a", 5: "doc-c"}  # with document ids as keys, 3 ("doc-b") now comes first
    assert mdgr_ranker.mdgr(beams, lam=0.0, keys=keys) == [(3, 2.0), (7, 2.0), (5, 1.0)]
    # λ large: the ranking term decides; 7 (1 + 1/4) > 3 (1 + 1/2)? no: 3 has 1.5 > 7's 1.25
    assert [d for d, _ in mdgr_ranker.mdgr(beams, lam=100.0)] == [3, 7, 5]
    # a document listed twice under one beam counts once for it
    assert mdgr_ranker.mdgr([[2, 2]], lam=1.0) == [(2, 2.0)]
    assert rankers.first_occurrence(beams, [-0.1, -0.5, -0.7, -0.9]) == [(7, -0.1), (3, -0.1), (5, -0.7)]
    assert rankers.first_occurrence(beams, [-0.1, -0.5, -0.7, -0.9], keys) == [(3, -0.1), (7, -0.1), (5, -0.7)]
    with pytest.raises(ValueError, match="MDGRRanker.lam must be ≥ 0"):
        mdgr_ranker.MDGRRanker(lam=-1.0)


def test_rankers_on_device_arrays_match_per_query_lists():
    """The model's rankers take the beams' documents as arrays for a whole batch (invalid slots and beams
    included) and give what the per-query definitions give."""
    rng = np.random.default_rng(4)
    B, N, P = 5, 7, 3
    docs = rng.integers(0, 9, (B, N, P))
    valid = rng.random((B, N, P)) < 0.6
    valid[:, 5:] = False  # fewer valid beams than N
    beam_scores = -np.sort(rng.random((B, N)), axis=1).cumsum(axis=1)
    def first(beams, scores):  # written here from the definitions, sharing no code with rankers.py
        out = {}
        for docs_n, score in zip(beams, scores):
            for x in docs_n:
                out.setdefault(x, score)
        return out

    def formula8(beams, lam):
        out = {}
        for rank, docs_n in enumerate(beams, start=1):
            for x in set(docs_n):
                out[x] = out.get(x, 0.0) + 1.0 + lam / rank
        return out

    for ranker in (rankers.FirstOccurrence(), mdgr_ranker.MDGRRanker(lam=0.5)):
        q, d, s = ranker(docs, valid, beam_scores)
        assert len(set(zip(q.tolist(), d.tolist()))) == len(q)  # each (query, document) once
        for b in range(B):
            beams = [docs[b, n][valid[b, n]].tolist() for n in range(5)]
            want = (formula8(beams, 0.5) if isinstance(ranker, mdgr_ranker.MDGRRanker)
                    else first(beams, beam_scores[b, :5].tolist()))
            got = {int(x): float(y) for x, y in zip(d[q == b], s[q == b])}
            assert got == pytest.approx(want), b


class _Words:
    """A word-level 'vocabulary' so chunk windows are easy to check by hand."""

    def __init__(self, texts):
        words = sorted({w for t in texts for w in t.split()})
        self.ids = {w: i + 2 for i, w in enumerate(words)}
        self.words = {i: w for w, i in self.ids.items()}
        self.size = len(words) + 2

    def encode(self, text):
        return [self.ids.get(w, 1) for w in text.split()]

    def decode(self, ids):
        return " ".join(self.words.get(i, "?") for i in ids)


def test_mdgr_docids_chunks_constrained_expansion_and_state(tmp_path):
    ds = demo.generate(num_docs=40, seed=7)
    d0 = Corpus(ds.corpus.doc_ids[:30], ds.corpus.texts[:30])
    vocab = _Words(list(ds.corpus.texts) + ["a b c d e f g"])
    s = ChunkedPQDocids(window=4, stride=2, m=2, k=8, embedder=TfidfSvdEmbedder(dim=8))
    s.bind(vocab)
    assert s.chunks("a b c d e f g") == ["a b c d", "c d e f", "d e f g"]  # the last window reaches the end
    assert s.chunks("a b") == ["a b"]
    s.fit(d0, FitContext(vocab=vocab))
    table0 = s.assign(d0)
    allowed = {tuple(c) for c in s.allowed.tolist()}
    assert {tuple(table0.sequence(i)) for i in range(len(table0))} == allowed  # D0 docids are the D0 set
    assert table0.space.kind == "codebook" and table0.space.length == 2 and table0.sequences.max() < 8
    (pairs,) = s.training_pairs()  # MDGR's chunk objective
    texts, owners, idx = pairs.texts, pairs.rows, pairs.docid_index
    assert pairs.name == "chunk" and len(texts) == len(owners) == len(idx) and (table0.doc_rows[idx] == owners).all()
    new = s.assign(ds.corpus, rows=range(30, 40))
    assert {tuple(new.sequence(i)) for i in range(len(new))} <= allowed  # constrained expansion
    free = ChunkedPQDocids(window=4, stride=2, m=2, k=8, constrain=False, embedder=TfidfSvdEmbedder(dim=8))
    free.fit(d0, FitContext(vocab=vocab))
    np.testing.assert_array_equal(free.assign(d0).sequences, table0.sequences)  # same codes for D0
    single = ChunkedPQDocids(window=4, stride=2, m=2, k=8, multi_docid=False, embedder=TfidfSvdEmbedder(dim=8))
    one = single.fit(d0, FitContext(vocab=vocab)).assign(d0)
    assert len(one) == 30 and sorted(one.doc_rows.tolist()) == list(range(30))
    save_scheme(s, tmp_path / "s")
    back = load_scheme_state(ChunkedPQDocids(embedder=TfidfSvdEmbedder()), tmp_path / "s")
    back.bind(vocab)
    assert back.window == 4 and back.m == 2
    np.testing.assert_array_equal(back.assign(ds.corpus, rows=range(30, 40)).sequences, new.sequences)
    with pytest.raises(ValueError, match="k = 100000 clusters but only"):
        ChunkedPQDocids(window=4, stride=2, k=100000, embedder=TfidfSvdEmbedder(dim=8)).fit(d0, FitContext(vocab=vocab))
