"""Scanned layer stacks with per-layer parameters.

A stack's parameters stay one subtree per layer (`layers_0` … `layers_{n-1}`: the layout of HF conversions,
t5x checkpoints and every checkpoint we wrote), but the forward pass runs the layers as one `jax.lax.scan`
over their parameters stacked on a leading axis. XLA then compiles one layer body instead of n copies: the
compile time of a search that unrolls every docid level no longer grows with the depth of the network.
The stack is a copy of the layer weights made inside the jitted program (its gradient flows back to each
layer's subtree); numerics are those of the unrolled loop up to XLA's choice of fusion.

`scan(fn, stacked_params(params, layer_names(n)), carry, xs)` calls `fn(params_i, carry, xs_i, rngs_i) ->
(carry, ys_i)` for i = 0 … n − 1, with `xs` and the returned `ys` stacked on their leading axis.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp


def layer_names(n: int, prefix: str = "layers_") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


STACKED = "layers"  # the key of a stack's layers stacked ahead of time (`with_stacked_layers`)


def stacked_params(params: dict, names: list[str]) -> Any:
    """The per-layer subtrees `params[name]` stacked leaf by leaf on a new leading axis (or the stack made ahead
    of time by `with_stacked_layers`)."""
    if STACKED in params:
        return params[STACKED]
    missing = [n for n in names if n not in params]
    if missing:
        raise KeyError(f"layer parameters {missing} are missing (have {sorted(params)})")
    trees = [nn.meta.unbox(params[n]) for n in names]
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *trees)


def with_stacked_layers(params: dict, n: int) -> dict:
    """A stack's parameters with its n layers stacked once (key `layers`) instead of one subtree each: a search
    that calls the network once per docid level then copies the weights once, not at every level. For use
    inside a jitted program (the per-layer layout stays what is stored)."""
    names = layer_names(n)
    out = {k: v for k, v in params.items() if k not in names}
    out[STACKED] = stacked_params(params, names)
    return out


def scan(fn: Callable, stacked: Any, carry: Any, xs: Any = None, rngs: dict | None = None):
    """`jax.lax.scan` of `fn(params_i, carry, xs_i, rngs_i) -> (carry, ys_i)` over the stacked layer parameters;
    `rngs` (name → key) are folded with the layer index, so each layer draws its own randomness."""
    n = jax.tree_util.tree_leaves(stacked)[0].shape[0]

    def body(c, item):
        i, p, x = item
        layer_rngs = None if rngs is None else {k: jax.random.fold_in(v, i) for k, v in rngs.items()}
        return fn(p, c, x, layer_rngs)

    return jax.lax.scan(body, carry, (jnp.arange(n), stacked, xs))
