"""python -m gr_jax.reproduce --paper NAME --gin.OUTPUT_DIR=DIR [--gin_file=DATASET_SETTINGS ...] [--quick]
       [--only SYSTEM ...] [--rerun SYSTEM ...] [--gin.NAME=VALUE ...] [--gin_search_paths=A,B]

A paper's tables in one command (protocols/reproduce.py): every system of the paper's tables is run by its
protocol in OUTPUT_DIR/systems/<system>/ (a system whose recipe has not changed is reused), then
OUTPUT_DIR/paper/ gets tables.md (ours beside the published values), tables.json, significance.json (paired
randomisation tests) and tables.png. `--gin_file` (e.g. datasets/pydoc.gin) and other `--gin.` bindings are
given to every system's run; `--quick` adds the paper's smoke-run bindings. Papers: gin_configs/papers/.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from gr_jax.runtime import gin_utils, locks
from gr_jax.runtime.cli import setup_logging


def main(argv=None) -> int:
    setup_logging()
    files, bindings, paths, rest = gin_utils.split_flags(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m gr_jax.reproduce", usage=__doc__)
    parser.add_argument("--paper", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", default=None)
    parser.add_argument("--rerun", nargs="+", default=[])
    args = parser.parse_args(rest)
    output = [b for b in bindings if b.split("=", 1)[0].strip() == "OUTPUT_DIR"]
    bindings = [b for b in bindings if b.split("=", 1)[0].strip() != "OUTPUT_DIR"]
    if len(output) != 1:
        sys.stderr.write("error: give the output directory: --gin.OUTPUT_DIR=\"'runs/paper'\"\n")
        return 2
    output_dir = output[0].split("=", 1)[1].strip().strip("'\"")
    from gr_jax.protocols import reproduce as rp

    try:
        with contextlib.ExitStack() as held:
            held.enter_context(locks.output_lock(output_dir, "gr_jax reproduce"))
            record = rp.reproduce(args.paper, output_dir, files, bindings, quick=args.quick, rerun=args.rerun,
                                  search_paths=paths, only=args.only)
    except gin_utils.expected_errors() as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    sys.stdout.write(record["markdown"] + "\n")
    failed = {n: s for n, s in record["status"].items() if s["status"] in ("failed", "skipped")}
    if failed:
        sys.stderr.write("error: " + "; ".join(
            f"{n}: {s['last_line']} (log: {s['log']})" if s["status"] == "failed" else f"{n}: not run, {s['why']}"
            for n, s in failed.items()) + "\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
