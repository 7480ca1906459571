"""Published numbers from the authors' released checkpoints, as one command:

    python -m gr_jax.reproduce --paper glen --released DIR --gin.OUTPUT_DIR="'runs/released_glen'"

A release file, `gin_configs/released/<paper>.json`, says for each system of the paper:

* `files`: the names its release needs, each a path relative to DIR (a file or a folder: the network, its docid
  files, the tokenizer, the dataset), and in `get` where each is obtained (README, "Released checkpoints");
* `import`: the command that makes a MODEL_DIR of the release (default `gr_jax.import_checkpoint`; SEAL's
  family `gr_jax.methods.seal.import_released`) and its arguments, then `gin` (the experiment files) and `bindings`
  given to the import and the evaluation alike; `{NAME}` in an argument or binding is the path of `files[NAME]`
  (or `{MODEL_DIR}`, the system's directory);
* `evaluate`: the evaluations with the paper's settings (`split`, `num_beams`, extra `bindings`), each with its
  `rows`: a metric of ours (`Hit@1`, `MRR@100`, `nDCG@10`, ...), the `published` value, the `tolerance` within
  which ours counts as reproducing it and the `source` (table and column of the paper; `published` null when no
  published figure is at hand: ours is shown alone). `Answer@k` rows (answer accuracy, `evaluation/answers.py`)
  are computed from the evaluation's run file with its `answers` file and `passages` corpus.

Each system runs in OUTPUT_DIR/released/<system>/ as child processes (`reproduce.log` there): the import once,
then `gr_jax.infer` with runs/eval.gin per evaluation. The import is reused while its recipe — the command lines,
every gin file read (includes followed) and the digest of every released file — is the recorded one; otherwise
the earlier directory is kept as `.prev-<n>` and the import runs again. An evaluation is reused on the same terms.
Extra `--gin_file` / `--gin.` flags of the command go to every child (e.g. a smaller beam to try it out).

OUTPUT_DIR/released_<paper>.md and .json (an earlier, different table kept as `.prev-<n>`): one row per
(system, split, metric): published, ours, ours − published, the tolerance and whether |Δ| ≤ tolerance. The
command exits 0 when every row is within its tolerance, 1 when a row is not or a system failed (named, with its
log), 2 on a bad request (an unknown paper, a release file missing from DIR: named, with where to get it).
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from gr_jax.evaluation import answers
from gr_jax.protocols.paper_tables import Paper, ReproduceError, directory_name, include_closure
from gr_jax.runtime import gin_utils
from gr_jax.runtime.run_dir import RunDir
from gr_jax.runtime.io_utils import json_text, keep_aside, make_dirs, read_json, write_text
from gr_jax.runtime.provenance import file_digest, json_digest

log = logging.getLogger(__name__)

DEFAULT_IMPORT = {"module": "gr_jax.import_checkpoint", "args": ["--gin.MODEL_DIR='{MODEL_DIR}'"]}
_PLACEHOLDER = re.compile(r"\{([A-Z_][A-Z0-9_]*)\}")


Release = Paper  # a name, its file, the spec; `systems` (a release file has no tables)


def load_release(name: str, search_paths: Sequence[str] = ()) -> Release:
    """`gin_configs/released/<name>.json`, checked: every system has files, evaluations with rows, and only
    placeholders it defines."""
    try:
        path = gin_utils.resolve(f"released/{name}.json", search_paths)
    except Exception:
        known = sorted(p.stem for p in (gin_utils.GIN_CONFIGS / "released").glob("*.json"))
        raise ReproduceError(f"no release file for paper {name!r} (gin_configs/released/{name}.json); papers with "
                             f"released checkpoints: {known}") from None
    spec = read_json(path, "release file")
    if not isinstance(spec, dict) or not isinstance(spec.get("systems"), dict) or not spec["systems"]:
        raise ReproduceError(f"{path}: a release file needs a non-empty 'systems' object")
    get = spec.get("get", {})
    for sname, s in spec["systems"].items():
        if not re.fullmatch(r"[\w+\-(). =/]+", sname):
            raise ReproduceError(f"{path}: system name {sname!r} has characters a directory name cannot carry")
        files = s.get("files")
        if not isinstance(files, dict) or not files:
            raise ReproduceError(f"{path}: system {sname!r} needs 'files' (name → path inside the release folder)")
        missing_get = sorted(k for k in files if k not in get)
        if missing_get:
            raise ReproduceError(f"{path}: 'get' does not say where to obtain {missing_get} (system {sname!r})")
        known = set(files) | {"MODEL_DIR"}
        imp = {**DEFAULT_IMPORT, **s.get("import", {})}
        texts = [*imp["args"], *s.get("bindings", []), *s.get("evaluate_bindings", [])]
        evaluations = s.get("evaluate")
        if not isinstance(evaluations, list) or not evaluations:
            raise ReproduceError(f"{path}: system {sname!r} needs 'evaluate' (a list of evaluations with rows)")
        for e in evaluations:
            if not isinstance(e.get("split"), str) or not isinstance(e.get("num_beams"), int) or not e.get("rows"):
                raise ReproduceError(f"{path}: system {sname!r}: each evaluation needs 'split', 'num_beams' and "
                                     f"'rows'")
            texts += e.get("bindings", [])
            if any(answers.ANSWER_METRIC.match(str(r.get("metric"))) for r in e["rows"]):
                if not isinstance(e.get("answers"), str) or not isinstance(e.get("passages"), str):
                    raise ReproduceError(f"{path}: system {sname!r}: Answer@k rows need the evaluation's 'answers' "
                                         f"(answers file) and 'passages' (corpus TSV)")
                texts += [e["answers"], e["passages"]]
            for r in e["rows"]:
                if not {"metric", "published", "tolerance", "source"} <= set(r):
                    raise ReproduceError(f"{path}: system {sname!r}: each row needs metric, published, tolerance "
                                         f"and source; got {sorted(r)}")
        unknown = sorted({m for t in texts for m in _PLACEHOLDER.findall(t)} - known)
        if unknown:
            raise ReproduceError(f"{path}: system {sname!r} refers to {unknown}, which are not among its files")
    return Release(name, path, spec)


def release_paths(release: Release, system: str, release_dir: Path) -> dict[str, Path]:
    """The system's release files inside `release_dir`; a missing one is an error naming it and where to get it."""
    out, missing = {}, []
    for key, rel in release.systems[system]["files"].items():
        p = release_dir / rel
        if not p.exists():
            missing.append(f"{key} = {p} ({release.spec['get'][key]})")
        out[key] = p
    if missing:
        raise ReproduceError(f"{system}: the release folder {release_dir} lacks " + "; ".join(missing) +
                             " (README: Released checkpoints)")
    return out


