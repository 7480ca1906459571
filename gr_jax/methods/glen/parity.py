"""Parity of `methods.glen.model` with GLEN's own PyTorch code, on a fixture folder of reference outputs.

A fixture folder (the layout of `tests/fixtures/glen_parity/`, README there) holds a tiny HF T5 (`model/`),
inputs (`inputs.npz`), the reference outputs of GLEN's code (`outputs.npz`, `ranking.json`), its docid file
(`glen_docid.tsv`) and `meta.json` (token strings `tok{id}`, docid length M). `check_fixture` loads the
model through our loader and compares every quantity: step logits and hidden states (queries and documents),
encoder output, each document's docid (tokens identical, logits), the docid file as read, and for every
setting (N returned, K = 2N beams) the final beams and the collision-free ranked lists (identical order;
beam log-probabilities and cosines). Keys ending in `_diff` are max differences relative to the reference's
magnitude (log-probabilities: to max(|value|, 1); cosines, in [-1, 1], absolute).
"""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.glen import docids as glen_docids
from gr_jax.methods.api import (leaf_documents, load_npz, read_json, rel_diff, swapped_or_negated, sweep,
    t5_convert, worst)
from gr_jax.methods.glen.ranker import collision_free_arrays
from gr_jax.methods.glen import model as glen


def _read(fixture: Path):
    for name in ("model", "inputs.npz", "outputs.npz", "ranking.json", "glen_docid.tsv", "meta.json"):
        if not (fixture / name).exists():
            raise ValueError(f"{fixture}: no {name}; not a GLEN parity fixture folder")
    meta = read_json(fixture / "meta.json")
    inputs = load_npz(fixture / "inputs.npz", "parity fixture file")
    outputs = load_npz(fixture / "outputs.npz", "parity fixture file")
    ranking = read_json(fixture / "ranking.json")
    return meta, inputs, outputs, ranking


def _piece_to_id(meta: dict):
    """The fixture's stub tokenizer: token string `tok{id}` ↔ id (meta.json's token_layout.token_string)."""
    pattern = meta.get("token_layout", {}).get("token_string", "tok{id}")
    regex = re.compile("^" + re.escape(pattern).replace(re.escape("{id}"), "([0-9]+)") + "$")

    def piece_to_id(piece: str):
        m = regex.match(piece)
        return int(m.group(1)) if m else None

    return piece_to_id


