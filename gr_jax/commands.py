"""The commands, as one table, with one scaffold. `python -m gr_jax.<name>` runs `COMMANDS[<name>]` (the files
`gr_jax/<name>.py` are shims that name their entry here); a method's own command is a `Command` in its folder
(`methods/<name>/command.py`, run as `python -m gr_jax.methods.<name>.command`).

| command | runs (gin configurable) | prints |
|---|---|---|
| train | `compose.train` | the final evaluation's table (BM25 beside it), the run, checkpoint and metrics files |
| infer | `compose.infer` | JSON: the run file, step, split, queries, beams (and metrics with runs/eval.gin) |
| dynamic | `protocols.dynamic_corpora.run_dynamic` | the protocol's tables: P, F_n, GA_n, IDBI |
| robustness | `protocols.query_variation.run_robustness` | the robustness tables (004 Tables 6–8 shape) |
| cross_lingual | `protocols.language_shift.run_cross_lingual` | the cross-lingual tables (004 Table 9 shape) |
| pseudo_queries | `protocols.lm_pseudo_queries.write_pseudo_queries` | JSON: the file and its rows |
| reproduce | `protocols.paper_tables.reproduce` (flags `--paper`, `--quick`, ...) | the paper's tables |
| eval | (flags, no gin) trec_eval's measures of TREC runs | a metrics table |
| align_planner | `methods/pag/command.py` | JSON: the aligned planner's directory, epoch, history |
| fewshot | `methods/fewshot/command.py` | the Few-Shot GR table, one row per bank size |
| rank_data | `methods/seal/command.py` (`python -m gr_jax.methods.seal.rank_data`) | the rank data's counts |

Every gin command goes through `Command.main` (`runtime/command.py`, the scaffold a method's command uses too): logging set up, `gin_utils.run_entry` (flags, gin parsing and
checks, the output lock, exit code 2 with one message for a bad input), then what it prints on success (process
0 only for the commands that run over several processes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from gr_jax.runtime import gin_utils, locks
from gr_jax.runtime.cli import setup_logging
from gr_jax.runtime.command import ON_A_TRAINED_SYSTEM, Command, deferred  # noqa: F401 (re-exported)
from gr_jax.runtime.run_dir import RunDir

# ----------------------------------------------------------------------------------------------------------
# what each command prints
# ----------------------------------------------------------------------------------------------------------


def summary_table(summary: dict) -> str:
    """The final evaluation of `gr_jax.train` as a markdown table, BM25 beside the model when it was run."""
    from gr_jax.evaluation.report import markdown_table

    metrics = summary.get("metrics", {})
    rows = [[summary.get("system", "generative retriever"), *[f"{v:.4f}" for v in metrics.values()]]]
    if "bm25_metrics" in summary:
        rows.append(["BM25", *[f"{summary['bm25_metrics'][k]:.4f}" for k in metrics]])
    return markdown_table(["system", *metrics], rows)


def _train_printout(summary: dict) -> str:
    out = []
    if "metrics" in summary:
        out.append(f"\n{summary['split']} ({summary['queries']} queries):\n{summary_table(summary)}\n\n")
        out.append(f"run file:   {summary['run']}\n")
    out.append(f"checkpoint: {summary['checkpoint']}\n")
    out.append(f"metrics:    {RunDir(summary['model_dir']).final_metrics}\n")
    return "".join(out)


def _tables(module: str, name: str, wrap_in_list: bool = False) -> Callable[[Any], str]:
    def show(result) -> str:
        import importlib

        table = getattr(importlib.import_module(module), name)
        return "\n" + table([result] if wrap_in_list else result) + "\n"

    return show


def _json(result) -> str:
    return json.dumps(result, indent=1) + "\n"


# ----------------------------------------------------------------------------------------------------------
# the table
# ----------------------------------------------------------------------------------------------------------

COMMANDS: dict[str, Command] = {c.name: c for c in (
    Command("train", """python -m gr_jax.train --gin_file=FILE [--gin_file=...] [--gin.NAME=VALUE ...] [--gin_search_paths=A,B]
    [--multiprocess [--coordinator_address=HOST:PORT --process_count=N --process_index=I]]

