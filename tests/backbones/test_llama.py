"""The decoder-only Llama network: parity with transformers' PyTorch Llama on random tiny configs, the cache
(left padding, a shared prefix, beam tiling) and generation."""

import chex
import numpy as np
import pytest

import jax
import jax.numpy as jnp

from gr_jax.backbones import llama, lm_generate
from tests.conftest import require, sweep

TINY = llama.get_config("llama_tiny", vocab_size=96)


@pytest.fixture(scope="module")
def tiny():
    params = llama.init_params(TINY, seed=3)
    # wider weights than the 0.02 initialisation, so attention is far from uniform and logits spread
    params = jax.tree_util.tree_map(lambda p: p * 8.0 if p.ndim == 2 else p, params)
    return llama.Llama(TINY), params


def _logits(model, params, ids, mask=None):
    return np.asarray(model.apply({"params": params}, jnp.asarray(ids), None if mask is None else jnp.asarray(mask)))


@pytest.mark.torch
@pytest.mark.parametrize("kv_heads,tied", [(2, False), (4, True), (1, True)])
def test_parity_with_transformers(tmp_path, kv_heads, tied):
    require("torch")
    from gr_jax.backbones import llama_parity

    hf_dir = llama_parity.write_random_hf_llama(tmp_path / "hf", seed=kv_heads, num_kv_heads=kv_heads,
                                                tie_word_embeddings=tied)
    r = llama_parity.check_llama_parity(hf_dir, batch=3, length=20, greedy_steps=6)
    # logits of this config reach ~6; 1e-4 relative is float32 accumulation-order noise across 2 layers
    assert r["max_rel_diff_logits"] <= 1e-4, r
    assert r["max_abs_logit"] > 1.0, r  # a degenerate model (all logits ~0) would pass trivially
    assert r["greedy_identical"], r
    assert (r["num_kv_heads"], r["tie_word_embeddings"]) == (kv_heads, tied)


def test_left_padding_does_not_change_a_prompts_logits(tiny):
    model, params = tiny
    prompt = np.arange(5, 12)
    alone = _logits(model, params, prompt[None])
    ids = np.zeros((1, 11), np.int32)
    ids[0, 4:] = prompt
    mask = ids != 0
    padded = _logits(model, params, ids, mask)[:, 4:]
    scale = np.abs(alone).max()
    chex.assert_trees_all_close(padded, alone, rtol=0, atol=1e-5 * scale)


@pytest.mark.slow
def test_shared_prefix_equals_prefilling_the_whole_sequence(tiny):
    model, params = tiny
    prefix, rest = np.array([7, 8, 9, 10, 11]), np.array([[20, 21, 22], [30, 31, 32]])
    whole = _logits(model, params, np.concatenate([np.tile(prefix, (2, 1)), rest], axis=1))[:, -3:]
    pre = llama.prefix_cache(model, params, prefix)
    assert pre.k[0].shape[:2] == (1, 5)
    cache = model.apply({"params": params}, 2, 3, pre, method=llama.Llama.init_cache)
    assert cache.prefix_k[0].shape[:2] == (1, 5)  # one copy for all rows
    logits, cache = model.apply({"params": params}, cache, jnp.asarray(rest), method=llama.Llama.prefill)
    chex.assert_trees_all_close(np.asarray(logits), whole, rtol=0, atol=1e-5 * np.abs(whole).max())
    tiled = cache.repeat(3)
    assert tiled.k[0].shape[0] == 6 and tiled.prefix_k[0].shape[0] == 1
    np.testing.assert_array_equal(np.asarray(tiled.positions), [8, 8, 8, 8, 8, 8])
    picked = tiled.gather(jnp.array([5, 0]))
    np.testing.assert_array_equal(np.asarray(picked.k[1][0]), np.asarray(cache.k[1][1]))


