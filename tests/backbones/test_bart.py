"""BART: parity with transformers' BartForConditionalGeneration (logits, cached steps, greedy and constrained
beam search) in both directions of the conversion, fairseq checkpoints (key names, settings, the unpickling
allowlist), the library's id order and the byte-level BPE tokenizer."""

import argparse
import json

import chex
import numpy as np
import pytest

from gr_jax.backbones import bart, bart_convert, bart_parity, bart_tokenizer
from gr_jax.backbones.t5_convert import CheckpointError
from tests.conftest import require

# float32 through a few layers of d_model 32: differences of summation order stay near 1e-7 of the logits'
# magnitude (~3); 1e-5 of the magnitude leaves room for XLA's fusion while a mis-mapped weight moves them by O(1)
REL = 1e-5


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    require("torch")
    return bart_parity.write_random_hf_bart(tmp_path_factory.mktemp("bart") / "hf", seed=3)


@pytest.fixture(scope="module")
def unbiased_hf_dir(hf_dir, tmp_path_factory):
    """`hf_dir` without the logits bias: the same network as a fairseq checkpoint can hold."""
    model = bart_parity.load_torch_bart(hf_dir)
    model.final_logits_bias.zero_()
    out = tmp_path_factory.mktemp("bart") / "unbiased"
    model.save_pretrained(str(out))
    return out


def _fairseq_file(path, hf_tensors, settings: dict, as_cfg: bool = False, extra=None):
    import torch

    state = {"model": {k: torch.tensor(v) for k, v in bart_convert.hf_to_fairseq_keys(hf_tensors).items()}}
    if as_cfg:
        state["cfg"] = {"model": settings, "task": {"_name": "translation"}}
    else:
        state["args"] = argparse.Namespace(**settings)
    if extra:
        state.update(extra)
    torch.save(state, str(path))
    return path


class AverageMeter:
    """Stands for the training meters older fairseq releases pickle into `extra_state`."""

    def __init__(self):
        self.avg = 0.5


SETTINGS = {"arch": "bart_large", "encoder_attention_heads": 4, "decoder_attention_heads": 2, "activation_fn": "gelu",
            "no_scale_embedding": False, "dropout": 0.0, "share_all_embeddings": True}


@pytest.mark.torch
def test_logits_cached_steps_and_greedy_match_transformers(hf_dir):
    result = bart_parity.check_parity(hf_dir)
    assert result["relative_diff_logits"] < REL, result
    assert result["max_abs_diff_encoder"] < REL * 10, result  # LayerNorm outputs are O(1)
    assert result["greedy_identical"], result


@pytest.mark.slow  # the default tier's parity checks; this shows they can fail
@pytest.mark.torch
def test_a_swapped_weight_breaks_parity(hf_dir, tmp_path):
    """The check can fail: the value and output projections of the decoder's first cross-attention swapped."""
    import torch
    import transformers

    model = transformers.BartForConditionalGeneration.from_pretrained(str(hf_dir)).eval()
    attn = model.model.decoder.layers[0].encoder_attn
    with torch.no_grad():
        v = attn.v_proj.weight.clone()
        attn.v_proj.weight.copy_(attn.out_proj.weight)
        attn.out_proj.weight.copy_(v)
    model.save_pretrained(str(tmp_path / "swapped"))
    config, params = bart_convert.load_hf(tmp_path / "swapped")
    cross = params["decoder"]["layers_0"]["cross_attention"]
    cross["v"]["kernel"], cross["o"]["kernel"] = cross["o"]["kernel"], cross["v"]["kernel"]  # undone on our side
    ids, mask = bart_parity.random_batch(config, 2, 12, 0)
    dec, _ = bart_parity.random_batch(config, 2, 4, 1)
    _, ours = bart_parity.forward(config, params, ids, mask, dec)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                    decoder_input_ids=torch.tensor(dec)).logits.numpy()
    assert np.max(np.abs(ours - ref)) / np.max(np.abs(ref)) > 100 * REL


@pytest.mark.slow  # the default tier checks logits, cached steps and greedy tokens (the first test)
@pytest.mark.torch
def test_export_loads_in_transformers_with_the_same_logits(hf_dir, tmp_path):
    """The other direction: our parameters written as an HF directory and read by transformers."""
    import torch

    config, params = bart_convert.load_hf(hf_dir)
    params["final_logits_bias"] = params["final_logits_bias"] + 0.25  # something HF's init would not give
    bart_convert.save_hf(params, config, tmp_path / "out")
    model = bart_parity.load_torch_bart(tmp_path / "out")
    ids, mask = bart_parity.random_batch(config, 3, 10, 1)
    dec, _ = bart_parity.random_batch(config, 3, 5, 2)
    _, ours = bart_parity.forward(config, params, ids, mask, dec)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                    decoder_input_ids=torch.tensor(dec)).logits.numpy()
    assert np.max(np.abs(ours - ref)) < REL * np.max(np.abs(ref))
    again_config, again = bart_convert.load_hf(tmp_path / "out")
    assert again_config == config
    np.testing.assert_array_equal(again["final_logits_bias"], params["final_logits_bias"])


