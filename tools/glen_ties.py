"""Collision-free ranking vs a random order of documents that share a docid (GLEN's Table 5 shape), for a
trained GLEN MODEL_DIR: the same beams ranked by `CollisionFree` (identifier logits, paper Eq. 9) and by
`RandomTieOrder` over `--seeds` seeds (mean ± std, min, max).

    python tools/glen_ties.py --gin_file=experiments/demo/glen.gin --gin.MODEL_DIR="'runs/demo_glen'" \
        [--seeds 10] [--split test] [--num_beams 10]

Writes MODEL_DIR/ties/<split>.step<N>.{json,md} and prints the markdown table; exit 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import gin

from gr_jax.runtime import cli
from gr_jax.runtime import gin_utils
from gr_jax.runtime.cli import setup_logging


def compare(model_dir: str, split: str, num_beams: int, seeds: int) -> dict:
    from gr_jax import compose
    from gr_jax.evaluation.retrieval import EvalConfig
    from gr_jax.methods.glen.ranker import CollisionFree, RandomTieOrder

    setup, params, step = compose.restore(model_dir)
    cfg = EvalConfig(split=split, num_beams=num_beams).validate()
    if not getattr(setup.model, "beams", None) or setup.table.weights is None:
        raise ValueError(f"{model_dir}: not a GLEN model with docid logits (GlenRetriever + GlenDocids)")
    rows = {}
    setup.model.ranker = CollisionFree()
    rows["collision-free"] = compose.evaluate_split(setup, params, split, cfg)[2]
    random_rows = []
    for seed in range(seeds):
        setup.model.ranker = RandomTieOrder(seed=seed)
        random_rows.append(compose.evaluate_split(setup, params, split, cfg)[2])
    metrics = list(rows["collision-free"])
    summary = {m: {"mean": statistics.fmean(r[m] for r in random_rows),
                   "std": statistics.pstdev([r[m] for r in random_rows]),
                   "min": min(r[m] for r in random_rows), "max": max(r[m] for r in random_rows)}
               for m in metrics}
    stats = setup.table.stats()
    lines = [f"{split}, step {step}, {num_beams} beams; docids: {stats['distinct_docids']} distinct for "
             f"{stats['documents']} documents (collision rate {stats['collision_rate']:.3f})", "",
             "| ranking of documents sharing a docid | " + " | ".join(metrics) + " |",
             "|---|" + "---|" * len(metrics),
             "| collision-free (identifier logits, Eq. 9) | "
             + " | ".join(f"{rows['collision-free'][m]:.4f}" for m in metrics) + " |",
             f"| random order, {seeds} seeds: mean ± std [min, max] | "
             + " | ".join(f"{summary[m]['mean']:.4f} ± {summary[m]['std']:.4f} [{summary[m]['min']:.4f}, "
                          f"{summary[m]['max']:.4f}]" for m in metrics) + " |"]
    out = {"split": split, "step": step, "num_beams": num_beams, "docids": stats,
           "collision_free": rows["collision-free"], "random": random_rows, "random_summary": summary,
           "table": "\n".join(lines)}
    from gr_jax.runtime.io_utils import write_text

    base = Path(model_dir) / "ties"
    write_text(base / f"{split}.step{step}.json", json.dumps(out, indent=1), keep_previous=True)
    write_text(base / f"{split}.step{step}.md", out["table"] + "\n", keep_previous=True)
    return out


def main(argv=None) -> int:
    setup_logging()
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--seeds", type=cli.count, default=10)
    parser.add_argument("--split", default="test")
    parser.add_argument("--num_beams", type=cli.count, default=10)
    own, rest = parser.parse_known_args(argv)
    if own.seeds < 1 or own.num_beams < 1:
        sys.stderr.write("error: --seeds and --num_beams must be ≥ 1\n")
        return 2

    def configured():
        return lambda: compare(gin.query_parameter("MODEL_DIR/macro.value"), own.split, own.num_beams, own.seeds)

    rc, out = gin_utils.run_entry(rest, __doc__, configured, ["TRAIN_STEPS = 1", "BATCH_SIZE = 1"], root="infer",
                                  allow_unused=("train", "make_optimizer", "EvalConfig"))
    if rc or out is None:  # (None: --help)
        return rc
    sys.stdout.write(out["table"] + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
