"""SEAL's document scoring on the device against the host scorer, side by side, on a trained SEAL-family model's
queries: the same keys (one search per batch) scored by `DeviceScorer` (SealSearch.scorer 'device') and by
`rank_documents` (numpy, the oracle), each warmed up, alternating in rounds; ms a query of each, the ratio, and
whether the two agree (the same documents, scores within 1e-5 relative; exit 1 when they do not).

    python -m gr_jax.train --gin_file=experiments/demo/seal.gin --gin.MODEL_DIR="'runs/demo_seal'"
    python tools/bench_seal_scoring.py --gin_file=experiments/demo/seal.gin --gin.MODEL_DIR="'runs/demo_seal'" \\
        [--split dev] [--queries 200] [--rounds 3] [--no_write]

Replaces its section of BENCHMARKS.md (unless --no_write); exit 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import gin
import numpy as np

from gr_jax.runtime import cli, gin_utils
from gr_jax.runtime.cli import setup_logging
from gr_jax.runtime.command import ON_A_TRAINED_SYSTEM
from gr_jax.evaluation.report import benchmark_writer

ROOT = Path(__file__).resolve().parents[1]
RTOL = 1e-5  # the acceptance's bound; float32 sums of a query's keys round near 1e-6 relative


def _agree(got: list, want: list) -> tuple[bool, float]:
    """(same documents for every query, the largest relative score difference)."""
    worst, same = 0.0, True
    for g, w in zip(got, want):
        gd, wd = {r: v for r, v, *_ in g}, {r: v for r, v, *_ in w}
        if set(gd) != set(wd):
            same = False
            continue
        for r, v in wd.items():
            worst = max(worst, abs(gd[r] - v) / abs(v))
    return same, worst


def bench(model_dir: str, split: str, queries: int, rounds: int) -> dict:
    from gr_jax import compose

    setup, params, step = compose.restore(model_dir)
    model = setup.model
    if not hasattr(model, "scoring_inputs") or model.search.document_score != "intersective":
        raise ValueError(f"{model_dir}: not a SEAL-family model with intersective scoring (SealRetriever / "
                         f"SealDecoderOnly, SealSearch.document_score 'intersective')")
    ds = setup.dataset
    if split not in ds.queries:
        raise ValueError(f"--split {split!r}: the dataset has {sorted(ds.queries)}")
    qids = sorted(q for q in ds.queries[split].qids if q in ds.qrels[split])[:queries]
    text_of = dict(zip(ds.queries[split].qids, ds.queries[split].texts))
    tokens = compose.tokenize([text_of[q] for q in qids], setup.vocab, setup.feature_lengths["inputs"], what=split)
    inputs = []
    for b in range(0, len(tokens), model.search.scorer_batch):
        inputs += model.scoring_inputs(params, tokens[b: b + model.search.scorer_batch], setup.index, 15)[0]
    positions = setup.index.num_positions

    def run(scorer):
        return model.score_documents(inputs, positions, with_keys=False, scorer=scorer)

    first = {}
    for scorer in ("device", "host"):  # warm-up: the device programs compile here
        t = time.perf_counter()
        first[scorer] = run(scorer)
        first[scorer + "_first_s"] = time.perf_counter() - t
    times = {"device": [], "host": []}
    for _ in range(rounds):
        for scorer in ("device", "host"):
            t = time.perf_counter()
            run(scorer)
            times[scorer].append(time.perf_counter() - t)
    same, worst = _agree(first["device"], first["host"])
    keys = [len(k) for k, _, _ in inputs]
    ranked = [len(r) for r in first["host"]]
    dev_ms = float(np.median(times["device"])) / len(inputs) * 1e3
    host_ms = float(np.median(times["host"])) / len(inputs) * 1e3
    return {"figure": "scoring", "model_dir": Path(model_dir).name, "step": step, "split": split,
            "queries": len(inputs), "keys_mean": round(float(np.mean(keys)), 1),
            "ranked_mean": round(float(np.mean(ranked)), 1), "batch": model.search.scorer_batch,
            "host_ms_per_query": round(host_ms, 2), "device_ms_per_query": round(dev_ms, 2),
            "host_over_device": round(host_ms / dev_ms, 2), "same_documents": same,
            "max_rel_diff": float(f"{worst:.2e}"), "device_first_call_s": round(first["device_first_s"], 1), "rounds": rounds}


def main(argv=None) -> int:
    setup_logging()
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--split", default="dev")
    parser.add_argument("--queries", type=cli.count, default=200)
    parser.add_argument("--rounds", type=cli.count, default=3)
    parser.add_argument("--no_write", action="store_true")
    own, rest = parser.parse_known_args(argv)
    if own.queries < 1 or own.rounds < 1:
        sys.stderr.write("error: --queries and --rounds must be ≥ 1\n")
        return 2

    def configured():
        return lambda: bench(gin.query_parameter("MODEL_DIR/macro.value"), own.split, own.queries, own.rounds)

    rc, row = gin_utils.run_entry(rest, __doc__, configured, ON_A_TRAINED_SYSTEM["fixed"], root="infer",
                                  allow_unused=ON_A_TRAINED_SYSTEM["allow_unused"])
    if rc or row is None:  # (None: --help)
        return rc
    print(json.dumps(row), flush=True)
    if not own.no_write:
        import jax

        from gr_jax.evaluation.report import benchmark_section

        header = (f"device: {jax.devices()[0].platform.upper()}, {jax.device_count()} device(s); command: "
                  f"`python tools/bench_seal_scoring.py {' '.join(argv)}`")
        with benchmark_writer(ROOT / "BENCHMARKS.md", "bench_seal_scoring") as f:
            f.write(benchmark_section("bench_seal_scoring", header, [row]))
    return 0 if row["same_documents"] and row["max_rel_diff"] <= RTOL else 1


if __name__ == "__main__":
    sys.exit(main())