@pytest.mark.slow  # the default tier checks logits, cached steps and greedy tokens (the first test)
@pytest.mark.torch
def test_constrained_beams_match_transformers_generate(hf_dir):
    """Constrained beam search over a prefix tree of docids: the same beams and scores as transformers'
    generate(prefix_allowed_tokens_fn=...), length_penalty 1 (HF's default convention)."""
    import torch

    from gr_jax.backbones.t5_parity import hf_prefix_allowed_fn
    from gr_jax.index.trie import TrieIndex
    from gr_jax.retriever.search import T5Searcher

    config, params = bart_convert.load_hf(hf_dir)
    eos = config.eos_token_id
    rng = np.random.default_rng(0)
    docids = np.unique(rng.integers(4, 40, (50, 3)), axis=0)
    docids = np.concatenate([docids, np.full((len(docids), 1), eos)], axis=1)
    index = TrieIndex.build(docids, vocab_size=config.vocab_size, eos_id=eos)
    queries, mask = bart_parity.random_batch(config, 6, 9, 4)
    k = 5
    with torch.no_grad():
        out = bart_parity.load_torch_bart(hf_dir).generate(
            input_ids=torch.tensor(queries), attention_mask=torch.tensor(mask), num_beams=k, num_return_sequences=k,
            max_new_tokens=docids.shape[1], prefix_allowed_tokens_fn=hf_prefix_allowed_fn(docids, eos),
            length_penalty=1.0, do_sample=False, output_scores=True, return_dict_in_generate=True,
            forced_bos_token_id=None, forced_eos_token_id=None)
    theirs = out.sequences[:, 1:].numpy().reshape(len(queries), k, -1)
    res = T5Searcher(bart.Bart(config), num_beams=k, score_mode="log_softmax", length_penalty=1.0).search(
        params, queries, index.device())
    np.testing.assert_array_equal(np.asarray(res.tokens)[:, :, :theirs.shape[2]], theirs)
    np.testing.assert_allclose(np.asarray(res.scores), out.sequences_scores.numpy().reshape(len(queries), k),
                               atol=1e-4, rtol=0)


@pytest.mark.torch
@pytest.mark.parametrize("as_cfg", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["args-namespace", "cfg-dict"])
def test_fairseq_checkpoint_reads_as_the_hf_one(unbiased_hf_dir, tmp_path, as_cfg):
    from gr_jax.backbones import t5_convert

    hf_dir = unbiased_hf_dir
    tensors = t5_convert.read_hf_tensors(hf_dir)
    path = _fairseq_file(tmp_path / "checkpoint_best.pt", tensors, SETTINGS, as_cfg=as_cfg,
                         extra={"optimizer_history": [{"num_updates": 7}], "extra_state": {"epoch": 2}})
    config, params = bart_convert.load_fairseq(path)
    hf_config, hf_params = bart_convert.load_hf(hf_dir)
    assert config.replace(dropout_rate=hf_config.dropout_rate) == hf_config
    import jax

    for (where, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(params),
                                  jax.tree_util.tree_leaves_with_path(hf_params)):
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(where))
    result = bart_parity.check_parity(hf_dir, fairseq_checkpoint=path)
    assert result["relative_diff_logits"] < REL and result["greedy_identical"], result


@pytest.mark.torch
def test_fairseq_mode_compares_against_hf_logits_without_their_bias(hf_dir, unbiased_hf_dir, tmp_path):
    """The HF directory beside a fairseq checkpoint may carry a non-zero final_logits_bias (fairseq has none): the
    comparison leaves it out and says how large it was, instead of failing by the bias's size."""
    from gr_jax.backbones import t5_convert

    bias = bart_parity.load_torch_bart(hf_dir).final_logits_bias
    assert float(bias.abs().max()) > 1e-3  # the fixture's bias is real
    path = _fairseq_file(tmp_path / "checkpoint_best.pt", t5_convert.read_hf_tensors(unbiased_hf_dir), SETTINGS)
    result = bart_parity.check_parity(hf_dir, fairseq_checkpoint=path)
    assert result["relative_diff_logits"] < REL and result["greedy_identical"], result
    assert result["hf_final_logits_bias_removed"] == pytest.approx(float(bias.abs().max()))


