"""GLEN's phase-2 terms against hand computations on a 3-token vocabulary (E = [[1,0],[0,1],[1,1]])."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.methods.glen import training as gl

E = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])


def test_identifier_repr_is_the_softmax_mixture_of_embeddings():
    logits = jnp.array([[[0.0, 0.0, math.log(2.0)]]])  # softmax = [1/4, 1/4, 1/2]
    np.testing.assert_allclose(gl.identifier_repr(logits, E, 1.0), [[[0.75, 0.75]]], rtol=1e-6)
    # τ → 0: the argmax's embedding (row 2 = [1, 1]); τ = 2: softmax([0, 0, ln2 / 2]) = [1, 1, √2] / (2 + √2)
    np.testing.assert_allclose(gl.identifier_repr(logits, E, 1e-5), [[[1.0, 1.0]]], rtol=1e-6)
    s = 2 + math.sqrt(2)
    np.testing.assert_allclose(gl.identifier_repr(logits, E, 2.0),
                               [[[(1 + math.sqrt(2)) / s, (1 + math.sqrt(2)) / s]]], rtol=1e-6)


def test_relevance_sums_over_steps():
    q = jnp.array([[[2.0, 1.0], [0.0, 1.0]]])  # one query, M = 2
    r = jnp.array([[[0.75, 0.75], [1.0, -3.0]]])  # one document
    np.testing.assert_allclose(gl.relevance(q, r), [[2.25 - 3.0]], rtol=1e-6)


def test_pairwise_loss_by_hand():
    q = jnp.array([[[1.0, 0.0]], [[0.0, 1.0]]])  # B = 2, M = 1
    docs = jnp.array([[[[2.0, 0.0]]], [[[0.0, 1.0]]]])  # G = 1: only positives
    # in-batch: query 0 scores [2, 0] → log(1 + e^-2); query 1 scores [0, 1] → log(1 + e^-1)
    loss, acc = gl.pairwise_loss(q, docs, in_batch=True)
    assert float(loss) == pytest.approx((math.log1p(math.exp(-2)) + math.log1p(math.exp(-1))) / 2, rel=1e-6)
    assert float(acc) == 1.0
    loss, _ = gl.pairwise_loss(q, docs, in_batch=False)  # nothing to contrast with
    assert float(loss) == pytest.approx(0.0, abs=1e-7)
    # own negatives: query 0's positive scores 2, its negative [0, 3] scores 0; query 1: 1 vs 3 (wrong order)
    docs = jnp.array([[[[2.0, 0.0]], [[0.0, 3.0]]], [[[0.0, 1.0]], [[1.0, 3.0]]]])
    loss, acc = gl.pairwise_loss(q, docs, in_batch=False)
    assert float(loss) == pytest.approx((math.log1p(math.exp(-2)) + math.log1p(math.exp(2))) / 2, rel=1e-6)
    assert float(acc) == 0.5


def test_pointwise_loss_by_hand():
    q = jnp.array([[[1.0, 2.0, 0.5], [3.0, 0.0, 1.0]]])  # B = 1, M = 2, V = 3
    d = jnp.array([[[0.0, 1.0, 3.0], [2.0, 0.0, 1.0]]])  # z⁺ = [2, 0]

    def lse(*x):
        return math.log(sum(math.exp(v) for v in x))

    nll = (lse(1, 2, 0.5) - 0.5) + (lse(3, 0, 1) - 3.0)
    cos = (0.5 * 3 + 3 * 2) / (math.hypot(0.5, 3) * math.hypot(3, 2))  # w^q = [0.5, 3], w^d = [3, 2]
    loss, z = gl.pointwise_loss(q, d, lambda_dist=0.5)
    assert z.tolist() == [[2, 0]]
    assert float(loss) == pytest.approx(nll + 0.5 * (1 - cos), rel=1e-6)
    # id 2 masked: z⁺ = [1, 0], the normaliser loses id 2; w^q = [2, 3], w^d = [1, 2]
    loss, z = gl.pointwise_loss(q, d, masked_ids=(2,), lambda_dist=0.0)
    assert z.tolist() == [[1, 0]]
    assert float(loss) == pytest.approx((lse(1, 2) - 2) + (lse(3, 0) - 3), rel=1e-6)
    assert float(gl.glen_loss(jnp.float32(1.0), jnp.float32(2.0), 0.5)) == 2.0


def test_temperature_annealing():
    assert gl.temperature(0) == 1.0
    assert gl.temperature(2) == pytest.approx(math.exp(-2))
    assert gl.temperature(20) == 1e-5  # e^-20 ≈ 2e-9 is below the floor


def test_prefix_negatives_back_off_by_hand():
    docids = np.array([[1, 1], [1, 1], [1, 2], [1, 3], [2, 1]])
    rng = np.random.default_rng(0)
    assert gl.prefix_negatives(docids, [0], 1, rng).tolist() == [[1]]  # the same docid
    two = gl.prefix_negatives(docids, [0] * 20, 2, rng)  # same docid: 1 < 2 → first token: {1, 2, 3}
    assert set(two.ravel()) == {1, 2, 3} and all(len(set(r)) == 2 for r in two.tolist())
    four = gl.prefix_negatives(docids, [0], 4, rng)  # first token: 3 < 4 → every other document
    assert sorted(four[0].tolist()) == [1, 2, 3, 4]
    alone = gl.prefix_negatives(docids, [4] * 20, 1, rng)  # [2, 1] shares no prefix: any other document
    assert set(alone.ravel()) <= {0, 1, 2, 3} and len(set(alone.ravel())) > 1
    many = gl.prefix_negatives(docids, [0], 6, rng)  # fewer documents than asked: drawn with replacement
    assert many.shape == (1, 6) and 0 not in many
    with pytest.raises(ValueError, match="no document besides"):
        gl.prefix_negatives(docids[:1], [0], 1, rng)


def test_prefix_negatives_follow_document_keys_not_rows():
    docids = np.array([[1, 1], [1, 1], [1, 1], [1, 2]])
    keys = np.array(["d", "a", "c", "b"])
    perm = np.array([2, 0, 3, 1])  # the same documents in another row order
    a = gl.prefix_negatives(docids, [0], 1, np.random.default_rng(7), doc_keys=keys)
    b = gl.prefix_negatives(docids[perm], [1], 1, np.random.default_rng(7), doc_keys=keys[perm])
    assert keys[a[0]].tolist() == keys[perm][b[0]].tolist()


def _phase2_batches(num_negatives=1, seed=0):
    from gr_jax.data.pipeline import ExampleStore, MixtureIterator

    docids = np.array([[1, 1], [1, 1], [1, 2], [1, 3], [2, 1], [2, 2]])
    doc_tokens = np.stack([np.arange(6) + 10, np.arange(6) + 20], axis=1)  # document r's tokens: [r+10, r+20]
    queries = np.arange(24).reshape(12, 2) + 100
    positive = (np.arange(12) % 6)[:, None]
    pairs = MixtureIterator([ExampleStore({"inputs": queries, "positive": positive})], batch_size=4, seed=seed)
    return gl.Phase2Batches(pairs, doc_tokens, docids, num_negatives=num_negatives, seed=seed), docids


def test_phase2_batches_pair_each_query_with_its_document_and_prefix_negatives():
    batches, docids = _phase2_batches(num_negatives=1)
    seen = 0
    for _ in range(6):
        b = next(batches)
        assert b["documents"].shape == (4, 2, 2)
        pos = b["documents"][:, 0, 0] - 10
        assert ((b["inputs"][:, 0] - 100) // 2 % 6 == pos).all()  # query i was paired with document i % 6
        neg = b["documents"][:, 1, 0] - 10
        for p, n in zip(pos, neg):
            assert n != p
            if p in (0, 1):  # documents 0 and 1 share their docid: each is the other's only negative
                assert n == 1 - p
                seen += 1
        assert b["tau"].dtype == np.float32 and b["tau"][0] == pytest.approx(gl.temperature(batches.epochs()[0]))
    assert seen > 0
    assert b["tau"][0] < 1.0  # two epochs in: τ = e^-2


def test_phase2_batches_resume_to_the_same_batch():
    a, _ = _phase2_batches(num_negatives=2, seed=3)
    next(a), next(a)
    state = a.get_state()
    want = next(a)
    b, _ = _phase2_batches(num_negatives=2, seed=3)
    b.set_state(state)
    got = next(b)
    assert all(np.array_equal(want[k], got[k]) for k in want)
    with pytest.raises(ValueError, match="one per document row"):
        b.set_docids(np.zeros((5, 2)))


def _fixture_glen():
    from pathlib import Path

    from gr_jax.methods.glen import parity as glen_parity

    model, params, inputs, _ = glen_parity.fixture_model(Path(__file__).resolve().parents[2] / "fixtures"
                                                         / "glen_parity" / "peer_v512_d64")
    return model, params, inputs


@pytest.mark.slow
def test_glen_objective_trains_and_reduces_to_its_terms():
    import jax
    import optax

    model, params, inputs = _fixture_glen()
    docs = inputs["doc_input_ids"]
    batch = {"inputs": jnp.asarray(inputs["query_input_ids"][:4], jnp.int32),
             "documents": jnp.asarray(np.stack([docs[[0, 5, 6]], docs[[1, 7, 8]], docs[[2, 9, 10]],
                                                docs[[3, 11, 12]]]), jnp.int32),
             "tau": jnp.full((4,), 0.5, jnp.float32)}
    objective = jax.jit(lambda p, b, in_batch=True: gl.glen_objective(model, p, b, in_batch=in_batch),
                        static_argnames=("in_batch",))  # compiled: eager Flax calls are slow
    loss, metrics = objective(params, batch)
    assert set(metrics) == {"loss", "pair_loss", "point_loss", "pair_accuracy"}
    pair, point = (float(metrics[k][0] / metrics[k][1]) for k in ("pair_loss", "point_loss"))
    assert float(loss) == pytest.approx(pair + 0.5 * point, rel=1e-5)
    # one candidate per query and no in-batch negatives: the pairwise term is exactly 0
    single = dict(batch, documents=batch["documents"][:, :1])
    _, m = objective(params, single, in_batch=False)
    assert float(m["pair_loss"][0]) == pytest.approx(0.0, abs=1e-6)
    # a few Adam steps on this batch lower the loss (the gradient flows through both towers)
    tx = optax.adam(1e-3)
    opt = tx.init(params)
    grad_fn = jax.jit(jax.value_and_grad(lambda p: gl.glen_objective(model, p, batch)[0]))
    first = None
    for _ in range(8):
        value, grads = grad_fn(params)
        first = float(value) if first is None else first
        updates, opt = tx.update(grads, opt, params)
        params = optax.apply_updates(params, updates)
    assert float(grad_fn(params)[0]) < first


def _batches(negatives, num_negatives=2, candidates=None, doc_keys=None, n_docs=6, seed=0):
    from gr_jax.data.pipeline import ExampleStore, MixtureIterator

    doc_tokens = np.stack([np.arange(n_docs) + 10, np.arange(n_docs) + 20], axis=1)
    queries = np.arange(2 * n_docs).reshape(n_docs, 2) + 100
    features = {"inputs": queries, "positive": np.arange(n_docs)[:, None]}
    if candidates is not None:
        features["candidates"] = candidates
    pairs = MixtureIterator([ExampleStore(features)], batch_size=n_docs, seed=seed, shuffle=False)
    return gl.Phase2Batches(pairs, doc_tokens, None, num_negatives=num_negatives, seed=seed, doc_keys=doc_keys,
                            negatives=negatives)


def test_random_negatives_are_other_documents_and_follow_document_keys():
    b = next(_batches("random", num_negatives=50))
    pos, neg = b["documents"][:, 0, 0] - 10, b["documents"][:, 1:, 0] - 10
    assert (neg != pos[:, None]).all()
    assert all(set(row) == set(range(6)) - {p} for p, row in zip(pos, neg))  # 50 draws cover the other 5
    # the same documents in another row order, named by the same keys: the same negatives by key
    keys = np.array(["f", "b", "e", "a", "d", "c"])
    perm = np.array([3, 1, 5, 4, 2, 0])
    a = next(_batches("random", doc_keys=keys))["documents"][:, :, 0] - 10
    from gr_jax.data.pipeline import ExampleStore, MixtureIterator

    doc_tokens = np.stack([perm + 10, perm + 20], axis=1)  # row r of the permuted corpus is document perm[r]
    inv = np.argsort(perm)
    pairs = MixtureIterator([ExampleStore({"inputs": np.arange(12).reshape(6, 2) + 100,
                                           "positive": inv[np.arange(6)][:, None]})],
                            batch_size=6, seed=0, shuffle=False)
    c = next(gl.Phase2Batches(pairs, doc_tokens, None, num_negatives=2, doc_keys=keys[perm],
                              negatives="random"))["documents"][:, :, 0] - 10
    assert np.array_equal(keys[a], keys[c])


def test_bm25_negatives_come_from_the_candidates_only():
    candidates = np.full((6, 3), -1)
    candidates[:, 0] = (np.arange(6) + 1) % 6  # each query's only BM25 candidate: the next document
    candidates[2] = [2, -1, -1]  # query 2: only its own positive → uniform fallback
    b = next(_batches("bm25", num_negatives=2, candidates=candidates))
    pos, neg = b["documents"][:, 0, 0] - 10, b["documents"][:, 1:, 0] - 10
    for p, row in zip(pos, neg):
        if p == 2:
            assert (row != 2).all()
        else:
            assert (row == (p + 1) % 6).all()  # one candidate, drawn twice


def test_no_sampled_negatives_leaves_the_positive_alone():
    b = next(_batches("none", num_negatives=8))
    assert b["documents"].shape == (6, 1, 2)
    with pytest.raises(RuntimeError, match="set_docids"):
        next(_batches("prefix"))
    with pytest.raises(ValueError, match="negatives must be one of"):
        _batches("hard")


def test_glen_phase2_config_checks_its_values():
    with pytest.raises(ValueError, match="negatives must be one of"):
        gl.GlenPhase2(negatives="bm-25")
    with pytest.raises(ValueError, match="reassign_every must be an integer"):
        gl.GlenPhase2(reassign_every=-1)
