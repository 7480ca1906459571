"""A trie split over the devices of a mesh's "index" axis (`DeviceTrie.split`, the `Searcher` over a data × index
mesh): on 8 host devices the search gives the docids (tokens, leaves) and scores of the trie kept whole on every
device, bit for bit — every score mode and scanned and unrolled levels on 8 blocks, 2 data × 4 blocks; a built
trie, one with inserted docids (the table form), and a shallow one with leaves among other children, split from
its host copy as a model with `GenerativeRetriever.index_shards` does, and a substring index of two segments
(its n-grams' suffix-array ranges too) — and a device holds a fraction of the
trie's bytes, as `nbytes_per_device` says. Runs tests/index/split_trie_check.py in a process of its own (the
device count is fixed when JAX starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import xla_flags

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # a process with 8 host devices; 22 searches compiled


def test_a_split_trie_searches_as_the_whole_trie_and_holds_a_block_per_device():
    env = {**os.environ, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=8", across_programs=True)}
    res = subprocess.run([sys.executable, str(REPO / "tests" / "index" / "split_trie_check.py")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-4000:]
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert rows.pop() == {"retriever_mesh": {"data": 2, "index": 4}, "whole_device_copy": False}
    # every storage form a split read goes through: dense levels (whole) with and without leaves among the
    # children, CSR levels with every / some children leaves or their ids stored (inserted), a run
    forms = set(rows.pop()["forms"])
    assert {"dense none", "dense some", "csr some", "csr all", "csr table", "run run"} <= forms, forms
    searches = [r for r in rows if "same" in r]
    memory = [r for r in rows if "bytes_split" in r]
    assert len(searches) == 11 and len(memory) == 4
    for r in searches:
        assert all(r["same"].values()), r
        assert r["found"] == 8 * 12  # every beam of every query holds a docid: the comparison covers them all
    assert {(r["mode"], r["scan"]) for r in searches} == {("log_softmax", True), ("log_softmax", False),
                                                          ("renormalized", True), ("raw", True)}
    assert {r["stage"] for r in searches} == {"built", "inserted", "shallow", "substrings"}
    assert all(r["segments"] == 2 for r in searches if r["stage"] == "substrings")
    assert all(r["same"]["states"] for r in searches if r["stage"] == "substrings")  # the n-grams' ranges too
    for r in memory:
        assert r["runs"] >= 1 or r["stage"] == "substrings"  # the scanned run's table is split too
        assert r["bytes_split"] == r["reported_split"] and r["bytes_whole"] == r["reported_whole"], r
        # CSR levels and runs (texts and suffix arrays) in S blocks; the dense first level (48 × 48 ids) and the
        # substring index's per-token root bounds and per-document starts stay whole on every device
        if r["stage"] == "substrings":  # 1.2k tokens: the whole [V + 1] root bounds weigh as much as the blocks
            assert r["bytes_split"] < r["bytes_whole"] / 2, r
        else:
            assert r["bytes_split"] < 2 * r["bytes_whole"] / r["shards"], r


def test_the_memory_arithmetic_of_the_scale_plan_matches_a_built_trie():
    """tools/plan_scale.py (docs/scale.md): its arithmetic of a trie's bytes on one device, whole and split in 8,
    equals what 200k random docids take once built and placed on 8 host devices (the estimate of K per level
    picks the same dense levels and runs; the byte counts agree to 0.1%)."""
    env = {**os.environ, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=8")}
    res = subprocess.run([sys.executable, str(REPO / "tools" / "plan_scale.py"), "--simulate", "200000", "--plan",
                          "1000000"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    lines = res.stdout.splitlines()
    simulated, arithmetic = json.loads(lines[0]), json.loads(lines[1])
    assert simulated["what"] == "simulated" and arithmetic["what"] == "arithmetic"
    assert simulated["dense"] == arithmetic["dense"] and simulated["runs"] == arithmetic["runs"]
    for key in ("whole", "split", "payload"):
        assert abs(arithmetic[key] - simulated[key]) <= 1e-3 * simulated[key], (key, simulated, arithmetic)
    assert simulated["split"] < simulated["whole"] / 4
