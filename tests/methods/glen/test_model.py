"""GLEN (002_glen.txt): parity with GLEN's own PyTorch code on its fixture, an independent brute-force oracle
of the hidden-state-fed decoding, the collision-free ranker by hand, GLEN's docid file, and the loader's
refusals."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.methods.glen import ranker as glen_ranker
from gr_jax.methods.glen import docids as glen_docids
from gr_jax.docids.base import DocidTable
from gr_jax.backbones import t5_convert
from gr_jax.methods.glen import model as glen
from gr_jax.methods.glen import parity as glen_parity
from gr_jax.data.vocab import DocidTokenSpace
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "fixtures" / "glen_parity" / "peer_v512_d64"


def tok(piece):
    return int(piece[3:]) if piece.startswith("tok") and piece[3:].isdigit() else None


@pytest.fixture(scope="module")
def parity():
    return glen_parity.check_fixture(FIXTURE)


def test_parity_with_glens_own_code(parity):
    # the fixture's README: logits recomputed in different ways differ by ≤ ~2e-6 (|logits| ≈ 3), its smallest
    # beam-score gap is 3.1e-3 and cosine gap 1.3e-4 — so 1e-4 separates float noise from a real difference,
    # and the rankings must be identical
    assert parity["docids_identical"] and parity["docid_file_identical"]
    assert parity["final_beams_identical"] and parity["rankings_identical"]
    diffs = {k: v for k, v in parity.items() if k.endswith("_diff")}
    assert len(diffs) == 10 and all(v <= 1e-4 for v in diffs.values()), diffs
    assert glen_parity.within(parity)


def _copy_fixture(tmp_path):
    dst = tmp_path / "fixture"
    shutil.copytree(FIXTURE, dst)
    return dst


@pytest.mark.slow
def test_the_check_fails_on_a_changed_ranking_or_shifted_logits_and_the_tool_says_so(tmp_path):
    fx = _copy_fixture(tmp_path)
    ranking = json.loads((fx / "ranking.json").read_text())
    ranked = ranking["settings"][0]["per_query"][2]["ranked"]
    ranked[0]["doc"], ranked[1]["doc"] = ranked[1]["doc"], ranked[0]["doc"]  # two ranks swapped
    (fx / "ranking.json").write_text(json.dumps(ranking))
    with np.load(fx / "outputs.npz") as z:
        out = {k: z[k] for k in z.files}
    shift = 1e-3 * np.abs(out["query_step_logits"]).max()  # 1e-3 of the magnitude: 100× the tolerance
    out["query_step_logits"] = out["query_step_logits"] + shift
    expected = shift / np.abs(out["query_step_logits"]).max()  # the check's differences are relative
    np.savez(fx / "outputs.npz", **out)
    res = subprocess.run([sys.executable, "tools/check_parity.py", "--method", "glen", "--fixture", str(fx)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stderr
    line = json.loads(res.stdout.strip().splitlines()[-1])
    assert line["rankings_identical"] is False and line["docids_identical"] is True
    assert line["query_step_logits_diff"] == pytest.approx(expected, rel=0.01)
    assert line["doc_step_logits_diff"] < 1e-5  # only what was changed is reported as different
    assert line["within_tolerance"] is False


def _fixture_model():
    model, params, inputs, _ = glen_parity.fixture_model(FIXTURE)
    return model, params, inputs


def test_full_beam_search_equals_a_brute_force_over_every_docid():
    """Oracle sharing no code with the search: numpy log-softmax of the masked step logits, summed along
    every docid of the table, sorted. With K ≥ number of docids the beam search must return exactly that."""
    model, params, inputs = _fixture_model()
    docids = glen_docids.read_docid_tsv(FIXTURE / "glen_docid.tsv", tok)
    table = glen_docids.table_for_corpus(docids, docids.doc_ids, model.config.vocab_size)
    index = table.index(vocab_size=model.config.vocab_size)
    queries = inputs["query_input_ids"]
    logits, _ = model.step_table(params, jnp.asarray(queries, jnp.int32))
    logits = np.asarray(logits, np.float64)
    logits[..., inputs["masked_token_ids"]] = -np.inf
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    distinct = sorted({tuple(t) for t in docids.tokens.tolist()})
    res = jax.device_get(model.predict(params, queries, index, num_beams=len(distinct)))
    for b in range(len(queries)):
        oracle = sorted(distinct, key=lambda z: -sum(logp[b, t, z[t]] for t in range(3)))
        mine = [tuple(res.tokens[b, k, :3].tolist()) for k in range(len(distinct))]
        assert mine == oracle
        want = [sum(logp[b, t, z[t]] for t in range(3)) for z in oracle]
        # float32 log-softmax on the device vs float64 here; |log p| ≈ 10–20, so 1e-5 relative is float32 noise
        np.testing.assert_allclose(res.scores[b], want, rtol=1e-5)


def test_collision_free_ranking_by_hand():
    # one query, 3 beams: beam 0 → documents 5 and 7 (a collision), beam 1 → 3, beam 2 → 7 again
    docs = np.array([[[5, 7], [3, -1], [7, -1]]])
    valid = docs >= 0
    w_q = np.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])  # the query's logits at each beam's 2 tokens
    w_d = np.zeros((8, 2))
    w_d[5] = [0.0, 2.0]  # cos with beam 0's [1, 0]: 0
    w_d[7] = [3.0, 0.3]  # cos: 3 / sqrt(9.09) = 0.99504
    w_d[3] = [1.0, 1.0]  # cos with beam 1's [0, 1]: 1/sqrt(2)
    q, d, n, cos = glen_ranker.collision_free_arrays(docs, valid, w_q, w_d)
    assert d.tolist() == [7, 5, 3] and n.tolist() == [0, 0, 1]  # 7 once, at its first beam; cut to N = 3
    np.testing.assert_allclose(cos, [3 / np.sqrt(9.09), 0.0, 1 / np.sqrt(2)], rtol=1e-12)
    _, d2, s2 = glen_ranker.CollisionFree()(docs, valid, np.zeros((1, 3)), beam_weights=w_q, doc_weights=w_d)
    assert d2.tolist() == [7, 5, 3]
    np.testing.assert_allclose(s2, [3 + (1 + 3 / np.sqrt(9.09)) / 4, 3.25, 2 + (1 + 1 / np.sqrt(2)) / 4])
    with pytest.raises(ValueError, match="token weights"):
        glen_ranker.collision_free_arrays(docs, valid, w_q, None)


def test_the_cut_to_n_happens_after_a_group_is_expanded():
    docs = np.array([[[1, 2, 3], [4, -1, -1]]])  # N = 2 beams; the first beam's group has 3 documents
    w_d = np.array([[0, 0], [1, 0], [0, 1], [1, 1], [1, 0]], float)
    q, d, n, cos = glen_ranker.collision_free_arrays(docs, docs >= 0, np.array([[[1.0, 0.2], [1.0, 0.0]]]), w_d)
    assert d.tolist() == [1, 3]  # cos 0.98 (doc 1), 0.83 (doc 3), then doc 2 (0.196) is cut, and beam 1 too


def test_random_tie_order_keeps_beam_order_and_depends_on_the_seed_only():
    docs = np.array([[list(range(10)), [10] + [-1] * 9]])
    orders = set()
    for seed in range(6):
        q, d, s = glen_ranker.RandomTieOrder(seed)(docs, docs >= 0, np.zeros((1, 2)))
        o = np.argsort(-s, kind="stable")
        assert d[o][-1] == 10 or 10 not in d  # the second beam's document never ahead of the first beam's
        assert len(d) == 2 and 10 not in d[o][:1]
        orders.add(tuple(d[o].tolist()))
        q2, d2, s2 = glen_ranker.RandomTieOrder(seed)(docs, docs >= 0, np.zeros((1, 2)))
        assert d2.tolist() == d.tolist() and s2.tolist() == s.tolist()  # the same seed, the same order
    assert len(orders) > 1


def test_docid_file_round_trip_and_errors(tmp_path):
    f = glen_docids.read_docid_tsv(FIXTURE / "glen_docid.tsv", tok)
    assert f.length == 3 and len(f.doc_ids) == 30 and f.texts[0].startswith("tok468 ")
    out = tmp_path / "docids.tsv"
    glen_docids.write_docid_tsv(out, f.doc_ids, f.tokens, f.logits, f.texts, lambda i: f"tok{i}")
    assert out.read_text() == (FIXTURE / "glen_docid.tsv").read_text()  # their format byte for byte

    def bad(text, match):
        p = tmp_path / "bad.tsv"
        p.write_text(text)
        with pytest.raises(ValueError, match=match) as e:
            glen_docids.read_docid_tsv(p, tok)
        assert str(p) in str(e.value)

    bad("0\ttok1<->tok2\t1.0<->2.0\ta\n1\ttok1\t1.0\tb\n", "bad.tsv:2: a docid of 1 tokens")
    bad("0\ttok1<->zz\t1.0<->2.0\ta\n", "bad.tsv:1: docid token 'zz' is not in the vocabulary")
    bad("0\ttok1<->tok2\t1.0\ta\n", "2 docid tokens but 1 logits")
    bad("0\ttok1\t1.0\ta\n0\ttok2\t1.0\tb\n", "bad.tsv:2: document id '0' repeats line 1")
    bad("0\ttok1\tnan\ta\n", "non-finite")
    bad("0 tok1 1.0\n", "found 1 field")
    with pytest.raises(ValueError, match="not in the corpus"):
        glen_docids.table_for_corpus(f, [str(i) for i in range(29)], 512)
    with pytest.raises(ValueError, match="have no docid"):
        glen_docids.table_for_corpus(f, [str(i) for i in range(31)], 512)


def test_fixed_length_text_docids_have_no_eos_and_keep_their_weights(tmp_path):
    space = DocidTokenSpace("text", 50, length=2)
    t = DocidTable.from_lists([[7, 9], [7, 9], [8, 3]], [2, 0, 1], space, weights=[[1, 2], [3, 4], [5, 6]])
    assert t.target_length == 2 and t.targets([0, 1]).tolist() == [[7, 9], [8, 3]]  # no EOS appended
    index = t.index(vocab_size=50)
    assert index.depth == 2
    t.save(tmp_path / "t")
    back = DocidTable.load(tmp_path / "t")
    assert back.space == space and np.array_equal(back.weights, t.weights)
    both = DocidTable.concatenate([t, t])
    assert both.weights.shape == (6, 2)
    with pytest.raises(ValueError, match="length 2"):
        DocidTable.from_lists([[7]], [0], space)
    with pytest.raises(ValueError, match="some tables have token weights"):
        DocidTable.concatenate([t, DocidTable.from_lists([[1, 2]], [3], space)])


def test_a_phase1_checkpoint_is_refused_with_the_reason(tmp_path):
    from safetensors.numpy import load_file, save_file

    d = tmp_path / "phase1"
    shutil.copytree(FIXTURE / "model", d)
    tensors = load_file(str(d / "model.safetensors"))
    tensors[glen.PHASE1_KEY] = np.zeros((32, 4), np.float32)
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(t5_convert.CheckpointError, match="phase-1 checkpoint"):
        glen.load_glen_hf(d)


def test_glen_retriever_checks_its_docid_length():
    model, _, _ = _fixture_model()
    with pytest.raises(ValueError, match="docid_length"):
        model.use_docids(DocidTable.from_lists([[1, 2]], [0], DocidTokenSpace("text", 512, length=2)))
    with pytest.raises(ValueError, match="score_mode"):
        glen.GlenRetriever(model.config, score_mode="raw")


@pytest.mark.slow
def test_training_path_equals_the_cached_step_table_without_dropout():
    model, params, inputs = _fixture_model()
    docs = jnp.asarray(inputs["doc_input_ids"][:8], jnp.int32)
    cached, _ = model.step_table(params, docs)
    recomputed, _ = model.hidden_fed(params, docs)
    # two float32 computations of the same logits (|logits| ≈ 3): 1e-4 is far above their ~2e-6 noise
    np.testing.assert_allclose(np.asarray(recomputed), np.asarray(cached), atol=1e-4)
    targets = np.zeros((8, 5), np.int32)
    targets[:, :3] = np.asarray(jax.device_get(model.decode_docids(params, docs)[0]))
    logp, hit = model.token_log_probs(params, docs, jnp.asarray(targets))
    masked = np.asarray(cached, np.float64)
    masked[..., inputs["masked_token_ids"]] = -np.inf
    ref = masked - np.log(np.exp(masked - masked.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - masked.max(-1, keepdims=True)
    want = np.take_along_axis(ref, targets[:, :3, None], axis=-1)[..., 0]
    np.testing.assert_allclose(np.asarray(logp)[:, :3], want, atol=1e-4)
    assert np.asarray(hit)[:, :3].all() and not np.asarray(logp)[:, 3:].any()  # greedy docids: every hit
    drop = model.hidden_fed(params, docs, jax.random.PRNGKey(0))[0]
    assert np.allclose(np.asarray(drop), np.asarray(recomputed))  # the fixture's dropout is 0


@pytest.mark.slow
def test_glen_phase1_trains_and_is_restored_through_gin(tmp_path, capsys):
    import gin

    from gr_jax import infer as infer_cmd
    from gr_jax import train as train_cmd

    model_dir = tmp_path / "glen"
    flags = ["--gin_file=experiments/demo/glen_phase1.gin", f"--gin.MODEL_DIR='{model_dir}'",
             "--gin.load_dataset.demo_docs=80", "--gin.TRAIN_STEPS=30", "--gin.BATCH_SIZE=16",
             "--gin.EvalConfig.compare_bm25=False", "--gin.train.progress=False", "--gin.train.log_period=10"]
    assert train_cmd.main(flags) == 0, capsys.readouterr().err
    logged = [json.loads(x) for x in (model_dir / "train_metrics.jsonl").read_text().splitlines()]
    assert logged[-1]["loss"] < logged[0]["loss"]  # L_key goes down on 80 documents
    final = json.loads((model_dir / "final_metrics.json").read_text())
    assert final["ranker"].startswith("FirstOccurrence") and final["queries"] > 0
    gin.clear_config()
    assert infer_cmd.main(["--gin_file=experiments/demo/glen_phase1.gin", "--gin_file=runs/eval.gin",
                           f"--gin.MODEL_DIR='{model_dir}'", "--gin.load_dataset.demo_docs=80",
                           "--gin.EVAL_SPLIT='test'"]) == 0, capsys.readouterr().err
    again = json.loads((model_dir / "runs" / "test.step30.metrics.json").read_text())
    assert again["metrics"] == final["metrics"]


@pytest.mark.torch
@pytest.mark.slow
def test_the_pytorch_reference_decoding_reproduces_glens_rankings_and_ours(tmp_path):
    """`methods.glen.torch_reference.glen_rank_torch` (the benchmark's PyTorch contender) on the fixture gives GLEN's own ranked
    lists; on another random model (other sizes, many collisions) it agrees with `GlenRetriever` exactly."""
    from gr_jax.backbones import t5
    from gr_jax.methods.glen.parity_reference import glen_rank_torch
    from gr_jax.backbones.t5_parity import load_torch_t5

    require("torch")
    hf = load_torch_t5(FIXTURE / "model")
    _, params, inputs = _fixture_model()
    docids = glen_docids.read_docid_tsv(FIXTURE / "glen_docid.tsv", tok)
    ranking = json.loads((FIXTURE / "ranking.json").read_text())
    for setting in ranking["settings"]:
        got = glen_rank_torch(hf, inputs["query_input_ids"], inputs["query_attention_mask"], docids.tokens,
                              docids.logits, setting["num_return_sequences"], inputs["masked_token_ids"])
        assert got == [[int(e["doc"]) for e in q["ranked"]] for q in setting["per_query"]]

    config = t5.get_config("tiny", dropout_rate=0.0).replace(vocab_size=96)
    net = t5.init_params(config, seed=3)
    t5_convert.save_hf(net, config, tmp_path / "hf")
    hf = load_torch_t5(tmp_path / "hf")
    rng = np.random.default_rng(0)
    distinct = np.unique(rng.integers(3, 96, (60, 3)), axis=0)[:40]
    tokens = np.concatenate([distinct, distinct[rng.integers(0, 40, 30)]])  # 70 documents, 40 docids
    weights = rng.normal(3.0, 1.0, tokens.shape).astype(np.float32)
    table = DocidTable(tokens, np.full(70, 3), np.arange(70), DocidTokenSpace("text", 96, length=3), weights)
    model = glen.GlenRetriever(config, docid_length=3, masked_ids=(2,))
    model.use_docids(table)
    mask = (np.arange(12)[None, :] < np.array([12, 9, 5, 12, 7, 3])[:, None]).astype(np.int64)
    queries = rng.integers(3, 96, (6, 12)) * mask
    for n in (5, 15):
        q, d, _ = model.rank({"network": net, "head": {}}, queries, table.index(vocab_size=96), n)
        mine = [d[q == b].tolist() for b in range(6)]
        assert mine == glen_rank_torch(hf, queries, mask, tokens, weights, n, (2,))
        assert any(len(set(tuple(tokens[r]) for r in m)) < len(m) for m in mine)  # collisions were ranked


def test_masked_special_ids_are_unk_and_t5s_sentinels():
    from gr_jax.methods.glen.model import masked_special_ids

    ids = masked_special_ids()
    assert ids[0] == 2 and ids[1:] == tuple(range(32000, 32100))  # t5-base: <extra_id_99> … <extra_id_0>
    # the fixture's list, written by GLEN's code from its tokenizer (all special ids but bos/eos/pad)
    import json
    from pathlib import Path

    meta = json.loads((Path(__file__).resolve().parents[2] / "fixtures" / "glen_parity" / "peer_v512_d64" / "meta.json").read_text())
    assert sorted(masked_special_ids(unk_id=2, first_sentinel=496, sentinels=16)) == \
        sorted(meta["token_layout"]["masked_token_ids"])


def test_token_fed_ablation_refuses_phase_2_and_decoded_docids():
    from gr_jax.backbones import t5
    from gr_jax.methods.glen.model import GlenRetriever

    model = GlenRetriever(t5.get_config("tiny").replace(vocab_size=64), docid_length=2, feed="tokens")
    params = model.init_params(0)
    tokens = np.ones((2, 5), np.int32)
    with pytest.raises(ValueError, match="token-fed ablation"):
        model.decode_docids(params, tokens)
    with pytest.raises(ValueError, match="glen_objective"):
        model.hidden_fed(params, tokens)
