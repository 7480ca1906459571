"""Random initialisation (backbones/random_init.py): the same parameters as a plain jitted `init` (on this CPU, where
the flag changes no lowering: what is checked is that the wrapper draws what `init` draws), the flag set around
the call, and that a CUDA lowering under it calls JAX's threefry kernel instead of inlining its rounds (lowered for
CUDA on this CPU with jax.export; that the kernel's bits equal the inlined ones is JAX's contract, not tested here)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from jax import export

from gr_jax.backbones import llama, random_init, t5

FLAG = "jax_threefry_gpu_kernel_lowering"
LLAMA = "llama_tiny"


def _plain_init(module, seed, *args):
    return nn.unbox(jax.jit(module.init)(jax.random.PRNGKey(seed), *args)["params"])


@pytest.mark.parametrize("name", ["t5", "llama"])
def test_same_parameters_as_a_plain_jitted_init(name):
    if name == "t5":  # the shapes init_params traces with (a program of other shapes may fuse differently)
        config = t5.get_config("tiny")
        module, args, init = t5.T5(config), (jnp.ones((1, 8), jnp.int32), jnp.ones((1, 4), jnp.int32)), t5.init_params
    else:
        config = llama.get_config(LLAMA)
        module, args, init = llama.Llama(config), (jnp.ones((1, 4), jnp.int32),), llama.init_params
    ours, theirs = init(config, 3), _plain_init(module, 3, *args)
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(theirs)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))  # bit-identical: same bits
    other = init(config, 4)
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))  # the seed matters
               for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(other)))


def test_the_flag_is_on_while_lowering_and_restored_after():
    seen = []

    class Probe(nn.Module):
        @nn.compact
        def __call__(self, x):
            seen.append(getattr(jax.config, FLAG))  # read while `init` is traced (lowered in the same call)
            return nn.Dense(3)(x)

    assert getattr(jax.config, FLAG) is False
    params = random_init.random_params(Probe(), 0, jnp.ones((1, 2)))
    assert seen == [True] and params["Dense_0"]["kernel"].shape == (2, 3)
    assert getattr(jax.config, FLAG) is False
    with pytest.raises(RuntimeError):
        with random_init.threefry_kernel():
            raise RuntimeError("inside")
    assert getattr(jax.config, FLAG) is False  # restored after an error too


def test_a_t5_init_lowered_for_cuda_calls_the_kernel_not_inlined_rounds():
    module = t5.T5(t5.get_config("tiny"))
    ones = jnp.ones((1, 4), jnp.int32)

    def cuda_text():
        return export.export(jax.jit(module.init), platforms=["cuda"])(jax.random.PRNGKey(0), ones, ones).mlir_module()

    inlined = cuda_text()
    with random_init.threefry_kernel():
        kernel = cuda_text()
    n_params = len(jax.tree_util.tree_leaves(t5.init_params(t5.get_config("tiny"))))
    assert "cu_threefry2x32" not in inlined and inlined.count("stablehlo.shift_left") > 0
    # the draws call the kernel (the text names a repeated function once: a count, not one per draw) and no
    # threefry round is inlined
    assert 0 < kernel.count("cu_threefry2x32") <= n_params
    assert kernel.count("stablehlo.shift_left") == 0
