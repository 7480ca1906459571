"""Run by tests/training/test_model_parallel.py in a process with 8 host devices (XLA_FLAGS): the loss and the
gradients of a T5 and a Llama retriever on one device, and on the training mesh (`partitioning.make_mesh`) of
data × model devices with the parameters laid out by the logical-axis rules, the batch split over `data` (with
`fsdp`, every matrix's d_model axis split over `data` too: fully sharded). Prints one JSON line per backbone: the
largest difference of each, relative to its magnitude, how many parameter arrays the mesh split, and how many of
the trainer's optimizer-state arrays are split."""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
import optax

from gr_jax.backbones import llama, t5
from gr_jax.retriever.decoder_only import DecoderOnlyRetriever
from gr_jax.retriever.model import GenerativeRetriever
from gr_jax.training import partitioning, trainer


def _batch(vocab: int, rows: int = 16, inputs: int = 12, targets: int = 5) -> dict:
    rng = np.random.default_rng(0)
    return {"inputs": rng.integers(3, vocab, (rows, inputs)).astype(np.int32),
            "targets": rng.integers(3, vocab, (rows, targets)).astype(np.int32)}


def check(name: str, model, partitions: int, rules: dict) -> dict:
    params = model.init_params(seed=3)
    batch = _batch(model.config.vocab_size)
    grad = jax.value_and_grad(lambda p, b: model.loss_fn(p, b)[0])
    loss1, grads1 = jax.jit(grad)(params, batch)  # one device
    mesh = partitioning.make_mesh(partitions)
    shardings = partitioning.param_shardings(model.param_axes(params), mesh, rules)
    placed = jax.device_put(params, shardings)
    b_shard = partitioning.batch_sharding(mesh)
    step = jax.jit(grad, in_shardings=(shardings, b_shard), out_shardings=(partitioning.replicated(mesh), shardings))
    loss8, grads8 = step(placed, jax.device_put(batch, b_shard))
    split = sum(1 for x in jax.tree_util.tree_leaves(placed)
                if x.addressable_shards[0].data.shape != x.shape)
    # the trainer's state on that mesh: Adam's two moments laid out as their parameters (split as often)
    state, _, _ = trainer._initial_state(model, params, optax.adamw(1e-3), mesh, rules)
    opt_split = sum(1 for x in jax.tree_util.tree_leaves(state["opt_state"]) if not x.sharding.is_fully_replicated)
    worst = 0.0
    for a, b in zip(jax.tree_util.tree_leaves(grads1), jax.tree_util.tree_leaves(grads8)):
        a, b = np.asarray(a), np.asarray(b)
        worst = max(worst, float(np.abs(a - b).max()) / max(float(np.abs(a).max()), 1e-30))
    return {"name": name, "devices": len(jax.devices()), "mesh": dict(mesh.shape), "split_arrays": split,
            "arrays": len(jax.tree_util.tree_leaves(placed)), "opt_split": opt_split, "loss": float(loss1),
            "loss_rel": abs(float(loss1) - float(loss8)) / abs(float(loss1)), "grad_rel": worst}


def main() -> int:
    """Arguments: the cases, each `PARTITIONS` or `PARTITIONS:fsdp` (default `2`); one process checks them all."""
    models = [("t5", GenerativeRetriever(t5.get_config("tiny", vocab_size=1000))),
              ("llama", DecoderOnlyRetriever(llama.get_config("llama_tiny", vocab_size=1000, pad_token_id=0,
                                                              bos_token_id=2)))]
    for case in sys.argv[1:] or ["2"]:
        partitions, _, mode = case.partition(":")
        # fsdp: the d_model axis of every matrix over `data` as well
        rules = partitioning.logical_rules(parameter_partitioning_dims=2 if mode == "fsdp" else 1)
        for name, model in models:
            row = {"case": case, **check(name, model, int(partitions), rules)}
            sys.stdout.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
