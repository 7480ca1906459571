"""Capability `traced_search` (retriever/contract.py): `beam_documents` traced inside a caller's own jit gives the
beams whose ranker output is `rank`'s — for DSI's GenerativeRetriever (both docid heads, with a decoding bonus) and
for PAG in its planned and unplanned modes, including a planning tie that `rank` settles on the host and the
traced search settles on the device. Models whose ranking is not one search do not declare it."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.methods.pag import docids as pag_docids
from gr_jax.methods.pag import model as pag
from gr_jax.methods.pag import parity as pag_parity
from gr_jax.retriever.model import GenerativeRetriever

from tests.retriever.test_retriever import CONFIG, _tables
from tests.conftest import sweep

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pag_parity" / "peer_v320_d64"


def traced_rank(model, params, q, index, num_beams):
    """What a caller holding only a jit does: trace `beam_documents`, rank on the host."""
    fn = jax.jit(lambda p, t: model.beam_documents(p, t, index, num_beams))
    return model.ranker(*jax.device_get(fn(params, jnp.asarray(q))))


def assert_same_ranking(a, b):
    """The same (query, document) pairs with the same scores. The traced and the eager search are one computation
    compiled in two programs: float32 rounding at most, relative to the score's magnitude."""
    qa, da, sa = map(np.asarray, a)
    qb, db, sb = map(np.asarray, b)
    oa, ob = np.lexsort((da, qa)), np.lexsort((db, qb))
    np.testing.assert_array_equal(qa[oa], qb[ob])
    np.testing.assert_array_equal(da[oa], db[ob])
    np.testing.assert_allclose(sa[oa], sb[ob], rtol=1e-5, atol=1e-6)


def _bonus(level, child_ids, state):
    return jnp.where(child_ids % 2 == 0, state[:, None, None], 0.0)


@pytest.mark.parametrize("kind", sweep("kind", ["codebook", "text"], ["text"]))
def test_generative_retriever_traced_equals_rank(kind):
    head, table = _tables()[kind]
    q = np.random.default_rng(1).integers(3, 500, (3, 6)).astype(np.int32)
    plain = GenerativeRetriever(CONFIG, head)
    guided = GenerativeRetriever(CONFIG, head, bonus_fn=_bonus,
                                 query_state_fn=lambda m, p, t: jnp.linspace(0.5, 1.5, t.shape[0]))
    for model in (plain, guided):
        assert model.capabilities.traced_search
        params = model.init_params(2)
        # traced first: the index's device arrays are first built inside the trace and must not cache a tracer
        index = table.index(vocab_size=CONFIG.vocab_size) if kind == "text" else table.index()
        traced = traced_rank(model, params, q, index, 4)
        ranked = model.rank(params, q, index, num_beams=4)
        assert len(ranked[0]) >= 3
        assert_same_ranking(traced, ranked)


@pytest.fixture(scope="module")
def pag_fixture():
    model, params, table, index, doc_ids = pag_parity.fixture_setup(FIXTURE)
    with np.load(FIXTURE / "inputs.npz") as z:
        queries = z["query_input_ids"].astype(np.int32)
    return model, params, index, doc_ids, queries


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pag", "seq_only"])
def test_pag_traced_equals_rank(pag_fixture, mode):
    model, params, index, _, q = pag_fixture
    with model.in_mode(mode):
        assert model.capabilities.traced_search
        assert_same_ranking(traced_rank(model, params, q, index, 4), model.rank(params, q, index, num_beams=4))


@pytest.mark.slow
def test_pag_planning_tie_is_settled_on_the_device_as_on_the_host(pag_fixture):
    """Two documents given one set docid tie across the planning boundary: `rank` plans that batch again exactly
    on the host; the traced search chooses the exact plan on the device. Same documents, same scores."""
    model, params, _, doc_ids, queries = pag_fixture
    q = queries[:1]
    rows, s = jax.device_get(model.plan(params, q, n=30))
    a, b = int(rows[0, 9]), int(rows[0, 10])
    lex = json.loads((FIXTURE / "lex_docid_to_tokenids.json").read_text())
    lex[doc_ids[b]] = lex[doc_ids[a]]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "lex.json").write_text(json.dumps(lex))
        table = pag_docids.table_from_files(FIXTURE / "smt_docid_to_tokenids.json", Path(tmp) / "lex.json",
                                            doc_ids, levels=4, k=16, base=256)
    planning = model.planning_size
    model.use_docids(table)
    model.planning_size = 10
    try:
        index = table.index(vocab_size=model.config.vocab_size)
        assert bool(jax.device_get(pag.top_n_fast(pag.simul_scores(model.lexical_rep(params, q), model.set_ids),
                                                  10)[2]))  # the tie is there
        assert_same_ranking(traced_rank(model, params, q, index, 4), model.rank(params, q, index, num_beams=4))
    finally:
        model.planning_size = planning
        _, _, t0, _, _ = pag_parity.fixture_setup(FIXTURE)
        model.use_docids(t0)


def test_models_whose_ranking_is_not_one_search_do_not_declare_it(pag_fixture):
    model, params, index, _, q = pag_fixture
    with model.in_mode("simul_only"):
        assert not model.capabilities.traced_search
        with pytest.raises(ValueError, match="simul_only"):
            model.beam_documents(params, q, index, 4)
    padding = model.query_padding
    model.query_padding = "batch_longest"
    try:
        assert not model.capabilities.traced_search
        with pytest.raises(ValueError, match="batch_longest"):
            model.beam_documents(params, q, index, 4)
    finally:
        model.query_padding = padding
    from gr_jax.methods.seal.model import SealRetriever

    assert not SealRetriever(CONFIG).capabilities.traced_search
