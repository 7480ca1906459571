"""PAG's training objectives by hand: the set objective (softmax and margin over in-batch s_simul, duplicates of
the positive's document left out) and the sequential prefix objective (per-level softmax over the level's
codes)."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.methods.pag import training as pag_training


def test_set_objective_softmax_and_margin_by_hand():
    s = jnp.asarray([[3.0, 1.0, 1.0],
                     [0.0, 2.0, 2.0],
                     [1.0, 0.0, 2.0]])
    rows = jnp.asarray([7, 8, 8])  # queries 1 and 2 share a document: neither is the other's negative
    loss, acc = pag_training.set_objective(s, rows, "softmax")
    expect = np.mean([math.log(math.exp(3) + 2 * math.exp(1)) - 3,       # query 0: all three candidates
                      math.log(math.exp(0) + math.exp(2)) - 2,          # query 1: doc 2 (same row) left out
                      math.log(math.exp(1) + math.exp(2)) - 2])         # query 2: doc 1 left out
    assert float(loss) == pytest.approx(expect, rel=1e-6)
    assert float(acc) == pytest.approx(1.0)  # every positive scores at least its negatives
    loss, _ = pag_training.set_objective(s, rows, "margin", margin=1.0)
    # hinge max(0, 1 − s⁺ + s⁻) over the valid pairs: (0,1) 0, (0,2) 0, (1,0) 0, (2,0) 0 → 0
    assert float(loss) == pytest.approx(0.0)
    loss, _ = pag_training.set_objective(s, rows, "margin", margin=3.0)
    # (0,1) 1, (0,2) 1, (1,0) 1, (2,0) 2 → mean 5/4
    assert float(loss) == pytest.approx(1.25)
    with pytest.raises(ValueError, match="set_loss must be one of"):
        pag_training.set_objective(s, rows, "hinge")


def test_prefix_objective_reads_only_the_levels_codes():
    base, K, M, V = 10, 2, 2, 16
    logits = np.zeros((1, M, V), np.float32)
    logits[0, 0, [10, 11]] = [2.0, 0.0]  # level 0: codes at ids 10, 11
    logits[0, 1, [12, 13]] = [0.0, 1.0]  # level 1: codes at ids 12, 13
    logits[0, :, 0] = 50.0  # a text id: never part of the softmax
    targets = jnp.asarray([[10, 12]])  # codes 0 and 0
    loss, acc = pag_training.prefix_objective(jnp.asarray(logits), targets, base, K)
    expect = np.mean([math.log(1 + math.exp(-2.0)), math.log(1 + math.exp(1.0))])
    assert float(loss) == pytest.approx(expect, rel=1e-6)
    assert float(acc) == pytest.approx(0.5)  # level 0 right, level 1 wrong


def test_objective_weights_are_checked():
    with pytest.raises(ValueError, match="not both 0"):
        pag_training.PagObjective(set_weight=0.0, seq_weight=0.0)
    with pytest.raises(ValueError, match="set_loss must be one of"):
        pag_training.PagObjective(set_loss="hinge")
