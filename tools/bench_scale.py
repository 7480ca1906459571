"""Training throughput over several processes and devices: the README's demo DSI (experiments/demo/dsi_url.gin,
batch 64) trained by the real entry point, `python -m gr_jax.train`, in each layout:

  1 process            one CPU device (the reference)
  2 processes          one device each, a localhost coordinator (`--multiprocess`, gr_jax/runtime/distributed.py)
  8 host devices       one process, XLA_FLAGS=--xla_force_host_platform_device_count=8, data parallel
  8 host devices 4x2   the same, a 4 data × 2 model mesh (`train.num_partitions = 2`)

Each run trains `--steps` steps from scratch in a fresh MODEL_DIR (no final evaluation) and logs steps/s every
`--log_period` steps; a layout's figure is the median of its windows after the first (which holds the compile),
the best of `--rounds` alternating rounds. On one machine every layout shares the same cores: host devices and
processes split the CPU, they do not add to it — the ratio is the cost of the layout (collectives, smaller
per-device matmuls), not a scale-out figure. Replaces its section of BENCHMARKS.md.

    python tools/bench_scale.py                       # all four layouts, 2 rounds
    python tools/bench_scale.py --steps 40 --rounds 1 --no_write
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gr_jax.runtime import cli
from gr_jax.evaluation.report import benchmark_writer

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "experiments/demo/dsi_url.gin"

LAYOUTS = {
    "1 process": {"processes": 1, "devices": 1, "partitions": 1},
    "2 processes": {"processes": 2, "devices": 1, "partitions": 1},
    "8 host devices": {"processes": 1, "devices": 8, "partitions": 1},
    "8 host devices 4x2": {"processes": 1, "devices": 8, "partitions": 2},
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_layout(layout: dict, model_dir: Path, steps: int, log_period: int) -> float:
    """Trains in `layout`; the steady steps/s (median of the log windows after the first)."""
    base = [sys.executable, "-m", "gr_jax.train", f"--gin_file={EXPERIMENT}", f"--gin.MODEL_DIR='{model_dir}'",
            f"--gin.TRAIN_STEPS={steps}", f"--gin.train.log_period={log_period}",
            f"--gin.train.checkpoint_period={steps}", "--gin.train.final_eval=False", "--gin.train.progress=False",
            f"--gin.train.num_partitions={layout['partitions']}"]
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} "
                                          f"--xla_force_host_platform_device_count={layout['devices']}".strip()}
    n = layout["processes"]
    if n == 1:
        commands = [base]
    else:
        port = _port()
        commands = [base + ["--multiprocess", f"--coordinator_address=localhost:{port}", f"--process_count={n}",
                            f"--process_index={i}"] for i in range(n)]
    logs = [model_dir.parent / f"{model_dir.name}.{i}.log" for i in range(len(commands))]
    procs = []
    for command, path in zip(commands, logs):  # logs in files: a full pipe would stall the others' collectives
        with open(path, "w") as log:
            procs.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log))
    for p, path in zip(procs, logs):
        if p.wait():
            raise SystemExit(f"{layout}: exit code {p.returncode}\n{path.read_text()[-3000:]}")
    lines = [json.loads(x) for x in (model_dir / "train_metrics.jsonl").read_text().splitlines() if x.strip()]
    rates = [x["steps_per_s"] for x in lines[1:]]
    if not rates:
        raise SystemExit(f"{model_dir}: fewer than two log windows; raise --steps or lower --log_period")
    return statistics.median(rates)


def main(argv=None) -> int:
    cli.setup_logging()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=cli.count, default=60)
    ap.add_argument("--log_period", type=cli.count, default=10)
    ap.add_argument("--rounds", type=cli.count, default=2)
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of: {', '.join(LAYOUTS)}")
    ap.add_argument("--no_write", action="store_true", help="print the table only")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.layouts.split(",") if n.strip()]
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown:
        ap.error(f"unknown layouts {unknown}; known: {list(LAYOUTS)}")
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench_scale_") as tmp:
        for r in range(args.rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                rate = run_layout(LAYOUTS[name], Path(tmp) / f"{r}-{name.replace(' ', '_')}", args.steps,
                                  args.log_period)
                best[name] = max(best.get(name, 0.0), rate)
    ref = best.get("1 process")
    batch = 64
    rows = ["| layout | processes × devices | mesh (data × model) | steps/s | examples/s | vs 1 process |",
            "|---|---|---|---|---|---|"]
    for name in names:
        lay, rate = LAYOUTS[name], best[name]
        devices = lay["processes"] * lay["devices"]
        rows.append(f"| {name} | {lay['processes']} × {lay['devices']} | {devices // lay['partitions']} × "
                    f"{lay['partitions']} | {rate:.2f} | {rate * batch:.0f} | "
                    f"{f'{rate / ref:.2f}×' if ref else '—'} |")
    table = "\n".join(rows)
    sys.stdout.write(table + "\n")
    if not args.no_write:
        cmd = shlex.join(["python", "tools/bench_scale.py", *(argv if argv is not None else sys.argv[1:])])
        section = (f"\n## Training over processes and devices ({datetime.date.today()}, `{cmd.strip()}`)\n\n"
                   f"{EXPERIMENT}, batch {batch}, {args.steps} steps, best of {args.rounds} rounds; "
                   f"{os.cpu_count()} CPU cores shared by every layout (host devices and processes split them, they "
                   f"do not add to them).\n\n"
                   f"{table}\n")
        with benchmark_writer(ROOT / "BENCHMARKS.md", "bench_scale") as f:
            f.write(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
