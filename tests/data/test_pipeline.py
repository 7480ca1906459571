import json

import numpy as np
import pytest

from gr_jax.data import demo
from gr_jax.data.pipeline import ExampleStore, MixtureIterator, eval_batches, pad_sequences, tokenize
from gr_jax.data.vocab import train_sentencepiece


def _store(n, width=3, offset=0):
    rows = np.arange(n)[:, None] + offset
    return ExampleStore({"inputs": np.repeat(rows, width, axis=1), "targets": rows.copy()})


def test_pad_sequences_trims_then_appends_eos():
    out = pad_sequences([[5, 6, 7, 8], [9], []], length=3)
    np.testing.assert_array_equal(out, [[5, 6, 1], [9, 1, 0], [1, 0, 0]])
    out = pad_sequences([[5, 6, 7, 8], [9]], length=3, add_eos=False)
    np.testing.assert_array_equal(out, [[5, 6, 7], [9, 0, 0]])
    assert pad_sequences([[70000]], 2).dtype == np.int32 and pad_sequences([[7]], 2).dtype == np.uint16
    with pytest.raises(ValueError, match="non-negative"):
        pad_sequences([[3, -1]], 4)


def test_tokenize_with_trained_sentencepiece(tmp_path):
    ds = demo.generate(num_docs=60, seed=3)
    vocab = train_sentencepiece(list(ds.corpus.texts), tmp_path / "sp.model", vocab_size=300)
    again = train_sentencepiece(list(ds.corpus.texts), tmp_path / "sp2.model", vocab_size=300)
    assert (tmp_path / "sp.model").read_bytes() == (tmp_path / "sp2.model").read_bytes()  # deterministic
    arr = tokenize(ds.queries["train"].texts[:5], vocab, length=16)
    assert arr.shape == (5, 16)
    for row, text in zip(arr, ds.queries["train"].texts[:5]):
        ids = vocab.encode(text)[:15]
        np.testing.assert_array_equal(row[: len(ids)], ids)
        assert row[len(ids)] == 1 and (row[len(ids) + 1:] == 0).all()
        assert vocab.decode(row) == again.decode(row)
    with pytest.raises(ValueError, match="queries: row 1 is empty"):
        tokenize(["a b", "  "], vocab, 8, what="queries")


def test_single_source_epochs_cover_every_example_once():
    it = MixtureIterator([_store(10)], batch_size=4, seed=1)
    seen = np.concatenate([next(it)["targets"][:, 0] for _ in range(5)])  # 20 = two epochs
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
    assert not np.array_equal(seen[:10], seen[10:])  # a new permutation per epoch
    assert it.epochs() == [2.0]
    plain = MixtureIterator([_store(10)], batch_size=4, shuffle=False)
    np.testing.assert_array_equal(next(plain)["targets"][:, 0], [0, 1, 2, 3])


def test_resume_gives_the_same_batches_as_an_uninterrupted_run():
    sources = [_store(7), _store(11, offset=100), _store(3, offset=1000)]
    full = MixtureIterator(sources, batch_size=5, seed=9, rates=[3, 1, 1])
    reference = [next(full) for _ in range(12)]
    first = MixtureIterator(sources, batch_size=5, seed=9, rates=[3, 1, 1])
    got = [next(first) for _ in range(5)]
    state = json.loads(json.dumps(first.get_state()))  # survives JSON, as in a checkpoint
    resumed = MixtureIterator(sources, batch_size=5, seed=9, rates=[3, 1, 1])
    resumed.set_state(state)
    got += [next(resumed) for _ in range(7)]
    for a, b in zip(reference, got):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    other_seed = MixtureIterator(sources, batch_size=5, seed=10, rates=[3, 1, 1])
    assert any(not np.array_equal(next(other_seed)["targets"], r["targets"]) for r in reference)
    with pytest.raises(ValueError, match="does not match this pipeline"):
        MixtureIterator(sources, batch_size=6, seed=9, rates=[3, 1, 1]).set_state(state)


def test_mixture_rates_are_respected():
    it = MixtureIterator([_store(50), _store(50, offset=100)], batch_size=20, seed=0, rates=[0.8, 0.2])
    batch_targets = np.concatenate([next(it)["targets"][:, 0] for _ in range(50)])
    frac = (batch_targets < 100).mean()
    assert 0.75 < frac < 0.85
    zero = MixtureIterator([_store(5), _store(5, offset=100)], batch_size=4, rates=[1, 0])
    assert all((next(zero)["targets"] < 100).all() for _ in range(5))


def test_bad_configuration_errors():
    with pytest.raises(ValueError, match="different numbers of rows"):
        ExampleStore({"inputs": np.zeros((3, 2)), "targets": np.zeros((4, 2))})
    with pytest.raises(ValueError, match="different features/lengths"):
        MixtureIterator([_store(3, width=3), _store(3, width=4)], batch_size=2)
    with pytest.raises(ValueError, match="'empty' has no examples"):
        MixtureIterator([_store(3), _store(0)], batch_size=2, names=["a", "empty"])
    with pytest.raises(ValueError, match="rates"):
        MixtureIterator([_store(3)], batch_size=2, rates=[-1])


def test_eval_batches_cover_each_row_once_with_mask():
    store = _store(7)
    rows, masks = zip(*eval_batches(store, 3))
    assert [m.sum() for m in masks] == [3, 3, 1]
    got = np.concatenate([r["targets"][:, 0][m] for r, m in zip(rows, masks)])
    np.testing.assert_array_equal(got, np.arange(7))
    cat = ExampleStore.concatenate([_store(2), _store(3, offset=5)])
    np.testing.assert_array_equal(cat.features["targets"][:, 0], [0, 1, 5, 6, 7])
