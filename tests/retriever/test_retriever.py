"""GenerativeRetriever with both docid heads: scores agree with exhaustive teacher forcing, beam search with a
beam ≥ #docids returns the exact ranking, and the loss trains."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gr_jax.docids.base import DocidTable
from gr_jax.backbones import t5
from gr_jax.retriever.heads import CodebookHead, TextHead
from gr_jax.retriever.model import GenerativeRetriever
from gr_jax.data.vocab import DocidTokenSpace

CONFIG = t5.get_config("tiny", dropout_rate=0.0)


def _tables():
    rng = np.random.default_rng(0)
    L, V = 3, 5
    codes = np.unique(rng.integers(0, V, (16, L)), axis=0)
    codebook = DocidTable(codes, np.full(len(codes), L), np.arange(len(codes)), DocidTokenSpace.codebook(L, V))
    text = DocidTable.from_lists([[5, 6], [5, 7, 8], [9], [9, 10, 11, 12]], [0, 1, 2, 3],
                                 DocidTokenSpace("text", CONFIG.vocab_size))
    return {"codebook": (CodebookHead(L, V), codebook), "text": (TextHead(), text)}


@pytest.mark.parametrize("kind", ["codebook", "text"])
def test_score_equals_exhaustive_and_beam_equals_ranking(kind):
    head, table = _tables()[kind]
    model = GenerativeRetriever(CONFIG, head)
    params = model.init_params(1)
    index = table.index(vocab_size=CONFIG.vocab_size) if kind == "text" else table.index()
    q = np.random.default_rng(1).integers(3, 500, (2, 6)).astype(np.int32)
    M = len(table)
    exact = model.searcher(M).exhaustive_scores(params, q, index)  # [B, leaves]
    targets = table.targets(np.arange(M))
    eos = [] if kind == "codebook" else [1]
    leaves = index.lookup([table.sequence(i) + eos for i in range(M)])
    for b in range(2):
        scores = np.asarray(model.score(params, np.repeat(q[b:b + 1], M, 0), targets))
        np.testing.assert_allclose(scores, exact[b, leaves], atol=1e-5)
    res = model.predict(params, q, index, num_beams=M)
    for b in range(2):
        np.testing.assert_array_equal(np.asarray(res.leaf_ids[b]), np.argsort(-exact[b], kind="stable"))
    docs = model.predict_documents(params, q, index, num_beams=M)
    assert sorted(d for d, _ in docs[0]) == list(range(M))


class TestHeads(chex.TestCase):
    """Each head's embedding of a decoder input and its logits over a hidden state, jitted and not: the shapes the
    head declares (codebook: V codes per position; text: the vocabulary), finite, and the same on both paths; the
    codebook head's logits at position t by hand (the hidden state against level t's codes)."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_embed_and_logits(self):
        for kind, (head, _) in _tables().items():
            model = GenerativeRetriever(CONFIG, head)
            params = model.init_params(2)
            tokens = jnp.asarray(np.random.default_rng(3).integers(0, 5, (2, 3)), jnp.int32)
            hidden = jnp.asarray(np.random.default_rng(4).standard_normal((2, 3, CONFIG.d_model)), jnp.float32)
            emb = self.variant(lambda p, t: head.embed(model.network, p, t))(params, tokens)
            logits = self.variant(lambda p, h: head.logits(model.network, p, h))(params, hidden)
            chex.assert_shape(emb, (2, 3, CONFIG.d_model))
            chex.assert_shape(logits, (2, 3, head.output_size(CONFIG)))
            chex.assert_tree_all_finite((emb, logits))
            with jax.disable_jit():
                chex.assert_trees_all_close(logits, head.logits(model.network, params, hidden), rtol=1e-5)
            if kind == "codebook":
                table = np.asarray(params["head"]["codebook"]).reshape(head.length, head.codes, -1)
                h = np.asarray(hidden) * (CONFIG.d_model ** -0.5 if CONFIG.scale_decoder_outputs else 1.0)
                want = np.einsum("btd,tvd->btv", h, table[np.arange(3)])
                # float32 products of d_model terms: ~1e-6 of the magnitude
                chex.assert_trees_all_close(np.asarray(logits), want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["codebook", "text"])
def test_loss_decreases_and_sums_are_consistent(kind):
    head, table = _tables()[kind]
    model = GenerativeRetriever(CONFIG, head)
    params = model.init_params(0)
    q = np.random.default_rng(2).integers(3, 500, (len(table), 6)).astype(np.int32)
    batch = {"inputs": q, "targets": table.targets(np.arange(len(table)))}
    loss0, metrics = model.loss_fn(params, batch)
    mask = np.asarray(head.target_mask(batch["targets"]))
    loss_sum, tokens = (float(x) for x in metrics["loss"])
    assert tokens == mask.sum() and float(metrics["token_accuracy"][1]) == tokens
    assert abs(loss_sum / tokens - float(loss0)) < 1e-5
    tx = optax.adam(1e-2)
    opt = tx.init(params)

    @jax.jit
    def step(p, o):
        (l, _), g = jax.value_and_grad(model.loss_fn, has_aux=True)(p, batch)
        u, o = tx.update(g, o, p)
        return optax.apply_updates(p, u), o, l

    for _ in range(60):
        params, opt, loss = step(params, opt)
    _, metrics = model.loss_fn(params, batch)
    assert float(loss) < 0.2 * float(loss0)
    assert tuple(float(x) for x in metrics["docid_accuracy"]) == (len(table), len(table))  # memorised


@pytest.mark.slow
def test_scanned_levels_are_the_default_and_gin_turns_them_off():
    """`GenerativeRetriever.scan_levels` (gin) reaches the search: the default scans the trie's runs of levels
    (a codebook of 8 positions, CSR levels: 1–6 form runs), False unrolls them; both return every docid with the
    score of exhaustive teacher forcing."""
    import gin

    L, V = 8, 3
    codes = np.unique(np.random.default_rng(2).integers(0, V, (200, L)), axis=0)
    table = DocidTable(codes, np.full(len(codes), L), np.arange(len(codes)), DocidTokenSpace.codebook(L, V))
    index = table.index(dense_budget_bytes=0)  # every level CSR (a small V would make them dense tables)
    assert index.device().level_runs()
    q = np.random.default_rng(3).integers(3, 500, (2, 6)).astype(np.int32)
    default = GenerativeRetriever(CONFIG, CodebookHead(L, V))
    with gin.unlock_config():
        gin.bind_parameter("GenerativeRetriever.scan_levels", False)
    try:
        unrolled = GenerativeRetriever(CONFIG, CodebookHead(L, V))
    finally:
        gin.clear_config()
    assert default.searcher(8).scan_levels and not unrolled.searcher(8).scan_levels
    params = default.init_params(4)
    exact = default.searcher(len(codes)).exhaustive_scores(params, q, index)
    a, b = (m.predict(params, q, index, num_beams=len(codes)) for m in (default, unrolled))
    for res in (a, b):
        leaves = np.asarray(res.leaf_ids)
        np.testing.assert_array_equal(np.sort(leaves, axis=1), np.tile(np.arange(len(codes)), (2, 1)))
        # float32 sums of 8 log-softmax terms of magnitude ~1: 1e-5 of the largest score's magnitude
        np.testing.assert_allclose(np.asarray(res.scores), np.take_along_axis(exact, leaves, axis=1),
                                   rtol=1e-5, atol=1e-5)
