"""Decoding across devices: the query batch split over a mesh of 8 host devices gives one device's results.

XLA's host device count is fixed when JAX starts, so the check runs in a fresh process with
`--xla_force_host_platform_device_count=8`. Compared there, for every score mode (beam 7; beam 1 once) and for
unconstrained search, and through `retrieval.retrieve` (a batch that 8 does not divide, so the padding path runs):
* exactly: docids, leaf ids, validity, and the ranked run's documents;
* bit for bit: the scores against one device searching the same per-device slices of the batch (the program
  each device runs);
* to float32 rounding: the scores against one device searching the whole batch at once (a matrix product of
  another row count may round differently; the scores are sums of ~5 log-probabilities of magnitude ≤ 30, so a
  relative 1e-5 is ~100 float32 ulps and far below any gap that decides a ranking here).
"""

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import xla_flags

SCRIPT = textwrap.dedent("""
    import numpy as np, jax
    from gr_jax.evaluation.retrieval import retrieve
    from gr_jax.index.trie import TrieIndex
    from gr_jax.backbones import t5
    from gr_jax.retriever.model import GenerativeRetriever
    from gr_jax.retriever.search import T5Searcher

    assert jax.device_count() == 8, jax.devices()
    config = t5.get_config("tiny", dropout_rate=0.0)
    params = t5.init_params(config, seed=0)
    rng = np.random.default_rng(1)
    docids = np.unique(rng.integers(3, 40, (300, 3)), axis=0)  # few tokens: shared prefixes, several levels
    docids = np.concatenate([docids, np.ones((len(docids), 1), np.int64)], axis=1)
    index = TrieIndex.build(docids, vocab_size=config.vocab_size, eos_id=1)
    queries = rng.integers(3, config.vocab_size, (16, 12))
    queries[3, 5:] = 0  # a padded query
    checked = 0
    cases = [(mode, 7, "search") for mode in ("log_softmax", "renormalized", "raw")] \
        + [("log_softmax", 1, "search"), ("log_softmax", 7, "unconstrained")]
    for mode, beams, kind in cases:
        many = T5Searcher(t5.T5(config), num_beams=beams, score_mode=mode, length_penalty=1.0)
        one = T5Searcher(t5.T5(config), num_beams=beams, score_mode=mode, length_penalty=1.0, mesh=None)
        assert many.mesh.shape["data"] == 8 and one.mesh is None
        if kind == "search":
            search = lambda s, q: s.search(params, q, index.device())  # noqa: E731
        else:
            search = lambda s, q: s.search_unconstrained(params, q, 4)  # noqa: E731
        got, whole = search(many, queries), search(one, queries)
        for f in ("tokens", "lengths", "leaf_ids", "valid"):
            assert np.array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(whole, f))), (mode, f)
        np.testing.assert_allclose(np.asarray(got.scores), np.asarray(whole.scores), rtol=1e-5)
        per_device = np.concatenate([np.asarray(search(one, queries[i:i + 2]).scores) for i in range(0, 16, 2)])
        assert np.array_equal(np.asarray(got.scores), per_device), mode
        checked += 1
    # through the model object and retrieval.retrieve: 13 queries in batches of 5 (padded to 8 per device)
    model = GenerativeRetriever(config)
    full = {"network": params, "head": {}}
    qids, doc_ids = [f"q{i}" for i in range(13)], [f"d{i}" for i in range(len(docids))]
    run_many = retrieve(model, full, queries[:13], qids, index, doc_ids, 7, 5)
    model_one = GenerativeRetriever(config)
    model_one.searcher(7).use_mesh(None)
    run_one = retrieve(model_one, full, queries[:13], qids, index, doc_ids, 7, 5)
    assert run_many.keys() == run_one.keys()
    for q in run_one:
        assert list(run_many[q]) == list(run_one[q])
        np.testing.assert_allclose(list(run_many[q].values()), list(run_one[q].values()), rtol=1e-5)
    print("checked", checked)
""")


@pytest.mark.slow
def test_query_batch_over_8_host_devices_gives_one_devices_results():
    env = dict(os.environ, XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=8", across_programs=True))
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "checked 5" in out.stdout
