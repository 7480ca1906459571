"""PAG's inverted planner (methods/pag/planner.py) beside the dense product it must equal: the index laid out by
hand, query-term pruning by hand, each of its paths (postings, rank layout, dense fallback) taken and equal to the
dense product, and the model's plan, rankings and traced search unchanged by it. The oracle written from the
paper alone is test_planner_oracle.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.methods.pag import parity as pag_parity
from gr_jax.methods.pag import planner

FIXTURE = pag_parity.Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "pag_parity"


def test_postings_by_hand():
    # rows 0, 1, 2 with keys 5, 9, 1 → by key descending: row 1 (rank 0), row 0 (rank 1), row 2 (rank 2)
    post = planner.Postings(np.array([[2, 0], [0, -1], [2, 2]], np.int32), 3, np.array([5, 9, 1], np.int32))
    assert post.by_key.tolist() == [1, 0, 2]
    assert post.start.tolist() == [0, 2, 2, 5]  # token 0: 2 postings, token 1: none, token 2: 3
    assert post.docs.tolist() == [0, 1, 1, 2, 2]  # token 0: ranks of rows 1, 0; token 2: rows 0, 2, 2 (listed twice)
    with pytest.raises(ValueError, match="beyond the planning vocabulary of 2"):
        planner.Postings(np.array([[2]], np.int32), 2, np.array([0], np.int32))


def test_query_term_pruning_keeps_every_weight_tied_at_the_t_th():
    from gr_jax.methods.pag.model import PagRetriever
    from gr_jax.models import t5

    model = PagRetriever(t5.get_config("tiny", vocab_size=8), planner_query_terms=2)
    rep = jnp.asarray([[0.0, 3.0, 1.0, 3.0, 2.0], [4.0, 0.0, 1.0, 2.0, 3.0]])
    assert np.asarray(model.query_rep(rep)).tolist() == [[0, 3, 0, 3, 0], [4, 0, 0, 0, 3]]
    model.planner_query_terms = 3
    assert np.asarray(model.query_rep(rep)).tolist() == [[0, 3, 0, 3, 2], [4, 0, 0, 2, 3]]
    model.planner_query_terms = 0
    assert np.array_equal(np.asarray(model.query_rep(rep)), np.asarray(rep))


D, M, V, B, N = 6000, 8, 500, 4, 40


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(7)
    ids = np.sort(rng.integers(0, V, (D, M)), axis=1).astype(np.int32)
    ids[:, 1:][ids[:, 1:] == ids[:, :-1]] = -1
    keys = rng.permutation(1 << 20)[:D].astype(np.int32)
    return jnp.asarray(ids), jnp.asarray(keys), planner.Postings(ids, V, keys)


def _queries(seed: int, fired: int, values=None):
    rng = np.random.default_rng(seed)
    rep = np.zeros((B, V), np.float32)
    for b in range(B):
        tok = rng.choice(V, fired, replace=False)
        rep[b, tok] = rng.choice(values, fired) if values is not None else rng.random(fired) + 0.1
    return jnp.asarray(rep)


@pytest.mark.parametrize("case, n, quick", [("continuous", N, True), ("continuous", 400, True),
                                           ("equal weights", 400, False), ("few scoring", 200, False)])
def test_each_path_of_the_inverted_planner_equals_the_dense_product(corpus, case, n, quick):
    """Continuous weights on 12 tokens (~96 documents each): the top-k over the postings decides, with the n-th
    place among documents on several tokens (n 40: ~100 such a query) or among those on one (n 400). Weights from
    {1, 2}: the 400th place falls among documents on one weight-2 token, tied across 6 such tokens; 1 fired token
    scores fewer than 200 documents: the rank layout decides. All exact, with the dense product's rows and bits."""
    ids, keys, post = corpus
    rep = {"continuous": _queries(1, 12), "equal weights": _queries(2, 12, [1.0, 2.0]),
           "few scoring": _queries(3, 1)}[case]
    if case == "few scoring":
        assert int(np.diff(post.start).max()) < n  # no single token reaches n documents
    budgets = planner.budgets_for(1 << 13, V)
    assert bool(planner.inverted_fits(rep, post.device()[1], budgets))
    rows, scores, exact, took_postings = jax.device_get(jax.jit(
        lambda r: planner.inverted_plan(r, ids, post.device(), n, budgets))(rep))
    assert bool(exact) and bool(took_postings) == quick
    want_rows, want_s, _ = jax.device_get(planner.plan_from_rep(rep, ids, keys, n, 512, exact=True))
    for b in range(B):
        assert len(set(rows[b].tolist())) == n and set(rows[b].tolist()) == set(want_rows[b].tolist())
        got = sorted(zip(rows[b].tolist(), scores[b].view(np.uint32).tolist()))
        assert got == sorted(zip(want_rows[b].tolist(), want_s[b].view(np.uint32).tolist()))  # bit for bit


