"""Parity of `methods.pag.model` with PAG's own PyTorch code, on a fixture folder of reference outputs (the layout of
`../shared/fixtures/peer_parity/pag/`, whose README cites the lines of their code each quantity follows).

The fixture holds a tiny HF T5 (`model/`), inputs (`inputs.npz`: one padded batch of queries, documents, their
sequential docid tokens), outputs of their model (`outputs.npz`: lexical representations, set docids, s_lex, the
planning set, raw step logits after every docid prefix, the exhaustive sequential score of every document),
their two `docid_to_tokenids.json` files, `lex_run.json`, `meta.json` and `decoding.json` (per query and beam:
guided and unguided beam search, final hypotheses and rankings). `check_fixture` loads the model and the
docid files through our loaders and compares every quantity; keys ending in `_diff` are max differences
relative to the reference's magnitude (scores: to the query's largest, at least 1), keys ending in `_identical`
identity checks.

Rankings are compared as sequences of tie groups: documents sharing a docid share a score; their code keeps
them in insertion order, this library orders ties by document id (`decoding.rankers.order`), so within a
tie group only the set is compared.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.api import (leaf_documents, load_npz, rankers, read_json, rel_diff, swapped_or_negated, sweep,
    t5_convert, worst)
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


class Fixture:
    """A fixture's files, our model of it and its docid table (built once), and the comparison, for any tensors of
    the fixture's HF model (`tensors`: the model/ directory's, as read)."""

    def __init__(self, fixture_dir):
        self.folder = Path(fixture_dir)
        self.meta, self.inputs, self.outputs, self.decoding = _read(self.folder)
        self.tensors = t5_convert.read_hf_tensors(self.folder / "model")
        self.config = t5_convert.config_from_hf(t5_convert.read_hf_config(self.folder / "model"), self.tensors,
                                                source=str(self.folder / "model"))
        tiny = self.meta["tiny_config"]
        self.doc_ids = [str(i) for i in range(len(self.inputs["doc_input_ids"]))]
        self.table = pag_docids.table_from_files(self.folder / "smt_docid_to_tokenids.json",
                                                 self.folder / "lex_docid_to_tokenids.json", self.doc_ids,
                                                 levels=int(tiny["levels"]), k=int(tiny["codes"]),
                                                 base=int(tiny["base_vocab"]))
        self.model = pag.PagRetriever(self.config, planning_size=int(self.decoding["planning_set_size"]))
        self.model.use_docids(self.table)
        self.index = self.table.index(vocab_size=self.config.vocab_size)

    def params(self, tensors: dict) -> dict:
        net = t5_convert.params_from_hf(tensors, self.config, source=str(self.folder / "model"))
        return {"network": jax.tree_util.tree_map(jnp.asarray, net), "head": {}}

    def compare(self, tensors: dict, search: bool = True) -> dict:
        meta, inputs, outputs = self.meta, self.inputs, self.outputs
        model, table, doc_ids = self.model, self.table, self.doc_ids
        params = self.params(tensors)
        out: dict = {"method": "pag", "fixture": str(self.folder)}
        tiny = meta["tiny_config"]
        queries = jnp.asarray(inputs["query_input_ids"], jnp.int32)
        docs = jnp.asarray(inputs["doc_input_ids"], jnp.int32)

        # planner
        rep_q = model.lexical_rep(params, queries)
        rep_d = model.lexical_rep(params, docs)
        out["query_lex_rep_diff"] = rel_diff(rep_q, outputs["query_lex_rep"])
        out["doc_lex_rep_diff"] = rel_diff(rep_d, outputs["doc_lex_rep"])
        set_ids = pag.top_set_ids(rep_d, int(meta["m"]), int(tiny["base_vocab"]))
        out["set_docids_identical"] = bool(np.array_equal(np.asarray(set_ids), outputs["doc_set_ids"]))
        out["set_docid_file_identical"] = bool(np.array_equal(table.extras["set_ids"], outputs["doc_set_ids"]))
        s = pag.simul_scores(rep_q, jnp.asarray(table.extras["set_ids"]))
        out["s_lex_diff"] = rel_diff(s, outputs["s_lex"])
        rows, planned = jax.device_get(model.plan(params, queries))
        out["planning_set_identical"] = bool(np.array_equal(rows, outputs["planning_doc_idx"]))
        out["planning_scores_diff"] = rel_diff(planned, outputs["planning_scores"])
        lex_run = read_json(self.folder / "lex_run.json")
        ref = np.array([[float(v) for v in lex_run[qid].values()] for qid in sorted(lex_run, key=int)])
        ours = np.array([[float(s[b, int(d)]) for d in lex_run[qid]] for b, qid in enumerate(sorted(lex_run, key=int))])
        out["lex_run_diff"] = rel_diff(ours, ref)

        # sequential scores
        prefixes = jnp.asarray(outputs["prefix_tokens"], jnp.int32)
        lengths = jnp.asarray(outputs["prefix_len"], jnp.int32)
        step = [pag.step_logits_along(model.network, params["network"], queries[b:b + 1], prefixes, lengths)
                for b in range(queries.shape[0])]
        out["prefix_logits_diff"] = rel_diff(jnp.stack(step), outputs["prefix_logits"])
        D = len(doc_ids)
        seq = model.raw_docid_scores(params, jnp.repeat(queries, D, axis=0),
                                     jnp.tile(jnp.asarray(inputs["docid_token_ids"], jnp.int32),
                                              (queries.shape[0], 1)))
        out["seq_score_all_docs_diff"] = rel_diff(np.asarray(seq).reshape(-1, D), outputs["seq_score_all_docs"])
        if search:
            out.update(self._decoding(params, queries))
        return out

    def _decoding(self, params, queries) -> dict:
        """Final hypotheses and rankings, guided (PAG) and unguided (planning-set trie, no bonus); scores relative to
        the largest of the query's reference scores."""
        model, index, doc_ids = self.model, self.index, self.doc_ids
        same = {"final_hypotheses": True, "ranking_pag": True, "ranking_pag_no_final_lex": True,
                "ranking_raw_plus_lex": True, "ranking_lexical_condition": True}
        raw_diff, final_diff = 0.0, 0.0
        for B in self.decoding["beams"]:
            for guided in (True, False):
                res, state = model.beams_and_state(params, queries, index, int(B), guided=guided)
                final = model.final_scores(res, state)
                found, valid = leaf_documents(index.device_payload(), jnp.where(res.valid, res.leaf_ids, -1))
                found, valid, final, res = jax.device_get((found, valid, final, res))
                with_lex = rankers.per_query(*rankers.first_occurrence_arrays(found, valid, final), len(queries),
                                             doc_ids)
                raw_only = rankers.per_query(*rankers.first_occurrence_arrays(found, valid, res.scores),
                                             len(queries), doc_ids)
                for b, pq in enumerate(self.decoding["per_query"]):
                    run = pq["runs"][f"beam{B}_{'guided' if guided else 'unguided'}"]
                    theirs = {tuple(h["tokens"]): h for h in run["final_hypotheses"]}
                    mine = {tuple(res.tokens[b, k].tolist()): k for k in range(res.tokens.shape[1])
                            if res.valid[b, k]}
                    same["final_hypotheses"] &= set(theirs) == set(mine)
                    # relative to the query's largest reference score, at least 1: a raw sum near 0 would
                    # otherwise turn float noise of the other terms into a large relative figure
                    scale = max([1.0] + [abs(h["raw_sum"]) for h in theirs.values()])
                    for t in set(theirs) & set(mine):
                        raw_diff = worst(raw_diff, abs(theirs[t]["raw_sum"] - float(res.scores[b, mine[t]])) / scale)
                    ours_lex = [(doc_ids[d], sc) for d, sc in with_lex[b]]
                    ours_raw = [(doc_ids[d], sc) for d, sc in raw_only[b]]
                    ref_lex = run["ranking_pag"] if guided else run["ranking_raw_plus_lex"]
                    ref_raw = run["ranking_pag_no_final_lex"] if guided else run["ranking_lexical_condition"]
                    same["ranking_pag" if guided else "ranking_raw_plus_lex"] &= _groups(ours_lex) == _groups(ref_lex)
                    same["ranking_pag_no_final_lex" if guided else "ranking_lexical_condition"] &= \
                        _groups(ours_raw) == _groups(ref_raw)
                    score_of = dict(ours_lex)
                    top = max([1.0] + [abs(sc) for _, sc in ref_lex])
                    final_diff = worst(*[final_diff] + [abs(sc - score_of[d]) / top for d, sc in ref_lex
                                                     if d in score_of])
        out = {f"{k}_identical": bool(v) for k, v in same.items()}
        out["final_raw_sum_diff"] = raw_diff
        out["final_score_diff"] = final_diff
        out["rankings_identical"] = all(v for k, v in same.items() if k.startswith("ranking"))
        return out


