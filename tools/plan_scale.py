"""Memory arithmetic of a docid trie at scale, checked by a simulation (docs/scale.md).

The arithmetic: M uniform random docids of L codes over V (PQ/RQ-like codebook docids, no EOS). The expected
number of distinct depth-d prefixes is n_d = V^d · (1 − exp(−M / V^d)) (n_L = M); a depth-d node's children
follow from the number of docids under it (zero-truncated Poisson of mean M / V^d; when that mean is large, the
number of distinct next codes, V · (1 − exp(−mean / V))), and the most children K_d of any of its n_d nodes from
that distribution's tail. The storage rules are the library's (`TrieIndex` dense tables, `to_device`'s runs via
`index.device._plan_runs`): a dense level holds n_d·V int32; a compact CSR level (n_d + 1) offsets (int32, int64
past 2^31) and n_{d+1} codes (int16 for V ≤ 32767); a run of levels (n_d + 1) offsets plus code, child and leaf
ids (int32) per child; a trie split in S blocks (`DeviceTrie.split`) puts 1/S of every non-dense array on a
device. The leaf → documents payload (`DevicePayload`: offsets and documents, padded to powers of two) is whole
on each device.

The simulation builds the trie of M random docids for real (`--simulate M`, default 1/100 of 100M), places it
whole and split over 8 host devices (XLA_FLAGS=--xla_force_host_platform_device_count=8: this tool sets it),
and compares the measured bytes on one device with the arithmetic at the same M. Then it prints the arithmetic
for `--plan` sizes.

    python tools/plan_scale.py                                 # simulate 1M, plan 100M and 1B (L 8, V 2048)
    python tools/plan_scale.py --simulate 200000 --plan 100000000 --length 8 --vocab 2048 --shards 8
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):  # kept with other XLA flags
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()

import numpy as np  # noqa: E402

from gr_jax.runtime import cli  # noqa: E402

DENSE_BUDGET = 64 << 20  # TrieIndex.build's default dense_budget_bytes


def level_nodes(M: int, L: int, V: int) -> list[float]:
    """Expected distinct prefixes at depths 0..L."""
    return [1.0] + [min(float(M), V ** d * -math.expm1(-M / V ** d)) for d in range(1, L)] + [float(M)]


def _poisson_tail_max(mean: float, nodes: float) -> int:
    """The largest docid count among `nodes` prefixes whose counts are zero-truncated Poisson(mean): the smallest
    k with nodes · P(count > k) < 1/2."""
    log_p0 = -mean
    tail, k = 1.0, 0
    while True:
        k += 1
        log_pk = log_p0 + k * math.log(mean) - math.lgamma(k + 1)
        tail -= math.exp(log_pk) / -math.expm1(-mean)  # P(count > k) of the truncated law
        if nodes * max(tail, 0.0) < 0.5:
            return k


def _normal_max(nodes: float) -> float:
    """z with nodes · P(Z > z) = 1/2 for a standard normal Z: where the largest of `nodes` draws lies."""
    lo, hi = 0.0, 40.0
    for _ in range(100):
        z = (lo + hi) / 2
        lo, hi = (z, hi) if nodes * 0.5 * math.erfc(z / math.sqrt(2)) > 0.5 else (lo, z)
    return lo


def max_children(M: int, L: int, V: int, nodes: list[float]) -> list[int]:
    """Estimated most children of any depth-d node, d in 0..L-1."""
    out = []
    for d in range(L):
        mean = M / V ** d
        if mean >= V / 8:  # many docids under each prefix: distinct next codes, about normal
            c = V * -math.expm1(-mean / V)
            z = _normal_max(nodes[d])
            out.append(min(V, int(math.ceil(c + z * math.sqrt(c * math.exp(-mean / V))))))
        else:
            out.append(min(V, _poisson_tail_max(mean, nodes[d])))
    return out


def _cap(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def trie_bytes(M: int, L: int, V: int, shards: int = 1) -> dict:
    """The arithmetic (module docstring): bytes of the device trie on one device, whole and in `shards` blocks,
    and of the payload; the structure it assumed (dense levels, runs)."""
    from gr_jax.index.device import _plan_runs

    n = level_nodes(M, L, V)
    K = max_children(M, L, V, n)
    dense = [n[d] * V * 4 <= DENSE_BUDGET and K[d] * 4 >= V for d in range(L)]
    runs = _plan_runs([(dense[d], 0 if dense[d] else K[d]) for d in range(L)])
    in_run = {d for a, b in runs for d in range(a, b)}
    code = 2 if V <= 32767 else 4
    whole = split = 0.0
    for d in range(L):
        if dense[d]:
            b = n[d] * V * 4
            whole, split = whole + b, split + b
        elif d not in in_run:
            wide = 8 if n[d + 1] >= 2 ** 31 else 4
            b = (n[d] + 1) * wide + n[d + 1] * code
            whole, split = whole + b, split + b / shards
    for a, b in runs:
        children = sum(n[d + 1] for d in range(a, b))
        offsets = sum(n[d] + 1 for d in range(a, b))
        wide = 8 if max(children, offsets) >= 2 ** 31 else 4
        size = offsets * wide + children * 4 * 3
        whole, split = whole + size, split + size / shards
    payload = (_cap(M + 1) + _cap(M)) * (4 if M < 2 ** 31 else 8)
    return {"M": M, "whole": whole, "split": split, "payload": payload, "dense": [d for d in range(L) if dense[d]],
            "runs": runs, "K": K}


def simulate(M: int, L: int, V: int, shards: int) -> dict:
    """The trie of M random docids built, placed whole and split over `shards` host devices: measured bytes on
    the first device, beside the arithmetic."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from gr_jax.index.device import SHARD_AXIS
    from gr_jax.index.trie import TrieIndex

    if len(jax.devices()) < shards:
        raise SystemExit(f"{len(jax.devices())} devices for {shards} blocks: set XLA_FLAGS="
                         f"--xla_force_host_platform_device_count={shards} before starting")
    index = TrieIndex.build(np.random.default_rng(0).integers(0, V, (M, L)).astype(np.int32), vocab_size=V)
    trie = index.device()
    mesh = Mesh(np.array(jax.devices()[:shards]), (SHARD_AXIS,))

    def on_first(tree, specs) -> int:
        shardings = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs,
                                           is_leaf=lambda x: isinstance(x, P))
        placed = jax.device_put(tree, shardings)
        first = mesh.devices.flat[0]
        return sum(s.data.nbytes for x in jax.tree_util.tree_leaves(placed) for s in x.addressable_shards
                   if s.device == first)

    split = trie.split(shards)
    payload = index.device_payload()
    return {"M": M, "whole": on_first(trie, jax.tree_util.tree_map(lambda _: P(), trie)),
            "split": on_first(split, split.partition_specs()),
            "payload": int(payload.offsets.nbytes + payload.docs.nbytes),
            "dense": [d for d, s in enumerate(trie.specs) if s.dense],
            "runs": [(r.start, r.stop) for r in trie.run_specs],
            "K": [s.max_children if not s.dense else V for s in trie.specs]}


def main(argv=None) -> int:
    cli.setup_logging()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--simulate", type=cli.count, default=1_000_000)
    ap.add_argument("--plan", type=cli.count, nargs="+", default=[100_000_000, 1_000_000_000])
    ap.add_argument("--length", type=cli.count, default=8)
    ap.add_argument("--vocab", type=cli.count, default=2048)
    ap.add_argument("--shards", type=cli.count, default=8)
    args = ap.parse_args(argv)
    L, V, S = args.length, args.vocab, args.shards
    measured = simulate(args.simulate, L, V, S)
    predicted = trie_bytes(args.simulate, L, V, S)
    rows = [{"what": "simulated", **measured}, {"what": "arithmetic", **predicted}]
    rows += [{"what": "arithmetic", **trie_bytes(M, L, V, S)} for M in args.plan]
    for r in rows:
        sys.stdout.write(json.dumps({k: (round(v) if isinstance(v, float) else v) for k, v in r.items()}) + "\n")
    ratio = predicted["whole"] / measured["whole"], predicted["split"] / measured["split"]
    sys.stdout.write(f"arithmetic / measured at M = {args.simulate}: whole {ratio[0]:.3f}, split {ratio[1]:.3f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