Parses the gin flags, calls `compose.train` (which writes the final config to MODEL_DIR/config.gin), and
prints where the checkpoint, run file and metrics went (with BM25 next to the model when configured).
With `--multiprocess` it is one of N processes of one run (`gr_jax/runtime/distributed.py`); process 0 prints.""",
            deferred("gr_jax.compose", "train"), _train_printout, root="train", multiprocess=True),
    Command("infer", """python -m gr_jax.infer --gin_file=EXPERIMENT.gin --gin_file=runs/infer.gin --gin.MODEL_DIR="'DIR'"
    [--gin.EvalConfig.split="'test'"] [--gin.EvalConfig.num_beams=20] [--gin.CHECKPOINT_STEP=1000]

Queries of a split → constrained beam search with a trained MODEL_DIR → TREC run file (documents in beam
order) at MODEL_DIR/runs/<split>.step<N>.run; with runs/eval.gin also the metrics (printed and written as
JSON next to the run). The split, beams and batch size are the experiment's `EvalConfig` (the command line's
over the file's); EVAL_SPLIT and NUM_BEAMS, their earlier names, still work. With t5x's `--multiprocess` flags
(as for gr_jax.train) each process searches a block of the queries and process 0 writes the merged run.""",
            # the experiment file is the training one: its training settings stay unused here
            deferred("gr_jax.compose", "infer"), _json, root="infer", fixed=ON_A_TRAINED_SYSTEM["fixed"],
            allow_unused=("train", "make_optimizer"), multiprocess=True),
    Command("dynamic", """python -m gr_jax.dynamic --gin_file=FILE [--gin_file=...] [--gin.NAME=VALUE ...] [--gin_search_paths=A,B]

The dynamic-corpora protocol (protocols/dynamic_corpora.py): build a system on D0, index D1..D5 one after
another without retraining, and write MODEL_DIR/dynamic/{dynamic.json, dynamic.md, dynamic.png} with the P
matrix, F_n, GA_n and IDBI. The method (BM25, dense, a generative retriever with any docid scheme, MDGR) is
chosen by the gin file, e.g. experiments/demo/dynamic_bm25.gin.""",
            # a GR system trains in MODEL_DIR/model: the protocol passes train's model_dir itself
            deferred("gr_jax.protocols.dynamic_corpora", "run_dynamic"),
            _tables("gr_jax.protocols.dynamic_corpora", "tables_markdown", wrap_in_list=True), root="run_dynamic",
            allow_unused=("train.model_dir",)),
    Command("robustness", """python -m gr_jax.robustness --gin_file=FILE [--gin_file=...] [--gin.NAME=VALUE ...] [--gin_search_paths=A,B]

The robustness protocol (protocols/query_variation.py): a retriever under intent-preserving query variations
(misspelling, reordering, synonym, paraphrase, naturality; five seeds), with plan-drift diagnostics, plan
collapse, tables shaped like 004's Tables 6–8 and boxplots like its Figs. 2–3. A trained MODEL_DIR: its
experiment file, then runs/robustness.gin (e.g. experiments/demo/robustness_dsi.gin); BM25:
experiments/demo/robustness_bm25.gin.""",
            deferred("gr_jax.protocols.query_variation", "run_robustness"),
            _tables("gr_jax.protocols.query_variation", "tables_markdown"), root="run_robustness",
            **ON_A_TRAINED_SYSTEM),
    Command("cross_lingual", """python -m gr_jax.cross_lingual --gin_file=EXPERIMENT.gin --gin_file=runs/cross_lingual.gin --gin.MODEL_DIR="'DIR'"
    --gin.CROSS_LINGUAL_QUERIES="{'de': 'mmarco/german_queries.dev.tsv'}" [--gin.NAME=VALUE ...]

