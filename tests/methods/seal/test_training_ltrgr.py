"""LTRGR's second stage: the passage score recomputed with gradient equals SEAL's document score of the same keys
(so, before any update, the score the rank data recorded), the weight on the device equals the host's, the
quadruples are chosen as the authors choose them and do not depend on the order of the data, the loss is the
hand formula, and its gradient separates a positive from a negative."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.data.readers import Corpus
from gr_jax.docids.base import FitContext
from gr_jax.runtime.errors import UserError
from gr_jax.methods.seal.docids import SealDocids
from gr_jax.methods.seal.training_ltrgr import LtrgrObjective, LtrgrPairs, coverage_counts, key_weights, params_digest
from gr_jax.methods.seal.model import SealRetriever, SealSearch
from gr_jax.methods.seal.ranker import weight
from gr_jax.backbones import t5
from tests.methods.seal.small import small_run, train_small

WORDS = [f"w{i}" for i in range(30)]


class Words:
    size = 2 + len(WORDS)

    def encode(self, text):
        return [2 + WORDS.index(w) for w in text.split()]


_rng = np.random.default_rng(0)
CORPUS = Corpus([f"d{i}" for i in range(6)], [" ".join(_rng.choice(WORDS, 12)) for _ in range(6)],
                titles=[" ".join(_rng.choice(WORDS, 2)) for _ in range(6)])
SMOOTHING = 0.01  # with ~100 index positions SEAL's 5 would leave a random model no key of positive weight


def _setup():
    scheme = SealDocids(max_text_tokens=12).fit(CORPUS, FitContext(vocab=Words()))
    table = scheme.assign(CORPUS)
    config = t5.get_config("tiny", vocab_size=scheme.space().end)
    model = SealRetriever(config, search=SealSearch(body_length=2, title_length=3, max_hits=4, smoothing=SMOOTHING))
    model.use_docids(table)
    return scheme, table, model, model.init_params(1)  # a seed whose keys score every document for both queries


def test_key_weights_on_the_device_equal_the_host_formula():
    rng = np.random.default_rng(0)
    positions = 321_897
    scores = np.concatenate([[0.0, -1e-7, -1e-3, -0.5], -rng.uniform(0, 15, 200)])
    counts = np.concatenate([[1, 3, 1500, 7], rng.integers(1, 5000, 200)])
    got = np.asarray(key_weights(jnp.asarray(scores, jnp.float32), jnp.asarray(counts, jnp.float32),
                                 jnp.float32(positions)))
    want = np.array([weight(s, int(c), positions) for s, c in zip(scores, counts)])
    assert (want > 0).sum() > 60 and (want == 0).sum() > 10  # both sides of the clip are exercised
    # float32 logs of magnitudes ≤ log N ≈ 13 (error ~1e-6 each) and a square: 1e-4 relative, 1e-3 absolute near 0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_coverage_counts_by_hand():
    assert coverage_counts([(1, 2), (2, 3), (3,), (4, 4), (1, 5, 5)]) == ([2, 1, 0, 1, 1], [2, 2, 1, 1, 2])


def _doc(doc_id, score):
    return {"doc_id": doc_id, "score": score, "keys": [[[2], 1, "body"]]}


def test_quadruples_as_the_authors_choose_them_whatever_the_order():
    rows = [
        {"qid": "q1", "docs": [_doc("a", 50.0), _doc("b", 40.0), _doc("c", 40.0), _doc("d", 10.0)]},
        {"qid": "q2", "docs": [_doc("a", 5.0), _doc("b", 4.0)]},  # no judged document retrieved
        {"qid": "q3", "docs": [_doc("a", 500.0), _doc("b", 100.0)]},  # positive leads by ≥ the margin: easy
        {"qid": "q4", "docs": [_doc("a", 3.0)]},  # nothing but the positive
        {"qid": "q5", "docs": [_doc("x", 9.0), _doc("y", 9.0)]},  # a tie: broken by the document id
    ]
    qrels = {"q1": {"c": 1, "d": 1, "z": 1}, "q2": {"z": 1}, "q3": {"a": 2}, "q4": {"a": 1}, "q5": {"y": 1}}
    pairs = LtrgrPairs(margin=300.0)
    kept, dropped = pairs.quadruples({}, rows, qrels, seed=0)
    assert dropped == {"no positive retrieved": 1, "no negative retrieved": 1, "already by the margin": 1}
    assert [q for q, _ in kept] == ["q1", "q5"]
    ids = {q: [d["doc_id"] for d in ps] for q, ps in kept}
    # q1: top positive c (40, ties with the negative b broken by id), top negative a; the random positive is the
    # other positive d, the random negative another negative (b)
    assert ids["q1"] == ["c", "a", "d", "b"]
    assert ids["q5"] == ["y", "x", "y", "x"]  # one of each: the random ones are the top ones
    shuffled = [{"qid": r["qid"], "docs": r["docs"][::-1]} for r in rows[::-1]]
    assert pairs.quadruples({}, shuffled, qrels, seed=0)[0] == kept


def _kept(model, params, queries, index, table):
    """The four passages of each query taken from the model's own ranking: the best, the second, the third and
    the last document (as positive, negative, positive, negative), with the keys the ranking recorded."""
    kept = []
    for b, docs in enumerate(model.ranked(params, queries, index, num_beams=40)):
        recs = [{"doc_id": CORPUS.doc_ids[r], "score": v, "keys": [[list(t), c, view] for t, c, view in keys]}
                for r, v, keys in docs]
        assert len(recs) >= 3, "the test needs three documents with a positive score per query"
        kept.append((f"q{b}", [recs[0], recs[1], recs[2], recs[-1]]))
    return kept


def _batch(model, params, queries, table, keys_per_passage=64):
    index = table.index()
    kept = _kept(model, params, queries, index, table)
    store = LtrgrPairs(keys_per_passage=keys_per_passage).store(
        kept, queries, index.num_positions, table, {d: r for r, d in enumerate(CORPUS.doc_ids)}, 6, seed=0)
    return kept, {k: jnp.asarray(v) for k, v in store.take(np.arange(len(store))).items()}


QUERIES = np.array([[2, 3, 1, 0, 0], [4, 3, 2, 1, 0]], np.int32)  # "alpha beta", "gamma beta alpha"


@pytest.mark.slow
def test_passage_scores_before_any_update_equal_the_recorded_document_scores():
    scheme, table, model, params = _setup()
    kept, batch = _batch(model, params, QUERIES, table)
    got = np.asarray(LtrgrObjective().passage_scores(model, params, batch))
    want = np.array([[p["score"] for p in ps] for _, ps in kept])
    # the recorded scores come from the search (float32 beam sums, float64 weights); these from teacher forcing
    # in float32: 1e-4 relative to each score
    np.testing.assert_allclose(got, want, rtol=1e-4)
    # with fewer keys kept per passage the score is the sum over the first ones, in the greedy order
    few = np.asarray(LtrgrObjective().passage_scores(model, params, _batch(
        model, params, QUERIES, table, keys_per_passage=1)[1]))
    assert (few <= got + 1e-4 * np.abs(got)).all() and (few > 0).all()


def test_the_loss_is_the_hand_formula():
    scheme, table, model, params = _setup()
    _, batch = _batch(model, params, QUERIES, table)
    objective = LtrgrObjective(margin=1.0, random_pair_extra=0.5, generation_weight=2.0)
    # each network pass compiled once (jit) rather than run op by op: the same arithmetic, a fraction of the time
    s = np.asarray(jax.jit(lambda p, b: objective.passage_scores(model, p, b))(params, batch), np.float64)
    gen_targets = np.asarray(batch["gen_targets"]).reshape(-1, 6)
    gen_inputs = np.asarray(batch["view_inputs"]).reshape(len(gen_targets), -1)
    score = jax.jit(model.score)  # one row at a time: the oracle does not batch what the objective batches
    logp = np.concatenate([np.asarray(score(params, gen_inputs[i:i + 1], gen_targets[i:i + 1]))
                           for i in range(len(gen_targets))])
    l_gen = -logp.sum() / (gen_targets != 0).sum()
    want = (0.5 * np.maximum(0, s[:, 1] - s[:, 0] + 1.0).mean() + 0.5 * np.maximum(0, s[:, 3] - s[:, 2] + 1.5).mean()
            + 2.0 * l_gen)
    loss, metrics = jax.jit(lambda p, b: objective(model, p, b))(params, batch)
    assert math.isclose(float(loss), want, rel_tol=1e-4)  # float32 sums of a few dozen terms
    assert float(metrics["rank_loss"][0]) > 0  # the pairs are not yet ordered by the margin


@pytest.mark.slow  # the gradient through the passage scores: a compile of its own
def test_the_rank_loss_gradient_separates_positive_from_negative():
    scheme, table, model, params = _setup()
    _, batch = _batch(model, params, QUERIES, table)
    rank_only = LtrgrObjective(margin=1e3, generation_weight=0.0)
    gap = lambda p: np.asarray(rank_only.passage_scores(model, p, batch))  # noqa: E731
    before = gap(params)
    grad = jax.grad(lambda p: rank_only(model, p, batch)[0])(params)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree_util.tree_leaves(grad))
    moved = jax.tree_util.tree_map(lambda p, g: p - 1e-3 * g, params, grad)
    after = gap(moved)
    # every hinge is active (margin 1e3), so the rank loss is −½·mean(lead of the top pair) − ½·mean(lead of the
    # random pair) + constants: a small step down its gradient widens the positives' summed lead
    lead = lambda s: (s[:, 0] - s[:, 1]).mean() + (s[:, 2] - s[:, 3]).mean()  # noqa: E731
    assert lead(after) > lead(before) + 1e-3
    assert float(rank_only(model, moved, batch)[0]) < float(rank_only(model, params, batch)[0])


def test_rank_data_refusals(tmp_path):
    from gr_jax.runtime.provenance import records_text

    scheme, table, _, _ = _setup()
    from types import SimpleNamespace

    no_start = SimpleNamespace(start=lambda: SimpleNamespace(initial_checkpoint_path=None), table=table)
    with pytest.raises(UserError, match="LTRGR starts from a trained MINDER: set INITIAL_CHECKPOINT_PATH"):
        LtrgrPairs().iterator(no_start)
    path = tmp_path / "rank.jsonl"
    inp = SimpleNamespace(table=table, train_split="train", start=None)

    def write(**built):
        path.write_text(records_text({"built_from": {"table": table.digest(), "keys_per_passage": 40, "split": "train",
                                                     **built}, "positions": 9}, []))

    write(table="0" * 16)
    with pytest.raises(UserError, match=f"{path}: LTRGR rank data built over another identifier table"):
        LtrgrPairs(rank_data=str(path))._read(inp)
    write(keys_per_passage=10)
    with pytest.raises(UserError, match="holds 10 keys per passage, fewer than"):
        LtrgrPairs(rank_data=str(path))._read(inp)
    write(split="dev")
    with pytest.raises(UserError, match="rank data of the 'dev' queries, this run trains on 'train'"):
        LtrgrPairs(rank_data=str(path))._read(inp)
    # retrieved by another network than the one training starts from
    _, _, model, params = _setup()
    write(network=params_digest(params["network"]), model_dir="runs/m", step=7)
    other = jax.tree_util.tree_map(lambda x: x + 1e-3, params)
    starts = lambda p: SimpleNamespace(table=table, train_split="train", start=lambda: SimpleNamespace(  # noqa: E731
        params=p, initial_checkpoint_path="runs/m"))
    assert LtrgrPairs(rank_data=str(path))._read(starts(params))[0]["built_from"]["step"] == 7
    with pytest.raises(UserError, match="retrieved by another network than the one this run starts from"):
        LtrgrPairs(rank_data=str(path))._read(starts(other))




@pytest.mark.slow
def test_minder_then_rank_data_then_ltrgr_training(tmp_path, capsys):
    """The three commands in a row: MINDER, its rank data (kept on a re-run, refused for other settings), then
    LTRGR's training from the MINDER checkpoint."""
    import gin

    from gr_jax import train as train_cmd
    from gr_jax.methods.seal import rank_data

    exp, _ = train_small(tmp_path, "minder", "experiments/demo/minder.gin", 30)
    args = [f"--gin_file={exp}", f"--gin.MODEL_DIR='{tmp_path / 'minder'}'", "--gin.write_rank_data.top_k=60",
            "--gin.write_rank_data.max_queries=24", "--gin.write_rank_data.num_beams=4"]
    assert rank_data.main(args) == 0, capsys.readouterr().err
    data = tmp_path / "minder" / "ltrgr_rank_data.jsonl"
    from gr_jax.runtime.provenance import read_records

    head, rows = read_records(data, "rank data")
    assert head["rows"] == 24 and [r["qid"] for r in rows] == sorted(r["qid"] for r in rows)
    for r in rows:
        scores = [d["score"] for d in r["docs"]]
        assert scores == sorted(scores, reverse=True) and all(len(d["keys"]) <= 40 for d in r["docs"])
        assert all(view in ("body", "title", "query") for d in r["docs"] for _, _, view in d["keys"])
    before = data.read_bytes()
    gin.clear_config()
    assert rank_data.main(args) == 0  # built from the same checkpoint and settings: kept
    assert data.read_bytes() == before
    gin.clear_config()
    capsys.readouterr()
    assert rank_data.main(args + ["--gin.write_rank_data.top_k=5"]) == 2
    err = capsys.readouterr().err
    assert f"{data}: LTRGR rank data built with another top_k" in err and "Traceback" not in err

    ltr = tmp_path / "ltrgr.gin"
    ltr.write_text(small_run("experiments/demo/ltrgr.gin", 30) + f"""
INITIAL_CHECKPOINT_PATH = '{tmp_path / 'minder'}'
LtrgrPairs.rank_data = '{data}'
LTRGR_MARGIN = 1e6  # keep every query with a positive and a negative, however easy
TRAIN_STEPS = 2
BATCH_SIZE = 4
train.checkpoint_period = 2
""")
    gin.clear_config()
    assert train_cmd.main([f"--gin_file={ltr}", f"--gin.MODEL_DIR='{tmp_path / 'ltrgr'}'"]) == 0, \
        capsys.readouterr().err
    logged = [json.loads(line) for line in (tmp_path / "ltrgr" / "train_metrics.jsonl").read_text().splitlines()]
    assert {"rank_loss", "generation_loss", "pairs_ordered"} <= set(logged[-1])
    assert (tmp_path / "ltrgr" / "checkpoints" / "2").is_dir()
