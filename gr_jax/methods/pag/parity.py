"""Parity of `methods.pag.model` with PAG's own PyTorch code, on a fixture folder of reference outputs (the layout of
`../shared/fixtures/peer_parity/pag/`, whose README cites the lines of their code each quantity follows).

The fixture holds a tiny HF T5 (`model/`), inputs (`inputs.npz`: one padded batch of queries, documents, their
sequential docid tokens), outputs of their model (`outputs.npz`: lexical representations, set docids, s_lex, the
planning set, raw step logits after every docid prefix, the exhaustive sequential score of every document),
their two `docid_to_tokenids.json` files, `lex_run.json`, `meta.json` and `decoding.json` (per query and beam:
guided and unguided beam search, final hypotheses and rankings). `check_fixture` loads the model and the
docid files through our loaders and compares every quantity; keys ending in `_diff` are max absolute
differences, keys ending in `_identical` identity checks.

Rankings are compared as sequences of tie groups: documents sharing a docid share a score; their code keeps
them in insertion order, this library orders ties by document id (`decoding.rankers.order`), so within a
tie group only the set is compared.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.api import leaf_documents, load_npz, rankers, read_json
from gr_jax.methods.pag import docids as pag_docids
from gr_jax.methods.pag import model as pag

FILES = ("model", "inputs.npz", "outputs.npz", "decoding.json", "smt_docid_to_tokenids.json",
         "lex_docid_to_tokenids.json", "lex_run.json", "meta.json")


def _read(fixture: Path):
    for name in FILES:
        if not (fixture / name).exists():
            raise ValueError(f"{fixture}: no {name}; not a PAG parity fixture folder")
    inputs = load_npz(fixture / "inputs.npz", "parity fixture file")
    outputs = load_npz(fixture / "outputs.npz", "parity fixture file")
    meta = read_json(fixture / "meta.json")
    decoding = read_json(fixture / "decoding.json")
    return meta, inputs, outputs, decoding


def _max_diff(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shape {a.shape} vs the reference's {b.shape}")
    return float(np.abs(a - b).max()) if a.size else 0.0


def _groups(ranking) -> list[frozenset]:
    """[(doc, score), ...] best first → the sequence of sets of documents with equal scores."""
    out, last = [], None
    for doc, score in ranking:
        if out and score == last:
            out[-1] = out[-1] | {str(doc)}
        else:
            out.append(frozenset({str(doc)}))
        last = score
    return out


def fixture_setup(fixture_dir, read=None):
    """(model, params, table, index, doc ids) of a fixture folder, through our loaders."""
    fixture = Path(fixture_dir)
    meta, inputs, _, decoding = read if read is not None else _read(fixture)
    config, net = pag.load_pag_hf(fixture / "model")
    tiny = meta["tiny_config"]
    doc_ids = [str(i) for i in range(len(inputs["doc_input_ids"]))]
    table = pag_docids.table_from_files(fixture / "smt_docid_to_tokenids.json", fixture / "lex_docid_to_tokenids.json",
                                        doc_ids, levels=int(tiny["levels"]), k=int(tiny["codes"]),
                                        base=int(tiny["base_vocab"]))
    model = pag.PagRetriever(config, planning_size=int(decoding["planning_set_size"]))
    model.use_docids(table)
    params = {"network": jax.tree_util.tree_map(jnp.asarray, net), "head": {}}
    return model, params, table, table.index(vocab_size=config.vocab_size), doc_ids


def check_fixture(fixture_dir) -> dict:
    fixture = Path(fixture_dir)
    read = _read(fixture)
    meta, inputs, outputs, decoding = read
    model, params, table, index, doc_ids = fixture_setup(fixture, read)
    out: dict = {"method": "pag", "fixture": str(fixture)}
    tiny = meta["tiny_config"]
    queries = jnp.asarray(inputs["query_input_ids"], jnp.int32)
    docs = jnp.asarray(inputs["doc_input_ids"], jnp.int32)

    # planner
    rep_q = model.lexical_rep(params, queries)
    rep_d = model.lexical_rep(params, docs)
    out["query_lex_rep_diff"] = _max_diff(rep_q, outputs["query_lex_rep"])
    out["doc_lex_rep_diff"] = _max_diff(rep_d, outputs["doc_lex_rep"])
    set_ids = pag.top_set_ids(rep_d, int(meta["m"]), int(tiny["base_vocab"]))
    out["set_docids_identical"] = bool(np.array_equal(np.asarray(set_ids), outputs["doc_set_ids"]))
    out["set_docid_file_identical"] = bool(np.array_equal(table.extras["set_ids"], outputs["doc_set_ids"]))
    s = pag.simul_scores(rep_q, jnp.asarray(table.extras["set_ids"]))
    out["s_lex_diff"] = _max_diff(s, outputs["s_lex"])
    rows, planned = jax.device_get(model.plan(params, queries))
    out["planning_set_identical"] = bool(np.array_equal(rows, outputs["planning_doc_idx"]))
    out["planning_scores_diff"] = _max_diff(planned, outputs["planning_scores"])
    lex_run = read_json(fixture / "lex_run.json")
    run_diff = 0.0
    for b, qid in enumerate(sorted(lex_run, key=int)):
        for doc, score in lex_run[qid].items():
            run_diff = max(run_diff, abs(float(score) - float(s[b, int(doc)])))
    out["lex_run_diff"] = run_diff

    # sequential scores
    prefixes = jnp.asarray(outputs["prefix_tokens"], jnp.int32)
    lengths = jnp.asarray(outputs["prefix_len"], jnp.int32)
    step = [pag.step_logits_along(model.network, params["network"], queries[b:b + 1], prefixes, lengths)
            for b in range(queries.shape[0])]
    out["prefix_logits_diff"] = _max_diff(jnp.stack(step), outputs["prefix_logits"])
    D = len(doc_ids)
    seq = model.raw_docid_scores(params, jnp.repeat(queries, D, axis=0),
                                 jnp.tile(jnp.asarray(inputs["docid_token_ids"], jnp.int32), (queries.shape[0], 1)))
    out["seq_score_all_docs_diff"] = _max_diff(np.asarray(seq).reshape(-1, D), outputs["seq_score_all_docs"])

    # decoding: final hypotheses and rankings, guided (PAG) and unguided (planning-set trie, no bonus)
    same = {"final_hypotheses": True, "ranking_pag": True, "ranking_pag_no_final_lex": True,
            "ranking_raw_plus_lex": True, "ranking_lexical_condition": True}
    raw_diff, final_diff = 0.0, 0.0
    keys = doc_ids
    for B in decoding["beams"]:
        for guided in (True, False):
            res, state = model.beams_and_state(params, queries, index, int(B), guided=guided)
            final = model.final_scores(res, state)
            found, valid = leaf_documents(index.device_payload(), jnp.where(res.valid, res.leaf_ids, -1))
            found, valid, final, res = jax.device_get((found, valid, final, res))
            with_lex = rankers.per_query(*rankers.first_occurrence_arrays(found, valid, final), len(queries), keys)
            raw_only = rankers.per_query(*rankers.first_occurrence_arrays(found, valid, res.scores), len(queries), keys)
            for b, pq in enumerate(decoding["per_query"]):
                run = pq["runs"][f"beam{B}_{'guided' if guided else 'unguided'}"]
                theirs = {tuple(h["tokens"]): h for h in run["final_hypotheses"]}
                mine = {tuple(res.tokens[b, k].tolist()): k for k in range(res.tokens.shape[1]) if res.valid[b, k]}
                same["final_hypotheses"] &= set(theirs) == set(mine)
                for t in set(theirs) & set(mine):
                    raw_diff = max(raw_diff, abs(theirs[t]["raw_sum"] - float(res.scores[b, mine[t]])))
                ours_lex = [(doc_ids[d], sc) for d, sc in with_lex[b]]
                ours_raw = [(doc_ids[d], sc) for d, sc in raw_only[b]]
                ref_lex = run["ranking_pag"] if guided else run["ranking_raw_plus_lex"]
                ref_raw = run["ranking_pag_no_final_lex"] if guided else run["ranking_lexical_condition"]
                same["ranking_pag" if guided else "ranking_raw_plus_lex"] &= _groups(ours_lex) == _groups(ref_lex)
                same["ranking_pag_no_final_lex" if guided else "ranking_lexical_condition"] &= \
                    _groups(ours_raw) == _groups(ref_raw)
                score_of = dict(ours_lex)
                final_diff = max([final_diff] + [abs(sc - score_of[d]) for d, sc in ref_lex if d in score_of])
    for k, v in same.items():
        out[f"{k}_identical"] = bool(v)
    out["final_raw_sum_diff"] = raw_diff
    out["final_score_diff"] = final_diff
    out["rankings_identical"] = all(v for k, v in same.items() if k.startswith("ranking"))
    return out


def within(result: dict, tolerance: float = 1e-4) -> bool:
    """Every `_diff` within `tolerance` (the README's 1e-4: values up to a few tens in float32) and every
    identity check true."""
    return (all(v <= tolerance for k, v in result.items() if k.endswith("_diff"))
            and all(v for k, v in result.items() if k.endswith("_identical")))