Cross-lingual query shift with the index fixed (protocols/language_shift.py): non-English queries against the
English corpus and docids of a trained MODEL_DIR in the settings Naive, Seq-only, Translate and Aligned, with
overlap diagnostics against the English queries (004 Table 9 shape) and effectiveness (Fig. 5 shape).""",
            deferred("gr_jax.protocols.language_shift", "run_cross_lingual"),
            _tables("gr_jax.protocols.language_shift", "cross_lingual_markdown"), root="run_cross_lingual",
            **ON_A_TRAINED_SYSTEM),
    Command("pseudo_queries", """python -m gr_jax.pseudo_queries --gin_file=FILE [--gin_file=...] [--gin.NAME=VALUE ...] [--gin_search_paths=A,B]

Pseudo-queries for every document of a corpus, written by a decoder-only LM (protocols/lm_pseudo_queries.py),
to MODEL_DIR/pseudo_queries.jsonl with their provenance; resumable. The file feeds
`PseudoQueryDocids(source='file')` and `Objectives.pseudo_queries_file`. E.g.
experiments/demo/pseudo_queries_smollm2.gin.""",
            deferred("gr_jax.protocols.lm_pseudo_queries", "write_pseudo_queries"),
            lambda result: json.dumps(result) + "\n", root="write_pseudo_queries"),
)}


def run(name: str, argv: Optional[list[str]] = None) -> int:
    """`python -m gr_jax.<name>`: the command of that name (a gin command of the table, `eval` or `reproduce`)."""
    if name == "eval":
        return eval_main(argv)
    if name == "reproduce":
        return reproduce_main(argv)
    return COMMANDS[name].main(argv)


# ----------------------------------------------------------------------------------------------------------
# the two commands with flags of their own
# ----------------------------------------------------------------------------------------------------------

EVAL_USAGE = """Evaluate a TREC run against qrels: prints a markdown table, writes JSON.

    python -m gr_jax.eval --run RUN --qrels QRELS [--metrics Hit@1,Hit@10,MRR@10,nDCG@10]
                          [--rel_threshold 2] [--queries seen.txt] [--msmarco_official] [--out metrics.json]
