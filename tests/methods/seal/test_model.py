"""SEAL's retrieval end to end on a tiny random T5: with beams enough for every n-gram, the keys are every
n-gram of the identifier texts (and every complete title) with the model's teacher-forced log-probability,
and the ranking is the scoring of those keys — an oracle built from the documents' token lists and
`GenerativeRetriever.score`, not from the index or the search. Also the identifier texts, the views of the
training pairs, and the refusals."""

import math

import numpy as np
import pytest

from gr_jax.data.readers import Corpus
from gr_jax.docids.base import FitContext
from gr_jax.methods.seal.docids import SealDocids
from gr_jax.methods.seal.model import SealRetriever, SealSearch, mark
from gr_jax.methods.seal.ranker import Key, occurrences, rank_documents
from gr_jax.methods.seal.training import SealPairs, overlap_starts, split_views
from gr_jax.backbones import t5

WORDS = "alpha beta gamma delta eps zeta eta theta iota kappa".split()


class Words:
    """A word-level vocabulary: ids 2.. (0 pad, 1 end)."""

    size = 2 + len(WORDS)

    def encode(self, text):
        return [2 + WORDS.index(w) for w in text.split()]


CORPUS = Corpus(["d0", "d1", "d2", "d3"], ["alpha beta gamma", "beta gamma beta", "delta", "eps alpha beta"],
                titles=["zeta", "eta theta", "zeta iota", ""])


# SEAL's smoothing (5) against this corpus's 27 positions makes P(n) ≥ 0.19, above what a random model gives any
# key (P(n|q) ~ 1/18 a token): every weight would be 0 and every ranking empty; 1e-3 leaves P(n) = F(n) / 27
SMOOTHING = 1e-3


def _setup(views=("body", "title")):
    scheme = SealDocids(max_text_tokens=3).fit(CORPUS, FitContext(vocab=Words()))
    table = scheme.assign(CORPUS)
    config = t5.get_config("tiny", vocab_size=scheme.space().end)
    model = SealRetriever(config, search=SealSearch(views=views, body_length=2, title_length=3, max_hits=3,
                                                    smoothing=SMOOTHING))
    model.use_docids(table)
    return scheme, table, model, model.init_params(3)


def test_identifier_texts_mark_every_view():
    scheme, table, _, _ = _setup()
    m = scheme.markers
    assert (m.doc_start, m.title_end, m.query_start) == (12, 13, 14) and scheme.space().end == 18
    assert table.sequence(1) == [m.doc_start, 8, 9, m.title_end, 3, 4, 3]  # DOC_START eta theta @@ beta gamma beta
    assert table.sequence(3) == [m.doc_start, m.title_end, 6, 2, 3]  # a blank title is empty
    assert split_views(table.sequence(1), m) == ([8, 9], [3, 4, 3], [])
    assert split_views(table.sequence(3), m) == ([], [6, 2, 3], [])
    assert split_views([m.doc_start, 5, m.query_start, 6, m.title_end, m.query_start, 7, m.title_end], m) == \
        ([], [5], [[6], [7]])
    assert table.index_kind == "substrings"