def _values(paths: dict, model_dir: Path) -> dict:
    """What `{NAME}` stands for: the release's paths and the system's MODEL_DIR."""
    return {**{k: str(v) for k, v in paths.items()}, "MODEL_DIR": str(model_dir)}


def _fill(text: str, values: dict) -> str:
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), text)


def release_digests(paths: dict[str, Path]) -> dict:
    """The digest of every file a release path holds (a folder: its files, by relative name)."""
    out = {}
    for key, p in sorted(paths.items()):
        if p.is_dir():
            out[key] = {str(f.relative_to(p)): file_digest(f, f"{key} file") for f in sorted(p.rglob("*"))
                        if f.is_file()}
        else:
            out[key] = file_digest(p, f"{key} file")
    return out


def commands(release: Release, system: str, paths: dict, model_dir: Path, files: Sequence[str],
             bindings: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """(the import's command line, each evaluation's) for one system."""
    s = release.systems[system]
    values = _values(paths, model_dir)
    imp = {**DEFAULT_IMPORT, **s.get("import", {})}
    gin_flags = [f"--gin_file={f}" for f in [*s["gin"], *files]]
    given = [f"--gin_bindings={b}" for b in bindings]  # the command line's, as split_flags normalised them
    shared = [f"--gin.{_fill(b, values)}" for b in s.get("bindings", [])] + given
    imported = [sys.executable, "-m", imp["module"], *[_fill(a, values) for a in imp["args"]], *gin_flags, *shared]
    evaluations = []
    for e in s["evaluate"]:
        metrics = [r["metric"] for r in e["rows"] if not answers.ANSWER_METRIC.match(r["metric"])] or ["Hit@1"]
        evaluations.append([
            sys.executable, "-m", "gr_jax.infer", *gin_flags, "--gin_file=runs/eval.gin", *shared,
            *[f"--gin.{_fill(b, values)}" for b in [*s.get("evaluate_bindings", []), *e.get("bindings", [])]],
            f"--gin.MODEL_DIR='{model_dir}'", f"--gin.EvalConfig.split='{e['split']}'",
            f"--gin.EvalConfig.num_beams={e['num_beams']}", f"--gin.EvalConfig.metrics={json.dumps(metrics)}",
            *given])  # the command line's bindings last: they win over the release file's
    return imported, evaluations


def evaluation_digest(evaluation) -> str:
    """The content digest a stored evaluation records and is checked against before reuse."""
    return json_digest(json.loads(json_text(evaluation)))  # as the file holds it (NaN → null, numpy → Python)


def recipe(argv: Sequence[str], digests: dict, search_paths: Sequence[str]) -> dict:
    files = [a.split("=", 1)[1] for a in argv if a.startswith("--gin_file=")]
    return {"argv": list(argv[1:]),  # not the interpreter's path
            "gin_files": {str(p): file_digest(p, "gin file") for p in include_closure(files, search_paths)},
            "release": digests}


def _run(argv: list[str], log_path: Path) -> tuple[int, str]:
    with open(log_path, "a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=out, text=True)
        out.write(proc.stdout)
    return proc.returncode, proc.stdout


def _last_line(log_path: Path) -> str:
    """The child's error line (the last line that says "error"), else its last line."""
    lines = [x for x in log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
             if not x.startswith("$ ")]
    errors = [x for x in lines if "error" in x.lower()]
    return (errors or lines or [""])[-1]


def run_release_system(release: Release, system: str, release_dir: Path, output_dir: Path, files: Sequence[str],
                       bindings: Sequence[str], search_paths: Sequence[str]) -> dict:
    """Imports (or reuses) one system and runs (or reuses) its evaluations → {"status", "evaluations": [each
    {"metrics": {metric: value}, "num_beams", "queries"}], "seconds"} or {"status": "failed", "log", "last_line"}."""
    paths = release_paths(release, system, release_dir)
    model_dir = output_dir / "released" / directory_name(system)
    search = [f"--gin_search_paths={p}" for p in search_paths]
    imported, evaluations = commands(release, system, paths, model_dir, files, bindings)
    imported += search
    digests = release_digests(paths)
    rec = recipe(imported, digests, search_paths)
    rec_path, log_path = model_dir / "import_recipe.json", model_dir / "reproduce.log"
    t0 = time.perf_counter()
    reused = True
    if not (rec_path.is_file() and read_json(rec_path, "import recipe") == rec and RunDir(model_dir).checkpoints.is_dir()):
        reused = False
        if model_dir.exists():
            log.warning("%s: the release or its settings changed; the earlier import is kept as %s", system,
                        keep_aside(model_dir))
        make_dirs(model_dir.parent)
        # the import makes MODEL_DIR itself and refuses one that holds a vocabulary: its log goes beside it first
        side_log = model_dir.parent / f"{model_dir.name}.import.log"
        log.info("%s: importing the release (log: %s)", system, side_log)
        rc, _ = _run(imported, side_log)
        if rc != 0:
            return {"status": "failed", "stage": "import", "exit_code": rc, "log": str(side_log),
                    "last_line": _last_line(side_log)}
        write_text(log_path, side_log.read_text(encoding="utf-8"))
        side_log.unlink()
        write_text(rec_path, json_text(rec, indent=1))
    metrics = []
    for i, (argv, e) in enumerate(zip(evaluations, release.systems[system]["evaluate"])):
        argv = argv + search
        erec = {"import": rec, **recipe(argv, {}, search_paths)}
        done = model_dir / "released" / f"evaluation_{i}.json"
        if done.is_file():
            try:
                held = read_json(done, "released evaluation")
            except (OSError, ValueError) as e:  # cut off or not JSON: evaluated again, never fatal
                log.warning("%s: %s cannot be read (%s); evaluating again", system, done, e)
                held = {}
            held = held if isinstance(held, dict) else {}
            if held.get("recipe") == erec and held.get("digest") == evaluation_digest(held.get("evaluation")):
                metrics.append(held["evaluation"])
                continue
            if held.get("recipe") == erec:  # the settings match, the content does not: never trusted
                why = "has no content digest (written before digests were recorded)" if "digest" not in held \
                    else "is not the evaluation that was written (its content digest differs: edited or damaged)"
                log.warning("%s: %s %s; evaluating again (the file is kept as a .prev copy)", system, done, why)
        reused = False
        log.info("%s: evaluating on %s (log: %s)", system, e["split"], log_path)
        rc, stdout = _run(argv, log_path)
        if rc != 0:
            return {"status": "failed", "stage": f"evaluation {e['split']}", "exit_code": rc, "log": str(log_path),
                    "last_line": _last_line(log_path)}
        try:
            printed = json.loads(stdout)
            values = {"metrics": printed["metrics"], "num_beams": printed["num_beams"], "queries": printed["queries"]}
        except (ValueError, KeyError, TypeError):
            return {"status": "failed", "stage": f"evaluation {e['split']}", "log": str(log_path),
                    "last_line": "gr_jax.infer printed no metrics"}
        wanted = [r["metric"] for r in e["rows"] if answers.ANSWER_METRIC.match(r["metric"])]
        if wanted:  # answer accuracy: the run's passages against the queries' answer strings
            filled = {k: _fill(e[k], _values(paths, model_dir)) for k in ("answers", "passages")}
            values["metrics"].update(answers.answer_metrics(printed["run"], filled["answers"], filled["passages"],
                                                            wanted))
        write_text(done, json_text({"recipe": erec, "evaluation": values, "digest": evaluation_digest(values)},
                                   indent=1), keep_previous=True)
        metrics.append(values)
    return {"status": "reused" if reused else "ran", "evaluations": metrics, "seconds": time.perf_counter() - t0}


def check_answer_files(release: Release, system: str, paths: dict) -> None:
    """Reads every answers file the system's Answer@k rows will use (a malformed one is an error naming its line
    now, not after the import and the evaluation have run)."""
    for e in release.systems[system]["evaluate"]:
        if any(answers.ANSWER_METRIC.match(r["metric"]) for r in e["rows"]) and "answers" in e:
            answers.read_answers(_fill(e["answers"], _values(paths, Path("."))))


def table_rows(release: Release, results: dict) -> list[dict]:
    """One row per (system of `results`, evaluation, metric), in the release file's order."""
    rows = []
    for system, s in release.systems.items():
        if system not in results:
            continue
        result = results[system]
        for i, e in enumerate(s["evaluate"]):
            for r in e["rows"]:
                ours, done = None, {}
                if result and result["status"] != "failed":
                    done = result["evaluations"][i]
                    ours = done["metrics"].get(r["metric"])
                delta = None if ours is None or r["published"] is None else ours - r["published"]
                rows.append({"system": system, "split": e["split"], "paper_beams": e["num_beams"],
                             "beams": done.get("num_beams"), "queries": done.get("queries"), "metric": r["metric"],
                             "source": r["source"], "published": r["published"], "ours": ours, "delta": delta,
                             "tolerance": r["tolerance"],
                             "within": None if delta is None else bool(abs(delta) <= r["tolerance"] + 1e-12)})
    return rows


def _f(x) -> str:
    return "—" if x is None else f"{x:.4f}"


def markdown(release: Release, rows: list[dict], status: dict) -> str:
    lines = [f"### {release.spec.get('paper', release.name)}: published numbers from the released checkpoints", "",
             "| system | split | queries | beams | measure (paper's) | published | ours | Δ | tolerance | within |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = "—" if r["delta"] is None else f"{r['delta']:+.4f}"
        within = "—" if r["within"] is None else ("yes" if r["within"] else "**no**")
        beams = "—" if r["beams"] is None else str(r["beams"])
        if r["beams"] is not None and r["beams"] != r["paper_beams"]:
            beams += f" (paper: {r['paper_beams']})"
        queries = "—" if r["queries"] is None else str(r["queries"])
        lines.append(f"| {r['system']} | {r['split']} | {queries} | {beams} | {r['metric']} ({r['source']}) | "
                     f"{_f(r['published'])} | {_f(r['ours'])} | {d} | ±{r['tolerance']:.4f} | {within} |")
    if release.spec.get("tolerance"):
        lines += ["", f"Tolerance: {release.spec['tolerance']}"]
    failed = {n: s for n, s in status.items() if s["status"] == "failed"}
    for n, s in failed.items():
        lines.append(f"\n{n}: failed at its {s['stage']} ({s['last_line']}; log: {s['log']})")
    return "\n".join(lines)


def reproduce_released(paper: str, release_dir: str, output_dir: str, files: Sequence[str] = (),
                       bindings: Sequence[str] = (), search_paths: Sequence[str] = (),
                       only: Optional[Sequence[str]] = None) -> dict:
    """Runs every system of the paper's release file (or `only` those) → {"markdown", "rows", "status"}; writes
    OUTPUT_DIR/released_<paper>.md/.json."""
    release = load_release(paper, search_paths)
    root = Path(release_dir)
    if not root.is_dir():
        raise ReproduceError(f"--released {release_dir}: not a folder (the folder that holds the authors' released "
                             f"files; README: Released checkpoints)")
    names = list(release.systems)
    if only:
        unknown = [n for n in only if n not in release.systems]
        if unknown:
            raise ReproduceError(f"--only {unknown}: not systems of {release.path} ({names})")
        names = [n for n in names if n in only]
    gin_utils.check_binding_values(bindings)  # the command line's settings (e.g. a scorer's name) before any child
    for n in names:  # every release file present, and every answers file readable, before anything runs
        paths = release_paths(release, n, root)
        check_answer_files(release, n, paths)
    out = Path(output_dir)
    status = {}
    for n in names:
        status[n] = run_release_system(release, n, root, out, files, bindings, search_paths)
        log.info("%s: %s", n, status[n]["status"])
    rows = table_rows(release, status)
    text = markdown(release, rows, status)
    make_dirs(out)
    write_text(out / f"released_{paper}.md", text + "\n", keep_previous=True)
    write_text(out / f"released_{paper}.json", json_text({"paper": paper, "rows": rows}, indent=1),
               keep_previous=True)
    return {"markdown": text, "rows": rows, "status": status}
