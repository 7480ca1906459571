"""Parity of `methods.nci.released` (NCI's released model) with NCI's own PyTorch code, on a fixture folder that
`tools/nci_fixtures.py` writes from it (tests/fixtures/nci_parity/<shape>/: one folder per shape).

Their state dict is read by `params_from_nci` into a `NciReleasedRetriever` (a T5 with the cross-attention position
bias, `NciFlatHead`). Compared: the training-mode logits over [queries; augmented queries] (dropout off, the
training mask) at every target position (the padded ones too), the cross-entropy, their "Contrast" term and the loss
of `nci_objective(consistency="contrast")`; the evaluation-mode logits; the prefix-tree beam search (beams in order,
scores with the length penalty 0.8). Logits are compared where their mask allows a token (elsewhere both are −1e9 +
a logit); differences relative to the reference's magnitude (`_rel_diff`), identity checks end in `_identical`.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.api import load_npz, read_json, rel_diff, swapped, sweep, t5, TrieIndex
from gr_jax.methods.nci import model as nci_model
from gr_jax.methods.nci import released

FILES = ("weights.safetensors", "config.json", "inputs.npz", "outputs.npz", "meta.json")


def _read(fixture: Path):
    for name in FILES:
        if not (fixture / name).exists():
            raise ValueError(f"{fixture}: no {name}; not an NCI parity fixture folder (tools/nci_fixtures.py)")
    from safetensors.numpy import load_file

    return (read_json(fixture / "config.json"), read_json(fixture / "meta.json"),
            load_file(str(fixture / "weights.safetensors")), load_npz(fixture / "inputs.npz", "parity fixture file"),
            load_npz(fixture / "outputs.npz", "parity fixture file"))


def fixture_model(settings: dict, meta: dict, tensors: dict):
    """(NciReleasedRetriever as their settings build it, without dropout; params from their state dict)."""
    config = t5.T5Config(
        vocab_size=int(settings["vocab_size"]), d_model=int(settings["d_model"]), d_kv=int(settings["d_kv"]),
        d_ff=int(settings["d_ff"]), num_layers=int(settings["num_layers"]),
        num_decoder_layers=int(settings["num_decoder_layers"]), num_heads=int(settings["num_heads"]),
        dropout_rate=0.0, cross_attention_bias=True)
    head = released.NciFlatHead(codes=int(meta["codes"]), positions=int(meta["positions"]),
                                adaptor_layers=int(meta["adaptor_layers"]), adaptor_dropout=0.0)
    model = released.NciReleasedRetriever(config, head)
    return model, released.params_from_nci(tensors, config, head, "the NCI fixture's weights")


class Fixture:
    """A fixture's model (built once, its programs compiled once) and the comparison of any tensors of their state
    dict."""

    def __init__(self, fixture_dir):
        self.folder = Path(fixture_dir)
        self.settings, self.meta, self.tensors, self.inputs, self.outputs = _read(self.folder)
        self.model, _ = fixture_model(self.settings, self.meta, self.tensors)
        model = self.model
        self.logits_and_states = jax.jit(model.logits_and_states)  # compiled whole: faster here
        self.objective = jax.jit(lambda p, b, k: nci_model.nci_objective(model, p, b, k, consistency="contrast"))
        self.token_logits = jax.jit(model.token_logits)

    def compare(self, tensors: dict, search: bool = True) -> dict:
        model, inputs, outputs = self.model, self.inputs, self.outputs
        params = released.params_from_nci(tensors, model.config, model.head, "the NCI fixture's weights")
        out: dict = {"method": "nci", "fixture": str(self.folder), "their_commit": self.meta.get("nci_commit")}
        queries, augmented = jnp.asarray(inputs["queries"], jnp.int32), jnp.asarray(inputs["augmented"], jnp.int32)
        labels = jnp.asarray(inputs["labels"], jnp.int32)
        both_in, both_t = jnp.concatenate([queries, augmented]), jnp.concatenate([labels, labels])
        key = jax.random.PRNGKey(0)  # training mode (the training mask); every dropout rate is 0
        logits, _ = self.logits_and_states(params, both_in, both_t, key)
        allowed = np.asarray(outputs["train_logits"]) > -1e8
        out["train_mask_identical"] = bool(np.array_equal(np.asarray(logits) > -1e8, allowed))
        # every position, the padded ones included: their training hides the padded targets as decoder keys, and so
        # does ours (`NciReleasedRetriever.decoder_padding_mask`)
        out["train_logits_rel_diff"] = rel_diff(logits, outputs["train_logits"], allowed)
        loss, metrics = self.objective(params, {"inputs": queries, "targets": labels, "augmented_inputs": augmented},
                                       key)
        ce_sum, tokens = metrics["loss"]
        contrast_sum, rows = metrics["consistency_contrast"]
        out["train_ce_rel_diff"] = rel_diff(ce_sum / tokens, outputs["train_ce"])
        out["train_contrast_rel_diff"] = rel_diff(contrast_sum / rows, outputs["train_contrast"] / 0.15)
        out["train_loss_rel_diff"] = rel_diff(loss, outputs["train_loss"])
        ev = self.token_logits(params, queries, labels)
        allowed = np.asarray(outputs["eval_logits"]) > -1e8
        out["eval_logits_rel_diff"] = rel_diff(ev, outputs["eval_logits"], allowed)
        if not search:
            return out
        # the beam search over the prefix tree of the fixture's docids
        seqs = [[int(x) for x in row if x > 1] for row in np.asarray(inputs["labels"])]
        index = TrieIndex.build(seqs, list(range(len(seqs))), vocab_size=model.head.vocab, eos_id=released.END,
                                append_eos=True)
        beams = int(outputs["beams"].shape[1])
        res = jax.device_get(model.predict(params, queries, index, beams))
        same, diff = True, 0.0
        for b in range(queries.shape[0]):
            theirs = [[int(x) for x in row[1:] if x > 1] for row in outputs["beams"][b]]
            ours = [[int(x) for x in res.tokens[b, k] if x > 1] for k in range(beams) if res.valid[b, k]]
            same &= ours == theirs
            if ours == theirs:
                diff = max(diff, rel_diff(res.scores[b, :beams], outputs["beam_scores"][b]))
        out["beams_identical"] = bool(same)
        out["beam_scores_rel_diff"] = diff
        return out


def check_fixture(fixture_dir, search: bool = True) -> dict:
    """Every comparison of the module docstring (`search` False: all but the beam search)."""
    fx = Fixture(fixture_dir)
    return fx.compare(fx.tensors, search)


# their state dict's stored copies of one parameter: a mutation of the first changes the copies with it
TIED = {"decode_embeddings.weight": ("lm_head.weight", "decoder.embed_tokens.weight"),
        "shared.weight": ("encoder.embed_tokens.weight",)}


def mutations(fixture_dir, tolerance: float = 1e-4, names=None, sample: int = 0, seed: int = 0) -> dict:
    """{tensor name: whether the comparison (without the search) caught two of its rows swapped} for every parameter
    of their state dict (a tied table once, its copies mutated with it; or `names`, or `sample` of them drawn with
    `seed`)."""
    fx = Fixture(fixture_dir)
    copies = {c for group in TIED.values() for c in group}
    params = {k: v for k, v in fx.tensors.items() if k not in copies}

    def passes(mutated: dict) -> bool:
        full = {**fx.tensors, **mutated}
        for primary, group in TIED.items():
            full.update({c: full[primary] for c in group if c in fx.tensors})
        return within(fx.compare(full, search=False), tolerance)

    def mutate(name: str, value: np.ndarray) -> np.ndarray:
        # the adaptor's memory attention reads one memory vector: a softmax over one key is 1 whatever the query and
        # key projections, so two rows of its value block are what a swap can change
        if ".multihead_attn.in_proj_" in name:
            third = value.shape[0] // 3
            return np.concatenate([value[:2 * third], swapped(value[2 * third:])])
        return swapped(value)

    return sweep(params, passes, names, sample, seed, mutate)


def within(result: dict, tolerance: float = 1e-4) -> bool:
    return all(v <= tolerance for k, v in result.items() if k.endswith("_diff")) and \
        all(v for k, v in result.items() if k.endswith("_identical"))
