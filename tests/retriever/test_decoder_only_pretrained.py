"""Fine-tuning a pretrained decoder-only LM through the trainer: a tiny Llama written as a GGUF file with its
byte-level BPE tokenizer in the metadata (as llama.cpp writes them) stands in for SmolLM2; VOCABULARY and
INITIAL_CHECKPOINT_PATH name the file, and the network starts from its weights."""

import json

import numpy as np
import pytest

import jax

from gr_jax import compose
from gr_jax.data import demo
from gr_jax.backbones import llama, llama_io
from tests.conftest import require
from tests.backbones.test_llama_io import _llama_cpp_rows


def _tiny_lm_gguf(path):
    gguf = require("gguf")
    from tests.backbones.lm_helpers import train_byte_bpe

    d = demo.generate(num_docs=200, seed=0)
    backend = train_byte_bpe(list(d.corpus.texts) + [q for qs in d.queries.values() for q in qs.texts]
                             + list(d.corpus.urls), 600)
    vocab = backend.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = json.loads(backend.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    config = llama.get_config("llama_tiny", vocab_size=len(tokens), pad_token_id=2, bos_token_id=1, eos_token_id=2)
    params = llama.init_params(config, seed=11)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(config.num_layers)
    w.add_embedding_length(config.d_model)
    w.add_feed_forward_length(config.d_ff)
    w.add_head_count(config.num_heads)
    w.add_head_count_kv(config.num_kv_heads)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_vocab_size(config.vocab_size)
    w.add_context_length(512)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3 if i < 3 else 1 for i in range(len(tokens))])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    for key, ours, transpose in llama_io._key_map(config, "gguf"):
        value = params
        for p in ours:
            value = value[p]
        value = np.asarray(value, np.float32)
        value = value.T if transpose else value
        if key.endswith("attn_q.weight"):
            value = _llama_cpp_rows(value, config.num_heads)
        elif key.endswith("attn_k.weight"):
            value = _llama_cpp_rows(value, config.num_kv_heads)
        w.add_tensor(key, np.ascontiguousarray(value))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return config, params


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("lm") / "tiny.gguf"
    config, params = _tiny_lm_gguf(path)
    return path, config, params


def test_lm_vocabulary_and_initial_network_come_from_the_file(tiny_gguf, tmp_path):
    from gr_jax.docids.lexical import FieldDocids
    from gr_jax.retriever.decoder_only import DecoderOnlyRetriever

    path, config, params = tiny_gguf
    vocab = llama_io.lm_vocabulary(str(path))
    assert vocab.size == config.vocab_size and (vocab.pad_id, vocab.eos_id) == (0, 1)
    text = "Bobeksor is a northern bridge"
    assert vocab.decode(vocab.encode(text) + [1, 0, 0]) == text  # EOS ends it, padding dropped
    setup = compose.prepare(str(tmp_path / "m"), 8, {"inputs": 32, "targets": 24}, "demo", vocabulary=str(path),
                            initial_checkpoint_path=str(path), docid_scheme=FieldDocids("url"),
                            model_fn=DecoderOnlyRetriever)
    assert setup.model.config.num_kv_heads == config.num_kv_heads
    got = compose.initial_params(setup, 0, str(path))["network"]
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    # URL docids are written in the LM's tokens and end with the library's EOS (id 1)
    seq = setup.table.sequence(0)
    assert vocab.decode(seq) == setup.dataset.corpus.urls[0]


def test_a_t5_model_with_an_lm_checkpoint_is_refused(tiny_gguf, tmp_path):
    path = tiny_gguf[0]
    with pytest.raises(ValueError, match="set prepare.model_fn = @DecoderOnlyRetriever"):
        compose.prepare(str(tmp_path / "m"), 8, {"inputs": 32, "targets": 24}, "demo", vocabulary=str(path),
                        initial_checkpoint_path=str(path))


@pytest.mark.slow
def test_fine_tuning_through_the_trainer(tiny_gguf, tmp_path):
    from gr_jax import train as entry

    path = tiny_gguf[0]
    args = ["--gin_file=experiments/demo/dsi_url_smollm2.gin", f"--gin.MODEL_DIR='{tmp_path / 'm'}'",
            f"--gin.VOCABULARY='{path}'", f"--gin.INITIAL_CHECKPOINT_PATH='{path}'", "--gin.TRAIN_STEPS=4",
            "--gin.BATCH_SIZE=8", "--gin.EvalConfig.max_queries=16", "--gin.train.checkpoint_period=2",
            "--gin.load_dataset.demo_docs=60", "--gin.EvalConfig.compare_bm25=False"]
    assert entry.main(args) == 0
    summary = json.loads((tmp_path / "m" / "final_metrics.json").read_text())
    assert summary["steps"] == 4 and 0.0 <= summary["metrics"]["Hit@10"] <= 1.0