@pytest.mark.parametrize("scan", sweep("scan", [True, False], [True]))
def test_packed_prefill_equals_each_prompt_alone(tiny, scan):
    """A prefill packed to its real tokens (`Packing`) gives each left-padded prompt the hidden states and the
    keys/values of that prompt prefilled alone after the shared prefix (the oracle: one unpadded row at a
    time, no packing), then steps on from that cache as the unpacked one does."""
    model, params = tiny
    model = llama.Llama(TINY, scan_layers=scan)
    pre = llama.prefix_cache(model, params, np.array([7, 8, 9]))
    prompts = [[20, 21, 22, 23, 24, 25], [30, 31], [40, 41, 42, 43]]
    ids, mask = lm_generate.left_pad(prompts, 0, 6)
    real = int(mask.sum())
    packing = llama.Packing.of(mask, real + 3)  # three unused places
    assert np.asarray(packing.index)[real:].tolist() == [mask.size] * 3
    cache = model.apply({"params": params}, 3, 8, pre, method=llama.Llama.init_cache)
    hidden, packed = model.apply({"params": params}, cache, jnp.asarray(ids), jnp.asarray(mask), packing,
                                 method=llama.Llama.prefill_hidden)
    hidden = np.asarray(hidden)
    for b, p in enumerate(prompts):
        alone = model.apply({"params": params}, 1, len(p), pre, method=llama.Llama.init_cache)
        h, alone = model.apply({"params": params}, alone, jnp.asarray([p]), method=llama.Llama.prefill_hidden)
        h = np.asarray(h)[0]
        # float32 sums of ≤ 9 positions in another order: 1e-5 of the largest hidden value
        np.testing.assert_allclose(hidden[b, 6 - len(p):], h, atol=1e-5 * np.abs(h).max())
        assert not hidden[b, :6 - len(p)].any()  # padding stays zero
        for kv, want in ((packed.k, alone.k), (packed.v, alone.v)):
            np.testing.assert_allclose(np.asarray(kv)[:, b, 6 - len(p):6], np.asarray(want)[:, 0],
                                       atol=1e-5 * np.abs(np.asarray(want)).max())
    np.testing.assert_array_equal(np.asarray(packed.positions), [3 + len(p) for p in prompts])
    _, plain = model.apply({"params": params}, cache, jnp.asarray(ids), jnp.asarray(mask),
                           method=llama.Llama.prefill_hidden)
    step = jnp.asarray([5, 6, 7])
    a = np.asarray(model.apply({"params": params}, packed, step, method=llama.Llama.decode_step)[0])
    b = np.asarray(model.apply({"params": params}, plain, step, method=llama.Llama.decode_step)[0])
    chex.assert_trees_all_close(a, b, rtol=0, atol=1e-5 * np.abs(b).max())
    assert np.abs(b).max() > 1.0  # logits that spread: a model giving ~0 everywhere would pass trivially
    with pytest.raises(ValueError, match="do not fit"):
        llama.Packing.of(mask, real - 1)


@pytest.mark.slow
def test_fused_projections_give_the_logits_and_tokens_of_the_separate_ones(tiny):
    """Stacked parameters with each layer's q/k/v and gate/up kernels fused (`fuse_projections`, what
    `LMContext.generation_params` passes) give the logits and the generated tokens of the per-layer parameters."""
    model, params = tiny
    fused = llama.with_stacked_layers(params, TINY, fused=True)
    layer = jax.tree_util.tree_map(lambda a: a.shape, fused["layers"])
    assert sorted(layer["attention"]) == ["o", "qkv"] and sorted(layer["mlp"]) == ["down", "gate_up"]
    ids = np.array([[3, 14, 15, 92, 65, 35], [2, 7, 1, 8, 28, 18]])
    want = _logits(model, params, ids)
    # float32 dot products of the same 32 terms, blocked differently: 1e-5 of the largest logit
    chex.assert_trees_all_close(_logits(model, fused, ids), want, rtol=0, atol=1e-5 * np.abs(want).max())
    assert np.abs(want).max() > 1.0
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    kw = dict(max_new_tokens=6, stop_ids=[95], prefix=llama.prefix_cache(model, params, np.array([40, 41])))
    for extra in ({}, dict(greedy=False, num_samples=3, seed=2)):
        assert (lm_generate.generate(model, fused, prompts, **kw, **extra)
                == lm_generate.generate(model, params, prompts, **kw, **extra))


@pytest.mark.slow
def test_generation_packs_the_prefill_and_gives_the_same_tokens(tiny):
    """`generate` packs a padded prefill (`packed_size` places, fewer than B · T) and writes the same tokens
    as the padded prefill, greedy and sampled."""
    model, params = tiny
    prompts = [[5 + i] * (1 + i % 7) for i in range(24)]  # 1–7 tokens, padded to 16: 96 of 384 places real
    ids, mask = lm_generate.left_pad(prompts, 0)
    assert lm_generate.packed_size(int(mask.sum()), mask.size) == 96 < mask.size
    assert lm_generate.packed_size(97, 384) == 120 and lm_generate.packed_size(0, 384) == 24
    assert lm_generate.packed_size(5, 40) == 8 and lm_generate.packed_size(40, 40) == 40
    kw = dict(max_new_tokens=5, stop_ids=[95], prefix=llama.prefix_cache(model, params, np.array([40, 41])))
    for extra in ({}, dict(greedy=False, num_samples=2, seed=4)):
        assert (lm_generate.generate(model, params, prompts, **kw, **extra)
                == lm_generate.generate(model, params, prompts, packed=False, **kw, **extra))


