"""The Flax T5 network on its own (no torch): shapes, finiteness, cache = full pass, masks, dtypes, axes."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.backbones import t5

B, L, T = 3, 11, 6


def _batch(config, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, config.vocab_size, (B, L))
    mask = np.ones((B, L), bool)
    mask[1, 7:] = False
    mask[2, 2:] = False
    dec = rng.integers(3, config.vocab_size, (B, T))
    dec[:, 0] = config.decoder_start_token_id
    return jnp.asarray(ids * mask), jnp.asarray(mask), jnp.asarray(dec)


@pytest.fixture(scope="module", params=["tiny", "t5_1_1_tiny"])
def tiny(request):
    config = t5.get_config(request.param, dropout_rate=0.1)
    return config, t5.T5(config), t5.init_params(config, seed=1)


def test_relative_position_bucket_hand_worked():
    # Bidirectional, 32 buckets, max distance 128: 16 buckets per direction, exact for |d| < 8, then log-spaced.
    rel = jnp.array([-200, -128, -9, -8, -7, -1, 0, 1, 7, 8, 9, 64, 127, 500])
    got = t5.relative_position_bucket(rel, True, 32, 128)
    # d > 0 adds 16; for |d| >= 8: 8 + int(log(|d|/8) / log(16) * 8), capped at 15.
    want = [15, 15, 8, 8, 7, 1, 0, 17, 23, 24, 24, 30, 31, 31]
    np.testing.assert_array_equal(np.asarray(got), want)
    # Causal: positive (future) distances collapse to bucket 0; 32 buckets, exact below 16.
    got = t5.relative_position_bucket(jnp.array([5, 0, -1, -15, -16, -40, -127, -1000]), False, 32, 128)
    np.testing.assert_array_equal(np.asarray(got), [0, 0, 1, 15, 16, 23, 31, 31])


class TestShapes(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_encode_decode_step_shapes_and_finite(self):
        for name in ("tiny", "t5_1_1_tiny"):
            config = t5.get_config(name)
            model = t5.T5(config)
            params = t5.init_params(config)
            ids, mask, dec = _batch(config)

            encode = self.variant(lambda p, i, m: model.apply({"params": p}, i, m, method="encode"))
            decode = self.variant(lambda p, e, m, d: model.apply({"params": p}, e, m, d, method="decode"))
            step = self.variant(lambda p, c, tok: model.apply({"params": p}, c, tok, method="decode_step"))

            enc = encode(params, ids, mask)
            chex.assert_shape(enc, (B, L, config.d_model))
            logits = decode(params, enc, mask, dec)
            chex.assert_shape(logits, (B, T, config.vocab_size))
            chex.assert_type(logits, jnp.float32)
            cache = model.apply({"params": params}, enc, mask, T, method="init_cache")
            step_logits, cache = step(params, cache, dec[:, 0])
            chex.assert_shape(step_logits, (B, config.vocab_size))
            chex.assert_tree_all_finite((enc, logits, step_logits))
            assert int(cache.index) == 1


def test_cached_decoding_equals_full_forward(tiny):
    config, model, params = tiny
    ids, mask, dec = _batch(config, seed=2)
    v = {"params": params}
    enc = model.apply(v, ids, mask, method="encode")
    full_hidden = model.apply(v, enc, mask, dec, method="decode_hidden")
    full_logits = model.apply(v, full_hidden, method="logits")
    cache = model.apply(v, enc, mask, T + 3, method="init_cache")  # a longer cache than needed
    step = jax.jit(lambda c, tok: model.apply(v, c, tok, method="decode_step_hidden"))
    hidden = []
    for t in range(T):
        h, cache = step(cache, dec[:, t])
        hidden.append(h)
    hidden = jnp.stack(hidden, 1)
    np.testing.assert_allclose(np.asarray(hidden), np.asarray(full_hidden), atol=1e-5, rtol=0)
    # Logits: the same bound relative to their size (the v1.1 head has std-1 weights, |logits| ~ 20, where
    # float32 rounding alone is ~2e-6 per op).
    logits = model.apply(v, hidden, method="logits")
    scale = max(1.0, float(jnp.max(jnp.abs(full_logits))))
    np.testing.assert_allclose(np.asarray(logits), np.asarray(full_logits), atol=1e-5 * scale, rtol=0)


def test_padding_does_not_change_valid_positions(tiny):
    config, model, params = tiny
    ids, mask, dec = _batch(config, seed=3)
    v = {"params": params}
    enc = model.apply(v, ids, mask, method="encode")
    # The same rows with 5 more padding columns.
    ids2 = jnp.pad(ids, ((0, 0), (0, 5)))
    mask2 = jnp.pad(mask, ((0, 0), (0, 5)))
    enc2 = model.apply(v, ids2, mask2, method="encode")
    # Padding changes the length of the float32 reductions (softmax sums, matmuls), which reorders their rounding:
    # differences of some float32 ulps of the largest value are expected (7 were seen on v1.1 logits of size ~20),
    # so the tolerance is 32 ulps of the magnitude, not an absolute number. A real leak of padding into valid
    # positions changes them by the order of the values themselves.
    def close(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = max(np.abs(b).max(), 1.0)
        np.testing.assert_allclose(a, b, rtol=0, atol=32 * np.finfo(np.float32).eps * scale)

    m = np.asarray(mask)[..., None]
    close(np.asarray(enc2[:, :L]) * m, np.asarray(enc) * m)
    logits = model.apply(v, enc, mask, dec, method="decode")
    logits2 = model.apply(v, enc2, mask2, dec, method="decode")
    close(logits2, logits)
    # Changing a padded token's id must not matter either.
    ids3 = ids.at[2, 5].set(7)
    enc3 = model.apply(v, ids3, mask, method="encode")
    np.testing.assert_allclose(np.asarray(enc3[2, :2]), np.asarray(enc[2, :2]), atol=1e-6)


def test_decoder_is_causal(tiny):
    config, model, params = tiny
    ids, mask, dec = _batch(config, seed=4)
    v = {"params": params}
    logits = model.apply(v, ids, dec, mask)
    logits2 = model.apply(v, ids, dec.at[:, 4].set(5), mask)
    np.testing.assert_allclose(np.asarray(logits2[:, :4]), np.asarray(logits[:, :4]), atol=1e-6)
    assert not np.allclose(np.asarray(logits2[:, 4:]), np.asarray(logits[:, 4:]))


def test_dropout_only_when_not_deterministic(tiny):
    config, model, params = tiny
    ids, mask, dec = _batch(config)
    v = {"params": params}
    a = model.apply(v, ids, dec, mask, deterministic=True)
    b = model.apply(v, ids, dec, mask, deterministic=True)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    c = model.apply(v, ids, dec, mask, deterministic=False, rngs={"dropout": jax.random.PRNGKey(0)})
    d = model.apply(v, ids, dec, mask, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)})
    assert not np.allclose(np.asarray(c), np.asarray(d))
    assert np.isfinite(np.asarray(c)).all()


def test_bfloat16_close_to_float32(tiny):
    config, _, params = tiny
    ids, mask, dec = _batch(config)
    f32 = t5.T5(config).apply({"params": params}, ids, dec, mask)
    bf16_model = t5.T5(config.replace(dtype="bfloat16"))
    bf16 = bf16_model.apply({"params": params}, ids, dec, mask)
    assert bf16.dtype == jnp.float32  # logits are always returned in float32
    scale = float(jnp.max(jnp.abs(f32)))
    assert float(jnp.max(jnp.abs(bf16 - f32))) < 0.05 * scale
    enc = bf16_model.apply({"params": params}, ids, mask, method="encode")
    assert enc.dtype == jnp.bfloat16


def test_logical_axes_cover_every_param(tiny):
    config, _, params = tiny
    axes = t5.param_axes(config)
    flat_p = jax.tree_util.tree_leaves_with_path(params)
    flat_a = dict(jax.tree_util.tree_leaves_with_path(axes, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)))
    assert len(flat_a) == len(flat_p)
    for path, leaf in flat_p:
        spec = flat_a[path]
        assert len(spec) == leaf.ndim, (path, spec, leaf.shape)
        assert all(isinstance(name, str) for name in spec)
    assert axes["embedding"] == jax.sharding.PartitionSpec("vocab", "embed")
    assert axes["decoder"]["layers_0"]["mlp"]["wo"]["kernel"] == jax.sharding.PartitionSpec("mlp", "embed")


def test_named_configs_and_validation():
    base = t5.get_config("t5_base")
    assert (base.d_model, base.num_layers, base.num_heads, base.d_ff) == (768, 12, 12, 3072)
    v11 = t5.get_config("t5_1_1_base")
    assert v11.is_gated and not v11.tie_word_embeddings and not v11.scale_decoder_outputs
    n = t5.param_count(jax.eval_shape(lambda: t5.init_params(base)))
    assert 222e6 < n < 224e6, n  # T5-base: 222.9M parameters with the 32128-row embedding
    with pytest.raises(ValueError, match="unknown T5 config"):
        t5.get_config("t5_huge")
    with pytest.raises(ValueError, match="unknown activation"):
        t5.T5Config(feed_forward_proj="gated-tanhh")
    with pytest.raises(ValueError, match="dtype"):
        t5.T5Config(dtype="float8")


def test_shift_right():
    np.testing.assert_array_equal(np.asarray(t5.shift_right(jnp.array([[5, 6, 1, 0]]))), [[0, 5, 6, 1]])


@pytest.mark.parametrize("scale", [None, False])
def test_token_logits_are_the_columns_of_the_full_projection(tiny, scale):
    """The search's candidate-only logits (tied embedding for "tiny", an untied lm_head for "t5_1_1_tiny"; with
    the config's output scaling and PAG's unscaled one) equal the chosen columns of `logits`."""
    config, model, params = tiny
    hidden = jax.random.normal(jax.random.PRNGKey(4), (2, 3, config.d_model))
    tokens = jax.random.randint(jax.random.PRNGKey(5), (2, 3, 7), 0, config.vocab_size)
    full = np.asarray(model.apply({"params": params}, hidden, scale, method="logits"))
    got = np.asarray(model.apply({"params": params}, hidden, tokens, scale, method="token_logits"))
    want = np.take_along_axis(full, np.asarray(tokens), axis=-1)
    # the same d_model products summed in another order: float32 rounding relative to the largest logit
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(full).max())
    assert not np.allclose(want, want[..., :1])  # the columns differ, so a wrong gather would show


@pytest.mark.parametrize("scale", [None, False])
def test_logits_below_a_vocabulary_limit_are_the_first_columns(tiny, scale):
    """`logits(vocab_limit=k)` (PAG's planner reads the ids below its docid tokens) equals the first k columns of
    the full projection, tied or untied."""
    config, model, params = tiny
    hidden = jax.random.normal(jax.random.PRNGKey(6), (2, 3, config.d_model))
    k = config.vocab_size // 3
    full = np.asarray(model.apply({"params": params}, hidden, scale, method="logits"))
    got = np.asarray(model.apply({"params": params}, hidden, scale, k, method="logits"))
    assert got.shape == (2, 3, k)
    # each logit is the same d_model products; only a matmul blocked differently could reorder their sum
    np.testing.assert_allclose(got, full[..., :k], rtol=0, atol=1e-6 * np.abs(full).max())
    assert np.abs(got - full[..., 1:k + 1]).max() > 1e-3  # the columns differ: a shifted slice would show


@pytest.mark.slow  # over 5 s: the default tier keeps within 10 minutes
def test_the_cross_attention_position_bias_of_transformers_3():
    """`cross_attention_bias`: a zero table computes the network without it; a random one changes the states, and
    cached steps (one row per query, and rows sharing their query's cross keys) equal the full pass."""
    config = t5.get_config("tiny", cross_attention_bias=True)
    plain = t5.get_config("tiny")
    model, model0 = t5.T5(config), t5.T5(plain)
    params = t5.init_params(config, seed=3)
    assert params["decoder"]["cross_relpos_bias"]["rel_embedding"].shape == (config.relative_attention_num_buckets,
                                                                             config.num_heads)
    ids, mask, dec = _batch(config, seed=4)
    v = {"params": params}
    enc = model.apply(v, ids, mask, method="encode")
    full = model.apply(v, enc, mask, dec, method="decode_hidden")
    without = {k: v for k, v in params["decoder"].items() if k != "cross_relpos_bias"}
    base = model0.apply({"params": {**params, "decoder": without}}, enc, mask, dec, method="decode_hidden")
    assert float(jnp.abs(full - base).max()) > 1e-3
    zero = jax.tree_util.tree_map(lambda x: x, params)
    zero["decoder"]["cross_relpos_bias"]["rel_embedding"] = jnp.zeros_like(
        params["decoder"]["cross_relpos_bias"]["rel_embedding"])
    np.testing.assert_allclose(model.apply({"params": zero}, enc, mask, dec, method="decode_hidden"), base, atol=1e-5)
    for share in (False, True):
        cache = model.apply(v, enc, mask, T, method="init_cache")
        if share:  # two rows per query reading one copy of the encoder side
            cache = cache.repeat(2, share_cross=True)
        step = jax.jit(lambda c, tok: model.apply(v, c, tok, method="decode_step_hidden"))
        tokens = jnp.repeat(dec, 2, axis=0) if share else dec
        hidden = []
        for t in range(T):
            h, cache = step(cache, tokens[:, t])
            hidden.append(h)
        want = jnp.repeat(full, 2, axis=0) if share else full
        np.testing.assert_allclose(jnp.stack(hidden, 1), want, atol=1e-5)
    # the HF key maps to it, both ways
    from gr_jax.backbones import t5_convert

    hf = t5_convert.params_to_hf(params, config)
    key = "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"
    np.testing.assert_array_equal(hf[key], params["decoder"]["cross_relpos_bias"]["rel_embedding"])
    back = t5_convert.params_from_hf(hf, t5_convert.config_from_hf(t5_convert.config_to_hf(config)))
    np.testing.assert_array_equal(back["decoder"]["cross_relpos_bias"]["rel_embedding"], hf[key])


def test_a_decoder_mask_hides_keys_besides_the_causal_rule():
    """HF's decoder_attention_mask: a hidden key changes the later positions that read it, never the earlier ones,
    and the states of the positions before it equal a pass over the sequence cut there."""
    config = t5.get_config("tiny")
    model = t5.T5(config)
    params = t5.init_params(config, seed=0)
    enc = jnp.asarray([[5, 6, 7, 1]], jnp.int32)
    emask = enc != 0
    x = jax.random.normal(jax.random.PRNGKey(1), (1, 5, config.d_model))
    encoded = model.apply({"params": params}, enc, emask, method="encode")
    run = lambda x, m=None: np.asarray(model.apply({"params": params}, encoded, emask, x, True, m,  # noqa: E731
                                                   method="decode_hidden_embedded"))
    plain = run(x)
    np.testing.assert_array_equal(run(x, jnp.ones((1, 5), bool)), plain)  # all visible: the causal pass
    hidden = run(x, jnp.asarray([[1, 1, 1, 0, 0]], bool))
    np.testing.assert_array_equal(hidden[:, :3], plain[:, :3])  # earlier positions never read later keys
    assert not np.allclose(hidden[:, 3:], plain[:, 3:])
    # key 3 hidden: position 4 no longer reads what position 3 holds (it does in the plain causal pass)
    x3 = x.at[:, 3].add(1.0)
    np.testing.assert_array_equal(run(x3, jnp.asarray([[1, 1, 1, 0, 0]], bool))[:, 4], hidden[:, 4])
    assert not np.allclose(run(x3)[:, 4], plain[:, 4])