class Fixture:
    """A fixture's files, our model of it (built once) and the comparison, for any tensors of the fixture's HF
    model (`tensors`: the model/ directory's, as read)."""

    def __init__(self, fixture_dir):
        self.folder = Path(fixture_dir)
        self.meta, self.inputs, self.outputs, self.ranking = _read(self.folder)
        self.config, _ = glen.load_glen_hf(self.folder / "model")
        self.tensors = t5_convert.read_hf_tensors(self.folder / "model")
        self.model = glen.GlenRetriever(self.config, docid_length=int(self.meta["M"]),
                                        masked_ids=self.inputs["masked_token_ids"].tolist())
        self.tsv = glen_docids.read_docid_tsv(self.folder / "glen_docid.tsv", _piece_to_id(self.meta))
        table = glen_docids.table_for_corpus(self.tsv, self.tsv.doc_ids, self.config.vocab_size,
                                             source=str(self.folder / "glen_docid.tsv"))
        self.index = table.index(vocab_size=self.config.vocab_size)
        self.model.use_docids(table)
        net = self.model.network
        self._encode = jax.jit(lambda p, q: net.apply({"params": p}, q, q != self.config.pad_token_id,
                                                      method="encode"))

    def params(self, tensors: dict) -> dict:
        net = t5_convert.params_from_hf(tensors, self.config, source=str(self.folder / "model"))
        return {"network": jax.tree_util.tree_map(jnp.asarray, net), "head": {}}

    def compare(self, tensors: dict, search: bool = True, batch_size: int = 16) -> dict:
        params, inputs, outputs, M = self.params(tensors), self.inputs, self.outputs, self.model.docid_length
        model, tsv = self.model, self.tsv
        out: dict = {"method": "glen", "fixture": str(self.folder)}
        docs = jnp.asarray(inputs["doc_input_ids"], jnp.int32)
        queries = jnp.asarray(inputs["query_input_ids"], jnp.int32)
        d_logits, d_hidden = model.step_table(params, docs)
        q_logits, q_hidden = model.step_table(params, queries)
        out["doc_step_logits_diff"] = rel_diff(d_logits, outputs["doc_step_logits"])
        out["doc_step_hidden_diff"] = rel_diff(d_hidden, outputs["doc_step_hidden"])
        out["query_step_logits_diff"] = rel_diff(q_logits, outputs["query_step_logits"])
        out["query_step_hidden_diff"] = rel_diff(q_hidden, outputs["query_step_hidden"])
        out["query_encoder_output_diff"] = rel_diff(self._encode(params["network"], queries),
                                                     outputs["query_encoder_output"])
        ids, logits = model.decode_docids(params, inputs["doc_input_ids"], batch_size=batch_size)
        out["docids_identical"] = bool(np.array_equal(ids, outputs["doc_docid_tokens"]))
        out["doc_docid_logits_diff"] = rel_diff(logits, outputs["doc_docid_logit_raw"])
        out["docid_file_identical"] = bool(np.array_equal(tsv.tokens, outputs["doc_docid_tokens"]))
        out["docid_file_logits_diff"] = rel_diff(tsv.logits, outputs["doc_docid_logit_rounded"])
        if search:
            out.update(self._search(params, queries, M))
        return out

    def _search(self, params, queries, M) -> dict:
        model, index, tsv = self.model, self.index, self.tsv
        rankings_same, beams_same = True, True
        logprob_diff, cosine_diff, beam_diff = 0.0, 0.0, 0.0
        row_of = {doc_id: r for r, doc_id in enumerate(tsv.doc_ids)}
        for setting in self.ranking["settings"]:
            N = int(setting["num_return_sequences"])
            res, w_q = model.beams(params, queries, index, N)  # K = 2N beams, the first N
            # all K beams, through `predict` (the Searcher path), to compare the whole search, not only the first N
            full = jax.device_get(model.predict(params, queries, index, model.beam_factor * N))
            found, valid = leaf_documents(index.device_payload(), jnp.where(res.valid, res.leaf_ids, -1))
            q, d, n, cos = collision_free_arrays(*jax.device_get((found, valid, w_q)), model.doc_weights)
            scores = np.asarray(res.scores)
            for b, ref in enumerate(setting["per_query"]):
                mine = d[q == b]
                theirs = [row_of[e["doc"]] for e in ref["ranked"]]
                rankings_same &= mine.tolist() == theirs
                if mine.tolist() != theirs:
                    continue
                for e, nb, c in zip(ref["ranked"], n[q == b], cos[q == b]):
                    rankings_same &= int(e["beam_rank"]) == int(nb)
                    logprob_diff = worst(logprob_diff, abs(float(e["seq_logprob"]) - float(scores[b, nb]))
                                       / max(abs(float(e["seq_logprob"])), 1.0))
                    if e["cosine"] is not None:
                        cosine_diff = worst(cosine_diff, abs(float(e["cosine"]) - float(c)))
                ref_beams = [bm for bm in ref["final_beams"] if bm["logprob"] is not None]
                my_tokens = [full.tokens[b, k, :M].tolist() for k in range(full.tokens.shape[1]) if full.valid[b, k]]
                beams_same &= my_tokens == [bm["tokens"] for bm in ref_beams]
                if my_tokens == [bm["tokens"] for bm in ref_beams]:
                    beam_diff = worst(*[beam_diff] + [abs(float(bm["logprob"]) - float(full.scores[b, k]))
                                                   / max(abs(float(bm["logprob"])), 1.0)
                                                   for k, bm in enumerate(ref_beams)])
        # log-probabilities relative to their magnitude (at least 1); cosines are in [-1, 1] already
        return {"final_beams_identical": bool(beams_same), "final_beam_logprob_diff": beam_diff,
                "ranked_logprob_diff": logprob_diff, "ranked_cosine_diff": cosine_diff,
                "rankings_identical": bool(rankings_same)}


def fixture_model(fixture_dir, read=None):
    """The fixture's model through our loader: (GlenRetriever with the fixture's M and masked ids, params,
    inputs, meta). `read`: the fixture's files as `_read` returned them, when already read."""
    fixture = Path(fixture_dir)
    meta, inputs, _, _ = read if read is not None else _read(fixture)
    config, net = glen.load_glen_hf(fixture / "model")
    model = glen.GlenRetriever(config, docid_length=int(meta["M"]), masked_ids=inputs["masked_token_ids"].tolist())
    return model, {"network": jax.tree_util.tree_map(jnp.asarray, net), "head": {}}, inputs, meta


def check_fixture(fixture_dir, batch_size: int = 16) -> dict:
    fx = Fixture(fixture_dir)
    return fx.compare(fx.tensors, batch_size=batch_size)


def within(result: dict, tolerance: float = 1e-5) -> bool:
    """Every `_diff` within `tolerance` and every identity check true. 1e-5: the fixtures' float32 differences
    are ≤ 2e-6 of the magnitude; a swapped row moves some quantity by far more (the mutation sweep)."""
    diffs_ok = all(v <= tolerance for k, v in result.items() if k.endswith("_diff"))
    same_ok = all(v for k, v in result.items() if k.endswith("_identical"))
    return diffs_ok and same_ok


def mutations(fixture_dir, tolerance: float = 1e-5, names=None, sample: int = 0, seed: int = 0,
              search: bool = False) -> dict:
    """{tensor name: whether the comparison caught two of its rows swapped (a tensor whose entries are all equal:
    its first entry negated, `swapped_or_negated`)}, for every tensor of the fixture's model (or `names`, or `sample` of them
    drawn with `seed`). The step tables and the docids see every tensor;
    `search` adds the beam search and the ranking (slower)."""
    fx = Fixture(fixture_dir)
    return sweep(fx.tensors, lambda tensors: within(fx.compare(tensors, search=search), tolerance), names, sample,
                 seed, mutate=swapped_or_negated)
