"""CompileClock counts the compilations inside its block and nothing else."""

import jax
import jax.numpy as jnp

from gr_jax.runtime.compile_clock import CompileClock


def test_a_new_program_is_counted_and_a_cached_one_is_not():
    f = jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)
    x = jnp.arange(7.0)
    with CompileClock() as first:
        f(x).block_until_ready()
    with CompileClock() as again:
        f(x).block_until_ready()
    with CompileClock() as other_shape:
        f(jnp.arange(9.0)).block_until_ready()
    assert first.programs >= 1 and first.seconds > 0
    assert again.programs == 0 and again.seconds == 0.0  # the compiled program is reused
    assert other_shape.programs >= 1
