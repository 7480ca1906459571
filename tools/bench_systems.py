"""The time each system of a `python -m gr_jax.reproduce` run took: training and indexing D0, indexing each of
D1..D5, searching, and the whole command, read from OUTPUT_DIR (reproduce_status.json and every system's
dynamic_timing.json); replaces its section of BENCHMARKS.md.

    python tools/bench_systems.py runs/paper [--no_write]

The figures are those of the run that wrote the directory (a reused system keeps the timing of the run that
made it: the whole run's seconds from its run_seconds.json, "—" where that run did not record them); on a machine
shared with other work they are upper bounds. CPU only unless the run had a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rows_of(output_dir: Path) -> list[dict]:
    from gr_jax.runtime.io_utils import read_json
    from gr_jax.protocols.paper_tables import directory_name

    status = read_json(output_dir / "reproduce_status.json", "reproduce status")
    rows = []
    for name, st in status.items():
        system = output_dir / "systems" / directory_name(name)
        timing_path = system / "dynamic_timing.json"
        if st.get("status") not in ("ran", "reused") or not timing_path.is_file():
            rows.append({"figure": "seconds per system (demo)", "system": name, "status": st.get("status")})
            continue
        timing = read_json(timing_path, "dynamic timing")
        made = system / "run_seconds.json"  # the time of the run whose result is there (reproduce writes it)
        seconds = read_json(made, "run time").get("seconds") if made.is_file() else None
        result = read_json(system / "dynamic" / "dynamic.json", "dynamic result")
        added = [t["index_s"] for t in timing[1:]]
        queries = result["steps"][-1].get("queries") or 1
        rows.append({"figure": "seconds per system (demo)", "system": name,
                     "status": st["status"],
                     "whole run s": f"{seconds:.0f}" if seconds is not None else "—",
                     "D0: train + index s": f"{timing[0]['index_s']:.1f}",
                     "D1..D5: index s (mean)": f"{sum(added) / max(len(added), 1):.2f}",
                     "search ms/query (last step)": f"{1000 * timing[-1]['search_s'] / queries:.2f}",
                     "peak RSS MB": f"{max(t['rss_mb'] for t in timing):.0f}"})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output_dir", help="OUTPUT_DIR of a python -m gr_jax.reproduce run")
    parser.add_argument("--no_write", action="store_true", help="print only, do not touch BENCHMARKS.md")
    args = parser.parse_args(argv)
    from gr_jax.runtime import cli
    from gr_jax.runtime.errors import UserError
    from gr_jax.evaluation.report import benchmark_section

    cli.setup_logging()
    try:
        rows = rows_of(Path(args.output_dir))
    except (UserError, OSError, ValueError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    for r in rows:
        sys.stdout.write(json.dumps(r) + "\n")
    if not args.no_write:
        recipe = Path(args.output_dir) / "paper" / "tables.json"
        quick = recipe.is_file() and json.loads(recipe.read_text()).get("quick")
        header = (f"CPU (2 cores), one process per system; the run in {args.output_dir}"
                  f"{' (--quick)' if quick else ''}; command: `python tools/bench_systems.py {args.output_dir}`")
        from gr_jax.evaluation.report import benchmark_writer

        with benchmark_writer(ROOT / "BENCHMARKS.md", "bench_systems") as f:
            f.write(benchmark_section("bench_systems", header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
