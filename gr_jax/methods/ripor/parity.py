"""Parity of RIPOR's T5 layout (`t5_layout.RiporT5Retriever`) with RIPOR's own PyTorch code, on a fixture folder
that `tools/ripor_fixtures.py` writes from it (tests/fixtures/ripor_parity/<shape>/).

Their tensors map onto ours as: the T5 (`shared`, `encoder.*`, `decoder.*`) through `t5_convert.params_from_hf`;
`list_output_embeds.<l>` → codebook table l, `list_decoder_embeds.<l>` → code-input table l (read at position
l + 1), `start_token_embed` → `start`. Compared:
  * the centroid assignment: our `use_docids` + `init_params` from the fixture's centroids against their state
    dict after `assign_output_embeds` (identical, both code tables);
  * the prefix-oriented ranking phase: the prefix scores S_L of the positive and negative docids (their forward's
    sums) and the loss (`loss_fn` on the batch; theirs the sum of its `rank`, `rank_4` (, `rank_8`) terms, each
    of weight 1 as their arguments set them), relative to the reference's magnitude;
  * the constrained beam search: our `predict` over a `TrieIndex` of the fixture's docids with their beam count
    against their replayed loop (docids identical, best first; scores: theirs are the sums divided by M + 1).

`mutations(folder)` swaps two rows (elements, for a vector) of each of their tensors in turn, loads the result and
runs the same comparison: a check that passes a mutated tensor is a check that cannot see that tensor. The
compiled functions take the parameters as arguments, so one compile serves every mutation.
"""

from __future__ import annotations

import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.api import CodebookHead, load_npz, read_json, rel_diff, sweep, t5_convert, TrieIndex
from gr_jax.methods.ripor.docids import pack_codebooks
from gr_jax.methods.ripor.objectives import MARGIN_UNIT
from gr_jax.methods.ripor.t5_layout import RiporT5Retriever

FILES = ("weights.safetensors", "config.json", "inputs.npz", "outputs.npz", "meta.json")
THEIR_HEAD = ("list_output_embeds.", "list_decoder_embeds.", "start_token_embed")


def read_fixture(fixture: Path):
    for name in FILES:
        if not (fixture / name).is_file():
            raise ValueError(f"{fixture}: no {name}; not a RIPOR parity fixture folder (tools/ripor_fixtures.py)")
    from safetensors.numpy import load_file

    return (read_json(fixture / "meta.json"), read_json(fixture / "config.json"),
            load_file(str(fixture / "weights.safetensors")), load_npz(fixture / "inputs.npz", "parity fixture file"),
            load_npz(fixture / "outputs.npz", "parity fixture file"))


