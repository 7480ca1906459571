"""The backbones against transformers by logits and gradients (evaluation/gradient_parity.py), on the stored tiny
random models tests/fixtures/<arch>_parity/<shape>/ (tools/backbone_fixtures.py): every stored shape matches, and
a swapped row of any tensor is caught, including the ones the logits alone let through."""

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from gr_jax.evaluation import gradient_parity  # noqa: E402
from tests.conftest import REPO, run_tool  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
CASES = [(arch, p.name) for arch in gradient_parity.ARCHS
         for p in sorted((FIXTURES / f"{arch}_parity").iterdir()) if p.is_dir()]


def _folder(arch, shape):
    return FIXTURES / f"{arch}_parity" / shape


def test_two_shapes_per_backbone_are_stored():
    for arch in gradient_parity.ARCHS:
        metas = [json.loads((_folder(arch, s) / "meta.json").read_text()) for a, s in CASES if a == arch]
        assert len(metas) >= 2, arch
        assert len({json.dumps(m["sizes"], sort_keys=True) for m in metas}) == len(metas), arch
        assert any(m["sizes"]["layers"] >= 3 for m in metas), arch
    t5_metas = [json.loads((_folder("t5", s) / "meta.json").read_text()) for a, s in CASES if a == "t5"]
    assert any(m["sizes"].get("t5_version") == "1.1" for m in t5_metas)  # the gated feed-forward


@pytest.mark.parametrize("arch,shape", CASES)
def test_logits_and_every_gradient_match(arch, shape):
    result = gradient_parity.check(arch, _folder(arch, shape))
    assert gradient_parity.within(result), result
    assert result["gradients_compared"] >= 20


def test_a_swap_the_logits_let_through_is_caught_by_the_gradients():
    """The case that made this check: two rows of BART's first feed-forward swapped move the logits by less than
    the old 1e-4 tolerance, and that tensor's gradient by its own order of magnitude."""
    bb = gradient_parity.Backbone("bart", _folder("bart", "d32_l2"))
    name = "model.encoder.layers.0.fc1.weight"
    result = bb.compare({**bb.tensors, name: gradient_parity.swapped(bb.tensors[name])})
    assert result["logits_rel_diff"] < 1e-4
    assert result["gradient_rel_diff"] > 0.1
    assert not gradient_parity.within(result)


def test_inert_tensors_change_nothing():
    """A key projection's bias cannot change any output (softmax ignores a per-row shift): the reason the sweep
    leaves it out. Changing it entirely leaves the logits within float noise."""
    bb = gradient_parity.Backbone("bart", _folder("bart", "d24_l3"))
    inert = gradient_parity.inert(_folder("bart", "d24_l3"))
    assert inert
    changed = {n: bb.tensors[n] + 5.0 for n in inert}
    result = bb.compare({**bb.tensors, **changed})
    assert result["logits_rel_diff"] < 1e-5


def _mutate(arch, shape, capsys, sample, tolerance=None):
    argv = ["--arch", arch, "--hf_dir", str(_folder(arch, shape)), "--mutate", "--mutate_sample", str(sample)]
    code, out, _ = run_tool("check_parity", argv + ([] if tolerance is None else ["--tolerance", str(tolerance)]),
                            capsys)
    return code, json.loads(out.strip().splitlines()[-1])


def test_a_loose_check_lists_its_misses_and_exits_1(capsys):
    code, report = _mutate("llama", "kv2_untied", capsys, sample=3, tolerance=1e9)
    assert code == 1
    assert report["mutations"] == 3 and report["caught"] == 0 and len(report["missed"]) == 3


@pytest.mark.slow  # a seeded sample of 12 tensors per shape through the CLI (~5 s each); full counts: docs/results.md
@pytest.mark.parametrize("arch,shape", CASES)
def test_mutate_sample_misses_nothing(arch, shape, capsys):
    code, report = _mutate(arch, shape, capsys, sample=12)
    assert code == 0, report
    assert report["mutations"] == 12 and report["missed"] == []
    assert np.isfinite(report["gradient_rel_diff"])


def test_the_fixture_tool_leaves_no_constant_tensor_and_records_its_command(tmp_path, capsys):
    from gr_jax.backbones import t5_convert

    out = tmp_path / "bart_small"
    code, _, _ = run_tool("backbone_fixtures", ["--arch", "bart", "--out", str(out), "--d_model", "16", "--heads",
                                                "2", "--decoder_heads", "2", "--layers", "1", "--seed", "3"], capsys)
    assert code == 0
    tensors = t5_convert.read_hf_tensors(out)
    constant = [n for n, v in tensors.items() if np.all(v == v.reshape(-1)[0])]
    assert constant == []  # HF leaves biases at 0 and norms at 1: the tool spreads them
    meta = json.loads((out / "meta.json").read_text())
    assert meta["sizes"]["d_model"] == 16 and meta["seed"] == 3
    assert "--d_model 16" in meta["command"] and "--seed 3" in meta["command"]
    code, _, err = run_tool("backbone_fixtures", ["--arch", "bart", "--out", str(out), "--tied"], capsys)
    assert code == 2  # --tied is Llama's