def test_keys_and_ranking_equal_the_exhaustive_oracle():
    scheme, table, model, params = _setup()
    m = scheme.markers
    index = table.index()
    queries = np.array([[2, 3, 1, 0, 0], [5, 1, 0, 0, 0]], np.int32)
    ids = [table.sequence(i) for i in range(len(table))]
    body = sorted({tuple(s[i:i + n]) for s in ids for n in (1, 2) for i in range(len(s) - n + 1)})
    titles = sorted({tuple(s[: s.index(m.title_end) + 1]) for s in ids if m.title_end in s})
    got = model.keys(params, queries, index, num_beams=len(body))
    for b in range(2):
        want = {}
        for key, marker, target in [(k, m.view_body, k) for k in body] + [(k, m.view_title, k[1:]) for k in titles]:
            tgt = np.zeros((1, 4), np.int32)
            tgt[0, : len(target)] = target
            s = float(model.score(params, mark(queries[b:b + 1], marker), tgt)[0])
            want[key] = max(want.get(key, -math.inf), s)
        assert set(got[b]) == set(want)
        for key, (score, count, rows, starts, view) in got[b].items():
            # float32 log-probabilities summed over ≤ 4 tokens of a 18-way softmax: 1e-5 relative to |score|
            assert abs(score - want[key]) <= 1e-5 * max(1.0, abs(want[key])), key
            hits = [(r, p) for r, s in enumerate(ids) for p in occurrences(s, key).tolist()]
            assert count == len(hits)
            if count <= 3:
                assert sorted(zip(rows.tolist(), starts.tolist())) == hits
            else:
                assert rows is None
        keys = [Key(k, want[k], sum(len(occurrences(s, k)) for s in ids)) for k in sorted(want)]
        found = []
        for k in keys:
            hits = [(r, p) for r, s in enumerate(ids) for p in occurrences(s, k.tokens).tolist()]
            found.append((np.array([r for r, _ in hits]), np.array([p for _, p in hits])) if k.count <= 3 else None)
        width = max(map(len, ids))
        docs = lambda rows: np.array([ids[r] + [-1] * (width - len(ids[r])) for r in rows])  # noqa: E731
        types = model._types(np.asarray(model._first_step(params, mark(queries[b:b + 1], m.view_body)))[0], keys,
                             index)  # SEAL's unigram bonus (on by default)
        oracle = rank_documents(keys, found, docs, index.num_positions, max_hits=3, smoothing=SMOOTHING, types=types)
        assert oracle  # a ranking to compare
        q, d, s = model.rank(params, queries, index, num_beams=len(body))
        assert d[q == b].tolist() == [r for r, _ in oracle]
        # the scores come from float32 log-probabilities: 1e-4 relative (squared log-odds amplify ulps)
        np.testing.assert_allclose(s[q == b], [v for _, v in oracle], rtol=1e-4)


def test_training_pairs_sample_spans_by_overlap_and_do_not_depend_on_order():
    scheme, table, _, _ = _setup()
    m = scheme.markers
    body, query = [5, 6, 7, 8, 9], [7, 8, 9]
    # at 2 the trigram (7 8 9) agrees whole; at 3 (8 9 ·) and at 4 (9 · ·) agree with the query's own tail
    np.testing.assert_allclose(overlap_starts(body, query), [0, 0, 1, 2 / 3, 1 / 3])
    pairs = SealPairs(title_samples=2, span_samples=50, span_length=2)
    ex = pairs.supervised("q1", [3, 4], table.sequence(1), 1, m, seed=0)
    assert [t for _, v, t in ex if v == m.view_title] == [[8, 9, m.title_end]] * 2
    spans = [tuple(t) for _, v, t in ex if v == m.view_body]
    assert len(spans) == 50 and set(spans) <= {(3, 4), (4, 3), (3,)}
    # the start at "beta gamma" overlaps the query (beta gamma) most: the most frequent span
    assert max(set(spans), key=spans.count) == (3, 4)
    assert ex == pairs.supervised("q1", [3, 4], table.sequence(1), 1, m, seed=0)
    assert ex != pairs.supervised("q1", [3, 4], table.sequence(1), 1, m, seed=1)


def test_refusals():
    with pytest.raises(ValueError, match="log_softmax"):
        SealRetriever(t5.get_config("tiny"), score_mode="raw")
    with pytest.raises(ValueError, match="views"):
        SealSearch(views=("abstract",))
    _, _, model, _ = _setup()
    from gr_jax.docids.base import DocidTable
    from gr_jax.data.vocab import DocidTokenSpace

    with pytest.raises(ValueError, match="SealDocids"):
        model.use_docids(DocidTable.from_lists([[3]], [0], DocidTokenSpace("text", 10)))


