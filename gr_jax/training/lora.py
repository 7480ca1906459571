"""Low-rank adapters (LoRA: Hu et al., 2021) for any network built of `t5.Dense` projections — the T5, the Llama
family — as parameters beside the kernels they adapt, and a trainer that trains those alone.

    prepare.adapters = @Lora()
    Lora.rank = 8
    Lora.alpha = 16
    Lora.targets = ['q', 'k', 'v', 'o']      # Dense names: T5 and Llama attention q/k/v/o; MLP wi/wi_0/wi_1/wo,
                                             # gate/up/down

* **Where**: every Dense whose name is in `targets` gets `lora_a` [in, r] (normal, std in^-½), `lora_b` [r, out]
  (zeros: the network's function is unchanged at the start) and `lora_scale` = α / r beside its `kernel`; the
  Dense adds scale · (x A) B (`t5.Dense`, unmerged). Adapters of a layer stack stack with it.
* **What trains**: `trainable(name)` — the A and B leaves; the trainer's `fit(..., trainable=...)` takes the
  gradient with respect to those only, keeps the optimizer state for those only, and holds the rest (the base
  network, the docid head, the scales) fixed and out of its checkpoints, which record the frozen part's digest
  instead (`FROZEN_DIGEST` in the checkpoint's provenance: a resume or a restore over other base weights is
  refused, naming the fix).
* **Merge / unmerge**: `merge(params)` folds every adapter into its kernel (W + scale · A B) and drops it — the
  same function, one product per projection (inference: `compose.restore` merges); `unmerge(merged, adapters)`
  takes the adapters (`adapters_of`) back out.

Names are key paths joined by '/' (`network/layers_0/attention/q/lora_a`), the same for every tree layout.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from gr_jax.backbones.t5 import LORA_A, LORA_B, LORA_SCALE
from gr_jax.runtime import provenance
from gr_jax.runtime.validation import Count, Positive

ADAPTER_LEAVES = (LORA_A, LORA_B)
FROZEN_DIGEST = "frozen_parameters"  # the provenance key of a checkpoint that holds its trainable part only


def leaf_names(tree) -> list[str]:
    return [provenance.key_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Lora:
    rank: Count = 8
    alpha: Positive = 16.0
    targets: Sequence[str] = ("q", "k", "v", "o")
    seed: int = 0

    def __post_init__(self):
        if self.rank < 1:
            raise ValueError(f"Lora.rank must be ≥ 1, got {self.rank}")
        if isinstance(self.targets, str) or not self.targets or not all(isinstance(t, str) for t in self.targets):
            raise ValueError(f"Lora.targets must be a list of Dense names (e.g. ['q', 'v']), got {self.targets!r}")

    @property
    def scale(self) -> float:
        return float(self.alpha) / self.rank

    def settings(self) -> dict:
        """What a checkpoint's adapters depend on (recorded in its provenance)."""
        return {"rank": self.rank, "alpha": float(self.alpha), "targets": sorted(self.targets), "seed": self.seed}

    def add(self, params: dict) -> dict:
        """`params` with a fresh adapter beside every targeted kernel (B = 0: the same function). A tree without
        any targeted Dense is refused (the targets name nothing in this network)."""
        count = [0]
        key = jax.random.PRNGKey(self.seed)

        def visit(node, path):
            if not isinstance(node, dict):
                return node
            out = {k: visit(v, path + (k,)) for k, v in node.items()}
            if path and path[-1] in self.targets and "kernel" in node and np.ndim(node["kernel"]) >= 2:
                if LORA_A in node:
                    raise ValueError(f"{'/'.join(path)} already has an adapter; merge it first (lora.merge)")
                kernel = node["kernel"]
                d_in, d_out = kernel.shape[-2], kernel.shape[-1]
                lead = kernel.shape[:-2]  # a stacked layer axis, if any
                k = jax.random.fold_in(key, count[0])
                count[0] += 1
                out[LORA_A] = jax.random.normal(k, lead + (d_in, self.rank), jnp.float32) * d_in ** -0.5
                out[LORA_B] = jnp.zeros(lead + (self.rank, d_out), jnp.float32)
                out[LORA_SCALE] = jnp.full(lead, self.scale, jnp.float32)
            return out

        new = visit(params, ())
        if not count[0]:
            raise ValueError(f"Lora.targets {list(self.targets)} name no Dense projection of this network (T5 and "
                             f"Llama: q, k, v, o; MLP wi, wi_0, wi_1, wo or gate, up, down)")
        return new


