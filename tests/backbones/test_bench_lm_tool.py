"""`tools/bench_lm.py`'s ablations behind its attention-removed row: every row drawn to full length, and attention
taken out of the network (and put back)."""

import importlib.util
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.backbones import llama, lm_generate

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    sys.path.insert(0, str(ROOT / "tools"))  # bench_lm imports profile_search from beside it
    try:
        spec = importlib.util.spec_from_file_location("bench_lm", ROOT / "tools" / "bench_lm.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return module


def _tiny():
    config = llama.get_config("llama_tiny", vocab_size=64, pad_token_id=0)
    params = llama.init_params(config, seed=3)
    return llama.Llama(config), llama.with_stacked_layers(params, config, fused=True)


@pytest.mark.slow
def test_full_length_generation_draws_every_rows_max_tokens():
    tool = _tool()
    model, params = _tiny()
    prompts = [[5, 6, 7], [9, 10], [11, 12, 13, 14]]
    kw = dict(max_new_tokens=6, stop_ids=list(range(1, 33)), greedy=False, seed=0)  # half the vocabulary stops
    assert min(len(g) for g in lm_generate.generate(model, params, prompts, **kw)) < 6  # some row stops early
    with tool._full_length_generation(lm_generate):
        full = lm_generate.generate(model, params, prompts, **kw)
    assert [len(g) for g in full] == [6, 6, 6] and not any(1 <= t <= 32 for g in full for t in g)
    assert min(len(g) for g in lm_generate.generate(model, params, prompts, **kw)) < 6  # put back


@pytest.mark.slow
def test_attention_removed_makes_each_position_blind_to_the_others_and_is_put_back():
    tool = _tool()
    model, params = _tiny()
    a = jnp.asarray([[3, 4, 5, 6]])
    b = jnp.asarray([[40, 41, 5, 6]])  # the same last two tokens after other ones

    def last_logits(tokens):
        return np.asarray(model.apply({"params": params}, tokens)[0, -1])

    original = llama.Attention.attend
    # with attention the last position reads the tokens before it; without, only its own token
    assert np.abs(last_logits(a) - last_logits(b)).max() > 1e-3
    with tool._attention_removed(llama):
        np.testing.assert_allclose(last_logits(a), last_logits(b), rtol=0, atol=1e-5)  # float32 logits of O(1)
        assert np.abs(last_logits(a) - last_logits(jnp.asarray([[3, 4, 5, 7]]))).max() > 1e-3  # its own token
    assert llama.Attention.attend is original and np.abs(last_logits(a) - last_logits(b)).max() > 1e-3
