"""What the t5x adapter keeps in a MODEL_DIR, read without t5x: the record of the t5x run's system, the steps of
its checkpoints, the empty subtrees that t5x's train state drops, and the adapter's error. `python -m
gr_jax.t5x.checkpoints` needs only this (and orbax), so it starts without importing t5x, seqio or TensorFlow."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping

from gr_jax.runtime.errors import UserError
from gr_jax.runtime.io_utils import read_json

SYSTEM_RECORD = "t5x_system.json"  # in MODEL_DIR: what the t5x training run built (compose.provenance)


class T5xAdapterError(UserError, ValueError):
    pass


def all_empty(tree: Mapping) -> bool:
    """A mapping with no array under it (a head without parameters)."""
    return all(isinstance(v, Mapping) and all_empty(v) for v in tree.values())


def empty_paths(tree: Mapping, prefix: tuple = ()) -> list[tuple]:
    """(path, subtree) of each subtree without arrays: flax's axis names drop them, so t5x's train state holds the
    parameters without them (`without_empty`) and `with_empty` puts them back, as they were, for our model."""
    out = []
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out += ([(prefix + (key,), _plain(value))] if all_empty(value)
                    else empty_paths(value, prefix + (key,)))
    return out


def _plain(tree: Mapping) -> dict:
    return {k: _plain(v) for k, v in tree.items()}


def without_empty(tree: Mapping) -> dict:
    return {k: without_empty(v) if isinstance(v, Mapping) else v for k, v in tree.items()
            if not (isinstance(v, Mapping) and all_empty(v))}


def with_empty(tree: Mapping, paths: list[tuple]) -> dict:
    out = {k: with_empty(v, []) if isinstance(v, Mapping) else v for k, v in tree.items()}
    for path, subtree in paths:
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node.setdefault(path[-1], _plain(subtree))
    return out


_STEP_DIR = re.compile(r"checkpoint_(\d+)$")


def t5x_steps(model_dir: Path) -> list[int]:
    """The steps of the complete t5x checkpoints in `model_dir` (a checkpoint still being written has a
    temporary name)."""
    return sorted(int(m.group(1)) for p in model_dir.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name)))


def _read_record(path: Path) -> dict:
    try:
        return read_json(path)
    except (OSError, ValueError) as e:
        raise T5xAdapterError(f"{path}: cannot read the record of the t5x run's system ({e}); it is damaged: "
                              f"use a new MODEL_DIR") from None
