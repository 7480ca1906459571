"""Markdown tables for metrics and dynamic-corpora reports."""

from __future__ import annotations

from typing import Mapping, Sequence


def fmt(value, digits: int = 4) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return "" if value is None else str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence], digits: int = 4) -> str:
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v, digits) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def metrics_table(results: Mapping[str, Mapping[str, float]], digits: int = 4) -> str:
    """One row per system/subset, one column per metric (in first-seen order)."""
    names: list[str] = []
    for values in results.values():
        names += [n for n in values if n not in names]
    rows = [[system] + [values.get(n) for n in names] for system, values in results.items()]
    return markdown_table(["run"] + names, rows, digits)


def read_eval_curve(model_dir) -> tuple[list[dict], dict]:
    """A MODEL_DIR's evaluations (eval_metrics.jsonl): the periodic ones as [{"step", metric: value}] in step
    order, and the final evaluation's metrics ({} if none). The last record of a step wins (a resumed run
    appends again). Unreadable lines are an error naming the file."""
    import json

    from gr_jax.runtime.run_dir import RunDir

    path = RunDir(model_dir).eval_metrics
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror}); is {model_dir} a trained MODEL_DIR?") from None
    periodic: dict[int, dict] = {}
    final: dict = {}
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            step = int(rec.pop("step"))
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{path}:{no}: not an evaluation record") from None
        if any(k.startswith("final/") for k in rec):
            final = {k[len("final/"):]: v for k, v in rec.items()}
        else:
            periodic[step] = rec
    return [{"step": s, **periodic[s]} for s in sorted(periodic)], final


def plot_curves(curves: Mapping[str, Sequence[Mapping]], metric: str, path, title: str = "") -> None:
    """One line per run: `metric` of its periodic evaluations against the training step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for i, (label, points) in enumerate(curves.items()):
        pts = [p for p in points if metric in p]
        ax.plot([p["step"] for p in pts], [p[metric] for p in pts], "-o", color=f"C{i}", label=label, markersize=3)
    ax.set_xlabel("training step")
    ax.set_ylabel(metric)
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def benchmark_section(name: str, header: str, rows: Sequence[Mapping]) -> str:
    """A BENCHMARKS.md section of a `tools/bench_*.py` run: a dated title, a header line (device, command),
    then one table per figure (rows carry a "figure" key; columns in first-row order)."""
    import datetime

    lines = [f"\n## {name} — {datetime.date.today().isoformat()}\n", f"- {header}\n"]
    for fig in dict.fromkeys(r["figure"] for r in rows):
        part = [r for r in rows if r["figure"] == fig]
        keys = [k for k in part[0] if k != "figure"]
        lines += [f"**{fig}**\n", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(str(r.get(k)) for k in keys) + " |" for r in part]
        lines.append("")
    return "\n".join(lines) + "\n"


def replace_benchmark_section(path, name: str, section: str) -> None:
    """Writes `section` (a `tools/<name>.py` run's text, its first line a `## ` heading) as BENCHMARKS.md's section
    of that tool: the heading becomes `## <name> — <date>`, and the section whose heading names the tool (its first
    word) is replaced, or the section is appended. One section per tool, the current figure; the file goes through
    the keep-previous path (a different earlier file is kept as `.prev-<n>`)."""
    import datetime
    import re
    from pathlib import Path

    from gr_jax.runtime.io_utils import read_text, write_text

    body = section.strip("\n").split("\n")
    if not body or not body[0].startswith("## "):
        raise ValueError(f"a benchmark section starts with a '## ' heading, got {body[:1]}")
    text = "\n".join([f"## {name} — {datetime.date.today().isoformat()}"] + body[1:]).rstrip() + "\n"
    path = Path(path)
    old = read_text(path, "BENCHMARKS.md") if path.exists() else "# Benchmarks\n"
    parts = re.split(r"(?m)^(?=## )", old)
    mine = [i for i, p in enumerate(parts) if re.match(rf"## {re.escape(name)}(\s|:|$)", p)]
    if mine:
        parts[mine[0]] = text + "\n"
        parts = [p for i, p in enumerate(parts) if i not in mine[1:]]
    else:
        parts.append(("\n" if not parts[-1].endswith("\n\n") else "") + text)
    write_text(path, "".join(parts).rstrip() + "\n", keep_previous=True)


class benchmark_writer:
    """`with benchmark_writer(path, "bench_x") as f: f.write(section)`: the text written is the tool's section,
    replaced in place (`replace_benchmark_section`) when the block ends without an error."""

    def __init__(self, path, name: str):
        import io

        self.path, self.name, self._buf = path, name, io.StringIO()

    def __enter__(self):
        return self._buf

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            replace_benchmark_section(self.path, self.name, self._buf.getvalue())
        return False
