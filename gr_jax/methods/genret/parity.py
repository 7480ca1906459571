"""Parity of `methods.genret` with GenRET's own PyTorch code (sunnweiwei/GenRet, run.py), on a fixture folder
that `tools/genret_fixtures.py` writes from it (tests/fixtures/genret_parity/<shape>/: one folder per shape).

Ours runs with the settings that reproduce the released code: `GenretHead(start="learned", raw_logits=True)`,
`genret_losses(sinkhorn="released", mask_duplicates=False)`. Their tables map onto ours as: `centroids.<i>` → E_i
(rows i·K … of `codebook`), `code_embedding.<i>` (i ≥ 1, the input of position i) → `code_inputs` table i − 1,
row 0 of `code_embedding.0` → `start`. For each docid position t (their stage with t + 1 tables) it compares:
the docid logits of positions 0..t for queries and documents, the decoder states at t, the Sinkhorn plan and the
balanced codes (identical), the four loss terms, the prefix-centred states the codebook's k-means reads
(`prefix_centered` vs their `norm_by_prefix`), and their inference: `generate` over a prefix tree of docids (rankings
identical, scores). Differences are relative to the magnitude of the reference
(`_rel_diff` keys: max |ours − theirs| / max(|theirs|, 1e-30)); identity checks end in `_identical`.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.api import load_npz, read_json, rel_diff, sweep, t5_convert, TrieIndex
from gr_jax.methods.genret import model as genret
from gr_jax.methods.genret import training

FILES = ("model", "head.safetensors", "inputs.npz", "outputs.npz", "meta.json")


def _read(fixture: Path):
    for name in FILES:
        if not (fixture / name).exists():
            raise ValueError(f"{fixture}: no {name}; not a GenRET parity fixture folder (tools/genret_fixtures.py)")
    from safetensors.numpy import load_file

    return (read_json(fixture / "meta.json"), load_file(str(fixture / "head.safetensors")),
            load_npz(fixture / "inputs.npz", "parity fixture file"), load_npz(fixture / "outputs.npz",
                                                                              "parity fixture file"))


_LOSSES = jax.jit(training.genret_losses, static_argnames=("t", "sinkhorn", "mask_duplicates"))


class Fixture:
    """A fixture's model (built once, its programs compiled once) and the comparison of any tensors of their
    layout: `model/<name>` (the T5's HF tensors) and `head/<name>` (their centroids and code embeddings)."""

    def __init__(self, fixture_dir):
        self.folder = Path(fixture_dir)
        self.meta, head, self.inputs, self.outputs = _read(self.folder)
        net = t5_convert.read_hf_tensors(self.folder / "model")
        self.config = t5_convert.config_from_hf(t5_convert.read_hf_config(self.folder / "model"), net,
                                                source=str(self.folder / "model"))
        self.tensors = {**{f"model/{k}": v for k, v in net.items()}, **{f"head/{k}": v for k, v in head.items()}}
        T, K = int(self.meta["positions"]), int(self.meta["codes"])
        self.model = genret.GenretRetriever(self.config, genret.GenretHead(length=T, codes=K, start="learned",
                                                                           raw_logits=True))
        self.positions = jax.jit(self.model.positions)  # compiled whole: fewer, larger programs than op by op

    def params(self, tensors: dict) -> dict:
        net = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
        head = {k[len("head/"):]: v for k, v in tensors.items() if k.startswith("head/")}
        T, K = self.model.head.length, self.model.head.codes
        book = np.concatenate([head[f"centroids.{i}.weight"] for i in range(T)], 0)
        inputs = np.zeros_like(book)  # table T − 1 is never read
        for i in range(1, T):
            inputs[(i - 1) * K:i * K] = head[f"code_embedding.{i}.weight"]
        params = {"network": t5_convert.params_from_hf(net, self.config, source=str(self.folder / "model")),
                  "head": {"codebook": book, "code_inputs": inputs, "start": head["code_embedding.0.weight"][0]}}
        return jax.tree_util.tree_map(jnp.asarray, params)

    def compare(self, tensors: dict, search: bool = True) -> dict:
        model, params, inputs, outputs = self.model, self.params(tensors), self.inputs, self.outputs
        T, K = model.head.length, model.head.codes
        out: dict = {"method": "genret", "fixture": str(self.folder), "their_commit": self.meta.get("genret_commit")}
        query, doc = jnp.asarray(inputs["query"], jnp.int32), jnp.asarray(inputs["doc"], jnp.int32)
        B = query.shape[0]
        rows = jnp.arange(B)
        diffs: dict[str, float] = {}
        codes_same = True

        def worst(name, value):
            diffs[name] = max(diffs.get(name, 0.0), value)

        for t in range(T):
            prefix = np.zeros((B, T), np.int32)
            prefix[:, :t] = inputs["prefix"][:, :t]
            prefix = jnp.asarray(prefix)
            q_h, q_logits = self.positions(params, query, prefix)
            d_h, d_logits = self.positions(params, doc, prefix)
            worst("query_logits_rel_diff", rel_diff(q_logits[:, :t + 1], outputs[f"t{t}/query_logits"]))
            worst("doc_logits_rel_diff", rel_diff(d_logits[:, :t + 1], outputs[f"t{t}/doc_logits"]))
            worst("query_state_rel_diff", rel_diff(q_h[:, t], outputs[f"t{t}/query_state"]))
            worst("doc_state_rel_diff", rel_diff(d_h[:, t], outputs[f"t{t}/doc_state"]))
            worst("sinkhorn_plan_rel_diff", rel_diff(training.released_plan(d_logits[:, t]), outputs[f"t{t}/plan"]))
            table = params["head"]["codebook"].reshape(T, K, -1)
            terms = _LOSSES(q_h, q_logits, d_h, d_logits, prefix, t=t, rows_B=rows, codebook_KxD=table[t],
                            sinkhorn="released", mask_duplicates=False)
            codes_same &= np.array_equal(np.asarray(terms["codes"]), outputs[f"t{t}/codes"])
            for ours, theirs in (("cl", "cl_loss"), ("ce", "ce_loss"), ("rec", "cl_dd_loss")):
                worst(f"loss_{ours}_rel_diff", rel_diff(terms[ours], outputs[f"t{t}/loss_{theirs}"]))
            # the prefix-code term needs a prefix (their code_logits are None at t = 0)
            if t:
                worst("loss_code_rel_diff", rel_diff(terms["code"], outputs[f"t{t}/loss_code_loss"]))
            km_prefix = np.zeros((len(inputs["kmeans_docs"]), T), np.int32)
            km_prefix[:, :t] = inputs["kmeans_prefix"][:, :t]
            states = model.document_states(params, inputs["kmeans_docs"], km_prefix, t)
            worst("kmeans_states_rel_diff", rel_diff(states, outputs[f"t{t}/kmeans_states"]))
            worst("kmeans_normed_rel_diff", rel_diff(training.prefix_centered(states, km_prefix[:, :t]),
                                                     outputs[f"t{t}/kmeans_normed"]))
        out.update(diffs)
        out["balanced_codes_identical"] = bool(codes_same)
        if search and "search_docids" in outputs:  # their `generate` over a prefix tree, as many beams as docids
            docids = np.asarray(outputs["search_docids"])
            index = TrieIndex.build(docids.tolist(), list(range(len(docids))), vocab_size=K, eos_id=None,
                                    append_eos=False)
            res = jax.device_get(model.predict(params, query, index, len(docids)))
            ours = [[res.tokens[b, k, :T].tolist() for k in range(len(docids)) if res.valid[b, k]] for b in range(B)]
            out["search_rankings_identical"] = ours == np.asarray(outputs["search_beams"]).tolist()
            # theirs divides each beam's log-probability by its T generated codes (generate's length penalty 1.0)
            out["search_scores_rel_diff"] = rel_diff(np.asarray(res.scores)[:, :len(docids)] / T,
                                                     outputs["search_scores"])
        return out


def check_fixture(fixture_dir, search: bool = True) -> dict:
    """Every comparison of the module docstring (`search` False: all but their inference's search)."""
    fx = Fixture(fixture_dir)
    return fx.compare(fx.tensors, search)


def mutations(fixture_dir, tolerance: float = 1e-4, names=None, sample: int = 0, seed: int = 0) -> dict:
    """{tensor name: whether the comparison (without the search) caught two of its rows swapped} for every tensor
    of the fixture (`model/…`, `head/…`; or `names`, or `sample` of them drawn with `seed`)."""
    fx = Fixture(fixture_dir)
    return sweep(fx.tensors, lambda tensors: within(fx.compare(tensors, search=False), tolerance), names, sample,
                 seed)


def within(result: dict, tolerance: float = 1e-4) -> bool:
    """Every relative difference within `tolerance` and every identity check true."""
    return all(v <= tolerance for k, v in result.items() if k.endswith("_diff")) and \
        all(v for k, v in result.items() if k.endswith("_identical"))
