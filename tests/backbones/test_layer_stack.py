"""Scanned layer stacks (`backbones/layer_stack.py`): the scan over stacked per-layer parameters computes what
the unrolled loop computes (forward, cached decoding, gradients into each layer's own subtree), keeps the
per-layer parameter layout, and compiles one layer body whatever the depth."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from gr_jax.backbones import layer_stack, llama


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


# Both paths run the same float32 ops per layer; XLA may fuse the scan's body differently from the unrolled
# layers, which moves results by float32 rounding only: 1e-5 of the magnitude.
TOL = 1e-5


@pytest.fixture(scope="module")
def llama_pair():
    config = llama.get_config("llama_tiny", vocab_size=96, num_layers=3)
    params = llama.init_params(config, seed=5)
    params = jax.tree_util.tree_map(lambda p: p * 8.0 if p.ndim == 2 else p, params)  # logits far from 0
    return config, params, llama.Llama(config, scan_layers=True), llama.Llama(config, scan_layers=False)


def test_stacked_params_keep_each_layers_values():
    params = {"layers_0": {"w": jnp.ones((2, 3))}, "layers_1": {"w": 2 * jnp.ones((2, 3))}, "head": jnp.ones(4)}
    stacked = layer_stack.stacked_params(params, layer_stack.layer_names(2))
    assert stacked["w"].shape == (2, 2, 3)
    np.testing.assert_array_equal(np.asarray(stacked["w"][:, 0, 0]), [1.0, 2.0])
    with pytest.raises(KeyError, match="layers_2"):
        layer_stack.stacked_params(params, layer_stack.layer_names(3))


def test_llama_params_stay_one_subtree_per_layer(llama_pair):
    config, params, _, _ = llama_pair
    assert sorted(k for k in params if k.startswith("layers_")) == ["layers_0", "layers_1", "layers_2"]


@pytest.mark.slow  # over 5 s: the default tier keeps within 10 minutes
def test_llama_scanned_forward_and_cached_steps_equal_the_unrolled(llama_pair):
    config, params, scanned, unrolled = llama_pair
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 96, (2, 9)))
    mask = jnp.asarray(np.arange(9)[None] >= np.array([[0], [3]]))  # the second row left-padded
    a = scanned.apply({"params": params}, ids, mask)
    b = unrolled.apply({"params": params}, ids, mask)
    assert np.abs(np.asarray(b)).max() > 1.0  # a degenerate network would match trivially
    assert _rel(a, b) <= TOL
    prefix = llama.prefix_cache(scanned, params, np.array([7, 8, 9, 10]))
    prefix_u = llama.prefix_cache(unrolled, params, np.array([7, 8, 9, 10]))
    assert _rel(prefix.k, prefix_u.k) <= TOL
    caches = [m.apply({"params": params}, 2, 6, p, method=llama.Llama.init_cache)
              for m, p in ((scanned, prefix), (unrolled, prefix_u))]
    for t in range(3):
        out = [m.apply({"params": params}, c, ids[:, t], method=llama.Llama.decode_step)
               for m, c in zip((scanned, unrolled), caches)]
        assert _rel(out[0][0], out[1][0]) <= TOL
        caches = [o[1] for o in out]
    assert caches[0].k.shape == (3, 2, 6, config.num_kv_heads, config.q_dim)  # layers first, then rows
    assert _rel(caches[0].k, caches[1].k) <= TOL


@pytest.mark.slow
def test_llama_scanned_gradient_reaches_each_layer(llama_pair):
    config, params, scanned, unrolled = llama_pair
    ids = jnp.asarray(np.random.default_rng(1).integers(3, 96, (2, 7)))

    def loss(model):
        return lambda p: jnp.mean(jax.nn.logsumexp(model.apply({"params": p}, ids), axis=-1))

    ga, gb = jax.grad(loss(scanned))(params), jax.grad(loss(unrolled))(params)
    assert jax.tree_util.tree_structure(ga) == jax.tree_util.tree_structure(params)
    for i in range(3):
        a, b = ga[f"layers_{i}"]["mlp"]["down"]["kernel"], gb[f"layers_{i}"]["mlp"]["down"]["kernel"]
        assert np.abs(np.asarray(b)).max() > 0
        assert _rel(a, b) <= 1e-4  # a gradient sums more terms than the forward: 1e-4 of its magnitude


def _dots(model, config):
    params = llama.init_params(config, seed=0)
    jaxpr = jax.make_jaxpr(lambda p, t: model.apply({"params": p}, t))(params, jnp.ones((1, 4), jnp.int32))
    return str(jaxpr).count("dot_general")


def test_llama_scan_traces_one_layer_body_whatever_the_depth():
    shallow, deep = (llama.get_config("llama_tiny", num_layers=n) for n in (2, 6))
    assert _dots(llama.Llama(shallow), shallow) == _dots(llama.Llama(deep), deep)
    assert _dots(llama.Llama(deep, scan_layers=False), deep) > _dots(llama.Llama(shallow, scan_layers=False),
                                                                       shallow)


def test_scan_gives_each_layer_its_own_key():
    stacked = {"w": jnp.zeros((3, 2))}
    _, keys = layer_stack.scan(lambda p, c, x, rngs: (c, jax.random.key_data(rngs["dropout"])), stacked, 0,
                               rngs={"dropout": jax.random.PRNGKey(0)})
    keys = np.asarray(keys)
    assert len({tuple(k) for k in keys}) == 3


@pytest.fixture(scope="module")
def t5_pair():
    from gr_jax.backbones import t5

    config = t5.get_config("tiny", dropout_rate=0.0).replace(vocab_size=96, num_layers=3, num_decoder_layers=3)
    params = t5.init_params(config, seed=2)
    return t5, config, params, t5.T5(config, scan_layers=True), t5.T5(config, scan_layers=False)


@pytest.mark.slow
def test_t5_scanned_forward_and_cached_steps_equal_the_unrolled(t5_pair):
    t5, config, params, scanned, unrolled = t5_pair
    rng = np.random.default_rng(3)
    enc = jnp.asarray(rng.integers(2, 96, (2, 7)))
    dec = jnp.asarray(rng.integers(2, 96, (2, 5)))
    a = scanned.apply({"params": params}, enc, dec)
    b = unrolled.apply({"params": params}, enc, dec)
    assert np.abs(np.asarray(b)).max() > 1.0
    assert _rel(a, b) <= TOL
    for growing in (False, True):
        caches = []
        for m in (scanned, unrolled):
            encoded = m.apply({"params": params}, enc, method="encode")
            caches.append(m.apply({"params": params}, encoded, enc != 0, 4, growing, method="init_cache"))
        assert caches[0].cross_k.shape == (3, 2, 7, config.num_heads, config.d_kv)
        assert _rel(caches[0].cross_k, caches[1].cross_k) <= TOL
        tiled = [c.repeat(2, share_cross=True) for c in caches]
        for t in range(3):
            out = [m.apply({"params": params}, c, jnp.repeat(dec[:, t], 2), method="decode_step")
                   for m, c in zip((scanned, unrolled), tiled)]
            assert _rel(out[0][0], out[1][0]) <= TOL
            # a beam reorder between steps, as the search does it: the 4 decoder rows, not the 2 shared encoder rows
            tiled = [o[1].gather_rows(jnp.array([1, 1, 2, 3]), 4) for o in out]
        assert tiled[0].self_k.shape[:3] == (3, 4, 3 if growing else 4) and tiled[0].cross_k.shape[1] == 2


@pytest.mark.slow
def test_t5_scanned_training_gradient_reaches_each_layer(t5_pair):
    t5, config, params, scanned, unrolled = t5_pair
    rng = np.random.default_rng(4)
    enc = jnp.asarray(rng.integers(2, 96, (2, 7)))
    dec = jnp.asarray(rng.integers(2, 96, (2, 5)))

    def loss(model):
        return lambda p: jnp.mean(jax.nn.logsumexp(model.apply({"params": p}, enc, dec), axis=-1))

    ga, gb = jax.grad(loss(scanned))(params), jax.grad(loss(unrolled))(params)
    assert jax.tree_util.tree_structure(ga) == jax.tree_util.tree_structure(params)
    for stack in ("encoder", "decoder"):
        for i in range(3):
            a, b = ga[stack][f"layers_{i}"]["mlp"]["wo"]["kernel"], gb[stack][f"layers_{i}"]["mlp"]["wo"]["kernel"]
            assert np.abs(np.asarray(b)).max() > 0
            assert _rel(a, b) <= 1e-4  # a gradient sums more terms than the forward: 1e-4 of its magnitude


@pytest.mark.slow
def test_t5_scanned_dropout_draws_masks_in_training(t5_pair):
    t5, config, params, _, _ = t5_pair
    model = t5.T5(config.replace(dropout_rate=0.5), scan_layers=True)
    enc, dec = jnp.ones((2, 7), jnp.int32) * 5, jnp.ones((2, 5), jnp.int32) * 6
    keep = model.apply({"params": params}, enc, dec)
    drop = [model.apply({"params": params}, enc, dec, None, False, rngs={"dropout": jax.random.PRNGKey(s)})
            for s in (0, 1)]
    assert np.all(np.isfinite(np.asarray(drop[0])))
    assert _rel(drop[0], keep) > 1e-2 and _rel(drop[0], drop[1]) > 1e-2


@pytest.mark.slow
def test_t5_scanned_search_equals_the_unrolled_one(t5_pair):
    from gr_jax.index.trie import TrieIndex
    from gr_jax.retriever.search import T5Searcher

    t5, config, params, scanned, unrolled = t5_pair
    rng = np.random.default_rng(6)
    docids = np.unique(rng.integers(3, 96, (60, 3)), axis=0)
    trie = TrieIndex.build(docids, vocab_size=config.vocab_size).device()
    q = rng.integers(2, 96, (3, 6)).astype(np.int32)
    a, b = (T5Searcher(m, num_beams=5, mesh=None) for m in (scanned, unrolled))
    assert a.params_fn is not None and b.params_fn is None  # the scanning one stacks the layers once a search
    ra, rb = a.search(params, q, trie), b.search(params, q, trie)
    np.testing.assert_array_equal(np.asarray(ra.tokens), np.asarray(rb.tokens))
    assert _rel(ra.scores, rb.scores) <= TOL
    index = TrieIndex.build(docids, vocab_size=config.vocab_size)
    assert _rel(a.exhaustive_scores(params, q, index), b.exhaustive_scores(params, q, index)) <= TOL


@pytest.mark.slow
def test_decoder_only_retriever_search_with_layers_stacked_once_equals_the_unrolled():
    from gr_jax.index.trie import TrieIndex
    from gr_jax.retriever.decoder_only import DecoderOnlyRetriever

    config = llama.get_config("llama_tiny", vocab_size=40, pad_token_id=0, bos_token_id=2, num_layers=3)
    scanned, unrolled = DecoderOnlyRetriever(config), DecoderOnlyRetriever(config)
    unrolled.network = llama.Llama(config, scan_layers=False)
    params = scanned.init_params(seed=1)
    params = jax.tree_util.tree_map(lambda p: p * 8.0 if p.ndim == 2 else p, params)
    prepared = scanned._search_params(params)["network"]
    assert "layers" in prepared and "layers_0" not in prepared  # stacked once, before the search's steps
    assert unrolled._search_params(params) is params
    seqs = [[20, 21, 1], [20, 22, 23, 1], [24, 1], [25, 21, 26, 1], [20, 21, 27, 1]]
    index = TrieIndex.build(seqs, vocab_size=40, eos_id=1)
    q = np.array([[5, 6, 7, 1, 0], [9, 10, 11, 12, 1]], np.int32)
    a, b = scanned.predict(params, q, index, num_beams=4), unrolled.predict(params, q, index, num_beams=4)
    np.testing.assert_array_equal(np.asarray(a.leaf_ids), np.asarray(b.leaf_ids))
    assert _rel(a.scores, b.scores) <= TOL
