"""NCI as its authors released it: the fixtures tests/fixtures/nci_parity/<shape>/ (written by tools/nci_fixtures.py
from NCI's vendored modeling_t5.py) are matched by `methods/nci/released.py` on every stored shape, their decoder
mask over padded targets included; a swapped weight is caught; the consistency flag changes the loss as it should;
their docids and checkpoint keys are read or refused by name."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.methods.nci import model as nci_model
from gr_jax.methods.nci import parity, released
from tests.conftest import REPO, tool

FIXTURES = REPO / "tests" / "fixtures" / "nci_parity"
SHAPES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
FIXTURE = FIXTURES / "v10_d32"  # the shape the single-fixture tests below edit
# float32 here and in their run: logits (padded positions included), losses and beam scores agree to ~7e-7 of their
# magnitude on every stored shape; 1e-5 leaves room for another BLAS, a swapped weight moves them by more than 1e-2
TOLERANCE = 1e-5


def test_two_shapes_with_padded_targets_are_stored():
    metas = [__import__("json").loads((FIXTURES / s / "meta.json").read_text()) for s in SHAPES]
    assert len(SHAPES) >= 2 and len({tuple(sorted(m["sizes"].items())) for m in metas}) == len(SHAPES)
    labels = [np.load(FIXTURES / s / "inputs.npz")["labels"] for s in SHAPES]
    assert all((lab == 0).any() for lab in labels) and max(int((lab == 0).sum()) for lab in labels) >= 6


@pytest.mark.parametrize("shape", SHAPES)
def test_ours_matches_ncis_own_code(shape):
    result = parity.check_fixture(FIXTURES / shape, search=False)
    assert parity.within(result, TOLERANCE), result
    assert result["train_mask_identical"] and {"train_contrast_rel_diff", "eval_logits_rel_diff"} <= set(result)


def test_without_their_decoder_mask_the_contrast_term_leaves_the_tolerance():
    """`decoder_padding_mask=False` (padded targets visible as decoder keys): the real positions' logits are
    unchanged, the Contrast term (which reads the padded rows' states) and the loss move past 1e-5 on the padded
    shape."""
    settings, meta, tensors, inputs, outputs = parity._read(FIXTURES / "v7_d24_padded")
    model, params = parity.fixture_model(settings, meta, tensors)
    visible = released.NciReleasedRetriever(model.config, model.head, decoder_padding_mask=False)
    batch = {"inputs": jnp.asarray(inputs["queries"], jnp.int32), "targets": jnp.asarray(inputs["labels"], jnp.int32),
             "augmented_inputs": jnp.asarray(inputs["augmented"], jnp.int32)}
    key = jax.random.PRNGKey(0)
    terms = {}
    for name, m in (("masked", model), ("visible", visible)):
        _, metrics = nci_model.nci_objective(m, params, batch, key, consistency="contrast")
        terms[name] = float(metrics["consistency_contrast"][0] / metrics["consistency_contrast"][1])
    theirs = float(outputs["train_contrast"]) / 0.15
    assert abs(terms["masked"] - theirs) <= TOLERANCE * abs(theirs)
    assert abs(terms["visible"] - theirs) > TOLERANCE * abs(theirs)


@pytest.mark.slow  # compiles a beam search per shape (the default tier's time)
@pytest.mark.parametrize("shape", SHAPES)
def test_ours_searches_like_ncis_own_generate(shape):
    result = parity.check_fixture(FIXTURES / shape)
    assert parity.within(result, TOLERANCE), result
    assert result["beams_identical"]


@pytest.mark.slow  # a seeded sample of 20 parameters a shape; the full sweep's counts: docs/results.md
@pytest.mark.parametrize("shape", SHAPES)
def test_a_sample_of_single_tensor_mutations_is_caught(shape, capsys):
    from tests.conftest import mutation_report

    code, report = mutation_report("nci", FIXTURES / shape, capsys, 20, 76, TOLERANCE)
    assert code == 0 and report["missed"] == [] and report["mutations"] == 20, report


def test_a_tied_table_is_mutated_with_its_copies():
    caught = parity.mutations(FIXTURE, TOLERANCE, names=["decode_embeddings.weight",
                                                         "adaptor.layers.0.multihead_attn.in_proj_weight"])
    assert caught == {"decode_embeddings.weight": True, "adaptor.layers.0.multihead_attn.in_proj_weight": True}


def _with(tmp_path, change):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "fixture"
    shutil.copytree(FIXTURE, folder)
    tensors = load_file(str(folder / "weights.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "weights.safetensors"))
    return folder


@pytest.mark.slow  # three more parity runs (the default tier's time)
@pytest.mark.parametrize("what", ["adaptor", "cross_bias", "docid_table"])
def test_a_swapped_weight_is_caught(tmp_path, what):
    def change(t):
        if what == "adaptor":  # two (position, code) columns of the adapted weight trade places
            w = t["adaptor_linear.weight"].reshape(32, 52, 32).copy()
            w[:, [3, 14]] = w[:, [14, 3]]
            t["adaptor_linear.weight"] = w.reshape(-1, 32)
        elif what == "cross_bias":  # transformers 3.x's cross-attention bias: two heads swapped
            k = "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"
            t[k] = t[k][:, [1, 0, 2, 3]].copy()
        else:  # two codes of position 0 in the tied docid table (input and output)
            for k in ("decode_embeddings.weight", "lm_head.weight", "decoder.embed_tokens.weight"):
                if k in t:
                    w = t[k].copy()
                    w[[2, 5]] = w[[5, 2]]
                    t[k] = w

    result = parity.check_fixture(_with(tmp_path, change), search=False)
    assert not parity.within(result, TOLERANCE)
    assert result["eval_logits_rel_diff"] > 1e-2


def _fixture_model():
    settings, meta, tensors, inputs, _ = parity._read(FIXTURE)
    model, params = parity.fixture_model(settings, meta, tensors)
    return model, params, inputs


def test_the_consistency_flag_changes_the_second_term_only():
    model, params, inputs = _fixture_model()
    batch = {"inputs": jnp.asarray(inputs["queries"]), "targets": jnp.asarray(inputs["labels"])}
    key = jax.random.PRNGKey(0)  # every dropout rate of the fixture model is 0: both passes are equal
    objective = jax.jit(lambda p, b, k, kind: nci_model.nci_objective(model, p, b, k, consistency=kind),
                        static_argnums=3)  # compiled whole: less time than op by op
    contrast, m = objective(params, batch, key, "contrast")
    kl, mk = objective(params, batch, key, "kl")
    # the same cross-entropy; equal passes have no KL, while the Contrast term of equal rows is large
    assert float(m["loss"][0] / m["loss"][1]) == pytest.approx(float(mk["loss"][0] / mk["loss"][1]), rel=1e-5)
    assert float(mk["consistency_kl"][0]) == pytest.approx(0.0, abs=1e-5)
    assert float(contrast - kl) == pytest.approx(0.15 * float(m["consistency_contrast"][0] / m["consistency_contrast"][1]),
                                                 rel=1e-4)
    with pytest.raises(ValueError, match="nci_objective.consistency"):
        nci_model.nci_objective(model, params, batch, key, consistency="both")


def test_the_contrast_term_by_hand():
    # two pairs, one position: row a's positive is a ± 2; the softmax over the other rows, then CE on probabilities
    s = jnp.array([[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 0.1]], [[0.1, 1.0]]])
    got = float(nci_model.contrast(s, 2))
    x = np.asarray(s[:, 0])
    sim = x @ x.T - 1e9 * np.eye(4)
    p = np.exp(sim - sim.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    pos = [2, 3, 0, 1]
    want = np.mean([np.log(np.exp(p[a]).sum()) - p[a, pos[a]] for a in range(4)])
    assert got == pytest.approx(want, rel=1e-6)


def test_nci_docids_in_their_flat_vocabulary():
    from gr_jax.data.readers import Corpus
    from gr_jax.docids.base import FitContext

    corpus = Corpus(["a", "b", "c"], ["x", "y", "z"])
    scheme = released.NciDocids(codes=30, positions=10)
    with pytest.raises(ValueError, match="no semantic ids"):
        scheme.fit(corpus, FitContext())
    scheme.fit(corpus, FitContext(extras={"semantic_ids": {"a": (3, 14, 2), "b": (0,), "c": (29, 29, 29, 1)}}))
    table = scheme.assign(corpus)
    assert [list(table.sequence(i)) for i in range(3)] == [[5, 46, 64], [2], [31, 61, 91, 93]]
    bad = released.NciDocids(codes=30, positions=3).fit(corpus, FitContext(extras={"semantic_ids": {
        "a": (1, 2, 3), "b": (0,), "c": (0,)}}))
    with pytest.raises(ValueError, match="does not fit 2 positions"):
        bad.assign(corpus)


def test_their_checkpoint_keys_are_read_or_refused_by_name():
    from safetensors.numpy import load_file

    settings, meta, _, _, _ = parity._read(FIXTURE)
    tensors = {f"model.{k}": v for k, v in load_file(str(FIXTURE / "weights.safetensors")).items()}  # Lightning's
    model, _ = parity.fixture_model(settings, meta, load_file(str(FIXTURE / "weights.safetensors")))
    p = released.params_from_nci(tensors, model.config, model.head)
    assert p["head"]["adapt"].shape == (32, 52, 32)
    wrong = dict(tensors)
    wrong["model.lm_head.weight"] = wrong["model.lm_head.weight"] + 1.0
    with pytest.raises(ValueError, match="lm_head.weight differs from decode_embeddings"):
        released.params_from_nci(wrong, model.config, model.head)
    small = released.NciFlatHead(codes=9, positions=5, adaptor_layers=2)
    with pytest.raises(ValueError, match=r"decode_embeddings.weight is \(52, 32\)"):
        released.params_from_nci(tensors, model.config, small)
    one = released.NciFlatHead(codes=10, positions=5, adaptor_layers=1)
    with pytest.raises(ValueError, match="more layers than NciFlatHead.adaptor_layers = 1"):
        released.params_from_nci(tensors, model.config, one)


def test_the_fixture_tool_refuses_a_folder_without_their_code(tmp_path, capsys):
    assert tool("nci_fixtures").main(["--nci_repo", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "NCI_model/transformers/modeling_t5.py" in capsys.readouterr().err
