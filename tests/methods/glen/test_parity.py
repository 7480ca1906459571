"""GLEN against its authors' code on every stored shape (tests/fixtures/glen_parity/<shape>/: the shared peer
fixture and the ones tools/glen_fixtures.py wrote from skleee/GLEN), and a swapped row of any tensor caught."""

import json

import numpy as np
import pytest

from gr_jax.methods.glen import parity
from tests.conftest import REPO, fixture_tool_refuses, mutation_report

FIXTURES = REPO / "tests" / "fixtures" / "glen_parity"
SHAPES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
# float32 here and in their run: every quantity agrees to ≤ 2e-6 of its magnitude on these fixtures; 1e-5 leaves
# room for another BLAS's summation order, and a swapped row moves the step tables by far more (the sweep below)
TOLERANCE = 1e-5


def _meta(shape):
    return json.loads((FIXTURES / shape / "meta.json").read_text())


def test_several_shapes_are_stored():
    assert len(SHAPES) >= 3
    metas = [_meta(s) for s in SHAPES]
    sizes = {(m.get("tiny_config", m.get("sizes"))["d_model"], m["M"]) for m in metas}
    assert len(sizes) == len(SHAPES)
    made = [m for m in metas if "sizes" in m]  # ours: gated, deeper, long padding in the queries
    assert any(m["feed_forward"] == "gated-gelu" and m["sizes"]["encoder_layers"] > 2 for m in made)
    assert any(min(m["query_lengths"]) <= 3 and m["max_len"] >= 40 for m in made)


@pytest.mark.parametrize("shape", SHAPES[:1])
def test_ours_matches_their_code(shape):
    result = parity.check_fixture(FIXTURES / shape)
    assert parity.within(result, TOLERANCE), result
    assert result["rankings_identical"] and result["final_beams_identical"]


@pytest.mark.slow  # a search compile per shape and setting (~20 s each)
@pytest.mark.parametrize("shape", SHAPES[1:])
def test_ours_matches_their_code_on_every_shape(shape):
    result = parity.check_fixture(FIXTURES / shape)
    assert parity.within(result, TOLERANCE), result


def test_mutations_of_each_kind_are_caught():
    """The shared embedding, a relative-position table, an attention projection, a feed-forward matrix and a norm
    (at the peer fixture's ones: its first entry negated, `swapped_or_negated`): each fails the check."""
    names = ["shared.weight", "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
             "decoder.block.1.layer.1.EncDecAttention.v.weight", "encoder.block.1.layer.1.DenseReluDense.wi.weight",
             "decoder.final_layer_norm.weight"]
    caught = parity.mutations(FIXTURES / "peer_v512_d64", TOLERANCE, names=names)
    assert caught == {n: True for n in names}
    norm = parity.Fixture(FIXTURES / "peer_v512_d64").tensors["decoder.final_layer_norm.weight"]
    assert np.all(norm == 1.0)  # why the peer fixture needs the negation


def test_a_check_too_loose_to_see_a_mutation_exits_1(capsys):
    code, report = mutation_report("glen", FIXTURES / "v96_d32_relu", capsys, 6, 0, tolerance=1e9)
    # a tolerance of 1e9 still sees what changes the docids; the rest is missed (this sample holds two such tensors)
    assert code == 1 and report["mutations"] == 6
    assert set(report["missed"]) == {"decoder.block.1.layer.0.SelfAttention.k.weight", "decoder.final_layer_norm.weight"}


@pytest.mark.slow  # a seeded sample of 12 tensors a shape (~10 s); the full sweep's counts: docs/results.md
@pytest.mark.parametrize("shape", SHAPES)
def test_a_sample_of_single_tensor_mutations_is_caught(shape, capsys):
    code, report = mutation_report("glen", FIXTURES / shape, capsys, 12, 76)
    assert code == 0 and report["missed"] == [] and report["mutations"] == 12, report


def test_the_fixture_tool_refuses_a_folder_without_their_code_or_sizes_it_cannot_run(tmp_path, capsys):
    name, out = "glen_fixtures", tmp_path / "o"
    fixture_tool_refuses(name, ["--glen_repo", str(tmp_path), "--out", str(out)], "not a GLEN checkout", out, capsys)
    fixture_tool_refuses(name, ["--glen_repo", str(tmp_path), "--out", str(out), "--settings", "20", "--docs", "30"], "2 × --settings ≤ --docs", out, capsys,
                         parser_error=True)
