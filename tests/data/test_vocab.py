"""Vocabularies (a SentencePiece model trained here, offline) and docid token spaces / vocabulary growth."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.backbones import t5
from gr_jax.backbones.t5_convert import grow_vocab
from gr_jax.data.vocab import DocidTokenSpace, SentencePieceVocabulary, load_vocabulary

_TEXT = [
    "generative retrieval maps a query to a document identifier",
    "the decoder emits docid tokens under a prefix tree constraint",
    "dynamic corpora add new documents after training",
    "lexical docids use keywords of the document",
    "planning guided decoding looks ahead at the set of tokens",
] * 20


@pytest.fixture(scope="module")
def spm_file(tmp_path_factory):
    import sentencepiece as spm

    d = tmp_path_factory.mktemp("spm")
    corpus = d / "corpus.txt"
    corpus.write_text("\n".join(_TEXT))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(d / "spiece"), vocab_size=48,
                                   pad_id=0, eos_id=1, unk_id=2, bos_id=-1, model_type="unigram",
                                   minloglevel=2)
    return d / "spiece.model"


def test_sentencepiece_round_trip_and_specials(spm_file):
    vocab = SentencePieceVocabulary(spm_file, extra_ids=10)
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
    assert vocab.size == 48 + 10
    ids = vocab.encode("generative retrieval")
    assert ids and all(3 <= i < 48 for i in ids)
    assert vocab.decode(ids + [1, 7, 8]) == "generative retrieval"  # stops at EOS
    assert vocab.decode([0] + ids + [0]) == "generative retrieval"  # padding ignored
    assert vocab.extra_id(0) == 57 and vocab.id_to_piece(57) == "<extra_id_0>"
    with pytest.raises(ValueError, match="extra id 10 out of range"):
        vocab.extra_id(10)


def test_sentencepiece_wrong_special_ids_and_bad_file(tmp_path, spm_file):
    import sentencepiece as spm

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(_TEXT))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "default"), vocab_size=40,
                                   minloglevel=2)  # sentencepiece defaults: unk 0, bos 1, eos 2
    with pytest.raises(ValueError, match=r"default\.model: special ids .* differ from T5"):
        SentencePieceVocabulary(tmp_path / "default.model")
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="bad.model: not a SentencePiece model"):
        SentencePieceVocabulary(bad)
    with pytest.raises(ValueError, match="missing.model: cannot read"):
        SentencePieceVocabulary(tmp_path / "missing.model")


def test_hf_tokenizer_directory(tmp_path, spm_file):
    d = tmp_path / "tok"
    d.mkdir()
    (d / "spiece.model").write_bytes(spm_file.read_bytes())
    (d / "tokenizer_config.json").write_text(json.dumps({"extra_ids": 4}))
    vocab = load_vocabulary(d)
    assert vocab.size == 52
    assert load_vocabulary(spm_file).size == 48
    (d / "tokenizer_config.json").unlink()
    assert load_vocabulary(d).size == 48 + 100  # T5's released tokenizers carry 100 sentinels
    with pytest.raises(ValueError, match="neither spiece.model nor tokenizer.json"):
        load_vocabulary(tmp_path)


def test_docid_token_spaces():
    text = DocidTokenSpace.above_text(vocab_size=32128, count=1000)
    assert text.token_id(0) == 32128 and text.end == 33128
    np.testing.assert_array_equal(text.code(np.array([32128, 33127])), [0, 999])
    with pytest.raises(ValueError, match="out of range"):
        text.token_id(1000)
    with pytest.raises(ValueError, match="outside this docid space"):
        text.code(5)
    book = DocidTokenSpace.codebook(length=8, codes=2048)
    assert book.token_id(5, position=3) == 3 * 2048 + 5
    assert book.code(3 * 2048 + 5, position=3) == 5
    with pytest.raises(ValueError, match="position out of range"):
        book.token_id(5, position=8)
    with pytest.raises(ValueError, match="needs length"):
        DocidTokenSpace("codebook", 10)
    with pytest.raises(ValueError, match="kind"):
        DocidTokenSpace("atomic", 10)


@pytest.mark.parametrize("name", ["tiny", "t5_1_1_tiny"])
def test_grow_vocab_is_deterministic_and_keeps_old_rows(name):
    config = t5.get_config(name)
    params = t5.init_params(config, seed=0)
    space = DocidTokenSpace.above_text(config.vocab_size, 300)
    grown, new_config = grow_vocab(params, config, space.end, seed=5, pad_to_multiple=128)
    assert new_config.vocab_size == 896  # 812 rounded up to a multiple of 128
    again, _ = grow_vocab(params, config, space.end, seed=5, pad_to_multiple=128)
    other, _ = grow_vocab(params, config, space.end, seed=6, pad_to_multiple=128)
    np.testing.assert_array_equal(grown["embedding"], again["embedding"])
    assert not np.array_equal(grown["embedding"][512:], other["embedding"][512:])
    np.testing.assert_array_equal(grown["embedding"][:512], np.asarray(params["embedding"]))
    if not config.tie_word_embeddings:
        assert grown["lm_head"]["kernel"].shape == (config.d_model, 896)
        np.testing.assert_array_equal(grown["lm_head"]["kernel"][:, :512], np.asarray(params["lm_head"]["kernel"]))
    # The grown model still runs, and logits of the old vocabulary are unchanged.
    ids = jnp.array([[5, 6, 7, 1]])
    dec = jnp.array([[0, int(space.token_id(299)), 9]])
    old_logits = t5.T5(config).apply({"params": params}, ids, dec.at[0, 1].set(8))
    new_logits = t5.T5(new_config).apply({"params": grown}, ids, dec.at[0, 1].set(8))
    assert new_logits.shape[-1] == 896
    np.testing.assert_allclose(np.asarray(new_logits[..., :512]), np.asarray(old_logits), atol=1e-5)
    assert np.isfinite(np.asarray(t5.T5(new_config).apply({"params": grown}, ids, dec))).all()
    with pytest.raises(ValueError, match="smaller than the current"):
        grow_vocab(params, config, 100)
