"""The files of an aligned planner (`methods.pag.align` writes them): the student's network parameters
(`aligned_params.msgpack`, flax serialization — msgpack, no pickle) and `aligned.json` (the teacher checkpoint
it was aligned from, the pairs' digest, per-epoch loss and dev TokJaccard, the chosen epoch)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

import flax
import jax
import jax.numpy as jnp
from gr_jax.methods.api import read_json

PARAMS_FILE = "aligned_params.msgpack"
META_FILE = "aligned.json"


def load_aligned(directory: str | Path, params: dict, teacher: Optional[dict] = None) -> dict:
    """The teacher's parameters with the aligned network in place; refused when the file does not fit them or
    (with `teacher`) was aligned from another checkpoint."""
    directory = Path(directory)
    path, meta_path = directory / PARAMS_FILE, directory / META_FILE
    if not path.exists() or not meta_path.exists():
        raise FileNotFoundError(f"{directory}: no aligned planner ({PARAMS_FILE}, {META_FILE}); run "
                                f"python -m gr_jax.align_planner first")
    meta = read_json(meta_path)
    if teacher is not None and (not isinstance(meta, dict) or meta.get("teacher") != teacher):
        raise ValueError(f"{meta_path}: aligned from {meta.get('teacher')}, not from {teacher}; align again")
    blob = path.read_bytes()
    if not isinstance(meta, dict) or not isinstance(meta.get("params_digest"), str):  # never read unchecked
        raise ValueError(f"{meta_path}: no checksum of {PARAMS_FILE} recorded (damaged, or written by hand); run "
                         f"python -m gr_jax.align_planner again")
    if hashlib.blake2b(blob, digest_size=12).hexdigest() != meta["params_digest"]:
        raise ValueError(f"{path}: its bytes differ from the checksum {meta_path} recorded when it was written "
                         f"(damaged or replaced); run python -m gr_jax.align_planner again")
    try:
        net = flax.serialization.from_bytes(jax.device_get(params["network"]), blob)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: does not fit this model's parameters ({e})") from None
    return {**params, "network": jax.tree_util.tree_map(jnp.asarray, net)}
