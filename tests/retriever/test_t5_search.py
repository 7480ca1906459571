"""Constrained decoding with the Flax T5: parity with transformers' generate(prefix_allowed_tokens_fn=...),
and exactness against exhaustive scoring."""

import numpy as np
import pytest

from gr_jax.decoding.exhaustive import exhaustive_ranking
from gr_jax.retriever.search import T5Searcher
from gr_jax.index.trie import TrieIndex
from gr_jax.backbones import t5, t5_convert
from tests.conftest import require, sweep

EOS = 1


@pytest.fixture(scope="module")
def setup():
    config = t5.get_config("tiny", dropout_rate=0.0)
    params = t5.init_params(config, seed=11)
    rng = np.random.default_rng(0)
    docids = np.unique(rng.integers(3, 40, (60, 3)), axis=0)
    docids = np.concatenate([docids, np.full((len(docids), 1), EOS)], axis=1)  # EOS-terminated, as HF emits
    index = TrieIndex.build(docids, vocab_size=config.vocab_size, eos_id=EOS)
    queries = rng.integers(3, config.vocab_size, (20, 10))
    queries[5:, 7:] = 0  # padded queries
    return config, params, docids, index, queries


@pytest.mark.torch
@pytest.mark.parametrize("k", sweep("k", [5, 10], [10]))
def test_same_topk_as_transformers_generate(setup, tmp_path, k):
    """Convention matched: HF's default length_penalty=1.0 (score = sum of log-softmax / generated length,
    EOS counted); our search runs with score_mode="log_softmax", length_penalty=1.0."""
    torch = require("torch")
    config, params, docids, index, queries = setup
    t5_convert.save_hf(params, config, tmp_path / "hf")
    from gr_jax.backbones.t5_parity import hf_prefix_allowed_fn, load_torch_t5

    hf = load_torch_t5(tmp_path / "hf")
    allowed = hf_prefix_allowed_fn(docids, EOS)

    with torch.no_grad():
        out = hf.generate(input_ids=torch.tensor(queries), attention_mask=torch.tensor(queries != 0),
                          num_beams=k, num_return_sequences=k, max_new_tokens=docids.shape[1],
                          prefix_allowed_tokens_fn=allowed, length_penalty=1.0, do_sample=False,
                          output_scores=True, return_dict_in_generate=True)
    hf_seqs = out.sequences[:, 1:].numpy().reshape(len(queries), k, -1)
    hf_scores = out.sequences_scores.numpy().reshape(len(queries), k)
    res = T5Searcher(t5.T5(config), num_beams=k, score_mode="log_softmax", length_penalty=1.0).search(
        params, queries, index.device())
    ours = np.asarray(res.tokens)
    np.testing.assert_array_equal(ours[:, :, :hf_seqs.shape[2]], hf_seqs)
    np.testing.assert_allclose(np.asarray(res.scores), hf_scores, atol=1e-4, rtol=0)


def test_t5_beam_equals_exhaustive(setup):
    config, params, docids, index, queries = setup
    M = index.num_leaves
    searcher = T5Searcher(t5.T5(config), num_beams=M, score_mode="renormalized")
    res = searcher.search(params, queries[:4], index.device())
    exact = searcher.exhaustive_scores(params, queries[:4], index, chunk_size=32)
    order, scores = exhaustive_ranking(exact, M)
    np.testing.assert_array_equal(np.asarray(res.leaf_ids), order)
    np.testing.assert_allclose(np.asarray(res.scores), scores, atol=1e-5)
