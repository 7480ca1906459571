"""The backbones' parity by gradients, and its mutation sweep (`tools/check_parity.py --arch A --hf_dir DIR
--mutate`).

A swapped weight can hide in the final logits: a random tiny BART's feed-forward adds little to the residual
stream, so two of its rows swapped move the logits by about 2e-5 of their magnitude. The gradient of a loss with
respect to that tensor moves by the order of its own magnitude. `Backbone.compare` therefore runs transformers and
ours on the same HF weights and one padded batch, with the loss Σ logits · R (R fixed random weights, real
positions only), and compares the logits and the gradient of every parameter tensor transformers has, each
relative to the reference's own magnitude. `mutations` swaps two rows of each tensor of the HF directory in turn
(`evaluation.mutations.sweep`), feeds the result to ours, and asks whether the comparison fails. The compiled
loss-and-gradient takes the parameters as arguments: one compile serves every mutation.

Architectures: `t5`, `bart` (encoder-decoder: teacher-forced logits), `llama` (decoder-only, left-padded).
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.backbones import bart, bart_convert, bart_parity, llama, llama_io, llama_parity, t5, t5_convert, t5_parity
from gr_jax.evaluation.mutations import rel_diff, swapped, sweep

ARCHS = ("t5", "bart", "llama")
# tensors no output reads: a key projection's bias adds q·b to every score of a query's row, which the softmax
# ignores, so its gradient is zero (float noise, relative to nothing) and a swap of two of its entries changes
# nothing; they are neither compared nor mutated, and listed as `inert`
INERT = (".self_attn.k_proj.bias", ".encoder_attn.k_proj.bias")
# float32 forward and backward passes of a tiny random model agree with transformers' to ~1e-6 of the largest
# entry of each tensor (measured: ≤ 3e-6 on every stored shape); a swap of two rows of a tensor moves that tensor's
# gradient by the order of its own magnitude
TOLERANCE = 1e-4


class Backbone:
    """One HF directory's reference (transformers' logits and gradients, computed once) and our compiled
    loss-and-gradient over any tensors of its layout."""

    def __init__(self, arch: str, hf_dir: str | os.PathLike, batch: int = 3, encoder_length: int = 12,
                 decoder_length: int = 6, seed: int = 0):
        if arch not in ARCHS:
            raise ValueError(f"arch {arch!r}: one of {', '.join(ARCHS)}")
        self.arch, self.hf_dir = arch, Path(hf_dir)
        self.tensors = t5_convert.read_hf_tensors(self.hf_dir)
        hf_config = t5_convert.read_hf_config(self.hf_dir)
        source = str(self.hf_dir)
        if arch == "t5":
            self.config = t5_convert.config_from_hf(hf_config, self.tensors, source=source)
            ids, mask = t5_parity.random_padded_batch(self.config.vocab_size, batch, encoder_length, seed)
            dec, dec_mask = t5_parity.random_padded_batch(self.config.vocab_size, batch, decoder_length, seed + 1)
            torch_model = t5_parity.load_torch_t5(self.hf_dir)
        elif arch == "bart":
            self.config = bart_convert.config_from_hf(hf_config, source=source)
            ids, mask = bart_parity.random_batch(self.config, batch, encoder_length, seed)
            dec, dec_mask = bart_parity.random_batch(self.config, batch, decoder_length, seed + 1)
            torch_model = bart_parity.load_torch_bart(self.hf_dir)
        else:
            self.config = llama_io.config_from_hf_llama(hf_config, source=source)
            ids, mask = llama_parity.left_padded_batch(self.config.vocab_size, batch, encoder_length, seed)
            if self.config.bos_token_id is not None:  # prompts start with BOS, so its embedding row is read
                ids[np.arange(batch), np.argmax(mask, axis=1)] = self.config.bos_token_id
            dec, dec_mask = None, mask
            torch_model = llama_parity.load_torch_llama(self.hf_dir)
        if dec is not None:
            dec[:, 0] = self.config.decoder_start_token_id
        self.inputs = {"ids": ids, "mask": mask, "dec": dec}
        vocab = self.config.vocab_size
        real = dec_mask.astype(np.float32)[..., None]  # the loss reads real positions only
        self.weights = (np.random.default_rng(seed + 2).standard_normal((*dec_mask.shape, vocab))
                        .astype(np.float32) * real)
        self.ref_logits, self.ref_grads = self._reference(torch_model)
        self.real = real.astype(bool)
        self._loss_and_grad = jax.jit(jax.value_and_grad(self._loss, has_aux=True))

    # --- transformers ------------------------------------------------------------------------------------
    def _reference(self, torch_model):
        import torch

        torch_model.zero_grad()
        kwargs = {"input_ids": torch.tensor(self.inputs["ids"]), "attention_mask": torch.tensor(self.inputs["mask"])}
        if self.inputs["dec"] is not None:
            kwargs["decoder_input_ids"] = torch.tensor(self.inputs["dec"])
        logits = torch_model(**kwargs).logits
        (logits * torch.tensor(self.weights)).sum().backward()
        grads = {name: p.grad.numpy().copy() for name, p in torch_model.named_parameters()
                 if p.requires_grad and p.grad is not None}
        return logits.detach().numpy(), grads

    # --- ours --------------------------------------------------------------------------------------------
    def params(self, tensors: dict) -> dict:
        source = str(self.hf_dir)
        if self.arch == "t5":
            params = t5_convert.params_from_hf(tensors, self.config, source=source)
        elif self.arch == "bart":
            params = bart_convert.params_from_hf(tensors, self.config, source=source)
        else:
            params = llama_io.params_from_tensors(tensors.__getitem__, set(tensors), self.config, "hf", source)
        return jax.tree_util.tree_map(jnp.asarray, params)

    def _logits(self, params):
        ids, mask = jnp.asarray(self.inputs["ids"], jnp.int32), jnp.asarray(self.inputs["mask"])
        variables = {"params": params}
        if self.arch == "llama":
            return llama.Llama(self.config).apply(variables, ids, mask.astype(bool))
        net = t5.T5(self.config) if self.arch == "t5" else bart.Bart(self.config)
        encoded = net.apply(variables, ids, mask, method="encode")
        return net.apply(variables, encoded, mask, jnp.asarray(self.inputs["dec"], jnp.int32), method="decode")

    def _loss(self, params):
        logits = self._logits(params)
        return jnp.sum(logits * self.weights), logits

    def _key_map(self):
        if self.arch == "t5":
            return t5_convert._key_map(self.config)
        if self.arch == "bart":
            return bart_convert._key_map(self.config)
        return llama_io._key_map(self.config, "hf")

    def compare(self, tensors: dict) -> dict:
        """Relative differences of the logits (real positions) and of every reference gradient (the worst
        tensor named)."""
        (_, logits), grads = self._loss_and_grad(self.params(tensors))
        logits, grads = jax.device_get((logits, grads))
        out = {"arch": self.arch, "hf_dir": str(self.hf_dir),
               "logits_rel_diff": rel_diff(np.where(self.real, logits, 0), np.where(self.real, self.ref_logits, 0))}
        worst, worst_name, compared = 0.0, None, set()
        for key, path, transpose in self._key_map():
            if key not in self.ref_grads or key.endswith(INERT):  # a buffer (BART's final_logits_bias): the
                continue  # logits see it; an inert tensor (INERT)
            g = grads
            for p in path:
                g = g[p]
            d = rel_diff(g.T if transpose else g, self.ref_grads[key])
            compared.add(key)
            if not d <= worst or worst_name is None:  # a NaN is the worst of all
                worst, worst_name = d, key
        missing = sorted(k for k in set(self.ref_grads) - compared if not k.endswith(INERT))
        if missing:
            raise ValueError(f"{self.hf_dir}: no gradient of ours maps onto {', '.join(missing[:5])}")
        out["gradients_compared"] = len(compared)
        out["gradient_rel_diff"] = worst
        out["worst_gradient"] = worst_name
        return out


def within(result: dict, tolerance: float = TOLERANCE) -> bool:
    return all(v <= tolerance for k, v in result.items() if k.endswith("_diff"))  # a NaN fails


def check(arch: str, hf_dir, **kwargs) -> dict:
    bb = Backbone(arch, hf_dir, **kwargs)
    return bb.compare(bb.tensors)


def mutations(backbone: Backbone, tolerance: float = TOLERANCE, names=None, sample: int = 0, seed: int = 0) -> dict:
    """{tensor name: whether the comparison caught two of its rows swapped}, for every tensor of the backbone's HF
    directory (or `names`, or `sample` of them drawn with `seed`), on the backbone's own batch."""
    bb = backbone
    names = [n for n in (bb.tensors if names is None else names) if not n.endswith(INERT)]
    return sweep(bb.tensors, lambda tensors: within(bb.compare(tensors), tolerance), names, sample, seed,
                 mutate=_mutate)


def _mutate(name: str, value) -> np.ndarray:
    """`swapped`, except BART's learned positions, whose rows 0 and 1 no position reads (HF's offset of 2): rows
    2 and 3 there."""
    if name.endswith("embed_positions.weight"):
        return np.concatenate([value[:2], swapped(value[2:])])
    return swapped(value)


def inert(hf_dir) -> list[str]:
    """The tensors of the HF directory that no output reads (INERT)."""
    return sorted(n for n in t5_convert.hf_tensor_names(hf_dir) if n.endswith(INERT))
