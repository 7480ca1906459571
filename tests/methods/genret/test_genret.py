"""GenRET: the balanced assignment (Sinkhorn) against a closed form and its balance, the four loss terms against
numpy, frozen codebooks, greedy docid decoding equal to teacher forcing and to the search's steps, the stages of
the batches and their resume, and a demo run restored through infer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.methods.genret.docids import GenretDocids
from gr_jax.methods.genret.model import GenretHead, GenretRetriever
from gr_jax.methods.genret.training import (GenretBatches, GenretTraining, balanced_codes, balanced_kmeans,
                                            capped_assignment, genret_losses, genret_objective, in_batch_ce,
                                            prefix_centered, sinkhorn)
from gr_jax.backbones import t5
from gr_jax.retriever.heads import CodebookHead
from tests.methods import assert_infer_repeats_the_final_run, train_small

CONFIG = t5.get_config("tiny", vocab_size=64, dropout_rate=0.0)
T, K = 3, 5


def _model():
    return GenretRetriever(CONFIG, CodebookHead(T, K), objective=genret_objective)


def test_sinkhorn_two_by_two_closed_form():
    """Both rows prefer code 0. With uniform marginals (½ each) a 2×2 plan is [[p, ½−p], [½−p, p]], and Sinkhorn
    keeps the cross-ratio of exp(S'/ε): (p / (½−p))² = e^{S'00 + S'11 − S'01 − S'10}. S = [[2, 0], [1, 0]]
    rescales to S' = [[1, 0], [½, 0]], cross-ratio e^{½}, so p = e^{¼} / (2 (1 + e^{¼}))."""
    plan = np.asarray(sinkhorn(jnp.array([[2.0, 0.0], [1.0, 0.0]]), epsilon=1.0, iterations=100))
    p = np.exp(0.25) / (2 * (1 + np.exp(0.25)))
    # converged to float32 rounding: entries near ¼, 1e-6 relative
    np.testing.assert_allclose(plan, [[p, 0.5 - p], [0.5 - p, p]], rtol=1e-6)
    # balanced: the row that prefers code 0 less takes code 1; a plain argmax gives both code 0
    assert np.asarray(balanced_codes(jnp.array([[2.0, 0.0], [1.0, 0.0]]))).tolist() == [0, 1]


def _numpy_sinkhorn(S, eps=1.0, iters=100):
    """Plain (not log-domain) alternating normalisation: the oracle shares no code with `sinkhorn`."""
    Q = np.exp(S / np.abs(S).max() / eps)
    B, Kc = Q.shape
    for _ in range(iters):
        Q = Q / Q.sum(0, keepdims=True) / Kc
        Q = Q / Q.sum(1, keepdims=True) / B
    return Q


def test_balanced_codes_spread_a_skewed_batch_and_follow_the_rows():
    rng = np.random.default_rng(0)
    B, Kc = 64, 8
    S = rng.normal(size=(B, Kc)) * 0.3
    S[:, 0] += 2.0  # every document's best code is 0
    assert (S.argmax(1) == 0).all()
    plan = np.asarray(sinkhorn(jnp.asarray(S, jnp.float32)))
    oracle = _numpy_sinkhorn(S)
    # marginals: float32 log-domain iterations against float64; entries ~1/512, 1e-4 relative
    np.testing.assert_allclose(plan, oracle, rtol=1e-4)
    np.testing.assert_allclose(plan.sum(1), 1 / B, rtol=1e-5)
    np.testing.assert_allclose(plan.sum(0), 1 / Kc, rtol=1e-3)
    codes = np.asarray(balanced_codes(jnp.asarray(S, jnp.float32)))
    counts = np.bincount(codes, minlength=Kc)
    assert (counts > 0).all() and counts.max() <= 2 * B // Kc, counts
    np.testing.assert_array_equal(codes, oracle.argmax(1))
    perm = rng.permutation(B)  # a row's code does not depend on where the row sits in the batch
    np.testing.assert_array_equal(np.asarray(balanced_codes(jnp.asarray(S[perm], jnp.float32))), codes[perm])


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_the_loss_terms_by_hand():
    rng = np.random.default_rng(1)
    B, D, t = 4, 6, 1
    qh, dh = rng.normal(size=(B, T, D)), rng.normal(size=(B, T, D))
    ql, dl = rng.normal(size=(B, T, K)) * 2, rng.normal(size=(B, T, K)) * 2
    prefix = rng.integers(0, K, (B, T))
    rows = np.array([7, 3, 7, 5])  # rows 0 and 2 hold the same document
    E = rng.normal(size=(K, D))
    out = genret_losses(*(jnp.asarray(a, jnp.float32) for a in (qh, ql, dh, dl)), jnp.asarray(prefix),
                        jnp.int32(t), jnp.asarray(rows), jnp.asarray(E, jnp.float32))
    c = _numpy_sinkhorn(dl[:, t]).argmax(1)
    np.testing.assert_array_equal(np.asarray(out["codes"]), c)
    ce = -(_log_softmax(ql[:, t])[np.arange(B), c] + _log_softmax(dl[:, t])[np.arange(B), c]).mean()

    def in_batch(S):
        S = S.copy()
        for i in range(B):
            for j in range(B):
                if i != j and rows[i] == rows[j]:
                    S[i, j] = -np.inf
        return -np.diag(_log_softmax(S)).mean()

    cl = in_batch(qh[:, t] @ dh[:, t].T)
    code = -(_log_softmax(ql[:, 0])[np.arange(B), prefix[:, 0]]
             + _log_softmax(dl[:, 0])[np.arange(B), prefix[:, 0]]).mean()  # positions < t: only 0
    rec = in_batch(E[c] @ dh[:, t].T)
    # float32 against float64 on terms of order 1–10: 1e-5 relative
    for name, want in (("ce", ce), ("cl", cl), ("code", code), ("rec", rec)):
        np.testing.assert_allclose(float(out[name]), want, rtol=1e-5, err_msg=name)
    # at position 0 there is no prefix to keep
    out0 = genret_losses(*(jnp.asarray(a, jnp.float32) for a in (qh, ql, dh, dl)), jnp.asarray(prefix),
                         jnp.int32(0), jnp.asarray(rows), jnp.asarray(E, jnp.float32))
    assert float(out0["code"]) == 0.0


def test_in_batch_ce_masks_only_other_copies_of_the_same_document():
    S = jnp.array([[1.0, 5.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    # rows 0 and 1 hold the same document: each one's column of the other is masked (row 0 loses its 5.0)
    masked = float(in_batch_ce(S, jnp.array([2, 2, 9])))
    one_other = -np.log(np.exp(1) / (np.exp(1) + np.exp(0)))
    two_others = -np.log(np.exp(1) / (np.exp(1) + 2))
    np.testing.assert_allclose(masked, (one_other + one_other + two_others) / 3, rtol=1e-6)


@pytest.mark.slow
def test_earlier_codebooks_are_frozen_and_later_ones_untouched():
    model = _model()
    params = model.init_params(0)
    rng = np.random.default_rng(2)
    B = 6
    batch = {"inputs": jnp.asarray(rng.integers(2, 64, (B, 8)), jnp.int32),
             "documents": jnp.asarray(rng.integers(2, 64, (B, 10)), jnp.int32),
             "prefix": jnp.asarray(rng.integers(0, K, (B, T)), jnp.int32),
             "rows": jnp.arange(B, dtype=jnp.int32), "position": jnp.full(B, 1, jnp.int32)}
    grads = jax.grad(lambda p: genret_objective(model, p, batch)[0])(params)
    g = np.abs(np.asarray(grads["head"]["codebook"]).reshape(T, K, -1)).sum(axis=(1, 2))
    assert g[0] == 0.0 and g[2] == 0.0 and g[1] > 0.0, g
    assert np.abs(np.asarray(grads["head"]["code_inputs"])).sum() > 0.0  # the prefix's input codes train


@pytest.mark.slow
def test_greedy_docids_equal_teacher_forcing_and_the_search_steps():
    model = _model()
    params = model.init_params(3)
    # make the codebooks large enough that the argmax depends on the document
    params["head"]["codebook"] = params["head"]["codebook"] * 30.0
    docs = np.random.default_rng(4).integers(2, 64, (70, 12)).astype(np.int32)  # > one batch of 64
    codes, weights = model.decode_docids(params, docs)
    assert codes.shape == (70, T) and len({tuple(c) for c in codes}) > 5
    _, logits = model.positions(params, jnp.asarray(docs), jnp.asarray(codes))
    logits = np.asarray(logits)
    np.testing.assert_array_equal(logits.argmax(-1), codes)  # each code is the argmax given the earlier ones
    np.testing.assert_allclose(weights, np.take_along_axis(logits, codes[..., None], -1)[..., 0], rtol=1e-5,
                               atol=1e-5)
    cache = model._cache(params, jnp.asarray(docs[:5]), T + 1)
    prev = jnp.full(5, CONFIG.decoder_start_token_id, jnp.int32)
    for pos in range(T):  # the search's cached steps give teacher forcing's logits
        step_logits, cache = model._step(params, cache, prev)
        # float32 through two code paths (cached attention vs full): logits of order 10–100, 1e-4 relative
        np.testing.assert_allclose(np.asarray(step_logits), logits[:5, pos], rtol=1e-4, atol=1e-3)
        prev = jnp.asarray(codes[:5, pos])


def _batches(order=None, B=4):
    rows = np.arange(10)  # pair i: query "q<i>" (input tokens all i) → document row i
    keys = [(f"q{i}", f"d{i}") for i in rows]
    o = np.arange(10) if order is None else order
    doc_tokens = np.arange(10)[:, None] * np.ones((1, 3), np.int32) + 100
    b = GenretBatches(np.tile(rows[o, None], (1, 4)), rows[o], [keys[i] for i in o], doc_tokens, B,
                      stage_steps=4, positions=3, seed=1)
    b.set_docids(np.stack([rows % 2, rows % 3, rows % 5], 1))  # position 1's prefix groups: even / odd rows
    return b


def test_the_batches_stages_prefix_groups_and_resume():
    with pytest.raises(RuntimeError, match="set_docids"):
        next(GenretBatches(np.zeros((2, 3)), np.arange(2), [1, 2], np.zeros((2, 3)), 2, 2, 3))
    b = _batches()
    got = [next(b) for _ in range(12)]
    assert [int(x["position"][0]) for x in got] == [0] * 4 + [1] * 4 + [2] * 4
    for x in got:
        r = x["inputs"][:, 0]
        assert len(r) == 4
        np.testing.assert_array_equal(x["rows"], r)
        np.testing.assert_array_equal(x["documents"][:, 0], r + 100)
        np.testing.assert_array_equal(x["prefix"], np.stack([r % 2, r % 3, r % 5], 1))
    # position 1: groups {0,2,4,6,8} and {1,3,5,7,9} (code 0 = row mod 2) → batches of 4, then 1 + 3 filled from
    # the other group; one epoch = 4 batches, every pair once as a group member
    plan = b.plan(1, 0)
    assert len(plan) == 4
    members = np.concatenate([m for m, _ in plan])
    assert sorted(members.tolist()) == list(range(10))
    for m, fill in plan:
        assert len(m) + len(fill) == 4 and len({int(x) % 2 for x in m}) == 1
        assert all(int(f) % 2 != int(m[0]) % 2 for f in fill)
    # position 2: groups by (row mod 2, row mod 3): six groups of 1–2 pairs
    assert sorted(len(g) for g in b.groups(2)) == [1, 1, 2, 2, 2, 2]
    # resume: the state is the step
    resumed = _batches()
    resumed.set_state({"step": 3})
    for want in got[3:]:
        have = next(resumed)
        assert all(np.array_equal(have[k], want[k]) for k in want)
    # the order of the pairs changes no batch (keys decide)
    shuffled = _batches(order=np.random.default_rng(0).permutation(10))
    for want in got:
        have = next(shuffled)
        assert all(np.array_equal(have[k], want[k]) for k in want)
    with pytest.raises(ValueError, match="one per document row"):
        b.set_docids(np.zeros((10, 2)))


def test_prefix_centering_by_hand():
    x = np.array([[1.0, 0.0], [3.0, 2.0], [10.0, 10.0], [0.0, 0.0]])
    prefix = np.array([[0], [0], [1], [2]])
    # group means (2, 1), (10, 10), (0, 0); global mean (3.5, 3)
    want = np.array([[2.5, 2.0], [4.5, 4.0], [3.5, 3.0], [3.5, 3.0]])
    np.testing.assert_allclose(prefix_centered(x, prefix), want, rtol=1e-6)
    np.testing.assert_array_equal(prefix_centered(x, prefix[:, :0]), x.astype(np.float32))


def test_capped_assignment_by_hand():
    d = np.array([[0.0, 5.0], [1.0, 4.0], [2.0, 3.0], [9.0, 0.5]])
    # nearest first: (0,0) 0.0, (3,1) 0.5, (1,0) 1.0 fills cluster 0 (cap 2); row 2 goes to cluster 1 (3.0)
    assert capped_assignment(d, 2).tolist() == [0, 0, 1, 1]
    assert capped_assignment(d, 4).tolist() == [0, 0, 0, 1]
    with pytest.raises(ValueError, match="cannot hold"):
        capped_assignment(d, 1)


def test_balanced_kmeans_splits_a_cluster_above_the_cap():
    rng = np.random.default_rng(5)
    # 60 points near one centre and 4 near another: plain k-means with k = 2 keeps the two blobs (60 / 4); with
    # clusters capped at the mean size (32) the large blob is split and the 4 far points join 28 near ones
    x = np.concatenate([rng.normal(0, 1, (60, 2)), rng.normal(20, 1, (4, 2))]).astype(np.float32)
    from gr_jax.docids.quantize import kmeans

    assert sorted(np.bincount(kmeans(x, 2, seed=0).assignments).tolist()) == [4, 60]
    c = balanced_kmeans(x, 2, iters=30, max_ratio=1.0)
    d = ((x[:, None] - c[None]) ** 2).sum(-1)
    codes = capped_assignment(d, 32)
    assert sorted(np.bincount(codes, minlength=2).tolist()) == [32, 32]
    # converged: each centroid is the mean of the rows its own capped assignment gives it (float32 means, 1e-5)
    for j in range(2):
        np.testing.assert_allclose(c[j], x[codes == j].mean(0), rtol=1e-5, atol=1e-5)
    far = codes[60:]
    assert len(set(far.tolist())) == 1  # the far points stay together


def test_the_codebook_of_a_new_position_from_the_documents_and_again_the_same():
    model = _model()
    params = model.init_params(6)
    docs = np.random.default_rng(7).integers(2, 64, (40, 12)).astype(np.int32)
    scheme = GenretDocids(length=T, codes=K)
    table = scheme.table(*model.decode_docids(params, docs), np.arange(40), 64)
    training = GenretTraining(train_steps=9, positions=T)
    assert training.on_refresh(0, params, model, table, docs) is None  # position 0: untrained states, no k-means
    assert training.on_refresh(4, params, model, table, docs) is None  # not a stage's start
    new = training.on_refresh(3, params, model, table, docs)  # stage 2 starts: position 1
    book, old = (np.asarray(p["head"]["codebook"]).reshape(T, K, -1) for p in (new, params))
    np.testing.assert_array_equal(book[[0, 2]], old[[0, 2]])
    states = model.document_states(params, docs, table.sequences, 1)
    want = balanced_kmeans(prefix_centered(states, table.sequences[:, :1]), K, seed=1)
    np.testing.assert_allclose(book[1], want, rtol=1e-5, atol=1e-6)
    again = training.on_refresh(3, new, model, scheme.table(*model.decode_docids(new, docs), np.arange(40), 64), docs)
    # the states at position 1 do not read E_1: bit for bit the same centroids (what a resumed run relies on)
    np.testing.assert_array_equal(np.asarray(again["head"]["codebook"]), np.asarray(new["head"]["codebook"]))
    assert training.on_refresh(9, params, model, table, docs) is None  # training is over: no rewrite
    assert GenretTraining(train_steps=9, kmeans_init=False).on_refresh(3, params, model, table, docs) is None
    # the corpus in another row order (the k-means reads documents by id): the same codebook, bit for bit
    ids = np.array([f"d{i:02d}" for i in range(40)])
    perm = np.random.default_rng(8).permutation(40)
    keyed = GenretTraining(train_steps=9, positions=T)
    keyed._by_key = np.argsort(ids[perm], kind="stable")
    moved = keyed.on_refresh(3, params, model, scheme.table(*model.decode_docids(params, docs[perm]), np.arange(40),
                                                            64), docs[perm])
    np.testing.assert_array_equal(np.asarray(moved["head"]["codebook"]), np.asarray(new["head"]["codebook"]))


def test_the_scheme_and_the_model_refuse_what_they_cannot_do():
    from gr_jax.retriever.heads import TextHead

    with pytest.raises(ValueError, match="codebook docids"):
        GenretRetriever(CONFIG, TextHead())
    with pytest.raises(ValueError, match="decoded by the model"):
        GenretDocids().assign(None)
    with pytest.raises(ValueError, match="integer ≥ 1"):
        GenretDocids(codes=0)
    scheme = GenretDocids(length=2, codes=4)
    table = scheme.table(np.array([[1, 3], [0, 2]]), np.zeros((2, 2)), np.array([5, 2]), 100)
    assert table.doc_rows.tolist() == [2, 5] and table.sequences.tolist() == [[0, 2], [1, 3]]
    with pytest.raises(ValueError, match="outside"):
        scheme.table(np.array([[1, 4]]), np.zeros((1, 2)), np.array([0]), 100)
    with pytest.raises(ValueError, match="codes 8"):
        GenretDocids(length=2, codes=4).load_state({"length": 2, "codes": 8}, {})
    assert isinstance(_model().head, GenretHead)


@pytest.mark.slow
def test_a_small_genret_run_trains_in_stages_and_restores_through_infer(tmp_path):
    exp, model_dir, metrics = train_small(tmp_path, "experiments/demo/genret.gin", 9,
                                          "GenretDocids.codes = 8\ngenret_objective.iterations = 20\n")
    assert [m["position"] for m in metrics if "loss" in m] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    lines = (model_dir / "docids" / "step9.tsv").read_text().splitlines()
    assert len(lines) == 60 and all(len(x.split("\t")[1].split()) == 3 for x in lines)
    assert_infer_repeats_the_final_run(tmp_path, exp, model_dir, 9)


# -- GenRET's released stages: "pre" before each main stage, a final "fit" stage --------------------------------------


def test_occurrence_codes_number_the_documents_of_a_shared_docid_by_id():
    from gr_jax.methods.genret.training import occurrence_codes

    prefixes = np.array([[1, 2], [0, 0], [1, 2], [1, 2], [0, 1], [1, 2]])
    rank = np.array([5, 0, 1, 3, 2, 4])  # document-id order of the rows
    # docid (1, 2) holds rows 2 (rank 1), 3 (rank 3), 5 (rank 4), 0 (rank 5): places 1, 2, 3, 4 → mod 4: 1, 2, 3, 0
    np.testing.assert_array_equal(occurrence_codes(prefixes, rank, 4), [0, 1, 1, 2, 1, 3])
    np.testing.assert_array_equal(occurrence_codes(prefixes, rank, 16), [4, 1, 1, 2, 1, 3])


def test_the_stages_of_the_released_schedule():
    t = GenretTraining(train_steps=14, positions=3, pre_stage=True, fit_stage=True)
    assert t.stages == [("pre", 0), ("main", 0), ("pre", 1), ("main", 1), ("pre", 2), ("main", 2), ("fit", 3)]
    assert t.length == 4 and t.stage_steps == 2 and t.refresh_period == 2
    with pytest.raises(ValueError, match="multiple of the 7 stages"):
        _ = GenretTraining(train_steps=15, positions=3, pre_stage=True, fit_stage=True).stage_steps
    assert GenretTraining(train_steps=9, positions=3).stages == [("main", 0), ("main", 1), ("main", 2)]


def test_phased_batches_carry_the_stage_and_the_fit_codes():
    rows = np.arange(10)
    keys = [(f"q{i}", f"d{i}") for i in rows]
    doc_tokens = np.arange(10)[:, None] * np.ones((1, 3), np.int32) + 100
    stages = GenretTraining(train_steps=14, positions=2, pre_stage=True, fit_stage=True).stages
    with pytest.raises(ValueError, match="a fit stage needs the codes per position"):
        GenretBatches(np.tile(rows[:, None], (1, 4)), rows, keys, doc_tokens, 4, stage_steps=2, positions=3,
                      stages=stages)
    b = GenretBatches(np.tile(rows[:, None], (1, 4)), rows, keys, doc_tokens, 4, stage_steps=2, positions=3, seed=1,
                      stages=stages, doc_rank=rows[::-1].copy(), codes=8)
    b.set_docids(np.stack([rows % 2, rows % 3, np.zeros(10, int)], 1))
    got = [next(b) for _ in range(10)]
    assert [int(x["phase"][0]) for x in got] == [1, 1, 0, 0, 1, 1, 0, 0, 2, 2]  # pre, main, pre, main, fit
    assert [int(x["position"][0]) for x in got] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    # the fit code of row r: its place among the rows of its docid (r mod 2, r mod 3) by document rank (rows reversed)
    for x in got:
        for r, code in zip(x["rows"], x["fit_codes"]):
            same = [s for s in range(10) if (s % 2, s % 3) == (r % 2, r % 3)]
            assert code == sorted(same, reverse=True).index(r) + 1
    plain = _batches()
    assert "phase" not in next(plain) and "fit_codes" not in next(plain)  # the default schedule: batches as before
    pre_only = GenretBatches(np.tile(rows[:, None], (1, 4)), rows, keys, doc_tokens, 4, stage_steps=2, positions=2,
                             stages=GenretTraining(train_steps=8, positions=2, pre_stage=True).stages)
    pre_only.set_docids(np.stack([rows % 2, rows % 3], 1))
    assert int(next(pre_only)["phase"][0]) == 1 and not next(pre_only)["fit_codes"].any()  # no fit stage: no numbering


@pytest.mark.slow  # over 5 s: the default tier keeps within 10 minutes
def test_the_stage_weights_and_the_fit_targets():
    model = _model()
    params = model.init_params(3)
    rng = np.random.default_rng(4)
    B = 4
    batch = {"inputs": rng.integers(2, 64, (B, 6)).astype(np.int32),
             "documents": rng.integers(2, 64, (B, 8)).astype(np.int32),
             "prefix": rng.integers(0, K, (B, T)).astype(np.int32), "rows": np.arange(B, dtype=np.int32),
             "position": np.full(B, 2, np.int32), "fit_codes": np.array([1, 2, 1, 3], np.int32)}
    table = params["head"]["codebook"].reshape(T, K, -1)
    positions = jax.jit(model.positions)  # compiled whole rather than op by op: less time
    q_h, q_l = positions(params, batch["inputs"], batch["prefix"])
    d_h, d_l = positions(params, batch["documents"], batch["prefix"])
    objective = jax.jit(lambda p, b: genret_objective(model, p, b)[0])

    def loss(phase):
        return float(objective(params, {**batch, "phase": np.full(B, phase, np.int32)}))

    terms = genret_losses(q_h, q_l, d_h, d_l, batch["prefix"], 2, batch["rows"], table[2])
    # main (0): the configured weights; pre (1): 0.5 cl + 0.5 code, as their w_1
    assert loss(0) == pytest.approx(0.5 * (terms["ce"] + terms["cl"] + terms["code"]) + 0.1 * terms["rec"], rel=1e-5)
    assert loss(1) == pytest.approx(0.5 * (terms["cl"] + terms["code"]), rel=1e-5)
    # fit (2): 0.5 ce against the fit codes (not the balanced ones) + 1.0 code, as their w_3
    fit = genret_losses(q_h, q_l, d_h, d_l, batch["prefix"], 2, batch["rows"], table[2],
                        targets_B=jnp.asarray(batch["fit_codes"]))
    np.testing.assert_array_equal(np.asarray(fit["codes"]), batch["fit_codes"])
    assert loss(2) == pytest.approx(0.5 * float(fit["ce"]) + float(fit["code"]), rel=1e-5)
    assert float(fit["ce"]) != pytest.approx(float(terms["ce"]), rel=1e-3)


def test_with_pre_stages_the_k_means_initialises_position_0_after_its_pre_stage():
    model = _model()
    params = model.init_params(6)
    docs = np.random.default_rng(7).integers(2, 64, (40, 12)).astype(np.int32)
    table = GenretDocids(length=T, codes=K).table(*model.decode_docids(params, docs), np.arange(40), 64)
    training = GenretTraining(train_steps=12, positions=T, pre_stage=True)  # 6 stages of 2 steps
    assert training.on_refresh(0, params, model, table, docs) is None  # the pre stage of position 0 starts
    new = training.on_refresh(2, params, model, table, docs)  # its main stage: E_0 from the documents' states
    book, old = (np.asarray(p["head"]["codebook"]).reshape(T, K, -1) for p in (new, params))
    np.testing.assert_array_equal(book[1:], old[1:])
    assert not np.allclose(book[0], old[0])
    assert training.on_refresh(4, params, model, table, docs) is None  # position 1's pre stage