@pytest.mark.torch
def test_fairseq_refuses_other_classes_and_unmapped_keys(hf_dir, unbiased_hf_dir, tmp_path):
    import torch

    from gr_jax.backbones import t5_convert

    with pytest.raises(CheckpointError, match="final_logits_bias is not zero"):
        bart_convert.hf_to_fairseq_keys(t5_convert.read_hf_tensors(hf_dir))
    tensors = t5_convert.read_hf_tensors(unbiased_hf_dir)
    evil = tmp_path / "evil.pt"
    _fairseq_file(evil, tensors, SETTINGS, extra={"extra_state": {"train_meters": AverageMeter()}})
    with pytest.raises(CheckpointError, match=r"evil\.pt: refused: it pickles the global [\w.]*AverageMeter"):
        bart_convert.load_fairseq(evil)
    extra = tmp_path / "prenorm.pt"
    state = torch.load(str(_fairseq_file(extra, tensors, SETTINGS)), weights_only=False)
    state["model"]["encoder.layer_norm.weight"] = torch.ones(32)
    state["model"].pop("decoder.layers.1.fc2.bias")
    torch.save(state, str(extra))
    with pytest.raises(CheckpointError) as err:
        bart_convert.load_fairseq(extra)
    assert "model.encoder.layer_norm.weight" in str(err.value) and "model.decoder.layers.1.fc2.bias" in str(err.value)
    untied = tmp_path / "untied.pt"
    state = torch.load(str(_fairseq_file(untied, tensors, SETTINGS)), weights_only=False)
    state["model"]["decoder.output_projection.weight"] = state["model"]["decoder.output_projection.weight"] + 1
    torch.save(state, str(untied))
    with pytest.raises(CheckpointError, match="decoder.output_projection.weight differ"):
        bart_convert.load_fairseq(untied)


def test_library_id_order_leaves_the_network_unchanged():
    """Permuting the vocabulary axis to the library's ids: the logits of permuted inputs are the permuted
    logits, and the inverse restores the parameters exactly."""
    config = bart.get_config("tiny", vocab_size=40, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)
    params = bart.init_params(config, seed=1)
    params = {**params, "final_logits_bias": np.linspace(-1, 1, 40, dtype=np.float32)}
    lib_config, lib_params = bart_convert.to_library_ids(params, config)
    assert (lib_config.pad_token_id, lib_config.eos_token_id, lib_config.decoder_start_token_id) == (0, 1, 1)
    perm = bart_convert.library_id_order(40)
    ids, mask = bart_parity.random_batch(config, 2, 7, 0)
    dec = np.array([[2, 0, 5, 9], [2, 3, 3, 1]])
    _, ref = bart_parity.forward(config, params, ids, mask, dec)
    _, ours = bart_parity.forward(lib_config, lib_params, perm[ids], mask, perm[dec])
    chex.assert_trees_all_close(ours[..., perm], ref, rtol=0, atol=1e-5)
    back_config, back = bart_convert.from_library_ids(lib_params, lib_config)
    assert back_config == config
    np.testing.assert_array_equal(back["embedding"], params["embedding"])


def _toy_bpe(tmp_path):
    """A byte-level BPE trained on a few sentences, written in both layouts (HF: vocab.json + merges.txt with
    fairseq's dictionary order; fairseq: encoder.json + vocab.bpe + a shuffled dict.txt)."""
    from tokenizers import ByteLevelBPETokenizer

    texts = ["the cat sat on the mat", "json.dumps writes a JSON string", "the dog ate the cat's food"] * 5
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=300, min_frequency=1, special_tokens=[])
    gpt2_vocab = bpe.get_vocab()
    bpe.save_model(str(tmp_path))  # vocab.json + merges.txt in GPT-2 ids
    (tmp_path / "fairseq").mkdir()
    (tmp_path / "fairseq" / "encoder.json").write_text((tmp_path / "vocab.json").read_text())
    (tmp_path / "fairseq" / "vocab.bpe").write_text((tmp_path / "merges.txt").read_text())
    order = np.random.default_rng(0).permutation(sorted(gpt2_vocab.values()))
    (tmp_path / "fairseq" / "dict.txt").write_text("".join(f"{i} {100 - n % 7}\n" for n, i in enumerate(order)))
    by_id = {i: t for t, i in gpt2_vocab.items()}
    hf_vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    hf_vocab.update({by_id[int(i)]: 4 + n for n, i in enumerate(order)})
    hf_vocab["<mask>"] = len(hf_vocab)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "vocab.json").write_text(json.dumps(hf_vocab))
    (tmp_path / "hf" / "merges.txt").write_text((tmp_path / "merges.txt").read_text())
    return tmp_path / "hf", tmp_path / "fairseq", len(hf_vocab)


