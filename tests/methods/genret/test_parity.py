"""GenRET against its authors' code: the fixtures tests/fixtures/genret_parity/<shape>/ (written by tools/genret_fixtures.py
from sunnweiwei/GenRet's run.py) is matched by ours with the released code's settings; a swapped weight is caught;
each flag that reproduces the released code changes what it should."""

import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.methods.genret import parity, training
from tests.conftest import REPO, tool

FIXTURES = REPO / "tests" / "fixtures" / "genret_parity"
SHAPES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
FIXTURE = FIXTURES / "t3_k8_relu"  # the shape the single-fixture tests below edit
# float32 here and in their run: the logits and losses agree to ~6e-7 of their magnitude (the gated shape's small
# contrastive loss to 8e-6); 1e-5 leaves room for another BLAS's summation order, and a swapped weight moves them by
# more than 1e-2
TOLERANCE = 1e-5


def test_two_shapes_are_stored():
    metas = [__import__("json").loads((FIXTURES / s / "meta.json").read_text()) for s in SHAPES]
    assert len(SHAPES) >= 2 and len({(m["positions"], m["codes"]) for m in metas}) == len(SHAPES)
    assert any(m.get("sizes", {}).get("feed_forward") == "gated-gelu" for m in metas)


@pytest.mark.parametrize("shape", SHAPES)
def test_ours_matches_genrets_own_code(shape):
    result = parity.check_fixture(FIXTURES / shape, search=False)
    assert parity.within(result, TOLERANCE), result
    assert result["balanced_codes_identical"]
    assert {"query_logits_rel_diff", "loss_rec_rel_diff", "kmeans_normed_rel_diff", "sinkhorn_plan_rel_diff",
            "loss_code_rel_diff"} <= set(result)


@pytest.mark.slow  # compiles a beam search per shape (the default tier's time)
@pytest.mark.parametrize("shape", SHAPES)
def test_ours_searches_like_genrets_own_inference(shape):
    result = parity.check_fixture(FIXTURES / shape)
    assert parity.within(result, TOLERANCE), result
    assert result["search_rankings_identical"] and result["search_scores_rel_diff"] <= TOLERANCE


@pytest.mark.slow  # a seeded sample of 20 tensors a shape; the full sweep's counts: docs/results.md
@pytest.mark.parametrize("shape", SHAPES)
def test_a_sample_of_single_tensor_mutations_is_caught(shape, capsys):
    from tests.conftest import mutation_report

    code, report = mutation_report("genret", FIXTURES / shape, capsys, 20, 76, TOLERANCE)
    assert code == 0 and report["missed"] == [] and report["mutations"] == 20, report


def _copy_with(tmp_path, change):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "fixture"
    shutil.copytree(FIXTURE, folder)
    tensors = load_file(str(folder / "head.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "head.safetensors"))
    return folder


@pytest.mark.slow  # two more parity runs (the default tier's time)
def test_a_swapped_weight_is_caught(tmp_path):
    def swap_codes(t):  # two codes of position 1's codebook trade places
        w = t["centroids.1.weight"].copy()
        w[[2, 5]] = w[[5, 2]]
        t["centroids.1.weight"] = w

    result = parity.check_fixture(_copy_with(tmp_path, swap_codes), search=False)
    assert not parity.within(result, TOLERANCE)
    assert result["doc_logits_rel_diff"] > 1e-2

    def swap_start(t):  # the learned start vector against another row of the first input table
        w = t["code_embedding.0.weight"].copy()
        w[[0, 3]] = w[[3, 0]]
        t["code_embedding.0.weight"] = w

    result = parity.check_fixture(_copy_with(tmp_path / "b", swap_start), search=False)
    assert result["doc_state_rel_diff"] > 1e-2 and not parity.within(result, TOLERANCE)


@pytest.mark.slow  # over 5 s: the default tier keeps within 10 minutes
def test_each_released_code_flag_changes_what_it_should():
    fx = parity.Fixture(FIXTURE)
    model, params = fx.model, fx.params(fx.tensors)
    tokens = jnp.asarray(np.arange(2, 12)[None, :], jnp.int32)
    codes = jnp.zeros((1, model.head.length), jnp.int32)
    h, raw = model.positions(params, tokens, codes)
    # raw_logits = False: the T5 v1.0 head's d_model^-0.5, exactly
    scaled = parity.genret.GenretRetriever(model.config, parity.genret.GenretHead(
        length=model.head.length, codes=model.head.codes, start="learned"))
    _, logits = scaled.positions(params, tokens, codes)
    np.testing.assert_allclose(logits, raw * model.config.d_model ** -0.5, rtol=1e-5, atol=1e-6)
    # start = "text": position 0 reads the start token's embedding, so its state changes (the others too)
    text = parity.genret.GenretRetriever(model.config, parity.genret.GenretHead(
        length=model.head.length, codes=model.head.codes, start="text", raw_logits=True))
    h_text, _ = text.positions({**params, "head": {k: v for k, v in params["head"].items() if k != "start"}},
                               tokens, codes)
    assert float(jnp.abs(h_text[:, 0] - h[:, 0]).max()) > 1e-3


def test_the_released_sinkhorn_by_hand():
    # scores centred and divided by half their range: [[1, -1], [1, 1]] → each code's column softmax over the rows
    s = jnp.array([[3.0, 1.0], [3.0, 3.0]])
    plan = np.asarray(training.released_plan(s))
    x = (np.array([[3.0, 1.0], [3.0, 3.0]]) - 2.0) / (1.0 + 1e-5)
    expect = np.exp(x) / np.exp(x).sum(0, keepdims=True) / 2
    np.testing.assert_allclose(plan, expect, rtol=1e-6)
    assert np.allclose(plan.sum(0), 0.5)  # per-code mass 1/K ...
    assert not np.allclose(plan.sum(1), 0.5)  # ... but not per row (one-sided)
    # the two kinds disagree where the row marginal matters: every row prefers code 0
    skew = jnp.array([[2.0, 0.0], [1.9, 0.0], [1.8, 0.0], [1.7, 0.0]])
    balanced = training.balanced_codes(skew, 0.1, 200, "balanced").tolist()
    assert sorted(balanced) == [0, 0, 1, 1]
    assert training.balanced_codes(skew, 0.1, kind="released").tolist() != balanced
    with pytest.raises(ValueError, match="genret_objective.sinkhorn"):
        training.balanced_codes(skew, kind="both")


def test_mask_duplicates_off_counts_the_other_copy_as_a_negative():
    scores = jnp.array([[2.0, 2.0, 0.0], [2.0, 2.0, 0.0], [0.0, 0.0, 1.0]])
    rows = jnp.array([7, 7, 3])  # rows 0 and 1 hold the same document
    masked = float(training.in_batch_ce(scores, rows))
    plain = float(training.in_batch_ce(scores, rows, mask_duplicates=False))
    lse = np.log(np.exp(2) + np.exp(2) + 1)
    assert plain == pytest.approx((2 * (lse - 2) + (np.log(2 + np.e) - 1)) / 3, rel=1e-6)
    assert masked < plain


def test_the_fixture_tool_refuses_a_folder_without_their_code(tmp_path, capsys):
    assert tool("genret_fixtures").main(["--genret_repo", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "no run.py" in capsys.readouterr().err
