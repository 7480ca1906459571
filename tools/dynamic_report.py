"""Tables 1–2 (+ IDBI) and one plot for several dynamic-corpora runs side by side, optionally beside a published
table.

    python tools/dynamic_report.py runs/dyn_bm25 runs/dyn_mdgr runs/dyn_pq --out runs/dynamic_report
    python tools/dynamic_report.py n-gram=runs/dyn_seal url=runs/dyn_dsi_url title=runs/dyn_dsi_title \\
        query=runs/dyn_dsi_query --out runs/table4_demo \\
        --published ../shared/published/dynamic_corpora_sigir25.json --table table4_text_docid_types_NQ_hit10

Each argument is a MODEL_DIR of `python -m gr_jax.dynamic` (its dynamic/dynamic.json is read), optionally
NAME=MODEL_DIR: NAME labels the run and, with --published, names the published row shown beside it. Writes
OUT/report.md and OUT/report.png and prints the tables.

--published FILE --table KEY: the published Hit@10 rows of table KEY of FILE, in one of the layouts of the
published results file: {"initial": {row: [D0..Dn]}, "new": {...}} (Tables 3, 4); {row: {DATASET:
{"hit10_D0_to_D5": [...]}}} (Table 1 initial, Table 2 new: --dataset, default NQ, and --kind initial|new); {row:
[...]} (Table 6, new documents). Every NAME must be a row of the table, or the command says which rows it has.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from gr_jax.runtime.cli import setup_logging
from gr_jax.evaluation.report import markdown_table
from gr_jax.runtime.io_utils import atomic_dir
from gr_jax.protocols.dynamic_corpora import plot, tables_markdown

KINDS = ("initial", "new")
OURS = {"initial": "initial_P_o0", "new": "new_P_oo"}


class ReportError(ValueError):
    pass


def published_rows(path: str, table: str, dataset: str = "NQ", kind: str = "new") -> dict:
    """{"initial" | "new": {row: [Hit@10 D0..Dn]}} of a published table (module docstring's layouts)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ReportError(f"{path}: cannot read the published results ({e})") from None
    if table not in data:
        raise ReportError(f"{path}: no table {table!r}; it has {sorted(k for k in data if isinstance(data[k], dict))}")
    t = data[table]
    if isinstance(t, dict) and set(t) & set(KINDS) and all(isinstance(v, dict) for v in t.values()):
        return {k: dict(t[k]) for k in KINDS if k in t}
    rows = {}
    for name, v in t.items():
        if isinstance(v, list):
            rows[name] = v
        elif isinstance(v, dict) and isinstance(v.get(dataset), dict) and "hit10_D0_to_D5" in v[dataset]:
            rows[name] = v[dataset]["hit10_D0_to_D5"]
    if not rows:
        raise ReportError(f"{path}: table {table!r} has no Hit@10 rows for dataset {dataset!r}")
    return {kind: rows}


def published_markdown(labels: list, results: list, published: dict) -> str:
    fmt = lambda x: "—" if x is None or not np.isfinite(x) else f"{x:.3f}"  # noqa: E731
    n = len(results[0]["P"])
    out = []
    for kind in KINDS:
        if kind not in published:
            continue
        rows = []
        for label, r in zip(labels, results):
            rows.append([label, "ours", *map(fmt, r[OURS[kind]])])
            want = published[kind].get(label)
            want = list(want or [])[:n]
            rows.append([label, "published", *map(fmt, want), *["—"] * (n - len(want))])
        out.append(f"Hit@10 on {kind} documents, ours beside the published rows\n\n"
                   + markdown_table(["row", "", *[f"D{o}" for o in range(n)]], rows))
    return "\n\n".join(out) + "\n"


def plot_published(labels: list, results: list, published: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in KINDS if k in published]
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 3.8), squeeze=False)
    n = len(results[0]["P"])
    for ax, kind in zip(axes[0], kinds):
        for i, (label, r) in enumerate(zip(labels, results)):
            ax.plot(np.arange(n), r[OURS[kind]], "-o", color=f"C{i}", label=f"{label} (ours)")
            want = published[kind].get(label)
            if want:
                ax.plot(np.arange(len(want[:n])), want[:n], "--", color=f"C{i}", alpha=0.7,
                        label=f"{label} (published)")
        ax.set_title(f"{kind} documents")
        ax.set_xticks(np.arange(n))
        ax.set_xticklabels([f"D{o}" for o in range(n)])
        ax.set_ylabel("Hit@10")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dirs", nargs="+", help="MODEL_DIR or NAME=MODEL_DIR")
    parser.add_argument("--out", required=True)
    parser.add_argument("--published", help="a published results file (e.g. dynamic_corpora_sigir25.json)")
    parser.add_argument("--table", help="the table of --published to show beside the runs")
    parser.add_argument("--dataset", default="NQ", help="for tables with one row per dataset (default NQ)")
    parser.add_argument("--kind", choices=KINDS, default="new",
                        help="initial or new documents, for a table that holds one kind (default new)")
    args = parser.parse_args(argv)
    setup_logging()
    if bool(args.published) != bool(args.table):
        sys.stderr.write("error: --published and --table go together\n")
        return 2
    results, labels = [], []
    for arg in args.model_dirs:
        label, _, d = arg.partition("=") if "=" in arg else ("", "", arg)  # a path may hold "=", a label not
        path = Path(d) / "dynamic" / "dynamic.json"
        try:
            result = json.loads(path.read_text())
            if not isinstance(result, dict) or not {"P", "method", "idbi", "initial_P_o0", "new_P_oo"} <= set(result):
                raise ValueError("fields P, method, idbi, initial_P_o0, new_P_oo missing")
        except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
            sys.stderr.write(f"error: {path}: not a dynamic-corpora result ({e})\n")
            return 2
        if label:
            result = {**result, "method": label}
        results.append(result)
        labels.append(label or result["method"])
    if len({len(r["P"]) for r in results}) != 1:
        sys.stderr.write("error: the runs have different numbers of steps\n")
        return 2
    published = None
    if args.published:
        try:
            published = published_rows(args.published, args.table, args.dataset, args.kind)
        except ReportError as e:
            sys.stderr.write(f"error: {e}\n")
            return 2
        names = sorted({name for rows in published.values() for name in rows})
        unknown = [label for label in labels if label not in names]
        if unknown:
            sys.stderr.write(f"error: {', '.join(unknown)}: not a row of {args.table} (it has {', '.join(names)}); "
                             f"label each run NAME=MODEL_DIR with a row's name\n")
            return 2
    text = tables_markdown(results)
    if published:
        text = published_markdown(labels, results, published) + "\n" + text
    try:
        with atomic_dir(args.out, keep_previous=True) as tmp:
            (tmp / "report.md").write_text(text)
            if published:
                plot_published(labels, results, published, tmp / "report.png")
            else:
                plot(results, tmp / "report.png")
    except (OSError, ValueError) as e:  # FileFormatError (a part of --out is a file) is a ValueError
        sys.stderr.write(f"error: {e}\n")
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