def trainable(name: str) -> bool:
    """The leaves a LoRA run trains: the adapters' A and B."""
    return name.rsplit("/", 1)[-1] in ADAPTER_LEAVES


def has_adapters(params) -> bool:
    return any(trainable(n) for n in leaf_names(params))


def adapters_of(params) -> dict[str, Any]:
    """{name: leaf} of the adapters' A, B and scale."""
    return {n: x for n, x in zip(leaf_names(params), jax.tree_util.tree_leaves(params))
            if n.rsplit("/", 1)[-1] in ADAPTER_LEAVES + (LORA_SCALE,)}


def _map_dense(params, fn):
    if not isinstance(params, dict):
        return params
    if LORA_A in params:
        return fn(params)
    return {k: _map_dense(v, fn) for k, v in params.items()}


def merge(params) -> dict:
    """Every adapter folded into its kernel (W + scale · A B) and removed: the network's plain parameters."""
    def fold(node):
        rest = {k: v for k, v in node.items() if k not in (LORA_A, LORA_B, LORA_SCALE)}
        delta = jnp.einsum("...ir,...ro->...io", node[LORA_A], node[LORA_B]) * node[LORA_SCALE][..., None, None]
        return {**rest, "kernel": node["kernel"] + delta}

    return _map_dense(params, fold)


def unmerge(merged, adapters: dict) -> dict:
    """The inverse of `merge`: `merged` parameters with `adapters` (`adapters_of` of the unmerged tree) taken out
    of their kernels and put back beside them."""
    groups: dict[str, dict] = {}
    for name, leaf in adapters.items():
        where, leaf_name = name.rsplit("/", 1)
        groups.setdefault(where, {})[leaf_name] = leaf

    def visit(node, path):
        if not isinstance(node, dict):
            return node
        out = {k: visit(v, path + (k,)) for k, v in node.items()}
        own = groups.get("/".join(path))
        if own is not None:
            delta = jnp.einsum("...ir,...ro->...io", own[LORA_A], own[LORA_B]) * own[LORA_SCALE][..., None, None]
            out = {**out, "kernel": node["kernel"] - delta, **own}
        return out

    out = visit(merged, ())
    missing = sorted(set(groups) - {n.rsplit("/", 1)[0] for n in leaf_names(out) if trainable(n)})
    if missing:
        raise ValueError(f"lora.unmerge: no kernel at {missing[:3]} for their adapters")
    return out


def complete_axes(axes, params):
    """The model's logical axes (a tree without adapters) extended to `params`' adapters: A shards as its
    kernel's input axis, B as its output axis, the scale (and a stacked layer axis) replicated."""
    if not has_adapters(params):
        return axes

    def visit(ax, node):
        if not isinstance(node, dict):
            return ax
        out = {k: visit(ax[k], v) if isinstance(ax, dict) and k in ax else ax for k, v in node.items()}
        if LORA_A in node:
            spec = tuple(ax["kernel"]) if isinstance(ax, dict) and isinstance(ax.get("kernel"), P) else (None, None)
            lead = (None,) * (np.ndim(node[LORA_A]) - 2)
            out[LORA_A] = P(*lead, *(spec[-2:-1] or (None,)), None)
            out[LORA_B] = P(*lead, None, *(spec[-1:] or (None,)))
            out[LORA_SCALE] = P(*lead)
        return out

    return visit(axes, params)
