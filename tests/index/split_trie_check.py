"""Run by tests/index/test_split_trie.py in a process with 8 host devices (XLA_FLAGS): a T5 searches a trie of
3000 random docids (dense, CSR and run levels; the inserted-node table form after `insert`) through `T5Searcher`
on a mesh whose "index" axis holds the trie split in blocks, and on a mesh of the same data axis with the trie
whole on every device. Prints one JSON line per case: whether the beams (tokens, leaves, validity) and the
scores are identical, and the trie's bytes on one device, split and whole (measured on the placed arrays)."""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from gr_jax.index.device import SHARD_AXIS
from gr_jax.index.substring import SubstringIndex
from gr_jax.index.trie import TrieIndex
from gr_jax.backbones import t5
from gr_jax.retriever.model import GenerativeRetriever
from gr_jax.retriever.search import T5Searcher

V, EOS = 48, 1


def docids(n: int, seed: int) -> list[list[int]]:
    """n distinct docids of 3–9 tokens in [2, V) ending with EOS: a deep, uneven trie."""
    rng = np.random.default_rng(seed)
    out = set()
    while len(out) < n:
        length = int(rng.integers(2, 9))
        prefix = tuple(int(t) for t in rng.integers(2, 2 + min(V - 2, 3 + 4 * length), 1))  # a few hot first tokens
        out.add(prefix + tuple(int(t) for t in rng.integers(2, V, length - 1)) + (EOS,))
    return [list(s) for s in sorted(out)]


def placed_bytes(trie, mesh) -> int:
    """Bytes of the trie's arrays on the mesh's first device, once placed by its partition specs."""
    specs = trie.partition_specs() if trie.shards > 1 else jax.tree_util.tree_map(lambda _: P(), trie)
    shardings = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
    tree = jax.device_put(trie, shardings)
    first = mesh.devices.flat[0]
    return sum(s.data.nbytes for x in jax.tree_util.tree_leaves(tree) for s in x.addressable_shards
               if s.device == first)


