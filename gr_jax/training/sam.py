"""Sharpness-aware minimisation (SAM; Foret et al., ICLR 2021) as an optax transformation that any objective can
use — DSI++ trains with it to forget less.

One SAM update, for the loss L at parameters w with gradient g = ∇L(w):

    ε = ρ · g / ‖g‖₂            (‖·‖₂ over all parameters together)
    g_SAM = ∇L(w + ε)           (the same batch and dropout key)
    w ← w + inner(g_SAM)        (the inner optimizer: AdamW, Adafactor, with its clipping)

The second gradient needs the loss, which an optax transformation does not see: `sam(...)` is a
`GradientTransformationExtraArgs` whose `update` takes `grad_fn(params) -> gradient`, and `trainer.make_train_step`
passes it (for any other transformation the argument is ignored). Bound in gin by `make_optimizer.sam_rho`
(training) and `Replay.sam_rho` (the dynamic protocol's continued training).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax


class SamState(NamedTuple):
    inner: optax.OptState


def global_norm(tree) -> jnp.ndarray:
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree_util.tree_leaves(tree)))


def sam(inner: optax.GradientTransformation, rho: float) -> optax.GradientTransformationExtraArgs:
    """`inner` applied to the gradient at the ascent point w + ρ·g/‖g‖ (a zero gradient: at w itself)."""
    if not rho > 0:
        raise ValueError(f"sam: rho must be > 0, got {rho}")
    inner = optax.with_extra_args_support(inner)

    def init(params):
        return SamState(inner.init(params))

    def update(grads, state, params=None, *, grad_fn=None, **extra):
        if params is None or grad_fn is None:
            raise ValueError("sam: update needs params and grad_fn(params) -> gradient (trainer.make_train_step "
                             "passes both)")
        norm = global_norm(grads)
        scale = jnp.where(norm > 0, rho / jnp.where(norm > 0, norm, 1.0), 0.0)
        ascent = jax.tree_util.tree_map(lambda p, g: p + (scale * g).astype(p.dtype), params, grads)
        sharp_grads = grad_fn(ascent)
        updates, inner_state = inner.update(sharp_grads, state.inner, params, **extra)
        return updates, SamState(inner_state)

    return optax.GradientTransformationExtraArgs(init, update)
