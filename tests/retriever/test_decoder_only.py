"""The generative retriever on a decoder-only backbone: beam-search scores equal teacher-forced scores (the
cache path against the whole-sequence path) for text and codebook docids, query padding does not change them,
and the demo experiment trains, evaluates and resumes through the unchanged trainer (a gin switch)."""

import json

import numpy as np
import pytest

import jax

from gr_jax.docids.base import DocidTable
from gr_jax.index.trie import TrieIndex
from gr_jax.backbones import llama
from gr_jax.retriever.decoder_only import DecoderOnlyRetriever
from gr_jax.retriever.heads import CodebookHead
from gr_jax.data.vocab import EOS_ID, DocidTokenSpace

CONFIG = llama.get_config("llama_tiny", vocab_size=40, pad_token_id=0, bos_token_id=2)


def _spread(params):
    return jax.tree_util.tree_map(lambda p: p * 8.0 if p.ndim == 2 else p, params)


def _queries():
    q = np.zeros((3, 7), np.int32)  # right-padded with PAD (0), as the data pipeline writes them
    q[0, :5] = [5, 6, 7, 8, EOS_ID]
    q[1, :7] = [9, 10, 11, 12, 13, 14, EOS_ID]
    q[2, :3] = [15, 16, EOS_ID]
    return q


def test_text_docids_beam_scores_equal_teacher_forcing():
    model = DecoderOnlyRetriever(CONFIG)
    params = _spread(model.init_params(seed=1))
    seqs = [[20, 21, EOS_ID], [20, 22, 23, EOS_ID], [24, EOS_ID], [25, 21, 26, EOS_ID], [20, 21, 27, EOS_ID]]
    index = TrieIndex.build(seqs, vocab_size=CONFIG.vocab_size, eos_id=EOS_ID)
    q = _queries()
    res = model.predict(params, q, index, num_beams=8)
    targets = np.zeros((len(seqs), 4), np.int32)
    for i, s in enumerate(seqs):
        targets[i, :len(s)] = s
    for b in range(len(q)):
        want = np.asarray(model.score(params, np.repeat(q[b:b + 1], len(seqs), 0), targets))
        leaves = np.asarray(res.leaf_ids[b])[np.asarray(res.valid[b])]
        got = np.asarray(res.scores[b])[np.asarray(res.valid[b])]
        assert len(leaves) == len(seqs)  # beams ≥ docids: all found
        docs = [int(index.documents(int(leaf))[0]) for leaf in leaves]
        # sums of ≤ 4 log-probabilities in float32 from two computation orders
        np.testing.assert_allclose(got, want[docs], rtol=1e-4, atol=1e-4)
    # more padding on a query changes nothing
    wider = np.zeros((3, 12), np.int32)
    wider[:, :7] = q
    res2 = model.predict(params, wider, index, num_beams=8)
    np.testing.assert_allclose(np.asarray(res2.scores), np.asarray(res.scores), rtol=1e-5, atol=1e-5)


def test_codebook_docids_beam_scores_equal_teacher_forcing():
    head = CodebookHead(length=3, codes=5)
    model = DecoderOnlyRetriever(CONFIG, head)
    params = _spread(model.init_params(seed=2))
    codes = np.array([[0, 1, 2], [0, 1, 3], [4, 4, 0], [2, 0, 1]])
    table = DocidTable.from_lists(codes.tolist(), list(range(4)), DocidTokenSpace.codebook(3, 5))
    index = table.index()
    q = _queries()
    res = model.predict(params, q, index, num_beams=4)
    for b in range(len(q)):
        want = np.asarray(model.score(params, np.repeat(q[b:b + 1], 4, 0), codes))
        valid = np.asarray(res.valid[b])
        docs = [int(index.documents(int(leaf))[0]) for leaf in np.asarray(res.leaf_ids[b])[valid]]
        assert sorted(docs) == [0, 1, 2, 3]
        np.testing.assert_allclose(np.asarray(res.scores[b])[valid], want[docs], rtol=1e-4, atol=1e-4)


def test_a_t5_config_is_refused():
    from gr_jax.backbones import t5

    with pytest.raises(ValueError, match="needs a decoder-only config"):
        DecoderOnlyRetriever(t5.get_config("tiny"))


# the demo experiment at the smallest sizes that still train, evaluate and resume it: 60 documents, batch 8
SMALL = ["--gin.load_dataset.demo_docs=60", "--gin.prepare.vocab_size=300", "--gin.BATCH_SIZE=8",
         "--gin.EvalConfig.compare_bm25=False", "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 32}"]


@pytest.mark.slow
def test_demo_experiment_trains_evaluates_and_resumes(tmp_path):
    import gin

    from gr_jax import train as entry

    args = ["--gin_file=experiments/demo/dsi_url_llama.gin", f"--gin.MODEL_DIR='{tmp_path / 'm'}'",
            "--gin.TRAIN_STEPS=6", "--gin.EvalConfig.max_queries=20", "--gin.train.checkpoint_period=3",
            *SMALL]
    assert entry.main(args) == 0
    summary = json.loads((tmp_path / "m" / "final_metrics.json").read_text())
    assert summary["steps"] == 6 and 0.0 <= summary["metrics"]["Hit@10"] <= 1.0
    gin.clear_config()
    assert entry.main(args[:2] + ["--gin.TRAIN_STEPS=8", "--gin.EvalConfig.max_queries=20",
                                  "--gin.train.checkpoint_period=3", *SMALL]) == 0  # resumes at 6, trains to 8
    assert json.loads((tmp_path / "m" / "final_metrics.json").read_text())["steps"] == 8
