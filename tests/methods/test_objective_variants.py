"""Every objective, jitted and not (`chex.variants`): the core's docid cross-entropy and each method's loss give the
same values, shapes and finite numbers as the eager computation, on small random inputs. A loss that reads a
Python value of a traced array, or branches on one, fails the jitted variant; one whose compiled form rounds
differently beyond float32 noise fails the comparison."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.baselines.dense import in_batch_loss
from gr_jax.methods.genret.training import genret_losses
from gr_jax.methods.glen.training import glen_loss, pairwise_loss, pointwise_loss
from gr_jax.methods.nci.model import contrast
from gr_jax.methods.pag.training import prefix_objective, set_objective
from gr_jax.methods.pag.training_align import align_loss
from gr_jax.methods.ripor.model import prefix_rank_loss

B, M, V, D, K = 4, 3, 12, 8, 5
# float32 on both paths: XLA may fuse the compiled reductions in another order, ~1e-6 of the magnitude
RTOL = 1e-5


def _normal(seed, *shape):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _eager(fn, *args):
    with jax.disable_jit():
        return fn(*args)


class TestObjectives(chex.TestCase):
    def _same(self, fn, *args):
        got = self.variant(fn)(*args)
        chex.assert_tree_all_finite(got)
        chex.assert_trees_all_close(got, _eager(fn, *args), rtol=RTOL, atol=1e-6)
        return got

    @chex.variants(with_jit=True, without_jit=True)
    def test_the_core_docid_cross_entropy(self):
        from gr_jax.backbones import t5
        from gr_jax.retriever.model import GenerativeRetriever

        model = GenerativeRetriever(t5.get_config("tiny", vocab_size=64, dropout_rate=0.0))
        params = model.init_params(0)
        rng = np.random.default_rng(21)
        batch = {"inputs": jnp.asarray(rng.integers(3, 64, (B, 7)), jnp.int32),
                 "targets": jnp.asarray(np.concatenate([rng.integers(3, 64, (B, 3)), np.ones((B, 1))], 1), jnp.int32)}
        loss, metrics = self._same(lambda p, b: model.docid_cross_entropy(p, b), params, batch)
        chex.assert_shape(loss, ())
        assert set(metrics) == {"loss", "token_accuracy", "docid_accuracy"}

    @chex.variants(with_jit=True, without_jit=True)
    def test_dense_in_batch_loss(self):
        loss = self._same(lambda q, d: in_batch_loss(q, d, 0.05), _normal(0, B, D), _normal(1, B, D))
        chex.assert_shape(loss, ())

    @chex.variants(with_jit=True, without_jit=True)
    def test_glen_pairwise_pointwise_and_total(self):
        pair, acc = self._same(pairwise_loss, _normal(2, B, M, D), _normal(3, B, 2, M, D))
        point, z = self._same(lambda q, p: pointwise_loss(q, p, (0, 1)), _normal(4, B, M, V), _normal(5, B, M, V))
        chex.assert_shape([pair, acc, point], ())
        chex.assert_shape(z, (B, M))
        chex.assert_shape(self._same(glen_loss, pair, point), ())

    @chex.variants(with_jit=True, without_jit=True)
    def test_genret_terms(self):
        T = 2
        prefix = jnp.asarray(np.random.default_rng(6).integers(0, K, (B, T)), jnp.int32)
        rows = jnp.arange(B, dtype=jnp.int32)
        out = self._same(lambda qh, ql, dh, dl, p, r, c: genret_losses(qh, ql, dh, dl, p, 1, r, c, iterations=20),
                         _normal(7, B, T, D), _normal(8, B, T, K), _normal(9, B, T, D), _normal(10, B, T, K), prefix,
                         rows, _normal(11, K, D))
        for name in ("ce", "cl", "code", "rec"):
            chex.assert_shape(out[name], ())
        chex.assert_shape(out["codes"], (B,))

    @chex.variants(with_jit=True, without_jit=True)
    def test_nci_contrast(self):
        chex.assert_shape(self._same(lambda s: contrast(s, B // 2), _normal(12, B, M, D)), ())

    @chex.variants(with_jit=True, without_jit=True)
    def test_pag_set_prefix_and_alignment(self):
        rows = jnp.arange(B, dtype=jnp.int32)
        loss, acc = self._same(lambda s, r: set_objective(s, r), _normal(13, B, B), rows)
        chex.assert_shape([loss, acc], ())
        base, codes = 4, 2
        targets = jnp.asarray(base + np.arange(M) * codes + np.random.default_rng(14).integers(0, codes, (B, M)),
                              jnp.int32)
        loss, acc = self._same(lambda lg, t: prefix_objective(lg, t, base, codes), _normal(15, B, M, base + M * codes),
                               targets)
        chex.assert_shape([loss, acc], ())
        chex.assert_shape(self._same(lambda a, b: align_loss(a, b, k=5), _normal(16, B, V), _normal(17, B, V)), ())

    @chex.variants(with_jit=True, without_jit=True)
    def test_ripor_prefix_rank_loss(self):
        loss = self._same(lambda p, n, m: prefix_rank_loss(p, n, m, (1, 2), (0.5, 0.8)), _normal(18, B, M),
                          _normal(19, B, M), _normal(20, B))
        chex.assert_tree_all_finite(loss)