class Fixture:
    """A fixture's model (built once) and its compiled comparisons, for any tensors of their layout."""

    def __init__(self, fixture_dir):
        self.folder = Path(fixture_dir)
        self.meta, hf_config, self.tensors, self.inputs, self.outputs = read_fixture(self.folder)
        M, K = int(self.meta["levels"]), int(self.meta["codes"])
        net_tensors = {k: v for k, v in self.tensors.items() if not k.startswith(THEIR_HEAD)}
        self.config = t5_convert.config_from_hf(hf_config, net_tensors, source=str(self.folder / "config.json"))
        factors = self.meta["prefix_factors"]
        self.model = RiporT5Retriever(self.config, CodebookHead(length=M, codes=K),
                                      prefix_lengths=[int(L) for L in sorted(factors, key=int)],
                                      prefix_factors=[factors[L] for L in sorted(factors, key=int)])
        self.M, self.K = M, K
        self._initial_head = None
        inp = self.inputs
        docids = np.asarray(inp["docids"], np.int32)
        self.batch = {"inputs": jnp.asarray(inp["query_ids"], jnp.int32),
                      "targets": jnp.asarray(docids[inp["pos_rows"]]),
                      "negatives": jnp.asarray(docids[inp["neg_rows"]]),
                      "margin": jnp.asarray(np.round((inp["teacher_pos"] - inp["teacher_neg"]) / MARGIN_UNIT)
                                            .astype(np.int64)[:, None])}
        model = self.model
        self._scores = jax.jit(lambda p, q, c: model.docid_scores(p, q, c))
        self._loss = jax.jit(lambda p, b: model.loss_fn(p, b)[0])
        self.index = TrieIndex.build(docids.tolist(), list(range(len(docids))), vocab_size=K, eos_id=None,
                                     append_eos=False)

    def params(self, tensors: dict) -> dict:
        net = {k: v for k, v in tensors.items() if not k.startswith(THEIR_HEAD)}
        M = self.M
        head = {"codebook": np.concatenate([tensors[f"list_output_embeds.{l}.weight"] for l in range(M)]),
                "code_inputs": np.concatenate([tensors[f"list_decoder_embeds.{l}.weight"] for l in range(M)]),
                "start": tensors["start_token_embed"].reshape(-1)}
        params = {"network": t5_convert.params_from_hf(net, self.config, source=str(self.folder)), "head": head}
        return jax.tree_util.tree_map(jnp.asarray, params)

    def assignment_identical(self, tensors: dict) -> bool:
        """Our relevance-based initialisation from the fixture's centroids vs their tables after theirs."""
        if self._initial_head is None:  # ours does not depend on their tensors: made once
            self.model.use_docids(types.SimpleNamespace(constants=pack_codebooks(self.inputs["centroids"])))
            self._initial_head = jax.device_get(self.model.init_params(0)["head"])
        head = self._initial_head
        M, K = self.M, self.K
        theirs_out = np.stack([tensors[f"list_output_embeds.{l}.weight"] for l in range(M)])
        theirs_in = np.stack([tensors[f"list_decoder_embeds.{l}.weight"] for l in range(M)])
        return bool(np.array_equal(head["codebook"].reshape(M, K, -1), theirs_out)
                    and np.array_equal(head["code_inputs"].reshape(M, K, -1), theirs_in))

    def compare(self, tensors: dict, search: bool = True) -> dict:
        params = self.params(tensors)
        out = {"method": "ripor", "fixture": str(self.folder), "their_commit": self.meta.get("ripor_commit"),
               "shape": {k: self.meta[k] for k in ("levels", "codes", "d_model", "encoder_layers", "feed_forward")}}
        out["centroid_assignment_identical"] = self.assignment_identical(tensors)
        b, o = self.batch, self.outputs
        out["pos_prefix_scores_rel_diff"] = rel_diff(self._scores(params, b["inputs"], b["targets"]),
                                                     o["pos_prefix_scores"])
        out["neg_prefix_scores_rel_diff"] = rel_diff(self._scores(params, b["inputs"], b["negatives"]),
                                                     o["neg_prefix_scores"])
        theirs = sum(float(o[k]) for k in o if k.startswith("loss_"))
        out["lng_knp_loss_rel_diff"] = rel_diff(self._loss(params, b), theirs)
        if search:
            res = jax.device_get(self.model.predict(params, b["inputs"], self.index, int(self.meta["beams"])))
            n = o["beam_docids"].shape[1]
            ours = [[res.tokens[q, k, :self.M].tolist() for k in range(n) if res.valid[q, k]]
                    for q in range(res.tokens.shape[0])]
            out["beam_docids_identical"] = ours == o["beam_docids"].tolist()
            out["beam_scores_rel_diff"] = rel_diff(np.asarray(res.scores)[:, :n] / (self.M + 1), o["beam_scores"])
        return out


def check_fixture(fixture_dir, search: bool = True) -> dict:
    """Every comparison of the module docstring (`search` False: all but the beam search)."""
    fx = Fixture(fixture_dir)
    return fx.compare(fx.tensors, search=search)


def within(result: dict, tolerance: float = 1e-5) -> bool:
    """Every relative difference within `tolerance` and every identity check true."""
    return all(v <= tolerance for k, v in result.items() if k.endswith("_diff")) and \
        all(v for k, v in result.items() if k.endswith("_identical"))


def mutations(fixture_dir, tolerance: float = 1e-5, names=None, sample: int = 0, seed: int = 0,
              search: bool = False) -> dict:
    """{tensor name: whether the comparison caught two of its rows swapped}, for every tensor of the fixture (or
    `names`, or `sample` of them drawn with `seed` from the sorted names)."""
    fx = Fixture(fixture_dir)
    return sweep(fx.tensors, lambda tensors: within(fx.compare(tensors, search=search), tolerance), names, sample,
                 seed)