@pytest.mark.parametrize("n, exact", [(20, True), (400, False)])
def test_documents_on_several_tokens_beyond_the_rescored_budget(corpus, n, exact):
    """With room to rescore 64 postings on documents on several tokens (each query has ~140, of ~70 documents):
    at n 20 the rest score below
    the n-th place by more than the rounding margin, so the plan is exact without them; at n 400 they could
    reach it, so the batch takes the dense product. Either way plan_from_rep gives the dense product's plan."""
    ids, keys, post = corpus
    rep = _queries(1, 12)
    fired = np.asarray(rep) > 0
    on = fired[:, np.maximum(np.asarray(ids), 0)] & (np.asarray(ids) >= 0)[None]  # [B, D, M]
    count = on.sum(axis=2)
    assert (np.where(count >= 2, count, 0).sum(axis=1) > 64).all()  # more such postings than rescored
    budgets = planner.Budgets(active=V, postings=1 << 13, rescored=64)
    assert bool(planner.inverted_fits(rep, post.device()[1], budgets))
    assert bool(jax.device_get(planner.inverted_plan(rep, ids, post.device(), n, budgets)[2])) == exact
    got = jax.device_get(planner.plan_from_rep(rep, ids, keys, n, 512, post.device(), budgets, exact=True))
    want = jax.device_get(planner.plan_from_rep(rep, ids, keys, n, 512, exact=True))
    for b in range(B):
        assert sorted(zip(got[0][b].tolist(), got[1][b].view(np.uint32).tolist())) == \
            sorted(zip(want[0][b].tolist(), want[1][b].view(np.uint32).tolist()))


def test_a_batch_over_the_budgets_takes_the_dense_product(corpus):
    ids, keys, post = corpus
    rep = _queries(1, 12)
    small = planner.budgets_for(256, V)  # 12 tokens × ~190 postings do not fit 256
    assert not bool(planner.inverted_fits(rep, post.device()[1], small))
    got = jax.device_get(planner.plan_from_rep(rep, ids, keys, N, 512, post.device(), small, exact=True))
    want = jax.device_get(planner.plan_from_rep(rep, ids, keys, N, 512, exact=True))
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


@pytest.mark.slow
def test_the_model_plans_and_ranks_the_same_with_and_without_the_index():
    """PAG's parity fixture (30 documents, n = 20): plan, rankings in every mode and the traced search are the
    same with the inverted planner (the fixture's queries fit it) as with the dense product alone."""
    from gr_jax.decoding import rankers

    model, params, table, index, doc_ids = pag_parity.fixture_setup(FIXTURE)
    with np.load(FIXTURE / "inputs.npz") as z:
        q = z["query_input_ids"].astype(np.int32)
    assert model._planner_arrays()[2] is not None  # 30 documents, n 20: the index is built
    rep = model.lexical_rep(params, jnp.asarray(q))
    assert bool(planner.inverted_fits(rep, model._postings.device()[1], planner.budgets_for(
        model.planner_postings, model.docid_base)))
    out = []
    for postings in (model.planner_postings, 0):
        model.planner_postings = postings
        model.use_docids(table)
        assert (model._planner_arrays()[2] is None) == (postings == 0)
        rows, s = jax.device_get(model.plan(params, q))
        runs = {}
        for mode in ("pag", "simul_only", "seq_only", "pag_unguided"):
            with model.in_mode(mode):
                qq, d, sc = model.rank(params, q, index, num_beams=4)
                runs[mode] = rankers.per_query(qq, d, sc, len(q), keys=doc_ids)
        traced = jax.device_get(jax.jit(lambda p, x: model.beam_documents(p, x, index, 4))(params, jnp.asarray(q)))
        out.append(([set(r.tolist()) for r in rows], np.sort(s, axis=1), runs, traced))
    (rows_a, s_a, runs_a, tr_a), (rows_b, s_b, runs_b, tr_b) = out
    assert rows_a == rows_b and np.array_equal(s_a, s_b) and runs_a == runs_b
    assert all(np.array_equal(x, y) for x, y in zip(tr_a, tr_b))
