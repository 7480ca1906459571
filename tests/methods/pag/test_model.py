"""PAG (004_pag_lost_in_decoding.txt §2–3): parity with PAG's own PyTorch code on its fixture, the look-ahead
bonus table by hand on a 6-document trie, a relevant document that Seq-only prunes at beam 2 and PAG's bonus
recovers, the planner's sparse product and its tie rule."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax.decoding.beam_search import beam_search
from gr_jax.index.trie import TrieIndex
from gr_jax.methods.pag import model as pag
from gr_jax.methods.pag import parity as pag_parity
from tests.conftest import run_tool

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "fixtures" / "pag_parity" / "peer_v320_d64"


@pytest.fixture(scope="module")
def parity():
    return pag_parity.check_fixture(FIXTURE)


@pytest.mark.slow
def test_parity_with_pags_own_code(parity):
    # REFERENCE.md: logits recomputed with other batching differ by ~1e-5 (values up to ~40); the smallest
    # selection margin is 7e-2 and the smallest gap between final scores 2e-3, so 1e-4 separates noise from a
    # real difference and rankings must be identical
    for key in ("set_docids_identical", "set_docid_file_identical", "planning_set_identical",
                "final_hypotheses_identical", "ranking_pag_identical", "ranking_pag_no_final_lex_identical",
                "ranking_raw_plus_lex_identical", "ranking_lexical_condition_identical", "rankings_identical"):
        assert parity[key] is True, key
    diffs = {k: v for k, v in parity.items() if k.endswith("_diff")}
    assert len(diffs) == 9 and all(v <= 1e-5 for v in diffs.values()), diffs  # relative to the magnitude
    assert pag_parity.within(parity)


@pytest.mark.slow
def test_the_check_fails_on_a_changed_ranking_and_the_tool_says_so(tmp_path):
    fx = tmp_path / "fixture"
    shutil.copytree(FIXTURE, fx)
    dec = json.loads((fx / "decoding.json").read_text())
    dec["beams"] = [4]  # one beam size keeps the run short; the change below is at beam 4
    ranking = dec["per_query"][1]["runs"]["beam4_guided"]["ranking_pag"]
    ranking[0], ranking[-1] = ranking[-1], ranking[0]
    (fx / "decoding.json").write_text(json.dumps(dec))
    res = subprocess.run([sys.executable, "tools/check_parity.py", "--method", "pag", "--fixture", str(fx)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stderr
    line = json.loads(res.stdout.strip().splitlines()[-1])
    assert line["ranking_pag_identical"] is False and line["rankings_identical"] is False
    assert line["ranking_raw_plus_lex_identical"] is True  # only what was changed is reported as different
    assert line["prefix_logits_diff"] < 1e-5 and line["within_tolerance"] is False


def test_check_parity_refuses_a_folder_that_is_not_a_fixture(tmp_path, capsys):
    rc, _, err = run_tool("check_parity", ["--method", "pag", "--fixture", tmp_path], capsys)
    assert rc == 2 and "not a PAG parity fixture folder" in err
    assert "Traceback" not in err


# ----------------------------------------------------------------------------------------------------------
# the bonus table by hand
# ----------------------------------------------------------------------------------------------------------

# 6 documents, docids of 2 tokens over a vocabulary of 10: rows 0..5
DOCIDS = np.array([[1, 4], [1, 5], [1, 5], [2, 6], [3, 7], [3, 8]], np.int32)


def _paths(index, docids):
    nodes = index.path_nodes(docids, np.full(len(docids), docids.shape[1]))[:, 1:]
    return jnp.asarray(nodes.astype(np.int32)), jnp.asarray(index.lookup(docids.tolist()).astype(np.int32))


def test_bonus_table_by_hand_on_a_six_document_trie():
    index = TrieIndex.build(DOCIDS, np.arange(6), vocab_size=10)
    paths, leaves = _paths(index, DOCIDS)
    planned = jnp.asarray([[2, 0, 4]])  # query 0 plans rows 2 (s 5.0), 0 (s 3.0) and 4 (s 1.5)
    s = jnp.asarray([[5.0, 3.0, 1.5]])
    sizes = tuple(int(x) + 1 for x in np.append(np.asarray(paths).max(axis=0), np.asarray(leaves).max()))
    assert pag.paths_in_leaf_order(np.asarray(paths), np.asarray(leaves))
    for dense in ((), sizes):  # sorted keys + binary search, and dense rows per level: the same bonuses
        for ordered in (False, True):  # one sort per level, or one sort by leaf for all levels
            _check_bonus_by_hand(index, pag.bonus_tables(paths, leaves, planned, s, dense, ordered))


@pytest.mark.parametrize("same_length", [True, False])
def test_bonus_tables_in_every_layout_equal_a_brute_force_max(same_length):
    """Docids of one length (the index numbers every level in leaf order: one sort serves all levels) and of
    several (paths with −1 past the end; leaves numbered length by length, so not in that order), shared
    docids, repeated and tied scores: every layout gives each node the max s_simul of the planned rows through
    it, computed here row by row."""
    rng = np.random.default_rng(3)
    lengths = np.full(80, 3) if same_length else rng.integers(2, 5, 80)
    docids = [rng.integers(1, 5, n - 1).tolist() + [5] for n in lengths]  # 5 ends a docid: none is a prefix
    index = TrieIndex.build(docids, np.arange(80), vocab_size=6)
    width = int(lengths.max())
    arr = np.zeros((80, width), np.int32)
    for i, d in enumerate(docids):
        arr[i, :len(d)] = d
    nodes = index.path_nodes(arr, lengths)[:, 1:]
    leaves = index.lookup(docids)
    ordered = pag.paths_in_leaf_order(nodes, leaves)
    assert ordered == same_length
    paths, leaf_d = jnp.asarray(nodes.astype(np.int32)), jnp.asarray(leaves.astype(np.int32))
    planned = rng.integers(0, 80, (3, 12))
    scores = rng.choice([0.5, 1.0, 2.0, 3.25], (3, 12)).astype(np.float32)
    sizes = tuple(int(x) + 1 for x in np.append(nodes.max(axis=0), leaves.max()))
    layouts = [((), False), (sizes, False)] + ([((), True), (sizes[:1], True)] if ordered else [])
    for level in range(width + 1):
        column = leaves if level == width else nodes[:, level]
        ask = np.append(np.unique(column[column >= 0]), [column.max() + 7, -1]).astype(np.int32)
        want = np.full((3, len(ask)), -np.inf, np.float32)
        for b in range(3):
            for row, sc in zip(planned[b], scores[b]):
                hit = (ask == column[row]) & (ask >= 0)
                want[b, hit] = np.maximum(want[b, hit], sc)
        assert np.isfinite(want).any() and not np.isfinite(want).all()  # the planned rows reach some nodes only
        for layout in layouts:
            state = pag.bonus_tables(paths, leaf_d, jnp.asarray(planned), jnp.asarray(scores), *layout)
            ids = jnp.asarray(np.broadcast_to(ask, (3, len(ask))))
            got = pag.leaf_bonus(ids, state) if level == width else pag.node_bonus(level, ids, state)
            expect = np.where(np.isfinite(want), want, 0.0) if level == width else want
            np.testing.assert_array_equal(np.asarray(got), expect, err_msg=f"level {level}, layout {layout}")


@pytest.mark.parametrize("ordered", [False, True])
def test_a_searchs_child_slots_get_a_brute_force_max_where_the_tables_are_placed(ordered):
    """Tables built `placed` (each planned node finds its beam and slot, `_placed_bonus`) at every CSR level of a
    trie with consecutive children: the child slots of beams as the search hands them (−1 where no child, a dead
    beam's too, which repeats a live beam's node), each slot's max s_simul over the planned rows through it,
    computed here row by row; a slot under none gets −inf."""
    rng = np.random.default_rng(5)
    docids = sorted({tuple(rng.integers(1, 5, 3).tolist()) + (5,) for _ in range(90)})
    index = TrieIndex.build([list(d) for d in docids], np.arange(len(docids)), vocab_size=6, dense_budget_bytes=0)
    trie = index.device()
    arr = np.asarray(docids, np.int32)
    nodes = index.path_nodes(arr, np.full(len(arr), arr.shape[1]))[:, 1:]
    leaves = index.lookup([list(d) for d in docids])
    assert pag.paths_in_leaf_order(nodes, leaves)
    B, P = 3, 4  # P planned rows a query: fewer than a level's n · C slots, so the placed path is the one taken
    planned = rng.integers(0, len(docids), (B, P))
    scores = rng.choice([0.5, 1.0, 2.0, 3.25], (B, P)).astype(np.float32)
    placed = tuple(trie.consecutive_children(d) for d in range(nodes.shape[1]))
    state = pag.bonus_tables(jnp.asarray(nodes.astype(np.int32)), jnp.asarray(leaves.astype(np.int32)),
                             jnp.asarray(planned), jnp.asarray(scores), (), ordered, placed)
    checked = 0
    for d in range(1, nodes.shape[1]):
        assert placed[d], f"level {d} of a built CSR trie has consecutive children"
        at_depth = np.unique(nodes[:, d - 1])  # the beams: nodes at depth d, some of them, in random order
        beams = rng.permutation(at_depth)[:6]
        beams = np.concatenate([beams, beams[:2]])  # two dead beams on live beams' nodes
        alive = np.arange(len(beams)) < len(beams) - 2
        _, child, _, valid = trie.children(d, jnp.asarray(np.broadcast_to(beams, (B, len(beams))), jnp.int32))
        child = jnp.where(jnp.asarray(valid) & jnp.asarray(alive)[None, :, None], child, -1)
        assert child.shape[1] * child.shape[2] > P  # `_bonus` takes the placed path (n · C > N)
        got = np.asarray(pag.node_bonus(d, child, state))
        want = np.full(child.shape, -np.inf, np.float32)
        ids = np.asarray(child)
        for b in range(B):
            for row, sc in zip(planned[b], scores[b]):
                hit = (ids[b] == nodes[row, d]) & (ids[b] >= 0)
                want[b][hit] = np.maximum(want[b][hit], sc)
        live = ids[:, alive] >= 0
        assert np.isfinite(want).any() and (~np.isfinite(want[:, alive]) & live).any()  # some children get none
        np.testing.assert_array_equal(got, want, err_msg=f"level {d}")
        np.testing.assert_array_equal(np.asarray(pag.node_bonus(d, child, state, restrict=False)),
                                      np.where(np.isfinite(want), want, 0.0), err_msg=f"level {d}")
        checked += 1
    assert checked == nodes.shape[1] - 1


@pytest.mark.slow  # the planning sets' search in the default tier: tests/retriever/test_traced_search.py
@pytest.mark.parametrize("M, K, mode", [(6, 4, "pag_unguided"), (4, 8, "pag")])  # each mode on one trie shape
def test_the_planning_sets_trie_finds_what_the_corpus_trie_with_tables_finds(M, K, mode, monkeypatch):
    """A random tiny PAG over 1500 docids of depth 6 (a run of CSR levels stored together among them) or 4 (CSR
    levels whose invalid slots read child id 0), no dense bonus rows, 16 beams of ≤ K children against 40 planned
    documents. (1) The corpus trie searched with the bonus tables (`searcher(...).search(query_state=...)`): the
    wide levels take the placed tables, and it returns what it returns with every level looked up by binary
    search, bit for bit — dead beams and beams at a level's first node included (the search hands −1 where a slot
    holds no child). (2) The search PAG runs (`beams_and_state`: the planning sets' own trie, flat candidates)
    returns the same docids in the same order, with final scores equal to rounding."""
    from gr_jax.docids.base import DocidTable
    from gr_jax.methods.pag.docids import order_keys
    from gr_jax.backbones import t5
    from gr_jax.data.vocab import DocidTokenSpace

    monkeypatch.setattr(pag, "DENSE_BONUS_NODES", 0)
    rng = np.random.default_rng(0)
    base, n = 512, 1500
    codes = np.unique(rng.integers(0, K, (2 * n, M), dtype=np.int32), axis=0)[rng.permutation(n)]
    codes[7] = codes[3]  # two documents with one docid: the final bonus is the max of both
    seqs = (base + K * np.arange(M)[None] + codes).astype(np.int32)
    ids = np.sort(rng.integers(3, base, (n, 8)), axis=1).astype(np.int32)
    ids[:, 1:][ids[:, 1:] == ids[:, :-1]] = -1
    config = t5.get_config("tiny", dropout_rate=0.0).replace(vocab_size=base + M * K)
    table = DocidTable(seqs, np.full(n, M, np.int32), np.arange(n), DocidTokenSpace("text", M * K, offset=base,
                       length=M), extras={"set_ids": ids, "order_key": order_keys([f"d{i}" for i in range(n)])})
    model = pag.PagRetriever(config, planning_size=40)
    params = model.init_params(0)
    model.use_docids(table)
    model.mode = mode
    index = table.index(vocab_size=config.vocab_size, dense_budget_bytes=0)
    q = jnp.asarray(rng.integers(3, base, (4, 12)), jnp.int32)

    def corpus_trie():
        state = model.query_state(params, q, index)
        res = model.searcher(16, mode == "pag").search(params, q, index.device(), query_state=state)
        return state, jax.device_get((res.leaf_ids, res.valid, model.final_scores(res, state)))

    state, placed = corpus_trie()
    assert len([k for k in state if k.endswith("_placed_keys")]) >= 3
    assert bool(index.device().level_runs()) == (M == 6)  # the wide levels
    layout = model._tables_layout
    model._tables_layout = layout[:2] + ((),) + layout[3:]
    looked_up = corpus_trie()[1]
    model._tables_layout = layout
    for a, b in zip(placed, looked_up):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    res, state = model.beams_and_state(params, q, index, 16)
    got = jax.device_get((res.leaf_ids, res.valid, model.final_scores(res, state)))
    valid = placed[1]
    assert valid.sum() == 4 * 16
    np.testing.assert_array_equal(got[1], valid)
    np.testing.assert_array_equal(got[0][valid], placed[0][valid])
    # the same candidates' logits from a dot of another shape: float32 rounding of the raw sums' size
    np.testing.assert_allclose(got[2][valid], placed[2][valid], rtol=0, atol=1e-5 * np.abs(placed[2][valid]).max())
    assert len(jax.device_get(model.rank(params, q, index, num_beams=16))[1]) == 4 * 16


def test_one_sort_by_leaf_with_docids_that_end_early():
    # rows 1 and 3 end at depth 1 (−1 below): level 1 ascends where it has nodes, as `paths_in_leaf_order` asks
    paths, leaves = np.array([[0, 3], [1, -1], [1, 4], [2, -1]]), np.array([0, 1, 2, 3])
    assert pag.paths_in_leaf_order(paths, leaves)
    state = pag.bonus_tables(jnp.asarray(paths, jnp.int32), jnp.asarray(leaves, jnp.int32),
                             jnp.asarray([[3, 1, 2, 0]]), jnp.asarray([[1.0, 2.0, 0.5, 4.0]]), (), True)
    ask = lambda *ids: jnp.asarray([list(ids)], jnp.int32)  # noqa: E731
    np.testing.assert_array_equal(np.asarray(pag.node_bonus(0, ask(0, 1, 2), state))[0], [4.0, 2.0, 1.0])
    np.testing.assert_array_equal(np.asarray(pag.node_bonus(1, ask(3, 4, 5), state))[0], [4.0, 0.5, -np.inf])
    np.testing.assert_array_equal(np.asarray(pag.leaf_bonus(ask(0, 1, 2, 3, 9), state))[0], [4.0, 2.0, 0.5, 1.0, 0.0])


def test_paths_out_of_leaf_order_are_found():
    # leaf 0 lies under node 5 and leaf 1 under node 3: one sort by leaf would not order that level
    assert not pag.paths_in_leaf_order(np.array([[5, 9], [3, 10]]), np.array([0, 1]))
    assert pag.paths_in_leaf_order(np.array([[3, 9], [5, -1], [5, 10]]), np.array([0, 1, 2]))


def test_the_pooled_planner_rep_has_the_bits_of_the_paper_formula():
    """rep = max_i log(1 + ReLU(logit_i)) · mask_i (training's form) and log(1 + ReLU(max_i unmasked logit_i)) (the
    planner's): the same floats, padding inside and at the end of queries and a query of padding only."""
    from gr_jax.backbones import t5

    config = t5.get_config("tiny", dropout_rate=0.0)
    net = t5.T5(config)
    q = np.random.default_rng(0).integers(3, config.vocab_size, (4, 9)).astype(np.int32)
    q[1, 5:] = config.pad_token_id
    q[2, 2] = config.pad_token_id
    q[3] = config.pad_token_id
    params = pag.PagRetriever(config).init_params(0)["network"]
    plain = np.asarray(pag.lexical_rep(net, params, jnp.asarray(q)))
    pooled = np.asarray(pag.lexical_rep(net, params, jnp.asarray(q), pooled=True))
    assert (plain[:3] > 0).any(axis=1).all() and not plain[3].any()
    np.testing.assert_array_equal(pooled, plain)


def _check_bonus_by_hand(index, state):
    node = lambda *prefix: int(index.path_nodes(np.array([list(prefix)]), np.array([len(prefix)]))[0, -1])  # noqa
    level0 = jnp.asarray([[[node(1), node(2), node(3)]]])
    # node "1" holds rows 0, 1, 2 → max over planned rows 0 and 2 = 5.0; "2" holds row 3 (not planned) → −inf
    np.testing.assert_array_equal(np.asarray(pag.node_bonus(0, level0, state))[0, 0], [5.0, -np.inf, 1.5])
    np.testing.assert_array_equal(np.asarray(pag.node_bonus(0, level0, state, restrict=False))[0, 0], [5.0, 0.0, 1.5])
    level1 = jnp.asarray([[[node(1, 4), node(1, 5), node(3, 7), node(3, 8)]]])
    np.testing.assert_array_equal(np.asarray(pag.node_bonus(1, level1, state))[0, 0], [3.0, 5.0, 1.5, -np.inf])
    np.testing.assert_array_equal(np.asarray(pag.pruning_only(1, level1, state))[0, 0], [0.0, 0.0, 0.0, -np.inf])
    # docid (1, 5) is shared by rows 1 and 2: its leaf gets row 2's 5.0 (row 1 is not planned but receives it)
    leaf_ids = jnp.asarray(index.lookup([[1, 4], [1, 5], [2, 6]]).astype(np.int32))[None]
    np.testing.assert_array_equal(np.asarray(pag.leaf_bonus(leaf_ids, state))[0], [3.0, 5.0, 0.0])


def _table_step(cache, tokens_R):
    """A toy model of raw logits: the next token's logits depend on the last token only (table [V, V])."""
    table = cache["table"]
    return table[tokens_R], cache


def test_seq_only_prunes_the_relevant_document_at_beam_2_and_pags_bonus_recovers_it():
    docids = np.array([[1, 4], [1, 5], [2, 6], [3, 7]], np.int32)  # row 3 is the relevant document
    index = TrieIndex.build(docids, np.arange(4), vocab_size=10)
    table = np.full((10, 10), -1.0, np.float32)
    table[0, [1, 2, 3]] = [5.0, 4.0, 3.5]  # first token: "3" (the relevant document's) ranks third
    table[1, [4, 5]] = [1.0, 0.5]
    table[2, 6] = 1.0
    table[3, 7] = 2.0
    cache = {"table": jnp.asarray(table)}
    trie = index.device()

    def run(bonus_fn, state):
        return jax.device_get(beam_search(_table_step, cache, trie, batch_size=1, num_beams=2, score_mode="raw",
                                          bonus_fn=bonus_fn, query_state=state, accumulate_bonus=False))

    seq_only = run(None, None)
    relevant_leaf = int(index.lookup([[3, 7]])[0])
    assert relevant_leaf not in seq_only.leaf_ids[0].tolist()  # "3" was pruned at step 0 (beam 2 keeps 1, 2)
    paths, leaves = _paths(index, docids)
    state = pag.bonus_tables(paths, leaves, jnp.asarray([[3, 0]]), jnp.asarray([[4.0, 0.5]]))
    guided = run(pag.node_bonus, state)
    got = guided.leaf_ids[0].tolist()
    assert relevant_leaf in got
    k = got.index(relevant_leaf)
    assert guided.scores[0, k] == pytest.approx(3.5 + 2.0)  # the kept score is the raw sum, bonus-free
    assert guided.prune_scores[0, k] == pytest.approx(3.5 + 2.0 + 4.0)  # + the leaf's bonus only (not summed)
    # row 2 (docid 2 6) is not planned: PAG's trie holds only the planning set
    assert int(index.lookup([[2, 6]])[0]) not in got


# ----------------------------------------------------------------------------------------------------------
# planner
# ----------------------------------------------------------------------------------------------------------


def test_simul_scores_by_hand_and_in_chunks():
    rep = jnp.asarray([[0.0, 1.0, 2.0, 4.0, 8.0]])
    ids = jnp.asarray([[1, 2, -1], [3, 4, 1], [0, -1, -1], [4, 4, 2]], jnp.int32)
    expect = [[3.0, 13.0, 0.0, 18.0]]
    np.testing.assert_array_equal(np.asarray(pag.simul_scores(rep, ids)), expect)
    np.testing.assert_array_equal(np.asarray(pag.simul_scores(rep, ids, chunk=3)), expect)  # 4 docs, 2 chunks


def test_planning_ties_are_broken_by_the_document_key_not_the_row():
    scores = np.array([5.0, 2.0, 2.0, 7.0, 2.0], np.float32)
    keys = np.array([10, 40, 30, 20, 50], np.int32)
    rows, s = jax.device_get(pag.top_n_by_key(jnp.asarray(scores[None]), jnp.asarray(keys), 3))
    assert rows[0].tolist() == [3, 0, 4] and s[0].tolist() == [7.0, 5.0, 2.0]  # of the tied 2.0s: key 50
    perm = np.array([4, 2, 0, 3, 1])
    rows_p, _ = jax.device_get(pag.top_n_by_key(jnp.asarray(scores[perm][None]), jnp.asarray(keys[perm]), 3))
    assert perm[rows_p[0]].tolist() == [3, 0, 4]  # the same documents whatever the corpus order


def test_prefill_equals_one_step_at_a_time():
    from gr_jax.backbones import t5

    config = t5.get_config("tiny", vocab_size=50)
    net = t5.T5(config)
    params = t5.init_params(config)
    q = jnp.asarray([[5, 6, 7, 1, 0]])

    @jax.jit
    def both(params):
        mask = q != 0
        enc = net.apply({"params": params}, q, mask, method="encode")
        cache = net.apply({"params": params}, enc, mask, 8, method="init_cache")
        hidden, filled = net.apply({"params": params}, cache, q, method="prefill_hidden")
        step, stepped = cache, []
        for t in range(q.shape[1]):
            h, step = net.apply({"params": params}, step, q[:, t], method="decode_step_hidden")
            stepped.append(h)
        a, _ = net.apply({"params": params}, filled, jnp.asarray([9]), method="decode_step")
        b, _ = net.apply({"params": params}, step, jnp.asarray([9]), method="decode_step")
        return hidden, jnp.stack(stepped, 1), a, b

    hidden, stepped, a, b = both(params)
    # float32 of the same sums in another order: hidden states are O(1), logits O(10)
    np.testing.assert_allclose(np.asarray(hidden), np.asarray(stepped), atol=1e-5)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)


@pytest.mark.slow
def test_rankings_do_not_depend_on_the_corpus_order():
    """The fixture's model and docid files over the corpus in two row orders: every mode returns the same
    documents with the same scores (planning ties by document key, rankings in trec order)."""
    from gr_jax.decoding import rankers
    from gr_jax.methods.pag import docids as pag_docids

    model, params, _, _, doc_ids = pag_parity.fixture_setup(FIXTURE)
    with np.load(FIXTURE / "inputs.npz") as z:
        queries = z["query_input_ids"].astype(np.int32)
    results = []
    for order in (doc_ids, [doc_ids[i] for i in np.random.default_rng(3).permutation(len(doc_ids))]):
        table = pag_docids.table_from_files(FIXTURE / "smt_docid_to_tokenids.json",
                                            FIXTURE / "lex_docid_to_tokenids.json", order, levels=4, k=16, base=256)
        model.use_docids(table)
        index = table.index(vocab_size=model.config.vocab_size)
        per_mode = {}
        for mode in ("pag", "simul_only", "seq_only"):
            model.mode = mode
            q, d, s = model.rank(params, queries, index, num_beams=4)
            per_mode[mode] = [[(order[r], round(sc, 4)) for r, sc in ranked]
                              for ranked in rankers.per_query(q, d, s, len(queries), keys=order)]
        results.append(per_mode)
    assert results[0] == results[1]
    assert all(len(r) for r in results[0]["pag"])


@pytest.mark.slow
def test_a_tie_across_the_planning_boundary_takes_the_exact_path():
    """Two documents given the same set docid tie in s_simul; with n placing the tie across the boundary the
    search plans exactly: the document with the larger order key is planned, whatever the row order."""
    from gr_jax.methods.pag import docids as pag_docids

    model, params, table, _, doc_ids = pag_parity.fixture_setup(FIXTURE)
    with np.load(FIXTURE / "inputs.npz") as z:
        q = z["query_input_ids"][:1].astype(np.int32)
    rows, s = jax.device_get(model.plan(params, q, n=30))
    a, b = int(rows[0, 9]), int(rows[0, 10])
    assert s[0, 9] > s[0, 10]  # distinct before the change
    lex = json.loads((FIXTURE / "lex_docid_to_tokenids.json").read_text())
    lex[doc_ids[b]] = lex[doc_ids[a]]  # b now scores exactly as a: ranks 10 and 11 tie
    planned_doc = {}
    for name, order in (("rows", doc_ids), ("reversed", doc_ids[::-1])):
        with tempfile.TemporaryDirectory() as tmp:
            lex_path = Path(tmp) / "lex.json"
            lex_path.write_text(json.dumps(lex))
            t = pag_docids.table_from_files(FIXTURE / "smt_docid_to_tokenids.json", lex_path, order, levels=4,
                                            k=16, base=256)
        model.use_docids(t)
        model.planning_size = 10
        index = t.index(vocab_size=model.config.vocab_size)
        sc = pag.simul_scores(model.lexical_rep(params, q), model.set_ids)
        assert bool(jax.device_get(pag.top_n_fast(sc, 10)[2]))  # the fast path sees the tie
        _, state = model.beams_and_state(params, q, index, 4)
        planned = {order[r] for r in np.asarray(state["planned"][0]).tolist()}
        assert len(planned & {doc_ids[a], doc_ids[b]}) == 1
        planned_doc[name] = (planned & {doc_ids[a], doc_ids[b]}).pop()
    keys = dict(zip(doc_ids, pag_docids.order_keys(doc_ids)))
    winner = max((doc_ids[a], doc_ids[b]), key=lambda d: keys[d])
    assert planned_doc["rows"] == planned_doc["reversed"] == winner


@pytest.mark.slow
def test_plan_probes_for_the_robustness_protocol():
    """planner_tokens = the top-ℓ positive planner weights below the docid tokens (ties by smaller id), checked
    in numpy; searching a query under its own plan is `rank`; under another query's plan it differs."""
    model, params, _, index, _ = pag_parity.fixture_setup(FIXTURE)
    with np.load(FIXTURE / "inputs.npz") as z:
        q = z["query_input_ids"].astype(np.int32)
    rep = np.asarray(model.lexical_rep(params, q))[:, :model.docid_base]
    got = model.planner_tokens(params, q, 7)
    for row, ids in zip(rep, got):
        order = sorted((i for i in range(len(row)) if row[i] > 0), key=lambda i: (-row[i], i))[:7]
        assert ids == order and all(i < model.docid_base for i in ids)
    assert len(model.planner_tokens(params, q, 100)[0]) <= 100
    model.mode = "pag"
    own = model.rank(params, q, index, num_beams=4)
    same = model.rank_with_plan(params, q, q, index, num_beams=4)
    for a, b in zip(own, same):
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-6)
    other = model.rank_with_plan(params, q, q[::-1], index, num_beams=4)
    assert not (len(other[1]) == len(own[1]) and np.array_equal(other[1], own[1])
                and np.allclose(other[2], own[2]))
