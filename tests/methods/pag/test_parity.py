"""PAG against its authors' code on every stored shape (tests/fixtures/pag_parity/<shape>/: the shared peer fixture
and the ones tools/pag_fixtures.py wrote from HansiZeng/PAG), and a swapped row of any tensor caught."""

import json

import pytest

from gr_jax.methods.pag import parity
from tests.conftest import REPO, fixture_tool_refuses, mutation_report

FIXTURES = REPO / "tests" / "fixtures" / "pag_parity"
SHAPES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
# float32 here and in their run: every quantity agrees to ≤ 2e-6 of its magnitude on these fixtures (step logits
# through our cache against their full recompute); 1e-5 leaves room for another BLAS, and a swapped row moves the
# lexical representations or the step logits by far more (the sweep below)
TOLERANCE = 1e-5


def _meta(shape):
    return json.loads((FIXTURES / shape / "meta.json").read_text())


def test_several_shapes_are_stored():
    assert len(SHAPES) >= 3
    metas = [_meta(s) for s in SHAPES]
    shapes = {(m["tiny_config"]["d_model"], m["tiny_config"]["levels"], m["tiny_config"]["codes"]) for m in metas}
    assert len(shapes) == len(SHAPES)
    made = [m for m in metas if "sizes" in m]  # ours: gated, deeper, short queries padded in the batch
    assert any(m["feed_forward"] == "gated-gelu" and m["tiny_config"]["enc_layers"] > 2 for m in made)
    assert any(min(m["query_lengths"]) <= 3 < max(m["query_lengths"]) for m in made)


@pytest.mark.slow  # the decoding compiles per beam size (~40 s a shape); the peer shape: test_model.py
@pytest.mark.parametrize("shape", [s for s in SHAPES if not s.startswith("peer")])
def test_ours_matches_their_code_on_every_shape(shape):
    result = parity.check_fixture(FIXTURES / shape)
    assert parity.within(result, TOLERANCE), result
    assert result["rankings_identical"] and result["final_hypotheses_identical"]


def test_mutations_of_each_kind_are_caught():
    """The shared embedding (rows 0 and 1: pad and eos), a relative-position table, a cross-attention projection, a
    feed-forward matrix and a norm: each fails the check (without the decoding, which the slow tier adds)."""
    names = ["shared.weight", "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
             "decoder.block.1.layer.1.EncDecAttention.k.weight", "encoder.block.0.layer.1.DenseReluDense.wo.weight",
             "decoder.block.1.layer.2.layer_norm.weight"]
    caught = parity.mutations(FIXTURES / "l4_k12_relu", TOLERANCE, names=names)
    assert caught == {n: True for n in names}


def test_two_docid_token_rows_swapped_are_caught():
    fx = parity.Fixture(FIXTURES / "l4_k12_relu")
    base = int(fx.meta["tiny_config"]["base_vocab"])
    w = fx.tensors["shared.weight"].copy()
    w[[base, base + 1]] = w[[base + 1, base]]  # the first two codes of level 0
    assert not parity.within(fx.compare({**fx.tensors, "shared.weight": w}, search=False), TOLERANCE)


def test_a_check_too_loose_to_see_a_mutation_exits_1(capsys):
    code, report = mutation_report("pag", FIXTURES / "l4_k12_relu", capsys, 0, 0, tolerance=1e9)
    # a tolerance of 1e9 still sees what changes the set docids or the planning set; the rest is missed
    assert code == 1 and report["missed"] and report["caught"] < report["mutations"]


@pytest.mark.slow  # a seeded sample of 12 tensors a shape (~10 s); the full sweep's counts: docs/results.md
@pytest.mark.parametrize("shape", SHAPES)
def test_a_sample_of_single_tensor_mutations_is_caught(shape, capsys):
    code, report = mutation_report("pag", FIXTURES / shape, capsys, 12, 77)
    assert code == 0 and report["missed"] == [] and report["mutations"] == 12, report


def test_the_fixture_tool_refuses_a_folder_without_their_code_or_sizes_it_cannot_run(tmp_path, capsys):
    name, out = "pag_fixtures", tmp_path / "o"
    fixture_tool_refuses(name, ["--pag_repo", str(tmp_path), "--out", str(out)], "not a PAG checkout", out, capsys)
    fixture_tool_refuses(name, ["--pag_repo", str(tmp_path), "--out", str(out), "--planning", "40", "--docs", "30"], "--planning ≤ --docs", out, capsys,
                         parser_error=True)
