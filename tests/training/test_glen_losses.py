"""GLEN's phase-2 terms against hand computations on a 3-token vocabulary (E = [[1,0],[0,1],[1,1]])."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.training import glen_losses as gl

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
