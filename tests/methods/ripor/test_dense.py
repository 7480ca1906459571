"""RIPOR's dense phase and its T5 route (methods/ripor/dense.py, experiments/msmarco/ripor.gin) on a tiny random
T5: the embedder's vector is the decoder's first state; a RiporT5Retriever started from the dense T5 and the
centroids scores position 0's codes by ⟨dense query vector, centroid⟩ exactly (it starts as the dense
retriever on the first code); the command trains and writes a T5 directory the experiment file then runs from."""

from __future__ import annotations

import types

import gin
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax import compose
from gr_jax.backbones import t5_convert, t5_parity
from gr_jax.data.pipeline import tokenize
from gr_jax.data.sources import load_dataset
from gr_jax.data.vocab import load_vocabulary, train_sentencepiece
from gr_jax.methods.api import CodebookHead
from gr_jax.methods.ripor import dense
from gr_jax.methods.ripor.docids import pack_codebooks
from gr_jax.methods.ripor.t5_layout import RiporT5Retriever
from gr_jax.runtime import gin_utils


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    """A random HF T5 (d_model 64) with a SentencePiece tokenizer of the demo corpus and a start vector."""
    folder = t5_parity.write_random_hf_t5(tmp_path_factory.mktemp("t5") / "t5", seed=3, vocab_size=512)
    ds = load_dataset("demo", demo_docs=60)
    train_sentencepiece(list(ds.corpus.texts) + list(ds.queries["train"].texts), folder / "spiece.model",
                        vocab_size=200)
    np.save(folder / dense.START_FILE, np.random.default_rng(0).normal(0, 1, 64).astype(np.float32))
    return folder


def test_the_model_starts_as_the_dense_retriever_on_the_first_code(t5_dir):
    embedder = dense.RiporT5Embedder(checkpoint=str(t5_dir), length=16)
    queries = ["how to open a file", "sort a list in place"]
    q_vectors = embedder.embed_queries(queries)
    assert q_vectors.shape == (2, 64) and not np.allclose(np.linalg.norm(q_vectors, axis=1), 1.0)  # inner products
    config, net = t5_convert.load_hf(t5_dir)
    books = np.random.default_rng(1).normal(0, 0.5, (3, 5, 64)).astype(np.float32)
    model = RiporT5Retriever(config, CodebookHead(length=3, codes=5), dense_checkpoint=str(t5_dir))
    model.use_docids(types.SimpleNamespace(constants=pack_codebooks(books)))
    params = {**model.init_params(0), "network": net}  # INITIAL_CHECKPOINT_PATH's network, as the run loads it
    np.testing.assert_array_equal(params["head"]["start"], np.load(t5_dir / dense.START_FILE))
    tokens = jnp.asarray(tokenize(queries, embedder.load()[3], 16), jnp.int32)  # as the embedder reads them
    logits = np.asarray(model.docid_logits(params, tokens, jnp.zeros((2, 3), jnp.int32)))
    # the same float32 network run twice (jitted apart): agreement to ~1e-6 of the logits' size
    np.testing.assert_allclose(logits[:, 0], q_vectors @ books[0].T, rtol=1e-5, atol=1e-5 * np.abs(logits).max())


def test_a_start_vector_of_another_width_is_refused(t5_dir, tmp_path):
    import shutil

    other = tmp_path / "t5"
    shutil.copytree(t5_dir, other)
    np.save(other / dense.START_FILE, np.zeros(7, np.float32))
    with pytest.raises(ValueError, match="d_model 64"):
        dense.load_t5(other)


@pytest.mark.slow  # trains the dense phase, then the RIPOR route (about a minute)
def test_the_dense_command_then_the_experiment_file(t5_dir, tmp_path):
    out = tmp_path / "dense"
    from gr_jax.methods.ripor import command

    argv = ["--gin_file=experiments/msmarco/ripor_dense.gin", f"--gin.OUTPUT_DIR='{out}'",
            f"--gin.INITIAL_CHECKPOINT_PATH='{t5_dir}'", "--gin.MIXTURE_OR_TASK_NAME='demo'",
            "--gin.load_dataset.demo_docs=60", "--gin.ripor_dense.steps=3", "--gin.ripor_dense.batch_size=8",
            "--gin.ripor_dense.bm25_depth=5", "--gin.ripor_dense.progress=False"]
    assert command.main(argv) == 0
    written = out / "t5"
    assert (written / dense.START_FILE).is_file() and (written / "spiece.model").is_file()
    trained = np.load(written / dense.START_FILE)
    assert not np.array_equal(trained, np.load(t5_dir / dense.START_FILE))  # the start vector trained
    model_dir = tmp_path / "ripor"
    small = [f"MODEL_DIR = '{model_dir}'", "DATA_DIR = None", f"INITIAL_CHECKPOINT_PATH = '{written}'",
             "MIXTURE_OR_TASK_NAME = 'demo'", "load_dataset.demo_docs = 60", "TRAIN_STEPS = 4", "BATCH_SIZE = 8",
             "TASK_FEATURE_LENGTHS = {'inputs': 16, 'targets': 2}", "RiporDocids.levels = 2", "RiporDocids.k = 4",
             "RiporT5Retriever.prefix_lengths = [1]", "RiporT5Retriever.prefix_factors = [0.75]",
             "RiporPhases.seq2seq_steps = 2", "RiporRankData.candidates = 5", "RiporRankData.negatives_per_query = 2",
             "make_optimizer.warmup_steps = 1", "train.checkpoint_period = 4", "train.progress = False",
             "EvalConfig.num_beams = 8", "EvalConfig.max_queries = 10", "EvalConfig.metrics = ('MRR@10',)",
             "RiporT5Embedder.length = 16"]
    try:
        gin.clear_config()
        gin_utils.parse(["experiments/msmarco/ripor.gin"], small)
        result = compose.train()
        gin.clear_config()
        gin_utils.parse(["experiments/msmarco/ripor.gin"], small)
        setup, params, step = compose.restore(model_dir)
    finally:
        gin.clear_config()
    assert step == 4 and "MRR@10" in result["metrics"]
    assert setup.scheme.name == "ripor" and params["head"]["codebook"].shape == (2 * 4, 64)
    vocab = load_vocabulary(written)
    assert vocab.size <= setup.model.config.vocab_size
