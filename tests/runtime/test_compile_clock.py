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
    assert first.programs + first.loaded >= 1 and first.seconds > 0  # loaded: from the tests' persistent cache
    assert again.programs == 0 and again.seconds == 0.0  # the compiled program is reused
    assert other_shape.programs + other_shape.loaded >= 1


def test_a_program_read_back_from_the_persistent_cache_is_loaded_not_compiled():
    """After the in-memory programs are dropped (the protocol does so between steps), the persistent cache gives
    the program back: counted as loaded, not compiled; a compiled one is named."""
    import os
    import uuid

    assert os.environ.get("JAX_COMPILATION_CACHE_DIR")  # tests/conftest.py sets one for every test process
    salt = float(uuid.uuid4().int % 10**6)  # a program no earlier run has cached

    def salted(x):
        return jnp.cos(x) * salt + 2.0

    f = jax.jit(salted)
    x = jnp.arange(5.0)
    before = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    try:
        with CompileClock() as first:
            f(x).block_until_ready()
        jax.clear_caches()
        with CompileClock() as back:
            f(x).block_until_ready()
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before)
    assert first.programs == 1 and first.loaded == 0 and first.names == {"jit(salted)": 1}, (first.names, first.loaded)
    assert back.programs == 0 and back.loaded == 1 and back.names == {}
