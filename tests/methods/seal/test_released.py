"""A released SEAL checkpoint in its authors' layout → MODEL_DIR → a run file from `gr_jax.infer`: a tiny random BART
written as a fairseq checkpoint (fairseq's key names, its settings as an argparse.Namespace), fairseq's tokenizer
files (dict.txt, encoder.json, vocab.bpe) beside it, and a corpus in SEAL's layout (DPR's psgs_w100.tsv header)."""

import argparse
import json

import gin
import numpy as np
import pytest

from gr_jax import commands
from tests.conftest import require

TEXTS = ["the cat sat on the mat", "json dumps writes a string", "the dog ate the food",
         "x @@ y || body || + || title || + || query || +"]


def _release(tmp_path):
    """CKPT/{checkpoint_best.pt, dict.txt, encoder.json, vocab.bpe}; returns (dir, BART vocabulary size)."""
    torch = require("torch")
    from tokenizers import ByteLevelBPETokenizer

    from gr_jax.backbones import bart_convert, bart_parity, t5_convert

    ckpt = tmp_path / "release"
    ckpt.mkdir()
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXTS * 20, vocab_size=320, min_frequency=1, special_tokens=[])
    bpe.save_model(str(tmp_path))
    (ckpt / "encoder.json").write_text((tmp_path / "vocab.json").read_text())
    (ckpt / "vocab.bpe").write_text((tmp_path / "merges.txt").read_text())
    order = np.random.default_rng(0).permutation(sorted(bpe.get_vocab().values()))
    (ckpt / "dict.txt").write_text("".join(f"{i} 1\n" for i in order))
    size = 4 + len(order) + 1  # <s> <pad> </s> <unk>, the dictionary, <mask>
    hf = bart_parity.write_random_hf_bart(tmp_path / "hf", seed=5, vocab_size=size, max_positions=600)
    model = bart_parity.load_torch_bart(hf)
    model.final_logits_bias.zero_()
    model.save_pretrained(str(tmp_path / "hf0"))
    tensors = bart_convert.hf_to_fairseq_keys(t5_convert.read_hf_tensors(tmp_path / "hf0"))
    settings = argparse.Namespace(arch="bart_large", encoder_attention_heads=4, decoder_attention_heads=2,
                                  activation_fn="gelu", no_scale_embedding=False, dropout=0.1)
    torch.save({"model": {k: torch.tensor(v) for k, v in tensors.items()}, "args": settings},
               str(ckpt / "checkpoint_best.pt"))
    return ckpt, size


def _data(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    docs = [("d1", "the cat sat on the mat", "Cat"), ("d2", "the dog ate the food", "Dog"),
            ("d3", "json dumps writes a string", "Json")]
    (d / "corpus.tsv").write_text("id\ttext\ttitle\n" + "".join(f"{i}\t{t}\t{h}\n" for i, t, h in docs))
    (d / "queries.test.tsv").write_text("q1\twhere did the cat sit\nq2\twhat writes a string\n")
    (d / "qrels.test.tsv").write_text("q1\t0\td1\t1\nq2\t0\td3\t1\n")
    return d


@pytest.mark.slow  # runs two commands end to end (import, then infer), as test_commands does
@pytest.mark.torch
def test_a_released_checkpoint_runs_through_infer(tmp_path, capsys):
    from gr_jax.methods.seal import import_released

    ckpt, size = _release(tmp_path)
    data = _data(tmp_path)
    model_dir = tmp_path / "M"
    flags = ["--gin_file=experiments/released/seal_nq.gin", f"--gin.DATA_DIR='{data}'",
             "--gin.TASK_FEATURE_LENGTHS={'inputs': 24, 'targets': 8}", "--gin.EvalConfig.num_beams=3",
             "--gin.SealSearch.top_k_unigrams=50", "--gin.EvalConfig.batch_size=2",
             # a random network's keys are far less likely than their corpus frequency, so SEAL's intersective
             # weights are all 0: rank by the best key instead, which every document holding a key gets
             "--gin.SealSearch.document_score='best_key'"]
    assert import_released.main([f"--checkpoint_dir={ckpt}", f"--model_dir={model_dir}", *flags]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["docids"]["documents"] == 3 and "python -m gr_jax.infer" in out["evaluate"]
    vocab = json.loads((model_dir / "vocabulary" / "tokenizer.json").read_text())["model"]["vocab"]
    assert vocab["<pad>"] == 0 and vocab["</s>"] == 1 and vocab["<s>"] == 3 and len(vocab) <= size
    gin.clear_config()  # each command parses into gin's global configuration, as its own process would
    rc = commands.run("infer", ["--gin_file=runs/infer.gin", *flags, f"--gin.MODEL_DIR='{model_dir}'", f"--gin.INITIAL_CHECKPOINT_PATH='{ckpt}/checkpoint_best.pt'",
                                f"--gin.VOCABULARY='{model_dir / 'vocabulary'}'", "--gin.infer.evaluate=True"])
    assert rc == 0
    run = sorted((model_dir / "runs").glob("test.step0.run"))
    assert run, list((model_dir / "runs").iterdir())
    qids = {line.split()[0] for line in run[0].read_text().splitlines()}
    assert qids == {"q1", "q2"}
    assert {line.split()[2] for line in run[0].read_text().splitlines()} <= {"d1", "d2", "d3"}
    # a second import into the same MODEL_DIR is refused, and leaves what is there
    gin.clear_config()
    assert import_released.main([f"--checkpoint_dir={ckpt}", f"--model_dir={model_dir}", *flags]) == 2
    assert run[0].exists()
