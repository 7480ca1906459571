"""RIPOR's T5 layout (`RiporT5Retriever`) on a tiny random T5: the relevance-based initialisation puts both code
tables at the centroids and the start at the start token's embedding; the ranking loss is the prefix MarginMSE of
the teacher-forced prefix scores; a batch without negatives is the seq2seq cross-entropy; the search scores a
docid as teacher forcing does; sizes that do not fit are refused."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.backbones import t5
from gr_jax.index.trie import TrieIndex
from gr_jax.methods.api import CodebookHead
from gr_jax.methods.ripor.docids import pack_codebooks
from gr_jax.methods.ripor.objectives import MARGIN_UNIT
from gr_jax.methods.ripor.t5_layout import RiporT5Retriever

M, K = 3, 4


@pytest.fixture(scope="module")
def setup():
    config = t5.get_config("tiny")
    rng = np.random.default_rng(0)
    books = rng.normal(0, 0.5, (M, K, config.d_model)).astype(np.float32)
    model = RiporT5Retriever(config, CodebookHead(length=M, codes=K), prefix_lengths=[1, 2],
                             prefix_factors=[0.5, 0.75])
    model.use_docids(types.SimpleNamespace(constants=pack_codebooks(books)))
    return model, model.init_params(0), books


def test_both_code_tables_start_at_the_centroids_and_the_start_at_the_start_token(setup):
    model, params, books = setup
    np.testing.assert_array_equal(np.asarray(params["head"]["codebook"]).reshape(M, K, -1), books)
    np.testing.assert_array_equal(np.asarray(params["head"]["code_inputs"]).reshape(M, K, -1), books)
    np.testing.assert_array_equal(params["head"]["start"],
                                  params["network"]["embedding"][model.config.decoder_start_token_id])
    assert params["head"]["codebook"] is not params["head"]["code_inputs"]  # trained apart (untied)


def test_the_ranking_loss_is_the_prefix_margin_mse_of_the_prefix_scores(setup):
    model, params, _ = setup
    q = jnp.asarray([[5, 6, 7, 1, 0], [8, 9, 1, 0, 0]], jnp.int32)
    pos, neg = jnp.asarray([[0, 1, 2], [3, 3, 0]]), jnp.asarray([[1, 1, 2], [0, 2, 1]])
    margins = np.array([0.5, -0.25])
    batch = {"inputs": q, "targets": pos, "negatives": neg,
             "margin": jnp.asarray(np.round(margins / MARGIN_UNIT).astype(np.int64)[:, None])}
    loss, metrics = model.loss_fn(params, batch)
    sp, sn = np.asarray(model.docid_scores(params, q, pos)), np.asarray(model.docid_scores(params, q, neg))
    by_hand = sum((sp[:, L - 1] - sn[:, L - 1] - f * margins) ** 2 for L, f in ((1, .5), (2, .75), (3, 1.))).mean()
    # float32 sums of O(1) scores: agreement to ~1e-6 of the loss's size
    np.testing.assert_allclose(float(loss), by_hand, rtol=1e-5)
    assert metrics["pair_accuracy"][1] == 2
    logits = np.asarray(model.docid_logits(params, q, pos))
    np.testing.assert_allclose(sp, np.cumsum(np.take_along_axis(logits, np.asarray(pos)[..., None], -1)[..., 0], 1),
                               rtol=1e-6)


def test_a_batch_without_negatives_is_the_seq2seq_cross_entropy(setup):
    model, params, _ = setup
    q, pos = jnp.asarray([[5, 6, 7, 1]], jnp.int32), jnp.asarray([[0, 1, 2]])
    loss, _ = model.loss_fn(params, {"inputs": q, "targets": pos})
    logits = np.asarray(model.docid_logits(params, q, pos), np.float64)[0]  # raw logits, no temperature
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(float(loss), -np.mean(logp[np.arange(M), [0, 1, 2]]), rtol=1e-5)


def test_the_search_scores_a_docid_as_teacher_forcing_does(setup):
    model, params, _ = setup
    docids = np.array([[0, 1, 2], [0, 1, 3], [2, 0, 0], [3, 3, 1]])
    index = TrieIndex.build(docids.tolist(), list(range(4)), vocab_size=K, eos_id=None, append_eos=False)
    q = jnp.asarray([[5, 6, 7, 1]], jnp.int32)
    res = jax.device_get(model.predict(params, q, index, 4))
    found = {tuple(res.tokens[0, k, :M].tolist()): float(res.scores[0, k]) for k in range(4) if res.valid[0, k]}
    assert set(found) == {tuple(d) for d in docids.tolist()}
    forced = np.asarray(model.docid_scores(params, jnp.repeat(q, 4, 0), jnp.asarray(docids)))[:, -1]
    for d, s in zip(docids.tolist(), forced):
        assert found[tuple(d)] == pytest.approx(s, rel=1e-5)  # cached steps against one teacher-forced pass


def test_sizes_that_do_not_fit_are_refused():
    config = t5.get_config("tiny")
    model = RiporT5Retriever(config, CodebookHead(length=M, codes=K))
    with pytest.raises(ValueError, match="d_model"):
        model.use_docids(types.SimpleNamespace(constants=pack_codebooks(np.zeros((M, K, config.d_model + 1)))))
    with pytest.raises(ValueError, match="3 × 4"):
        model.use_docids(types.SimpleNamespace(constants=pack_codebooks(np.zeros((2, K, config.d_model)))))
    with pytest.raises(ValueError, match="score mode 'raw'"):
        RiporT5Retriever(config, CodebookHead(length=M, codes=K), score_mode="log_softmax")
