"""PAG's inverted planner (methods/pag/model_planner.py) beside the dense product it must equal: the index laid out by
hand, query-term pruning by hand, each of its paths (postings, rank layout, dense fallback) taken and equal to the
dense product, and the model's plan, rankings and traced search unchanged by it. The oracle written from the
paper alone is test_planner_oracle.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.methods.pag import parity as pag_parity
from gr_jax.methods.pag import model_planner
from tests.conftest import sweep

FIXTURE = pag_parity.Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "pag_parity" / "peer_v320_d64"


def test_postings_by_hand():
    # rows 0, 1, 2 with keys 5, 9, 1 → by key descending: row 1 (rank 0), row 0 (rank 1), row 2 (rank 2)
    post = model_planner.Postings(np.array([[2, 0], [0, -1], [2, 2]], np.int32), 3, np.array([5, 9, 1], np.int32))
    assert post.by_key.tolist() == [1, 0, 2]
    assert post.start.tolist() == [0, 2, 2, 5]  # token 0: 2 postings, token 1: none, token 2: 3
    assert post.docs.tolist() == [0, 1, 1, 2, 2]  # token 0: ranks of rows 1, 0; token 2: rows 0, 2, 2 (listed twice)
    with pytest.raises(ValueError, match="beyond the planning vocabulary of 2"):
        model_planner.Postings(np.array([[2]], np.int32), 2, np.array([0], np.int32))


def test_query_term_pruning_keeps_every_weight_tied_at_the_t_th():
    from gr_jax.methods.pag.model import PagRetriever
    from gr_jax.backbones import t5

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
    return jnp.asarray(ids), jnp.asarray(keys), model_planner.Postings(ids, V, keys)


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
    budgets = model_planner.budgets_for(1 << 13, V)
    assert bool(model_planner.inverted_fits(rep, post.device()[1], budgets))
    rows, scores, exact, took_postings = jax.device_get(jax.jit(
        lambda r: model_planner.inverted_plan(r, ids, post.device(), n, budgets))(rep))
    assert bool(exact) and bool(took_postings) == quick
    want_rows, want_s, _ = jax.device_get(model_planner.plan_from_rep(rep, ids, keys, n, 512, exact=True))
    for b in range(B):
        assert len(set(rows[b].tolist())) == n and set(rows[b].tolist()) == set(want_rows[b].tolist())
        got = sorted(zip(rows[b].tolist(), scores[b].view(np.uint32).tolist()))
        assert got == sorted(zip(want_rows[b].tolist(), want_s[b].view(np.uint32).tolist()))  # bit for bit


@pytest.mark.parametrize("n, exact", sweep("n, exact", [(20, True), (400, False)], [(400, False)]))
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
    budgets = model_planner.Budgets(active=V, postings=1 << 13, rescored=64)
    assert bool(model_planner.inverted_fits(rep, post.device()[1], budgets))
    assert bool(jax.device_get(model_planner.inverted_plan(rep, ids, post.device(), n, budgets)[2])) == exact
    got = jax.device_get(model_planner.plan_from_rep(rep, ids, keys, n, 512, post.device(), budgets, exact=True))
    want = jax.device_get(model_planner.plan_from_rep(rep, ids, keys, n, 512, exact=True))
    for b in range(B):
        assert sorted(zip(got[0][b].tolist(), got[1][b].view(np.uint32).tolist())) == \
            sorted(zip(want[0][b].tolist(), want[1][b].view(np.uint32).tolist()))


def test_room_for_exactly_the_postings_on_several_tokens(corpus):
    """R = the most postings on documents on several fired tokens of any query of the batch: every query's fit
    (no top-k over the postings: they are gathered in posting order), their documents fill up to R / 2 places,
    and the plan is exact, bit for bit the dense product's."""
    ids, keys, post = corpus
    rep = _queries(2, 12)
    fired = np.asarray(rep) > 0
    on = fired[:, np.maximum(np.asarray(ids), 0)] & (np.asarray(ids) >= 0)[None]  # [B, D, M]
    count = on.sum(axis=2)
    R = int(np.where(count >= 2, count, 0).sum(axis=1).max())
    assert R >= 8 and (np.where(count >= 2, count, 0).sum(axis=1) > R // 2).all()  # over half of the room used
    budgets = model_planner.Budgets(active=V, postings=1 << 13, rescored=R)
    rows, scores, exact, _ = jax.device_get(model_planner.inverted_plan(rep, ids, post.device(), 400, budgets))
    assert exact
    want_rows, want_s, _ = jax.device_get(model_planner.plan_from_rep(rep, ids, keys, 400, 512, exact=True))
    for b in range(rep.shape[0]):
        assert sorted(zip(rows[b].tolist(), scores[b].view(np.uint32).tolist())) == \
            sorted(zip(want_rows[b].tolist(), want_s[b].view(np.uint32).tolist()))


def test_a_batch_over_the_budgets_takes_the_dense_product(corpus):
    ids, keys, post = corpus
    rep = _queries(1, 12)
    small = model_planner.budgets_for(256, V)  # 12 tokens × ~190 postings do not fit 256
    assert not bool(model_planner.inverted_fits(rep, post.device()[1], small))
    got = jax.device_get(model_planner.plan_from_rep(rep, ids, keys, N, 512, post.device(), small, exact=True))
    want = jax.device_get(model_planner.plan_from_rep(rep, ids, keys, N, 512, exact=True))
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_the_ladder_of_compiled_postings_sizes_by_hand():
    big = model_planner.budgets_for(1 << 17, 32000)
    rungs = model_planner.ladder(big)
    assert [b.postings for b in rungs] == [1 << 14, 1 << 15, 1 << 16, 1 << 17] and rungs[-1] == big
    assert {(b.active, b.rescored) for b in rungs} == {(1024, 4096)}  # same tokens, same rescored documents
    small = model_planner.Budgets(active=3, postings=13, rescored=5)
    assert [(b.postings, b.rescored) for b in model_planner.ladder(small)] == [(1, 1), (3, 3), (6, 5), (13, 5)]
    assert model_planner.ladder(small, rungs=1) == (small,)


def test_the_rung_of_a_batch_by_hand():
    # posting lists of lengths 4, 0, 2, 7 (tokens 0..3)
    start = jnp.asarray([0, 4, 4, 6, 13], jnp.int32)
    rungs = (model_planner.Budgets(2, 4, 1), model_planner.Budgets(2, 8, 1), model_planner.Budgets(2, 16, 1))
    rep = jnp.asarray([[1.0, 0, 0, 0], [0, 9.0, 0.5, 0]])  # postings 4 and 2 (token 1 has none: not fired)
    assert int(model_planner.rung_of(rep, start, rungs)) == 0
    rep = jnp.asarray([[1.0, 0, 1.0, 0], [0, 0, 0, 0]])  # 6 postings: the 8 rung
    assert int(model_planner.rung_of(rep, start, rungs)) == 1
    rep = jnp.asarray([[1.0, 0, 0, 1.0], [0, 0, 0, 0]])  # 11
    assert int(model_planner.rung_of(rep, start, rungs)) == 2
    rep = jnp.asarray([[1.0, 0, 1.0, 1.0], [0, 0, 0, 0]])  # 13 postings but 3 fired tokens > 2: none fits
    assert int(model_planner.rung_of(rep, start, rungs)) == 3
    rep = jnp.asarray([[0, 0, 1.0, 0], [0, 0, 0, 1.0]])  # 2 and 7 postings: the batch's largest query decides
    assert int(model_planner.rung_of(rep, start, rungs)) == 1
    assert int(model_planner.rung_of(rep, start, rungs[:1])) == 1  # the 4 rung alone: none fits


@pytest.mark.parametrize("fired, values, n, quick", sweep("fired, values, n, quick", [
    (3, None, N, True), (12, None, N, True), (3, [0.5, 1.0], N, False), (3, None, 700, False)],
    [(3, [0.5, 1.0], N, False)]))
def test_every_rung_plans_what_the_largest_plans(corpus, fired, values, n, quick, monkeypatch):
    """A batch whose postings fit a small rung (a few fired tokens, ~100 postings each, against a budget of 4096)
    plans on the index, at that rung, the same rows with the same score bits as the largest rung alone (one
    compiled size) and as the dense product: by postings (continuous weights), by rank (equal weights on several
    tokens; fewer than n documents scoring, where the 512 rung, 512 + 128 < 700, is not compiled)."""
    ids, keys, post = corpus
    rep = _queries(5, fired, values)
    budgets = model_planner.budgets_for(1 << 12, V)
    rungs = tuple(b for b in model_planner.ladder(budgets) if b.candidates >= n)  # as plan_from_rep keeps
    assert len(rungs) == (3 if n == 700 else 4)
    chosen = int(model_planner.rung_of(rep, post.device()[1], rungs))
    assert chosen < len(rungs) - 1  # the batch runs below the largest rung
    fits, took_postings = jax.device_get(model_planner.inverted_plan(rep, ids, post.device(), n, rungs[chosen])[2:])
    assert bool(fits) and bool(took_postings) == quick  # the index decides, on the path this case is for
    got = jax.device_get(model_planner.plan_from_rep(rep, ids, keys, n, 512, post.device(), budgets, exact=True))
    monkeypatch.setattr(model_planner, "RUNGS", 1)
    one = jax.device_get(model_planner.plan_from_rep(rep, ids, keys, n, 512, post.device(), budgets, exact=True))
    dense = jax.device_get(model_planner.plan_from_rep(rep, ids, keys, n, 512, exact=True))
    for want in (one, dense):
        for b in range(B):
            assert sorted(zip(got[0][b].tolist(), got[1][b].view(np.uint32).tolist())) == \
                sorted(zip(want[0][b].tolist(), want[1][b].view(np.uint32).tolist()))


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
    assert bool(model_planner.inverted_fits(rep, model._postings.device()[1], model_planner.budgets_for(
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


def _both(ids, keys, rep, n, vocab):
    """(inverted, dense) plans as sorted (row, score bits) lists per query."""
    ids, keys, rep = np.asarray(ids, np.int32), np.asarray(keys, np.int32), jnp.asarray(rep, jnp.float32)
    post = model_planner.Postings(ids, vocab, keys).device()
    out = []
    for postings in (post, None):
        rows, s, _ = jax.device_get(model_planner.plan_from_rep(rep, jnp.asarray(ids), jnp.asarray(keys), n, 64, postings,
                                                          model_planner.budgets_for(64, vocab), exact=True))
        out.append([sorted(zip(r.tolist(), x.view(np.uint32).tolist())) for r, x in zip(rows, s)])
    return out


@pytest.mark.slow
def test_a_weight_absorbed_in_the_float_total_cannot_hide_a_document_on_two_tokens():
    # row 0 holds tokens 0 and 1: 3.0 + 1e-7 == 3.0 in float32, so its total equals a weight; weights spanning
    # 2^22 or more send the batch to the dense product
    inv, dense = _both([[0, 1], [2, -1], [3, -1], [-1, -1]], [10, 20, 30, 40], [[3.0, 1e-7, 0.5, 0.25]], 3, 4)
    assert inv == dense and [r for r, _ in dense[0]] == [0, 1, 2]
    u = 0.3 * 2.0 ** -23  # three tokens: the dense j-order sum (1 + u) + u differs from 1 + (u + u)
    inv, dense = _both([[1, 2, 0], [3, -1, -1], [-1, -1, -1]], [1, 2, 3], [[1.0, u, u, 0.5]], 2, 4)
    assert inv == dense and [r for r, _ in dense[0]] == [0, 1]


@pytest.mark.slow
def test_repeated_keys_and_rows_without_a_document_follow_the_key_then_the_row():
    # three rows tie at score 1 with keys 5, 5, 9: key 9 (row 2) first, then the earlier row of the two 5s (row 0)
    inv, dense = _both([[0], [0], [0], [1]], [5, 5, 9, 1], [[1.0, 2.0]], 3, 2)
    assert inv == dense and [r for r, _ in dense[0]] == [0, 2, 3]
    # nothing scores: the two documents by key (7: row 2, 3: row 4), then the first row without one (key −1)
    inv, dense = _both([[-1], [-1], [5], [-1], [6]], [-1, -1, 7, -1, 3], np.zeros((1, 8)), 3, 8)
    assert inv == dense and [r for r, _ in dense[0]] == [0, 2, 4]


def test_an_index_of_padding_alone_plans_by_the_dense_product():
    inv, dense = _both(np.full((4, 2), -1), [3, 1, 2, 0], [[0.5, 0.0, 0.0]], 2, 3)
    assert inv == dense and [r for r, _ in dense[0]] == [0, 2]  # all score 0: keys 3 and 2


@pytest.mark.slow
def test_query_terms_count_the_planning_vocabulary_only_and_a_new_setting_recompiles():
    """planner_query_terms T keeps T planning-vocabulary weights whatever the docid tokens weigh, and changing T
    after a plan plans with the new T (the compiled planner is keyed by it)."""
    model, params, _, _, _ = pag_parity.fixture_setup(FIXTURE)
    with np.load(FIXTURE / "inputs.npz") as z:
        q = jnp.asarray(z["query_input_ids"].astype(np.int32))
    rep = model.lexical_rep(params, q)
    base = model.docid_base
    first = jax.device_get(model.plan(params, q))
    model.planner_query_terms = 3
    kept = np.asarray(model.query_rep(rep))[:, :base]
    assert ((kept > 0).sum(axis=1) == 3).all()  # the fixture's weights do not tie at the 3rd
    got = jax.device_get(model.plan(params, q))
    want = jax.device_get(model_planner.plan_from_rep(model.query_rep(rep), model.set_ids, model._keys,
                                                model.planning_size, 64, exact=True))
    assert [set(r.tolist()) for r in got[0]] == [set(r.tolist()) for r in want[0]]
    assert [set(r.tolist()) for r in got[0]] != [set(r.tolist()) for r in first[0]]
