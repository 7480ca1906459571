"""`tools/profile_search.py`'s FLOP count of a compiled program's dots, on hand-worked products."""

from pathlib import Path

import jax
import jax.numpy as jnp

from tests.conftest import tool

ROOT = Path(__file__).resolve().parents[2]


def test_dot_flops_counts_every_product_of_a_compiled_program():
    def f(a, b, x, y):  # [8, 4] @ [4, 3]: 2·8·3·4 = 192; batched [2, 5, 6] @ [2, 6, 7]: 2·2·5·7·6 = 840
        return jnp.tanh(a @ b).sum() + jnp.einsum("bij,bjk->bik", x, y).sum()

    args = (jnp.ones((8, 4)), jnp.ones((4, 3)), jnp.ones((2, 5, 6)), jnp.ones((2, 6, 7)))
    hlo = jax.jit(f).lower(*args).compile().as_text()
    assert tool("profile_search").dot_flops(hlo) == 192 + 840
