"""Planner alignment (004 Eq. 13): the loss against a numpy oracle on a hand-sized case, and the training on the
PAG fixture model — a "language" that maps every query token to another id — raises the dev TokJaccard, keeps
the best epoch, freezes the decoder, and round-trips through its files (a file from another teacher refused)."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.data.readers import QuerySet
from gr_jax.methods.pag import parity as pag_parity
from gr_jax.methods.pag import training_align as pag_align

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "pag_parity" / "peer_v320_d64"


def _oracle(zt, zs, tau, k):
    total = 0.0
    for a, b in zip(zt, zs):
        top_a = set(np.argsort(-a, kind="stable")[:k]) | set(np.argsort(-b, kind="stable")[:k])
        u = sorted(top_a)
        p = np.exp(a[u] / tau) / np.exp(a[u] / tau).sum()
        q = np.exp(b[u] / tau) / np.exp(b[u] / tau).sum()
        total += float(np.sum(p * np.log(p / q)))
    return tau ** 2 * total / len(zt)


def test_align_loss_against_numpy():
    rng = np.random.default_rng(0)
    zt, zs = rng.gamma(1.0, size=(3, 12)), rng.gamma(1.0, size=(3, 12))
    for k in (2, 4, 12):
        got = float(pag_align.align_loss(jnp.asarray(zt, jnp.float32), jnp.asarray(zs, jnp.float32), 2.0, k))
        # relative tolerance: float32 softmax sums of ~10 terms (≈1e-6 relative); the values are O(0.1)
        assert got == pytest.approx(_oracle(zt, zs, 2.0, k), rel=1e-4)
    assert float(pag_align.align_loss(jnp.asarray(zt), jnp.asarray(zt), 2.0, 4)) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.slow
def test_alignment_raises_dev_jaccard_and_freezes_the_decoder(tmp_path):
    model, params, _, _, _ = pag_parity.fixture_setup(FIXTURE)
    with np.load(FIXTURE / "inputs.npz") as z:
        english = z["query_input_ids"].astype(np.int32)
    pad = model.config.pad_token_id
    # the "other language": each token id v → a different id below the docid tokens, padding kept
    perm = np.random.default_rng(1).permutation(np.arange(1, model.docid_base))
    other = np.where(english == pad, pad, perm[np.maximum(english - 1, 0)]).astype(np.int32)
    ids = {}
    for i in range(len(english)):
        ids[f"en{i}"], ids[f"xx{i}"] = english[i], other[i]

    def tokenize(texts):
        return np.stack([ids[t] for t in texts])

    n = len(english)
    train = (QuerySet([str(i) for i in range(n)], [f"en{i}" for i in range(n)]),
             QuerySet([str(i) for i in range(n)], [f"xx{i}" for i in range(n)]))
    teacher = {"model_dir": "fixture", "step": 0}
    meta = pag_align.train_aligned_planner(model, params, tokenize, train, train, tmp_path / "al", teacher, k=20,
                                   learning_rate=3e-3, epochs=4, batch_size=2, ell=10, progress=False)
    hist = meta["history"]
    assert hist[-1]["loss"] < hist[1]["loss"]
    best = max(h["dev_tok_jaccard"] for h in hist)
    assert best > hist[0]["dev_tok_jaccard"] and hist[meta["chosen_epoch"]]["dev_tok_jaccard"] == best
    aligned = pag_align.load_aligned(tmp_path / "al", params, teacher)
    same = jax.tree_util.tree_map(lambda a, b: bool(jnp.array_equal(a, b)), params["network"]["decoder"],
                                  aligned["network"]["decoder"])
    assert all(jax.tree_util.tree_leaves(same))  # the decoder is frozen
    changed = jax.tree_util.tree_map(lambda a, b: not bool(jnp.array_equal(a, b)), params["network"]["encoder"],
                                     aligned["network"]["encoder"])
    assert any(jax.tree_util.tree_leaves(changed))  # the query side moved
    with pytest.raises(ValueError, match="aligned from .* not from"):
        pag_align.load_aligned(tmp_path / "al", params, {"model_dir": "other", "step": 0})
    with pytest.raises(FileNotFoundError, match="no aligned planner"):
        pag_align.load_aligned(tmp_path / "none", params)
    with pytest.raises(ValueError, match="same query ids"):
        pag_align.train_aligned_planner(model, params, tokenize, (train[0], QuerySet(["x"], ["xx0"])), train, tmp_path / "b",
                                teacher, epochs=1)