@pytest.mark.slow
def test_query_spans_that_occur_are_keys_scored_under_the_body_view():
    """SEAL's add_query_to_keys: with the title view alone, the keys beyond the titles are exactly the query's
    spans of ≤ 2 tokens that occur in some identifier, each with its teacher-forced body-view score."""
    scheme, table, _, _ = _setup()
    config = t5.get_config("tiny", vocab_size=scheme.space().end)
    model = SealRetriever(config, search=SealSearch(views=("title",), title_length=3, query_keys=2, max_hits=3))
    model.use_docids(table)
    params = model.init_params(4)
    m = scheme.markers
    queries = np.array([[2, 3, 11, 1, 0], [9, 9, 1, 0, 0]], np.int32)  # "alpha beta kappa", "theta theta"
    got = model.keys(params, queries, table.index(), num_beams=4)
    ids = [table.sequence(i) for i in range(len(table))]
    occurs = lambda g: any(len(occurrences(s, g)) for s in ids)  # noqa: E731
    for b, want in enumerate([{(2,), (3,), (2, 3)}, {(9,)}]):  # kappa and (theta theta) occur nowhere
        spans = {k for k in got[b] if k[0] != m.doc_start}
        assert spans == want and all(occurs(g) for g in want)
        for g in want:
            tgt = np.zeros((1, 2), np.int32)
            tgt[0, : len(g)] = g
            s = float(model.score(params, mark(queries[b:b + 1], m.view_body), tgt)[0])
            assert abs(got[b][g][0] - s) <= 1e-5 * max(1.0, abs(s))  # float32 sums of ≤ 2 log-probabilities


def test_titles_the_title_view_cannot_reach_are_counted_at_index_time(caplog):
    """On a real corpus 1,976 of 8,077 titles were longer than the title view generates, silently. Here by hand:
    with TITLE_END, 'zeta' needs 2 tokens, 'eta theta' and 'zeta iota' 3, the empty title 1: with title_length 2,
    d1 and d2 are over, and the warning names the length that reaches them all."""
    import logging

    scheme = SealDocids(max_text_tokens=3).fit(CORPUS, FitContext(vocab=Words()))
    table = scheme.assign(CORPUS)
    config = t5.get_config("tiny", vocab_size=scheme.space().end)
    model = SealRetriever(config, search=SealSearch(title_length=2))
    with caplog.at_level(logging.WARNING, logger="gr_jax.methods.seal.model"):
        model.use_docids(table)
    assert "SEAL title view: 2 of 4 documents have a title longer than SealSearch.title_length = 2" in caplog.text
    assert "set SealSearch.title_length = 3" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gr_jax.methods.seal.model"):
        SealRetriever(config, search=SealSearch(title_length=3)).use_docids(table)
    assert "title view" not in caplog.text


def test_the_ranker_recorded_is_the_one_that_ranks():
    """Result files recorded "FirstOccurrence()" for SEAL, which ranks by its own scoring of the keys."""
    from gr_jax.compose import _describe
    from gr_jax.decoding.rankers import FirstOccurrence
    from gr_jax.methods.glen.ranker import CollisionFree

    model = SealRetriever(t5.get_config("tiny"), search=SealSearch(document_score="best_key"))
    assert _describe(model.ranker).startswith("SealScoring(document_score='best_key', smoothing=5.0")
    assert not isinstance(model.ranker, FirstOccurrence)
    with pytest.raises(ValueError, match="would go unused"):
        SealRetriever(t5.get_config("tiny"), ranker=CollisionFree())


def test_the_device_and_host_scorers_rank_alike():
    """SealSearch.scorer: the device scoring (the default) and the host oracle give one ranking (SEAL's unigram
    bonus and best unigrams on, as the setup's SealSearch defaults)."""
    _, table, model, params = _setup()
    index = table.index()
    queries = np.array([[2, 3, 1, 0, 0], [5, 1, 0, 0, 0], [4, 6, 3, 1, 0]], np.int32)
    assert model.search.scorer == "device" and model.search.unigram_bonus
    q, d, s = model.rank(params, queries, index, num_beams=20)
    model.search.scorer = "host"
    q2, d2, s2 = model.rank(params, queries, index, num_beams=20)
    assert len(d) and q.tolist() == q2.tolist() and d.tolist() == d2.tolist()
    np.testing.assert_allclose(s, s2, rtol=1e-5)  # float32 sums on the device, float64 on the host
    with pytest.raises(ValueError, match="scorer"):
        SealSearch(scorer="gpu")
    with pytest.raises(ValueError, match="scorer must be one of"):
        model.score_documents([], index.num_positions, False, "gpu")
    # a candidate row the docid table has no identifier for is an error on either path, not another row's text
    with pytest.raises(ValueError, match=r"corpus rows \[99\] have no identifier text"):
        model._documents(np.array([0, 99]))
