"""Sharpness-aware minimisation against a numpy computation of its update (analytic gradients, no JAX)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gr_jax.training import trainer
from gr_jax.training.sam import sam

A = np.array([[2.0, 0.5], [0.5, 1.0]])
C = np.array([0.3, -1.2])


def loss_np(w, v):
    """L(w, v) = ½ wᵀAw + Σ v⁴ / 4 + c·v: curved differently along each parameter."""
    return 0.5 * w @ A @ w + np.sum(v ** 4) / 4 + C @ v


def grad_np(w, v):
    return A @ w, v ** 3 + C


def sam_sgd_np(w, v, rho, lr):
    """One SAM step with plain SGD inside, by hand: ε = ρ g / ‖g‖ over both parameters, g' = ∇L(w + ε)."""
    gw, gv = grad_np(w, v)
    norm = np.sqrt(np.sum(gw ** 2) + np.sum(gv ** 2))
    gw2, gv2 = grad_np(w + rho * gw / norm, v + rho * gv / norm)
    return w - lr * gw2, v - lr * gv2


def loss_jax(params, batch, rng):
    w, v = params["w"], params["v"]
    loss = 0.5 * w @ jnp.asarray(A) @ w + jnp.sum(v ** 4) / 4 + jnp.asarray(C) @ v
    return loss, {"loss": (loss, jnp.ones(()))}


START = {"w": np.array([1.0, -2.0]), "v": np.array([0.7, 1.5])}


def run_steps(tx, steps):
    step = jax.jit(trainer.make_train_step(loss_jax, tx))
    params = {k: jnp.asarray(v, jnp.float32) for k, v in START.items()}
    state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params),
             "nonfinite": jnp.zeros((), jnp.int32)}
    for _ in range(steps):
        state, _ = step(state, {}, jax.random.PRNGKey(0))
    return state


@pytest.mark.parametrize("rho", [0.05, 0.5])
def test_sam_steps_through_the_train_step_equal_the_numpy_computation(rho):
    lr, steps = 0.1, 3
    state = run_steps(sam(optax.sgd(lr), rho), steps)
    w, v = START["w"], START["v"]
    for _ in range(steps):
        w, v = sam_sgd_np(w, v, rho, lr)
    # float32 against float64 on values of order 1: a relative 1e-5 covers the rounding, while a step without
    # the perturbation differs by ~lr·ρ·curvature ≥ 1e-3 (checked below)
    np.testing.assert_allclose(np.asarray(state["params"]["w"]), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(state["params"]["v"]), v, rtol=1e-5, atol=1e-6)
    plain = run_steps(optax.sgd(lr), steps)
    assert np.max(np.abs(np.asarray(plain["params"]["v"]) - v)) > 1e-3


def test_make_optimizer_wraps_sam_only_when_asked_and_refuses_a_negative_rho():
    plain = trainer.make_optimizer(learning_rate=0.1, clip_norm=None, weight_decay=0.0)
    with_sam = trainer.make_optimizer(learning_rate=0.1, clip_norm=None, weight_decay=0.0, sam_rho=0.2)
    a, b = run_steps(plain, 2), run_steps(with_sam, 2)
    assert not np.allclose(np.asarray(a["params"]["v"]), np.asarray(b["params"]["v"]))
    with pytest.raises(ValueError, match="sam_rho"):
        trainer.make_optimizer(sam_rho=-0.1)


def test_sam_needs_the_gradient_function():
    tx = sam(optax.sgd(0.1), 0.1)
    params = {"w": jnp.ones(2)}
    with pytest.raises(ValueError, match="grad_fn"):
        tx.update(params, tx.init(params), params)