def main() -> int:
    devices = np.array(jax.devices())
    config = t5.get_config("tiny", vocab_size=V)
    model = t5.T5(config)
    params = jax.tree_util.tree_map(lambda p: p * 6.0 if p.ndim == 2 else p, t5.init_params(config, seed=4))
    queries = np.random.default_rng(1).integers(2, V, (8, 10)).astype(np.int32)
    index = TrieIndex.build(docids(3000, 0), vocab_size=V, eos_id=EOS)
    layouts = {"8 index": (1, 8), "2 data x 4 index": (2, 4)}
    for stage in ("built", "inserted"):
        if stage == "inserted":
            have = set(map(tuple, docids(3000, 0)))
            new = [s for s in docids(3400, 7) if tuple(s) not in have][:300]
            index.insert(new, list(range(3000, 3000 + len(new))))
        trie = index.device()
        for name, (data, shards) in layouts.items():
            if stage == "inserted" and data > 1:
                continue
            split_mesh = Mesh(devices.reshape(data, shards), ("data", SHARD_AXIS))
            whole_mesh = Mesh(devices[:data], ("data",)) if data > 1 else None
            # every score mode and the unrolled levels on the first layout; the others in the scanned search
            # with the default mode (and "raw", whose scores skip the normalisation, on the inserted table)
            if (stage, name) == ("built", "8 index"):
                cases = [("log_softmax", True), ("log_softmax", False), ("renormalized", True), ("raw", True)]
            else:
                cases = [("log_softmax", True)] + ([("raw", True)] if stage == "inserted" else [])
            for mode, scan in cases:
                got = T5Searcher(model, 12, score_mode=mode, mesh=split_mesh, scan_levels=scan).search(
                    params, queries, trie)
                want = T5Searcher(model, 12, score_mode=mode, mesh=whole_mesh, scan_levels=scan).search(
                    params, queries, trie)
                same = {k: bool(np.array_equal(np.asarray(getattr(got, k)), np.asarray(getattr(want, k))))
                        for k in ("tokens", "leaf_ids", "valid", "scores")}
                found = int(np.asarray(want.valid).sum())
                row = {"stage": stage, "layout": name, "mode": mode, "scan": scan, "same": same,
                       "found": found}
                sys.stdout.write(json.dumps(row) + "\n")
            split = trie.split(shards)
            sys.stdout.write(json.dumps({"stage": stage, "layout": name, "shards": shards,
                                         "runs": len(trie.run_specs),
                                         "bytes_split": placed_bytes(split, split_mesh),
                                         "bytes_whole": placed_bytes(trie, split_mesh),
                                         "reported_split": split.nbytes_per_device(),
                                         "reported_whole": trie.nbytes_per_device()}) + "\n")
    # a shallow trie (docids of 1–3 codes and EOS): no run, leaves among other children in a dense level and in
    # CSR levels ("some": leaf ranks read through the split), searched from the host copy as a model does
    shallow = TrieIndex.build(shallow_docids(2500), vocab_size=V, eos_id=EOS)
    split_mesh = Mesh(devices.reshape(1, 8), ("data", SHARD_AXIS))
    for mode in ("log_softmax", "raw"):
        got = T5Searcher(model, 12, score_mode=mode, mesh=split_mesh).search(params, queries,
                                                                            shallow.device(on_host=True))
        want = T5Searcher(model, 12, score_mode=mode, mesh=None).search(params, queries, shallow.device())
        same = {k: bool(np.array_equal(np.asarray(getattr(got, k)), np.asarray(getattr(want, k))))
                for k in ("tokens", "leaf_ids", "valid", "scores")}
        sys.stdout.write(json.dumps({"stage": "shallow", "layout": "8 index", "mode": mode, "scan": True,
                                     "same": same, "found": int(np.asarray(want.valid).sum())}) + "\n")
    # the substring index (SEAL's any n-gram of any document), two segments (a build, then an insert), split
    substrings = SubstringIndex.build(shallow_docids(300), vocab_size=V)
    substrings.insert(shallow_docids(340)[300:])
    constraint = substrings.device(max_length=4, prefix=(), end_token=EOS)
    for mode in ("log_softmax", "raw"):
        got = T5Searcher(model, 12, score_mode=mode, mesh=split_mesh).search(params, queries, constraint)
        want = T5Searcher(model, 12, score_mode=mode, mesh=None).search(params, queries, constraint)
        same = {k: bool(np.array_equal(np.asarray(getattr(got, k)), np.asarray(getattr(want, k))))
                for k in ("tokens", "leaf_ids", "valid", "scores")}
        same["states"] = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
                             zip(jax.tree_util.tree_leaves(got.states), jax.tree_util.tree_leaves(want.states)))
        sys.stdout.write(json.dumps({"stage": "substrings", "layout": "8 index", "mode": mode, "scan": True,
                                     "same": same, "found": int(np.asarray(want.valid).sum()),
                                     "segments": constraint.slots}) + "\n")
    split = constraint.split(8)
    sys.stdout.write(json.dumps({"stage": "substrings", "layout": "8 index", "shards": 8, "runs": 0,
                                 "bytes_split": placed_bytes(split, split_mesh),
                                 "bytes_whole": placed_bytes(constraint, split_mesh),
                                 "reported_split": split.nbytes_per_device(),
                                 "reported_whole": constraint.nbytes_per_device()}) + "\n")
    forms = sorted({("dense" if s.dense else "run" if s.run >= 0 else "csr") + " " + s.leaf_mode
                    for t in (index.device(), shallow.device()) for s in t.specs})
    sys.stdout.write(json.dumps({"forms": forms}) + "\n")
    # a model with GenerativeRetriever.index_shards: the "auto" mesh with an index axis, and the trie placed from
    # its host copy (no whole copy on one device)
    retriever = GenerativeRetriever(config, index_shards=4)
    fresh = TrieIndex.build(shallow_docids(2500), vocab_size=V, eos_id=EOS)
    retriever.predict(retriever.init_params(seed=4), queries, fresh, num_beams=12)
    sys.stdout.write(json.dumps({"retriever_mesh": dict(retriever.searcher(12).mesh.shape),
                                 "whole_device_copy": fresh._device is not None}) + "\n")
    return 0


def shallow_docids(n: int) -> list[list[int]]:
    rng = np.random.default_rng(3)
    out = set()
    while len(out) < n:
        out.add(tuple(int(t) for t in rng.integers(2, V, int(rng.integers(1, 4)))) + (EOS,))
    return [list(s) for s in sorted(out)]


if __name__ == "__main__":
    sys.exit(main())
