"""The mutation sweep of the parity checks (`evaluation/mutations.py`) by hand: which rows a swap exchanges, what
cannot be mutated, and a sweep that reports exactly the tensors a toy check can and cannot see."""

import numpy as np
import pytest

from gr_jax.evaluation.mutations import chosen, swapped, sweep


def test_swapping_by_hand():
    np.testing.assert_array_equal(swapped(np.array([[1., 2.], [1., 2.], [3., 4.]])),
                                  [[3., 4.], [1., 2.], [1., 2.]])  # row 0 with the first row that differs
    np.testing.assert_array_equal(swapped(np.array([[[5., 6., 7.]]])), [[[6., 5., 7.]]])  # [1, 1, D]: elements
    np.testing.assert_array_equal(swapped(np.array([2.5])), [-2.5])  # a scalar: negated
    original = np.arange(6.0).reshape(3, 2)
    swapped(original)
    np.testing.assert_array_equal(original, np.arange(6.0).reshape(3, 2))  # a copy, never in place
    with pytest.raises(ValueError, match="changes nothing"):
        swapped(np.ones(4))


def test_a_sweep_reports_what_the_check_sees():
    tensors = {"seen": np.arange(4.0), "unseen": np.arange(3.0), "also_seen": np.eye(2)}
    reference = {k: v.copy() for k, v in tensors.items()}

    def passes(t):  # a check that reads two of the three tensors
        return all(np.array_equal(t[k], reference[k]) for k in ("seen", "also_seen"))

    assert sweep(tensors, passes) == {"also_seen": True, "seen": True, "unseen": False}
    # a tensor of identical rows cannot be mutated: missed, never a silent pass
    assert sweep({**tensors, "ones": np.ones(3)}, lambda t: False, names=["ones"]) == {"ones": False}
    assert sweep(tensors, passes, names=["unseen"]) == {"unseen": False}
    picked = chosen(tensors, sample=2, seed=5)
    assert len(picked) == 2 and picked == sorted(picked) and picked == chosen(tensors, sample=2, seed=5)
    assert chosen(tensors, sample=0) == sorted(tensors)