"""

DEFAULT_METRICS = "Hit@1,Hit@10,Recall@100,MRR@10,nDCG@10"


def eval_main(argv=None) -> int:
    """`python -m gr_jax.eval`: trec_eval's measures (our implementation, parity with pytrec_eval) of runs."""
    from gr_jax.data import trec
    from gr_jax.evaluation import metrics, report
    from gr_jax.runtime import cli, io_utils

    parser = argparse.ArgumentParser(prog="python -m gr_jax.eval", description=EVAL_USAGE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
            run_ = trec.read_run(path)
            evaluated = metrics.per_query(run_, qrels, names, args.rel_threshold, subset, args.msmarco_official)
            if not set(run_) & set(qrels) & (set(subset) if subset is not None else set(run_)):
                raise ValueError(f"{path}: no query of the run is judged in {args.qrels}"
                                 + (f" (and listed in {args.queries})" if subset is not None else "")
                                 + "; are the run and the qrels of the same query set?")
            values = metrics.evaluate(run_, qrels, names, args.rel_threshold, subset, args.msmarco_official)
            results[path] = {**values, "queries": len(evaluated)}
        sys.stdout.write(report.metrics_table(results) + "\n")
        if args.out:
            io_utils.write_text(args.out, io_utils.json_text({"qrels": args.qrels, "rel_threshold": args.rel_threshold,
                                                              "msmarco_official": args.msmarco_official,
                                                              "runs": results}, indent=2), keep_previous=True)
    except (ValueError, OSError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    return 0


REPRODUCE_USAGE = """python -m gr_jax.reproduce --paper NAME --gin.OUTPUT_DIR=DIR [--gin_file=DATASET_SETTINGS ...] [--quick | --released DIR]
       [--only SYSTEM ...] [--rerun SYSTEM ...] [--jobs N] [--gin.NAME=VALUE ...] [--gin_search_paths=A,B]

A paper's tables in one command (protocols/paper_tables.py): every system of the paper's tables is run by its
protocol in OUTPUT_DIR/systems/<system>/ (a system whose recipe has not changed is reused), then
OUTPUT_DIR/paper/ gets tables.md (ours beside the published values), tables.json, significance.json (paired
randomisation tests) and tables.png. `--gin_file` (e.g. datasets/pydoc.gin) and other `--gin.` bindings are
given to every system's run; `--quick` adds the paper's smoke-run bindings; `--jobs` systems run at once (2; a
system that starts from another waits for it). Papers: gin_configs/papers/.

With `--released DIR` (papers of gin_configs/released/: glen, pag, nci, seal) it evaluates the authors' released
checkpoints in DIR with the paper's settings instead (protocols/released.py) and prints ours beside the published
value, with the difference and the tolerance of each row; exit 1 when a row is outside its tolerance.
"""


def _released_exit(record: dict) -> int:
    """1 when a system failed or a row of the released table is outside its tolerance (named on stderr)."""
    bad = [f"{n}: failed at its {s['stage']} ({s['last_line']}; log: {s['log']})"
           for n, s in record["status"].items() if s["status"] == "failed"]
    bad += [f"{r['system']} {r['split']} {r['metric']}: ours {r['ours']:.4f}, published {r['published']:.4f}, "
            f"outside ±{r['tolerance']}" for r in record["rows"] if r["within"] is False]
    if bad:
        sys.stderr.write("error: " + "; ".join(bad) + "\n")
        return 1
    return 0


def reproduce_main(argv=None) -> int:
    """`python -m gr_jax.reproduce`: one process runs each system's command as a child (`paper_tables`)."""
    setup_logging()
    files, bindings, paths, rest = gin_utils.split_flags(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m gr_jax.reproduce", usage=REPRODUCE_USAGE)
    parser.add_argument("--paper", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", default=None)
    parser.add_argument("--rerun", nargs="+", default=[])
    parser.add_argument("--released", default=None)
    parser.add_argument("--jobs", type=int, default=2, help="systems run at once (default 2)")
    args = parser.parse_args(rest)
    if args.jobs < 1:
        sys.stderr.write(f"error: --jobs must be ≥ 1, got {args.jobs}\n")
        return 2
    output = [b for b in bindings if b.split("=", 1)[0].strip() == "OUTPUT_DIR"]
    bindings = [b for b in bindings if b.split("=", 1)[0].strip() != "OUTPUT_DIR"]
    if len(output) != 1:
        sys.stderr.write("error: give the output directory: --gin.OUTPUT_DIR=\"'runs/paper'\"\n")
        return 2
    output_dir = output[0].split("=", 1)[1].strip().strip("'\"")
    from gr_jax.protocols import paper_tables

    try:
        gin_utils.check_binding_values(bindings)  # the children's settings, before OUTPUT_DIR or a child exists
        with contextlib.ExitStack() as held:
            held.enter_context(locks.output_lock(output_dir, "gr_jax reproduce"))
            if args.released is not None:
                if args.quick or args.rerun:
                    raise paper_tables.ReproduceError("--released evaluates the released checkpoints as they are: "
                                                      "--quick and --rerun do not apply")
                from gr_jax.protocols import released

                record = released.reproduce_released(args.paper, args.released, output_dir, files, bindings,
                                                     search_paths=paths, only=args.only)
            else:
                record = paper_tables.reproduce(args.paper, output_dir, files, bindings, quick=args.quick,
                                                rerun=args.rerun, search_paths=paths, only=args.only, jobs=args.jobs)
    except gin_utils.expected_errors() as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    sys.stdout.write(record["markdown"] + "\n")
    if args.released is not None:
        return _released_exit(record)
    failed = {n: s for n, s in record["status"].items() if s["status"] in ("failed", "skipped")}
    if failed:
        sys.stderr.write("error: " + "; ".join(
            f"{n}: {s['last_line']} (log: {s['log']})" if s["status"] == "failed" else f"{n}: not run, {s['why']}"
            for n, s in failed.items()) + "\n")
        return 1
    return 0
