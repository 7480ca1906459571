"""Evaluate a TREC run against qrels: prints a markdown table, writes JSON.

    python -m gr_jax.eval --run RUN --qrels QRELS [--metrics Hit@1,Hit@10,MRR@10,nDCG@10]
                          [--rel_threshold 2] [--queries seen.txt] [--msmarco_official] [--out metrics.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gr_jax.runtime import io_utils
from gr_jax.runtime import cli
from gr_jax.runtime.cli import setup_logging
from gr_jax.data import trec
from gr_jax.evaluation import metrics, report

DEFAULT_METRICS = "Hit@1,Hit@10,Recall@100,MRR@10,nDCG@10"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, action="append", help="TREC run file (repeat to compare runs)")
    parser.add_argument("--qrels", required=True, help="TREC qrels file")
    parser.add_argument("--metrics", default=DEFAULT_METRICS, help=f"comma-separated (default {DEFAULT_METRICS})",
                        type=cli.name_list(what="metric", parse=lambda m: metrics.Metric.parse(m).name))
    parser.add_argument("--rel_threshold", type=cli.natural, default=1,
                        help="grade counted relevant by binary measures")
    parser.add_argument("--queries", help="file with one query id per line: evaluate only these (a subset)")
    parser.add_argument("--msmarco_official", action="store_true",
                        help="average over every qrels query, a query without results scoring 0")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        names = args.metrics
        qrels = trec.read_qrels(args.qrels)
        subset = None
        if args.queries:
            subset = [line.strip() for line in Path(args.queries).read_text().splitlines() if line.strip()]
        results = {}
        for path in args.run:
            run = trec.read_run(path)
            evaluated = metrics.per_query(run, qrels, names, args.rel_threshold, subset, args.msmarco_official)
            if not set(run) & set(qrels) & (set(subset) if subset is not None else set(run)):
                raise ValueError(f"{path}: no query of the run is judged in {args.qrels}"
                                 + (f" (and listed in {args.queries})" if subset is not None else "")
                                 + "; are the run and the qrels of the same query set?")
            values = metrics.evaluate(run, qrels, names, args.rel_threshold, subset, args.msmarco_official)
            results[path] = {**values, "queries": len(evaluated)}
        sys.stdout.write(report.metrics_table(results) + "\n")
        if args.out:
            io_utils.write_text(args.out, io_utils.json_text({"qrels": args.qrels, "rel_threshold": args.rel_threshold,
                                                      "msmarco_official": args.msmarco_official, "runs": results},
                                                     indent=2), keep_previous=True)
    except (ValueError, OSError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
