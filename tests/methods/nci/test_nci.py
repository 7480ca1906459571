"""NCI: PAWA's projection for a given prefix against numpy, the adaptor's causality, decoding equal to teacher
forcing (the prefix kept in the cache), the consistency loss by hand, and a demo run restored through infer."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.docids.base import DocidTable
from gr_jax.methods.nci.model import NciRetriever, PawaHead, nci_objective
from gr_jax.backbones import t5
from gr_jax.retriever.heads import CodebookHead
from gr_jax.data.vocab import DocidTokenSpace
from tests.methods import assert_infer_repeats_the_final_run, train_small

CONFIG = t5.get_config("tiny", dropout_rate=0.0)
L, V = 3, 5
PAWA = PawaHead(adaptor_layers=2, adaptor_heads=4, adaptor_ffn=32, adapt_init_std=0.2)


def _model(config=CONFIG):
    return NciRetriever(config, CodebookHead(L, V), pawa=PAWA)


def test_pawa_projection_for_a_given_prefix_by_hand():
    model = _model()
    params = model.init_params(3)
    head = model.head
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, L, CONFIG.d_model)).astype(np.float32)  # prefix embeddings
    s = rng.normal(size=(2, L, CONFIG.d_model)).astype(np.float32)  # decoder states
    g = np.asarray(head.adapted(params, jnp.asarray(x)), np.float64)
    logits = np.asarray(head.pawa_logits(model.network, params, jnp.asarray(s), jnp.asarray(g), jnp.arange(L)))
    E = np.asarray(params["head"]["codebook"], np.float64).reshape(L, V, -1)
    A = np.asarray(params["head"]["adapt"], np.float64)  # [j, i, v]
    scale = CONFIG.d_model ** -0.5 if CONFIG.scale_decoder_outputs else 1.0
    for b in range(2):
        for t in range(L):
            W = E[t].T + np.einsum("jiv,j->iv", A, g[b, t])  # the adapted weight [D, V] of position t
            # float32 einsums against float64: logits of order 1–10, 1e-4 relative covers the rounding
            np.testing.assert_allclose(logits[b, t], (s[b, t] * scale) @ W, rtol=1e-4, atol=1e-4)
    # g_t reads the prefix up to t only (causal), and it does read it
    y = x.copy()
    y[:, 2] += 1.0
    g2 = np.asarray(head.adapted(params, jnp.asarray(y)))
    np.testing.assert_allclose(g2[:, :2], g[:, :2], atol=1e-5)
    assert np.abs(g2[:, 2] - g[:, 2]).max() > 1e-3
    y = x.copy()
    y[:, 0] += 1.0
    assert np.abs(np.asarray(head.adapted(params, jnp.asarray(y)))[:, 1] - g[:, 1]).max() > 1e-3


@pytest.mark.slow
def test_decoding_equals_teacher_forcing_and_beams_follow_the_ranking():
    model = _model()
    params = model.init_params(1)
    codes = np.unique(np.random.default_rng(0).integers(0, V, (16, L)), axis=0)
    table = DocidTable(codes, np.full(len(codes), L), np.arange(len(codes)), DocidTokenSpace.codebook(L, V))
    index = table.index()
    q = np.random.default_rng(1).integers(3, 500, (2, 6)).astype(np.int32)
    M = len(table)
    exact = model.searcher(M).exhaustive_scores(params, q, index)  # through the decode steps and the cache
    leaves = index.lookup([table.sequence(i) for i in range(M)])
    targets = table.targets(np.arange(M))
    for b in range(2):
        forced = np.asarray(model.score(params, np.repeat(q[b:b + 1], M, 0), targets))
        # the same float32 computations in two orders: log-probabilities of order 1–10 agree to ~1e-5
        np.testing.assert_allclose(forced, exact[b, leaves], atol=1e-4)
    res = model.predict(params, q, index, num_beams=M)
    for b in range(2):
        np.testing.assert_array_equal(np.asarray(res.leaf_ids[b]), np.argsort(-exact[b], kind="stable"))
    # the prefix matters: a model without the adaptation ranks otherwise
    plain = dict(params, head=dict(params["head"], adapt=jnp.zeros_like(params["head"]["adapt"])))
    assert not np.allclose(model.searcher(M).exhaustive_scores(plain, q, index), exact, atol=1e-3)


def test_the_consistency_loss_by_hand():
    model = _model(t5.get_config("tiny", dropout_rate=0.3))
    params = model.init_params(2)
    rng = np.random.default_rng(4)
    batch = {"inputs": rng.integers(3, 500, (4, 6)).astype(np.int32), "targets": rng.integers(0, V, (4, L))}
    key = jax.random.PRNGKey(7)
    objective = jax.jit(lambda p, b, k: nci_objective(model, p, b, k, alpha=0.5))  # compiled whole: less time
    loss, m = objective(params, batch, key)
    r1, r2 = jax.random.split(key)
    # the oracle's two passes compiled once (jit) rather than run op by op: the same arithmetic, less time
    logits = jax.jit(lambda p, i, t, r: jax.nn.log_softmax(model.token_logits(p, i, t, r)))
    p = np.asarray(logits(params, batch["inputs"], batch["targets"], r1), np.float64)
    q = np.asarray(logits(params, batch["inputs"], batch["targets"], r2), np.float64)
    assert np.abs(p - q).max() > 1e-3  # two dropout passes differ
    ce, kl = 0.0, 0.0
    for b in range(4):
        for t in range(L):
            y = batch["targets"][b, t]
            ce += -(p[b, t, y] + q[b, t, y]) / 2
            P, Q = np.exp(p[b, t]), np.exp(q[b, t])
            kl += 0.5 * (np.sum(P * np.log(P / Q)) + np.sum(Q * np.log(Q / P)))
    # float32 network outputs read in float64: the sums of 12 terms of order 1 agree to ~1e-5 relative
    assert float(loss) == pytest.approx((ce + 0.5 * kl) / 12, rel=1e-4)
    assert float(m["consistency_kl"][0]) == pytest.approx(kl, rel=1e-3, abs=1e-6)
    # per-row weights, as the default cross-entropy reads them: only row 0 counts
    one, m1 = objective(params, {**batch, "weights": np.array([1.0, 0.0, 0.0, 0.0])}, key)
    ce0 = sum(-(p[0, t, batch["targets"][0, t]] + q[0, t, batch["targets"][0, t]]) / 2 for t in range(L))
    kl0 = sum(0.5 * (np.sum(np.exp(p[0, t]) * (p[0, t] - q[0, t])) + np.sum(np.exp(q[0, t]) * (q[0, t] - p[0, t])))
              for t in range(L))
    assert float(one) == pytest.approx((ce0 + 0.5 * kl0) / L, rel=1e-4) and float(m1["docid_accuracy"][1]) == 1
    evaluation, _ = nci_objective(model, params, batch, None)  # no dropout key: one pass, no KL
    assert float(evaluation) > 0


def test_a_text_docid_scheme_is_refused():
    from gr_jax.retriever.heads import TextHead

    with pytest.raises(ValueError, match="needs codebook docids"):
        NciRetriever(CONFIG, TextHead())


@pytest.mark.slow
def test_a_small_nci_run_restores_through_infer(tmp_path):
    exp, model_dir, metrics = train_small(tmp_path, "experiments/demo/nci.gin", 8,
                                          "SemanticDocids.k = 4\nSemanticDocids.c = 8\nTfidfSvdEmbedder.dim = 8\n"
                                          "PawaHead.adaptor_ffn = 32\nPawaHead.adaptor_layers = 1\n")
    assert all("consistency_kl" in m for m in metrics if "loss" in m)
    assert_infer_repeats_the_final_run(tmp_path, exp, model_dir, 8)
