"""Several trained MODEL_DIRs side by side: their periodic evaluations as curves (one PNG per metric) and a
table of the final and best periodic metrics — e.g. GLEN's negatives ablation (the paper's Fig. 2 shape).

    python tools/compare_runs.py prefix=runs/glen_prefix random=runs/glen_random bm25=runs/glen_bm25 \
        none=runs/glen_none --metrics Hit@1 MRR@10 --out runs/glen_negatives [--title TEXT]

Each argument is LABEL=MODEL_DIR (its eval_metrics.jsonl is read). Writes OUT/curves_<metric>.png and
OUT/table.md atomically (an earlier OUT is kept as OUT.prev-<n>) and prints the table; exit 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys

from gr_jax.runtime.cli import setup_logging
from gr_jax.evaluation.report import markdown_table, plot_curves, read_eval_curve
from gr_jax.runtime.io_utils import atomic_dir


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="LABEL=MODEL_DIR")
    parser.add_argument("--metrics", nargs="+", default=["Hit@1", "Hit@10", "MRR@10"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    setup_logging()
    curves, finals = {}, {}
    for item in args.runs:
        label, sep, model_dir = item.partition("=")
        if not sep or not label or not model_dir:
            sys.stderr.write(f"error: {item!r}: expected LABEL=MODEL_DIR\n")
            return 2
        if label in curves:
            sys.stderr.write(f"error: label {label!r} given twice\n")
            return 2
        try:
            curves[label], finals[label] = read_eval_curve(model_dir)
        except ValueError as e:
            sys.stderr.write(f"error: {e}\n")
            return 2
    header = ["run"] + [f"final {m}" for m in args.metrics] + [f"best periodic {m} (step)" for m in args.metrics]
    rows = []
    for label in curves:
        best = []
        for m in args.metrics:
            pts = [p for p in curves[label] if m in p]
            top = max(pts, key=lambda p: (p[m], -p["step"])) if pts else None  # ties: the earliest step
            best.append(f"{top[m]:.4f} ({top['step']})" if top else "")
        rows.append([label] + [finals[label].get(m) for m in args.metrics] + best)
    text = markdown_table(header, rows) + "\n"
    try:
        with atomic_dir(args.out, keep_previous=True) as tmp:
            (tmp / "table.md").write_text(text)
            for m in args.metrics:
                plot_curves(curves, m, tmp / f"curves_{m.replace('@', '_at_')}.png", args.title)
    except OSError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
