"""RIPOR's T5 layout against its authors' code: the fixtures tests/fixtures/ripor_parity/<shape>/ (written by
tools/ripor_fixtures.py from HansiZeng/RIPOR) — the centroid assignment, the prefix-oriented ranking loss and the
constrained beam search — are matched on every stored shape, and a swapped row of any tensor is caught."""

import json

import numpy as np
import pytest

from gr_jax.methods.ripor import parity
from gr_jax.evaluation.mutations import swapped
from tests.conftest import REPO, mutation_report

FIXTURES = REPO / "tests" / "fixtures" / "ripor_parity"
SHAPES = sorted((p.name for p in FIXTURES.iterdir() if p.is_dir()), key=lambda n: (n != "m8_relu", n))
# float32 here and in their run: the prefix scores, the loss and the beam scores agree to ~3e-6 of their
# magnitude on these fixtures; 1e-5 leaves room for another BLAS's summation order, and a swapped row moves them
# by more than 1e-3 (the mutation sweep below)
TOLERANCE = 1e-5


def test_two_shapes_are_stored():
    metas = [json.loads((FIXTURES / s / "meta.json").read_text()) for s in SHAPES]
    assert len(SHAPES) >= 2
    assert len({(m["levels"], m["codes"], m["d_model"], m["feed_forward"]) for m in metas}) == len(SHAPES)
    assert any(m["feed_forward"] == "gated-gelu" and m["encoder_layers"] > 2 for m in metas)
    # long padding: a 3-token query beside one of the full width
    assert any(min(m["query_lengths"]) == 3 and max(m["query_lengths"]) >= 20 for m in metas)


def test_ours_matches_their_code():
    result = parity.check_fixture(FIXTURES / SHAPES[0], search=False)
    assert parity.within(result, TOLERANCE), result
    assert result["centroid_assignment_identical"]
    assert {"pos_prefix_scores_rel_diff", "neg_prefix_scores_rel_diff", "lng_knp_loss_rel_diff"} <= set(result)


@pytest.mark.slow  # compiles a 12-layer decoder's beam search per shape (~30 s; the default tier's time)
@pytest.mark.parametrize("shape", SHAPES)
def test_ours_matches_their_code_and_search_on_every_shape(shape):
    result = parity.check_fixture(FIXTURES / shape)
    assert parity.within(result, TOLERANCE), result
    assert result["beam_docids_identical"] and "beam_scores_rel_diff" in result


def test_swapping_rows_reaches_every_kind_of_tensor():
    """`swapped` changes every tensor the fixtures hold: none is a no-op (tests/evaluation/test_mutations.py has
    the swap by hand)."""
    fx = parity.Fixture(FIXTURES / SHAPES[0])
    assert all(not np.array_equal(swapped(v), v) for v in fx.tensors.values())


def test_mutations_of_each_kind_are_caught():
    """A norm, an attention projection, the shared embedding, the learned start, the last input table (read only
    by the assignment: their decoder never reads it) and an output codebook: each swap fails the check."""
    names = ["decoder.block.5.layer.2.layer_norm.weight", "encoder.block.1.layer.0.SelfAttention.q.weight",
             "shared.weight", "start_token_embed", "list_decoder_embeds.7.weight", "list_output_embeds.3.weight"]
    caught = parity.mutations(FIXTURES / SHAPES[0], TOLERANCE, names=names)
    assert caught == {n: True for n in names}


def test_a_check_too_loose_to_see_a_mutation_exits_1(capsys):
    code, report = mutation_report("ripor", FIXTURES / SHAPES[0], capsys, 6, 3, tolerance=1e9)
    assert code == 1 and report["missed"] and report["mutations"] == 6
    # what a tolerance of 1e9 still sees: the code tables, through the identical assignment
    assert all(not n.startswith("list_") for n in report["missed"])


@pytest.mark.slow  # a seeded sample of 40 tensors a shape (~15 s); the full sweep's counts: docs/results.md
@pytest.mark.parametrize("shape", SHAPES)
def test_a_sample_of_single_tensor_mutations_is_caught(shape, capsys):
    code, report = mutation_report("ripor", FIXTURES / shape, capsys, 40, 75)
    assert code == 0 and report["missed"] == [] and report["mutations"] == 40, report


def test_the_fixture_tool_refuses_a_folder_without_their_code(tmp_path, capsys):
    from tests.conftest import tool

    assert tool("ripor_fixtures").main(["--ripor_repo", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "not a RIPOR checkout" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_fixture_command_keeps_no_machine_path():
    portable = __import__("tests.conftest", fromlist=["tool"]).tool("ripor_fixtures")._portable
    assert portable(["--ripor_repo", "/home/x/RIPOR", "--out", "f", "--seed", "1"]) == \
        ["--ripor_repo", "RIPOR", "--out", "f", "--seed", "1"]
    assert portable(["--ripor_repo=/abs/RIPOR"]) == ["--ripor_repo=RIPOR"]