@pytest.mark.torch
def test_bpe_tokenizer_matches_transformers_in_library_ids(tmp_path):
    import transformers

    from gr_jax.data.vocab import EOS_ID, PAD_ID, load_vocabulary

    hf, fairseq, size = _toy_bpe(tmp_path)
    theirs = transformers.BartTokenizer.from_pretrained(str(hf))  # vocab.json + merges.txt, as a checkpoint ships them
    for src in (hf, fairseq):
        out = bart_tokenizer.write_library_tokenizer(src, tmp_path / f"lib_{src.name}", vocab_size=size)
        vocab = load_vocabulary(out)
        assert (vocab.pad_id, vocab.eos_id) == (PAD_ID, EOS_ID) and vocab.size == size
        for text in ["the cat sat", "json.dumps writes", "a dog's JSON mat"]:
            want = theirs(text)["input_ids"]  # <s> … </s> in BART ids
            got = vocab.encode(text) + [EOS_ID]  # the pipeline ends a text with EOS
            assert got == bart_tokenizer.library_ids(want, size).tolist(), (src.name, text)
            assert vocab.decode(got) == text


@pytest.mark.torch
def test_a_bart_checkpoint_starts_a_run_in_the_librarys_ids(hf_dir, unbiased_hf_dir, tmp_path):
    """INITIAL_CHECKPOINT_PATH: an HF BART directory and a fairseq file are read as BART (not as T5), with the
    vocabulary axis moved to the library's ids; without VOCABULARY the run is refused with the command that
    writes it."""
    from gr_jax.backbones import t5_convert
    from gr_jax.training import initial

    fairseq = _fairseq_file(tmp_path / "checkpoint_best.pt", t5_convert.read_hf_tensors(unbiased_hf_dir), SETTINGS)
    for path, name in ((hf_dir, "HF BART directory"), (fairseq, "fairseq BART checkpoint")):
        loader = initial.loader_for(str(path))
        assert loader.name == name
        config, params = loader.load(str(path))
        assert (config.pad_token_id, config.eos_token_id, config.decoder_start_token_id) == (0, 1, 1)
        _, bart_ids = bart_convert.load_hf(hf_dir if path == hf_dir else unbiased_hf_dir)
        np.testing.assert_array_equal(params["embedding"][0], bart_ids["embedding"][1])  # <pad>
        np.testing.assert_array_equal(params["embedding"][3], bart_ids["embedding"][0])  # <s>
        with pytest.raises(ValueError, match="python -m gr_jax.backbones.bart_tokenizer"):
            loader.vocabulary(str(path), None)


class TestShapes(chex.TestCase):
    """Encoder states, teacher-forced logits and one cached step of a tiny random BART, jitted and not: their
    shapes, finite, and the cached step's logits equal to the teacher-forced logits of the first position."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_encode_decode_step(self):
        import jax.numpy as jnp

        config = bart.get_config("tiny", dropout_rate=0.0)
        net = bart.Bart(config)
        rng = np.random.default_rng(5)
        B, L, T = 2, 7, 4
        ids = jnp.asarray(rng.integers(4, config.vocab_size, (B, L)), jnp.int32)
        mask = jnp.ones((B, L), jnp.int32).at[1, 5:].set(0)
        dec = jnp.asarray(rng.integers(4, config.vocab_size, (B, T)), jnp.int32).at[:, 0].set(
            config.decoder_start_token_id)
        params = bart.init_params(config)
        encode = self.variant(lambda p, i, m: net.apply({"params": p}, i, m, method="encode"))
        decode = self.variant(lambda p, e, m, d: net.apply({"params": p}, e, m, d, method="decode"))
        step = self.variant(lambda p, c, t: net.apply({"params": p}, c, t, method="decode_step"))
        enc = encode(params, ids, mask)
        chex.assert_shape(enc, (B, L, config.d_model))
        logits = decode(params, enc, mask, dec)
        chex.assert_shape(logits, (B, T, config.vocab_size))
        cache = net.apply({"params": params}, enc, mask, T, method="init_cache")
        first, _ = step(params, cache, dec[:, 0])
        chex.assert_shape(first, (B, config.vocab_size))
        chex.assert_tree_all_finite((enc, logits, first))
        # the same float32 computation through the cache: ~1e-6 of the logits' magnitude
        chex.assert_trees_all_close(first, logits[:, 0], rtol=0, atol=1e-5 * float(jnp.abs(logits).max()))
