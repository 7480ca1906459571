"""Mesh and logical-axis sharding rules (the one table that maps parameter/activation axis names to mesh axes).

The mesh has two axes, "data" (data parallelism: the batch is split over it) and "model" (tensor
parallelism of the vocabulary, MLP and attention heads). With `num_partitions=1` (the default) every
parameter is replicated and only the batch is split — plain data parallelism. As in t5x's partitioner, gin
chooses: `train.num_partitions` (the `model` axis's size), `logical_rules.rules` (the table) and
`logical_rules.parameter_partitioning_dims = 2` (parameters split over `data` too). The mesh spans every
process's devices, ordered by process (`jax.devices()`), so each process's devices hold whole rows of the
batch (`distributed.global_batch`).
"""

from __future__ import annotations

from typing import Annotated, Optional, Sequence

import gin
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from gr_jax.runtime.validation import Count, Range


DEFAULT_RULES: tuple[tuple[str, Optional[str]], ...] = (
    ("batch", "data"),
    ("vocab", "model"),
    ("mlp", "model"),
    ("heads", "model"),
    ("joined_kv", "model"),
    ("embed", None),
    ("relpos_buckets", None),
    ("length", None),
)


@gin.configurable
def make_mesh(num_partitions: Count = 1, devices: Optional[Sequence] = None) -> Mesh:
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) % num_partitions:
        raise ValueError(f"{len(devices)} devices cannot be split into model partitions of {num_partitions}")
    grid = np.array(devices).reshape(len(devices) // num_partitions, num_partitions)
    return Mesh(grid, ("data", "model"))


@gin.configurable
def logical_rules(rules: Sequence[tuple[str, Optional[str]]] = DEFAULT_RULES,
                  parameter_partitioning_dims: Annotated[int, Range(integer=True, low=1, high=2)] = 1
                  ) -> dict[str, Optional[str]]:
    """{logical axis: mesh axis}. `parameter_partitioning_dims = 2` (t5x's name) also splits every matrix's
    `embed` (d_model) axis over `data`: parameters and optimizer state fully sharded (FSDP / ZeRO-3), each
    device holding 1/(data × model) of them; XLA gathers a layer's weights where the step needs them."""
    out = dict(rules)
    if parameter_partitioning_dims == 2:
        out["embed"] = "data"
    return out


def to_mesh_spec(logical: P, rules: dict[str, Optional[str]]) -> P:
    unknown = [a for a in logical if a is not None and a not in rules]
    if unknown:
        raise ValueError(f"no sharding rule for logical axes {unknown}; add them to partitioning.logical_rules")
    return P(*[None if a is None else rules[a] for a in logical])


def param_shardings(logical_specs, mesh: Mesh, rules: Optional[dict] = None):
    rules = logical_rules() if rules is None else rules
    return jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, to_mesh_spec(spec, rules)), logical_specs,
                                  is_leaf=lambda x: isinstance(x, P))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P("data"))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())
