"""Document vectors computed once per MODEL_DIR (`docids/vector_cache.py`): reused only for the same texts and the
same encoder, and only when the file's content is what was written; a damaged file is recomputed, named, and
kept aside."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from gr_jax.docids.embed import Embedder
from gr_jax.docids.vector_cache import cache_path, cache_record, document_vectors
from gr_jax.runtime import io_utils


class Counting(Embedder):
    """Vectors made from the texts' lengths (a hand-checkable function), counting the texts it embeds."""

    name = "counting"

    def __init__(self, weights: str = "w1", cached: bool = True):
        self.weights, self.cached, self.embedded = weights, cached, 0

    def embed(self, texts):
        self.embedded += len(texts)
        scale = 1.0 if self.weights == "w1" else 2.0
        return np.array([[len(t) * scale, 1.0] for t in texts], np.float32)

    def recipe(self):
        return {"class": "Counting", "weights": self.weights} if self.cached else None


TEXTS = ["ab", "abcd", "a"]


def test_computed_once_then_reused(tmp_path):
    emb = Counting()
    first = document_vectors(emb, TEXTS, tmp_path)
    assert first.tolist() == [[2, 1], [4, 1], [1, 1]] and emb.embedded == 3
    again = document_vectors(emb, TEXTS, tmp_path)
    assert emb.embedded == 3  # nothing embedded the second time
    np.testing.assert_array_equal(first, again)
    assert len(list(tmp_path.glob("*.npz"))) == 1


def test_other_texts_order_or_weights_are_another_file(tmp_path):
    emb = Counting()
    document_vectors(emb, TEXTS, tmp_path)
    document_vectors(emb, TEXTS[::-1], tmp_path)  # another order: rows differ, so another key
    assert emb.embedded == 6
    trained = Counting("w2")  # a fine-tuned encoder: other weights' digest, other vectors
    out = document_vectors(trained, TEXTS, tmp_path)
    assert trained.embedded == 3 and out[:, 0].tolist() == [4, 8, 2]
    assert len(list(tmp_path.glob("*.npz"))) == 3


def test_not_cached_without_a_recipe_or_a_directory(tmp_path):
    emb = Counting(cached=False)
    document_vectors(emb, TEXTS, tmp_path)
    document_vectors(emb, TEXTS, tmp_path)
    assert emb.embedded == 6 and not list(tmp_path.iterdir())
    emb = Counting()
    document_vectors(emb, TEXTS, None)
    document_vectors(emb, TEXTS, None)
    assert emb.embedded == 6


def _edit(path, vectors=None, meta=None):
    arrays = io_utils.load_npz(path)
    if vectors is not None:
        arrays["vectors"] = vectors
    if meta is not None:
        arrays["meta"] = np.asarray(json.dumps(meta))
    np.savez(path.with_suffix(".tmp.npz"), **arrays)
    path.with_suffix(".tmp.npz").replace(path)


@pytest.mark.parametrize("damage", ["edited vectors", "cut off", "record of other texts", "not npz"])
def test_a_damaged_file_is_never_trusted(tmp_path, caplog, damage):
    emb = Counting()
    want = document_vectors(emb, TEXTS, tmp_path)
    path = cache_path(tmp_path, cache_record(emb, TEXTS))
    meta = json.loads(str(io_utils.load_npz(path)["meta"]))
    if damage == "edited vectors":  # the record still matches: only the content digest tells
        _edit(path, vectors=want + np.float32(0.5))
    elif damage == "cut off":
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "record of other texts":
        _edit(path, meta={**meta, "built_from": {**meta["built_from"], "texts": "0" * 24}})
    else:
        path.write_text("not an array file")
    with caplog.at_level(logging.WARNING, logger="gr_jax.docids.vector_cache"):
        got = document_vectors(emb, TEXTS, tmp_path)
    np.testing.assert_array_equal(got, want)  # computed again, not read
    assert emb.embedded == 6
    assert any(str(path) in r.getMessage() and "computing the vectors again" in r.getMessage()
               for r in caplog.records)
    kept = list(tmp_path.glob("*.prev-*"))
    assert len(kept) == 1  # the damaged file is set aside, not deleted
    document_vectors(emb, TEXTS, tmp_path)
    assert emb.embedded == 6  # the new file is intact and reused


def test_inference_reads_but_never_writes(tmp_path):
    emb = Counting()
    document_vectors(emb, TEXTS, tmp_path, write=False)
    assert not list(tmp_path.iterdir())
    document_vectors(emb, TEXTS, tmp_path)  # training writes it
    document_vectors(emb, TEXTS, tmp_path, write=False)
    assert emb.embedded == 6  # the second read-only call reused the file


def test_a_new_vectors_file_is_provisional_until_the_run_is_accepted(tmp_path):
    """A command refused after it encoded the corpus (a docid scheme built from another corpus, a bad setting
    checked later) leaves nothing in MODEL_DIR: the new vectors folder is removed with what else it wrote."""
    import os

    from gr_jax.runtime import locks

    cache = tmp_path / "run" / "vectors"
    document_vectors(Counting(), TEXTS, cache)
    assert cache.is_dir()
    locks._remove_provisional(os.path.realpath(tmp_path))  # what a refusal does (runtime/locks.py)
    assert not cache.exists()
    document_vectors(Counting(), TEXTS, cache)
    locks.accept()  # an accepted run keeps it
    locks._remove_provisional(os.path.realpath(tmp_path))
    assert len(list(cache.glob("*.npz"))) == 1