def fixture_setup(fixture_dir):
    """(model, params, table, index, doc ids) of a fixture folder, through our loaders."""
    fx = Fixture(fixture_dir)
    return fx.model, fx.params(fx.tensors), fx.table, fx.index, fx.doc_ids


def check_fixture(fixture_dir) -> dict:
    fx = Fixture(fixture_dir)
    return fx.compare(fx.tensors)


def within(result: dict, tolerance: float = 1e-5) -> bool:
    """Every `_diff` within `tolerance` and every identity check true. 1e-5 of the magnitude: the fixtures' float32
    differences are ≤ 2e-6 of it (step logits recomputed through our cache against their full recompute)."""
    return (all(v <= tolerance for k, v in result.items() if k.endswith("_diff"))
            and all(v for k, v in result.items() if k.endswith("_identical")))


def mutations(fixture_dir, tolerance: float = 1e-5, names=None, sample: int = 0, seed: int = 0,
              search: bool = False) -> dict:
    """{tensor name: whether the comparison caught two of its rows swapped (a tensor whose entries are all equal:
    its first entry negated, `swapped_or_negated`)}, for every tensor of the fixture's model (or `names`, or `sample` of them
    drawn with `seed`). The lexical representations and the step logits
    after every prefix see every tensor; `search` adds the decoding (slower)."""
    fx = Fixture(fixture_dir)
    return sweep(fx.tensors, lambda tensors: within(fx.compare(tensors, search=search), tolerance), names, sample,
                 seed, mutate=swapped_or_negated)