@pytest.mark.slow
@pytest.mark.parametrize("scan", [True, False])
def test_shared_rows_equal_the_full_forward_of_each_sample(tiny, scan):
    """n samples that share their prompt's keys/values (`share_rows`) step as the full forward pass of
    prefix + prompt + that sample's own tokens (the oracle: no cache at all), with left-padded prompts."""
    model, params = tiny
    model = llama.Llama(TINY, scan_layers=scan)
    prefix = np.array([7, 8, 9, 10])
    prompts = [[20, 21, 22, 23, 24], [30, 31]]  # left-padded to 5
    ids, mask = lm_generate.left_pad(prompts, 0, 5)
    n, steps = 3, 4
    own = np.random.default_rng(0).integers(1, 90, (len(prompts) * n, steps))  # each sample's own tokens
    cache = model.apply({"params": params}, 2, 5, llama.prefix_cache(model, params, prefix),
                        method=llama.Llama.init_cache)
    _, cache = model.apply({"params": params}, cache, jnp.asarray(ids), jnp.asarray(mask),
                           method=llama.Llama.prefill)
    shared = cache.share_rows(n, steps)
    assert shared.k.shape[1:3] == (len(prompts) * n, steps) and shared.group_k.shape[1:3] == (2, 5)
    got = []
    for t in range(steps):
        logits, shared = model.apply({"params": params}, shared, jnp.asarray(own[:, t]),
                                     method=llama.Llama.decode_step)
        got.append(np.asarray(logits))
    got = np.stack(got, 1)  # [rows, steps, V]
    for r in range(len(prompts) * n):
        seq = np.concatenate([prefix, prompts[r // n], own[r]])[None]
        want = _logits(model, params, seq)[0, -steps:]
        # float32 sums over ≤ 13 positions in another order: 1e-5 of the largest logit (logits reach ~10)
        chex.assert_trees_all_close(got[r], want, rtol=0, atol=1e-5 * np.abs(want).max())
    assert np.abs(got).max() > 1.0  # a degenerate model (all logits ~0) would pass trivially
    with pytest.raises(ValueError, match="already shares"):
        shared.share_rows(2, 1)


@pytest.mark.slow
def test_selected_rows_go_on_as_the_full_forward_of_each_sample(tiny):
    """`select_rows` after some shared steps: the chosen rows (their group's slots copied ahead of their own)
    step on as the full forward pass of prefix + prompt + that row's tokens."""
    model, params = tiny
    prefix, prompts = np.array([7, 8, 9]), [[20, 21, 22, 23], [30, 31]]
    ids, mask = lm_generate.left_pad(prompts, 0, 4)
    n, steps, rows = 3, 5, np.array([5, 0, 3])
    own = np.random.default_rng(1).integers(1, 90, (len(prompts) * n, steps))
    cache = model.apply({"params": params}, 2, 4, llama.prefix_cache(model, params, prefix),
                        method=llama.Llama.init_cache)
    _, cache = model.apply({"params": params}, cache, jnp.asarray(ids), jnp.asarray(mask),
                           method=llama.Llama.prefill)
    cache = cache.share_rows(n, steps)
    for t in range(2):
        _, cache = model.apply({"params": params}, cache, jnp.asarray(own[:, t]), method=llama.Llama.decode_step)
    cache = cache.select_rows(jnp.asarray(rows))
    assert cache.group_k is None and cache.k.shape[1:3] == (3, 4 + steps)
    for t in range(2, steps):
        logits, cache = model.apply({"params": params}, cache, jnp.asarray(own[rows, t]),
                                    method=llama.Llama.decode_step)
    for i, r in enumerate(rows):
        want = _logits(model, params, np.concatenate([prefix, prompts[r // n], own[r]])[None])[0, -1]
        # float32 sums over ≤ 12 positions in another order: 1e-5 of the largest logit
        chex.assert_trees_all_close(np.asarray(logits)[i], want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.slow
def test_rows_still_running_go_on_as_a_smaller_batch(tiny):
    """Greedy rows are the same whether the rows still running move to a smaller batch or not, with rows that
    end at different steps (a third of the vocabulary stops a row)."""
    model, params = tiny
    prompts = [[5 + i, 6, 7 + 2 * i] for i in range(16)]  # 32 rows: fraction 0.5 moves them to 16, then 8
    kw = dict(max_new_tokens=8, stop_ids=list(range(60, 90)), num_samples=2,
              prefix=llama.prefix_cache(model, params, np.array([40, 41])))
    whole = lm_generate.generate(model, params, prompts, tail_fraction=1.0, **kw)
    assert len({len(x) for x in whole}) > 2  # rows end at several steps
    assert lm_generate._tail_rows(32, 0.5) == (16, 8) and lm_generate._tail_rows(32, 0.01) == (1,)
    for fraction in (0.5, 0.25, 0.01):
        assert lm_generate.generate(model, params, prompts, tail_fraction=fraction, **kw) == whole
    with pytest.raises(ValueError, match="tail_fraction"):
        lm_generate.generate(model, params, prompts, tail_fraction=0.0, **kw)


@pytest.mark.slow
def test_samples_of_a_shared_prompt_equal_the_prompt_repeated(tiny):
    """Greedy rows from `num_samples` (shared prompt keys/values) are the rows of the same prompts written n
    times with `num_samples=1` (every row its own copy of the prompt)."""
    model, params = tiny
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    kw = dict(max_new_tokens=6, stop_ids=[95], prefix=llama.prefix_cache(model, params, np.array([40, 41, 42])))
    shared = lm_generate.generate(model, params, prompts, num_samples=3, **kw)
    copies = lm_generate.generate(model, params, [p for p in prompts for _ in range(3)], **kw)
    assert shared == copies and len({tuple(x) for x in shared}) == 2


def test_cached_steps_equal_the_full_forward(tiny):
    model, params = tiny
    ids = np.array([[3, 14, 15, 92, 65, 35, 89, 79]])
    full = _logits(model, params, ids)
    cache = model.apply({"params": params}, 1, 8, method=llama.Llama.init_cache)
    logits, cache = model.apply({"params": params}, cache, jnp.asarray(ids[:, :3]), method=llama.Llama.prefill)
    steps = [np.asarray(logits)[:, -1]]
    for t in range(3, 8):
        step_logits, cache = model.apply({"params": params}, cache, jnp.asarray(ids[:, t]),
                                         method=llama.Llama.decode_step)
        steps.append(np.asarray(step_logits))
    np.testing.assert_allclose(np.stack(steps[:-1], 1), full[:, 2:7], atol=1e-5 * np.abs(full).max())


@pytest.mark.slow  # over 5 s: the default tier keeps within 10 minutes
def test_greedy_generation_follows_the_argmax_and_stops(tiny):
    model, params = tiny
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    out = lm_generate.generate(model, params, prompts, max_new_tokens=6, stop_ids=[95])
    # rows that run to the limit: their last token is chosen after the loop, with no network step after it
    assert [len(c) for c in out] == [6, 6]
    assert lm_generate.generate(model, params, prompts, max_new_tokens=1, stop_ids=[95]) == [c[:1] for c in out]
    for prompt, cont in zip(prompts, out):  # oracle: re-run the whole forward pass for every token
        seq = list(prompt)
        for tok in cont:
            assert int(np.argmax(_logits(model, params, np.array([seq]))[0, -1])) == tok
            seq.append(tok)
    # a stop token ends a row: make the first greedy token of row 0 the stop id
    first = out[0][0]
    stopped = lm_generate.generate(model, params, prompts[:1], max_new_tokens=6, stop_ids=[first])
    assert stopped == [[]]
    forced = lm_generate.generate(model, params, prompts[:1], max_new_tokens=6, stop_ids=[first], min_new_tokens=2)
    assert len(forced[0]) >= 2 and forced[0][:2] != [first, first]


@pytest.mark.slow
def test_sampling_is_deterministic_per_seed_and_shares_the_prompt(tiny):
    model, params = tiny
    kw = dict(max_new_tokens=5, stop_ids=[95], num_samples=4, greedy=False, temperature=1.5)
    a = lm_generate.generate(model, params, [[5, 6, 7]], seed=1, **kw)
    b = lm_generate.generate(model, params, [[5, 6, 7]], seed=1, **kw)
    c = lm_generate.generate(model, params, [[5, 6, 7]], seed=2, **kw)
    assert a == b and len(a) == 4
    assert a != c
    assert len({tuple(x) for x in a}) > 1  # four samples of one prompt differ
    # top_p → 0 keeps only the most likely token: sampling becomes greedy
    nucleus = lm_generate.generate(model, params, [[5, 6, 7]], seed=3, top_p=1e-6, **{**kw, "num_samples": 2})
    greedy = lm_generate.generate(model, params, [[5, 6, 7]], max_new_tokens=5, stop_ids=[95])
    assert nucleus == greedy * 2


def test_bfloat16_compute_is_close_to_float32(tiny):
    _, params = tiny
    ids = np.array([[3, 14, 15, 92, 65, 35]])
    f32 = _logits(llama.Llama(TINY), params, ids)
    bf16 = _logits(llama.Llama(TINY.replace(dtype="bfloat16")), params, ids)
    # bfloat16 keeps 8 mantissa bits: ~0.4% per rounding, a few percent after two layers
    assert np.abs(bf16 - f32).max() <= 0.05 * np.abs(f32).max()


def test_param_axes_name_every_parameter():
    axes = llama.param_axes(TINY)
    params = llama.init_params(TINY)
    flat_axes = jax.tree_util.tree_leaves(axes, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    assert len(flat_axes) == len(jax.tree_util.tree_leaves(params))
    assert axes["embedding"] == jax.sharding.PartitionSpec("vocab", "embed")
    assert axes["layers_0"]["mlp"]["gate"]["kernel"] == jax.sharding.PartitionSpec("embed", "mlp")


def test_config_errors():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        llama.LlamaConfig(num_heads=4, num_kv_heads=3, d_model=64)
    with pytest.raises(ValueError, match="unknown decoder-only config"):
        llama.get_config("llama_huge")


@pytest.mark.torch
def test_check_parity_tool_llama_demo_and_bad_input(tmp_path, capsys):
    import json

    from tests.conftest import run_tool

    require("torch")
    rc, out, err = run_tool("check_parity", ["--arch", "llama", "--demo"], capsys)
    assert rc == 0, err[-2000:]
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 2 and all(row["within_tolerance"] and row["greedy_identical"] for row in rows)
    assert {row["tie_word_embeddings"] for row in rows} == {True, False}
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"nope")
    for name, args in (("check_parity", ["--arch", "llama", "--gguf", bad]),
                       ("generate", ["--gguf", bad, "--prompt", "hi"])):
        rc, _, err = run_tool(name, args, capsys)
        assert rc == 2 and "x.gguf" in err and "Traceback" not in err, (name, err[-800:])


def test_sequence_log_probs_by_full_forward(tiny):
    model, params = tiny
    seqs = [[5, 6, 7], [9], [10, 11, 12, 13, 14]]
    got = lm_generate.sequence_log_probs(model, params, seqs, context=[3], batch_size=2)
    for s, g in zip(seqs, got):  # oracle: one unpadded forward per sequence, log-softmax by hand
        logits = _logits(model, params, np.array([[3] + s])).astype(np.float64)[0]
        m = logits.max(-1, keepdims=True)
        logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
        want = sum(logp[i, t] for i, t in enumerate(s))
        assert g == pytest.approx(want, rel=1e-5)
    with pytest.raises(ValueError, match="context"):
        lm_generate.sequence_log_probs(model, params, seqs, context=[])


@pytest.mark.parametrize("tied", [True, False])
def test_token_logits_are_the_columns_of_the_full_projection(tied):
    """The search's candidate-only logits equal the chosen columns of `logits`, tied embedding or lm_head."""
    config = TINY.replace(tie_word_embeddings=tied)
    model, params = llama.Llama(config), llama.init_params(config, seed=2)
    hidden = jax.random.normal(jax.random.PRNGKey(4), (2, 3, config.d_model))
    tokens = jax.random.randint(jax.random.PRNGKey(5), (2, 3, 7), 0, config.vocab_size)
    full = np.asarray(model.apply({"params": params}, hidden, method=llama.Llama.logits))
    got = np.asarray(model.apply({"params": params}, hidden, tokens, method=llama.Llama.token_logits))
    want = np.take_along_axis(full, np.asarray(tokens), axis=-1)
    # the same hidden-size products summed in another order: float32 rounding relative to the largest logit
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(full).max())
    assert not np.allclose(want, want[..., :1])
