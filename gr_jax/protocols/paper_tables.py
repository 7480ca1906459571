"""A paper's tables as one command (`python -m gr_jax.reproduce --paper NAME`).

A paper is a JSON file, `gin_configs/papers/<name>.json`: its systems — each the experiment files of one
protocol run (`gin`, plus `bindings`), or `same_as` another system, or `missing` with the reason —, its
tables (rows = systems, the measure, the published values) and the `quick` bindings of a smoke run.

`reproduce(...)` runs every system the tables need, one `python -m gr_jax.dynamic` process each, in
OUTPUT_DIR/systems/<name>/ (its MODEL_DIR), in an order that puts a system after those it `needs` (LTRGR after
the MINDER it starts from: `{MINDER}` in a binding is that system's directory). A system is reused when its
recipe — the command line and the digest of every gin file it reads, includes followed — is the recorded one
and its results exist; a system whose recipe changed is run again and its earlier directory is kept as
`<name>.prev-<n>` (nothing is deleted). A system that fails is reported (its log named) and the others go on;
the command then exits non-zero.

OUTPUT_DIR/reproduce_status.json says what ran, was reused or failed, and the seconds of each run (kept in
the system's run_seconds.json, so a reused result reports the time of the run that made it);
OUTPUT_DIR/paper/ (kept as paper.prev-<n> when a new run changes it) gets tables.md and tables.json (ours beside the published rows, the orderings by the tables'
measure), significance.json (paired randomisation tests between the systems of each table on per-query Hit@10:
Table 1 on Q0 after the last step, Table 2 on the mean of the new parts' means) and tables.png.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import itertools
import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from gr_jax.runtime import gin_utils
from gr_jax.runtime.errors import UserError
from gr_jax.evaluation import dynamic_measures as measures
from gr_jax.runtime.compile_clock import CACHE_VARIABLE
from gr_jax.runtime.io_utils import atomic_dir, json_text, keep_aside, make_dirs, read_json, write_text
from gr_jax.runtime.provenance import file_digest
from gr_jax.runtime.run_dir import RunDir

log = logging.getLogger(__name__)

CACHE_BYTES = 8 << 30  # the shared compilation cache's size: JAX locks it and evicts the least used past this
PERMUTATIONS = 10_000  # paired randomisation test: p resolves to 1e-4
MEASURES = ("initial", "new", "both", "cost")


class ReproduceError(UserError, ValueError):
    """A paper file or a request that cannot be run; the message names the file and the fix."""


@dataclasses.dataclass
class Paper:
    name: str
    path: Path
    spec: dict

    @property
    def systems(self) -> dict:
        return self.spec["systems"]

    @property
    def tables(self) -> dict:
        return self.spec["tables"]

    def source(self, name: str) -> str:
        """The system whose run gives `name`'s numbers (following `same_as`)."""
        seen = [name]
        while "same_as" in self.systems[name]:
            name = self.systems[name]["same_as"]
            if name in seen:
                raise ReproduceError(f"{self.path}: systems {seen} are each other's same_as")
            seen.append(name)
        return name


def load_paper(name: str, search_paths: Sequence[str] = ()) -> Paper:
    try:
        path = gin_utils.resolve(f"papers/{name}.json", search_paths)
    except Exception:
        known = sorted(p.stem for p in (gin_utils.GIN_CONFIGS / "papers").glob("*.json"))
        raise ReproduceError(f"no paper {name!r} (gin_configs/papers/{name}.json); known: {known}") from None
    spec = read_json(path, "paper file")
    if not isinstance(spec, dict) or not isinstance(spec.get("systems"), dict) or \
            not isinstance(spec.get("tables"), dict):
        raise ReproduceError(f"{path}: a paper file needs 'systems' and 'tables' objects")
    paper = Paper(name, path, spec)
    for sname, s in paper.systems.items():
        kinds = [k for k in ("gin", "same_as", "missing") if k in s]
        if len(kinds) != 1:
            raise ReproduceError(f"{path}: system {sname!r} needs exactly one of gin / same_as / missing, has {kinds}")
        for other in [*s.get("needs", []), *([s["same_as"]] if "same_as" in s else [])]:
            if other not in paper.systems:
                raise ReproduceError(f"{path}: system {sname!r} refers to unknown system {other!r}")
        if not re.fullmatch(r"[\w+\-(). =/]+", sname):
            raise ReproduceError(f"{path}: system name {sname!r} has characters a directory name cannot carry")
    for tname, t in paper.tables.items():
        if t.get("measure") not in MEASURES:
            raise ReproduceError(f"{path}: table {tname!r} has measure {t.get('measure')!r}, not one of {MEASURES}")
        unknown = [r for r in t.get("rows", []) if r not in paper.systems]
        if unknown:
            raise ReproduceError(f"{path}: table {tname!r} names unknown systems {unknown}")
    for sname in paper.systems:
        paper.source(sname)
    return paper


def directory_name(system: str) -> str:
    """A system's directory under OUTPUT_DIR/systems (spaces, '=' and brackets replaced)."""
    return re.sub(r"[^\w+\-.]+", "_", system).strip("_")


# ----------------------------------------------------------------------------------------------------------
# running the systems
# ----------------------------------------------------------------------------------------------------------

_INCLUDE = re.compile(r"""^\s*include\s+['"]([^'"]+)['"]""", re.M)


def include_closure(files: Sequence[str], search_paths: Sequence[str] = ()) -> list[Path]:
    """Every gin file the given ones read, includes followed, in first-seen order."""
    out: list[Path] = []
    todo = list(files)
    while todo:
        path = gin_utils.resolve(todo.pop(0), search_paths)
        if path.resolve() in {p.resolve() for p in out}:
            continue
        out.append(path)
        todo += _INCLUDE.findall(path.read_text(encoding="utf-8"))
    return out


def order(paper: Paper, names: Sequence[str]) -> list[str]:
    """The runnable systems behind `names` (same_as followed, missing left out), each after those it needs."""
    out: list[str] = []

    def visit(name: str, path: tuple):
        name = paper.source(name)
        if name in path:
            raise ReproduceError(f"{paper.path}: systems {list(path) + [name]} need each other")
        if name in out or "missing" in paper.systems[name]:
            return
        for need in paper.systems[name].get("needs", []):
            visit(need, path + (name,))
        out.append(name)

    for n in names:
        visit(n, ())
    return out


def command(paper: Paper, name: str, output_dir: Path, dataset_files: Sequence[str], bindings: Sequence[str],
            quick: bool) -> list[str]:
    s = paper.systems[name]
    argv = [f"--gin_file={f}" for f in [*s["gin"], *dataset_files]]
    dirs = {need: str(output_dir / "systems" / directory_name(need)) for need in s.get("needs", [])}
    extra = [b.format(**dirs) for b in s.get("bindings", [])]
    if quick:
        extra += [*paper.spec.get("quick", []), *s.get("quick", [])]
    extra += list(bindings)
    return argv + [f"--gin_bindings={b}" for b in extra]


def recipe(argv: Sequence[str], search_paths: Sequence[str], needs: Optional[dict] = None) -> dict:
    """What a system's run is made from: its command line, the content of every gin file it reads and, for each
    system it starts from (`needs`: name → directory), that system's recipe and results — so a system is run
    again when what it starts from was (the library's version is recorded, but an edit of the code within a
    version is not seen: --rerun NAME)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        __version__ = version("gr_jax")
    except PackageNotFoundError:
        __version__ = "unknown"
    files = [a.split("=", 1)[1] for a in argv if a.startswith("--gin_file=")]
    out = {"argv": list(argv), "gr_jax": __version__,
           "files": {str(p): file_digest(p, "gin file") for p in include_closure(files, search_paths)}}
    if needs:
        out["needs"] = {name: {"recipe": file_digest(Path(d) / "recipe.json", f"{name}'s recipe"),
                               "results": file_digest(Path(d) / "dynamic" / "dynamic.json", f"{name}'s results")}
                        for name, d in sorted(needs.items())}
    return out


def _current(paper: Paper, name: str, out: Path, dataset_files, bindings, quick: bool, search_paths) -> bool:
    """Whether OUTPUT_DIR holds a result of `name` made by the recipe it would run now (what `run_system` reuses)."""
    model_dir = out / "systems" / directory_name(name)
    rec_path = model_dir / "recipe.json"
    if not rec_path.is_file() or not (model_dir / "dynamic" / "dynamic.json").is_file():
        return False
    needs = {n: out / "systems" / directory_name(n) for n in paper.systems[name].get("needs", [])}
    if any(not (d / "recipe.json").is_file() or not (d / "dynamic" / "dynamic.json").is_file()
           for d in needs.values()):
        return False  # a system it starts from has no finished run now: its result is not current
    argv = command(paper, name, out, dataset_files, bindings, quick)
    try:
        return read_json(rec_path, "system recipe") == recipe(argv, search_paths, needs) and \
            _result_intact(model_dir) == ""
    except (OSError, ValueError) as e:  # an unreadable recipe or gin file: shown as not run, never as current
        log.warning("%s: its earlier result is not shown (%s)", name, e)
        return False


def _result_intact(model_dir: Path) -> str:
    """"" when the system's dynamic.json is the file its run wrote (the digest recorded in run_seconds.json
    then); else why not."""
    made, result = model_dir / "run_seconds.json", model_dir / "dynamic" / "dynamic.json"
    try:
        held = read_json(made, "run record") if made.is_file() else {}
    except (OSError, ValueError) as e:  # cut off or not JSON: never trusted, never fatal
        return f"{made} cannot be read ({e})"
    recorded = held.get("results_digest") if isinstance(held, dict) else None
    if not isinstance(recorded, str):
        return f"{made} records no digest of {result} (written before digests were recorded)"
    if recorded != file_digest(result, "system result"):
        return f"{result} is not the result its run wrote (its digest differs: edited or damaged)"
    return ""


def write_status(out: Path, previous, status: dict) -> None:
    """OUTPUT_DIR/reproduce_status.json: this command's statuses over those of systems it has not run (yet)."""
    kept = {k: v for k, v in previous.items() if k not in status} if isinstance(previous, dict) else {}
    make_dirs(out)
    write_text(out / "reproduce_status.json", json_text({**kept, **status}, indent=1))


def run_system(name: str, argv: Sequence[str], model_dir: Path, search_paths: Sequence[str],
               needs: Optional[dict] = None, compilation_cache: Optional[Path] = None, shared: bool = False) -> dict:
    """Runs (or reuses) one system; → {"status": "reused" | "ran" | "failed", ...}. `compilation_cache`: XLA's
    program cache the system's process shares with the others (JAX_COMPILATION_CACHE_DIR, when the caller has not
    set one): systems of one architecture compile their common programs once. `shared`: other processes use it
    at the same time, so JAX reads and writes it under its file lock (which it takes when the cache has a size)."""
    rec = recipe(argv, search_paths, needs)
    rec_path, result = model_dir / "recipe.json", model_dir / "dynamic" / "dynamic.json"
    if model_dir.exists():
        old = read_json(rec_path, "system recipe") if rec_path.is_file() else None
        if old == rec and result.is_file():
            why = _result_intact(model_dir)
            if not why:
                log.info("%s: reused (%s)", name, model_dir)
                made = model_dir / "run_seconds.json"  # the time of the run that made the reused result
                return {"status": "reused", "seconds": read_json(made, "run record").get("seconds")}
            # the recipe holds, the content does not: run again (it resumes; the result it rewrites keeps this
            # one as dynamic.json.prev-<n>)
            log.warning("%s: not reused: %s; running it again", name, why)
        if old != rec:
            kept = keep_aside(model_dir)
            log.warning("%s: its recipe changed; the earlier run is kept as %s", name, kept)
    make_dirs(model_dir)
    write_text(rec_path, json_text(rec, indent=1))
    full = [sys.executable, "-m", "gr_jax.dynamic", *argv, f"--gin.MODEL_DIR='{model_dir}'",
            *[f"--gin_search_paths={p}" for p in search_paths]]
    log_path = model_dir / "reproduce.log"
    log.info("%s: running (log: %s)", name, log_path)
    t = time.perf_counter()
    with open(log_path, "a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(full)}\n")
        out.flush()
        env = dict(os.environ)
        if compilation_cache is not None:
            env.setdefault(CACHE_VARIABLE, str(compilation_cache))
        if shared:
            env.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(CACHE_BYTES))
        rc = subprocess.run(full, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    seconds = time.perf_counter() - t
    if rc != 0 or not result.is_file():
        tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
        return {"status": "failed", "exit_code": rc, "log": str(log_path), "last_line": tail[0] if tail else "",
                "seconds": seconds}
    write_text(model_dir / "run_seconds.json",
               json_text({"seconds": seconds, "results_digest": file_digest(result, "system result")}))
    return {"status": "ran", "seconds": seconds}


# ----------------------------------------------------------------------------------------------------------
# tables and tests
# ----------------------------------------------------------------------------------------------------------


def _summary(row: Sequence[float], measure: str) -> float:
    row = [float(x) for x in row]
    return measures.forgetting(row) if measure == "initial" else measures.generalization(row)


def _rows_of(result: dict, measure: str) -> list:
    return result["initial_P_o0"] if measure == "initial" else result["new_P_oo"]


def query_groups(hits: dict, measure: str) -> list[dict]:
    """The per-query Hit@10 a table's test compares: Table 1 — Q0 after the last step (one group); Table 2 —
    Q_o after step o, o = 1..n (one group each, the statistic being the mean of the groups' means)."""
    h = hits["hits"]
    n = len(h) - 1
    if measure == "initial":
        return [h[n][0]]
    return [h[o][o] for o in range(1, n + 1)]


def statistic(groups: Sequence[np.ndarray]) -> float:
    return float(np.mean([g.mean() for g in groups if len(g)]))


def paired_randomisation(a: Sequence[np.ndarray], b: Sequence[np.ndarray], permutations: int = PERMUTATIONS,
                         seed: int = 0) -> tuple[float, float]:
    """(observed difference of the statistic, two-sided p): each query's pair of values is swapped with
    probability ½, `permutations` times (seeded); p = (1 + #{|d*| ≥ |d|}) / (1 + permutations)."""
    rng = np.random.default_rng(seed)
    diffs = [np.asarray(x, float) - np.asarray(y, float) for x, y in zip(a, b)]
    used = [d for d in diffs if len(d)]
    if not used:  # no query to compare on: no test (not the smallest p)
        return float("nan"), float("nan")
    observed = statistic(a) - statistic(b)
    total = np.zeros(permutations)
    for d in used:
        signs = rng.integers(0, 2, size=(permutations, len(d))) * 2 - 1
        total += (signs * d).mean(axis=1)
    permuted = total / len(used)
    extreme = int(np.sum(np.abs(permuted) >= abs(observed) - 1e-12))
    return observed, (1 + extreme) / (1 + permutations)


def significance(paper: Paper, table: dict, hits: dict) -> list[dict]:
    measure = table["measure"]
    kinds = ["initial", "new"] if measure == "both" else [measure]
    out = []
    rows = [r for r in table["rows"] if paper.source(r) in hits]
    for kind in kinds:
        for x, y in itertools.combinations(rows, 2):
            sx, sy = paper.source(x), paper.source(y)
            if sx == sy:
                continue
            gx, gy = query_groups(hits[sx], kind), query_groups(hits[sy], kind)
            if [sorted(g) for g in gx] != [sorted(g) for g in gy]:
                raise ReproduceError(f"systems {x!r} and {y!r} were tested on other queries; run them on the same "
                                     f"dataset and settings")
            a = [np.array([g[q] for q in sorted(g)], float) for g in gx]
            b = [np.array([g2[q] for q in sorted(g2)], float) for g2 in gy]
            diff, p = paired_randomisation(a, b, seed=int(hashlib.blake2b(f"{x}|{y}|{kind}".encode(),
                                                                          digest_size=4).hexdigest(), 16))
            out.append({"measure": kind, "a": x, "b": y, "difference": diff, "p": p,
                        "statistic": "Hit@10 on Q0 after the last step" if kind == "initial"
                        else "mean over o of Hit@10 on Q_o after step o"})
    return out


def _fmt(x) -> str:
    return "—" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.3f}"


def _ordering(values: dict, lower_better: bool) -> list[str]:
    """Names by value, best first; equal values by name (a documented key, never the table's order)."""
    return sorted(values, key=lambda n: ((values[n] if lower_better else -values[n]), n))


def table_markdown(paper: Paper, tname: str, results: dict, status: dict) -> tuple[str, dict]:
    from gr_jax.evaluation.report import markdown_table

    t = paper.tables[tname]
    measure = t["measure"]
    lines, record = [f"### {t['title']}", ""], {"rows": {}}
    if measure == "cost":
        rows = []
        for r in t["rows"]:
            src = paper.source(r)
            timing = results.get(src, {}).get("timings")
            pub = [x for x in t["published"] if x["method"] == r]
            pub_text = "; ".join(f"top-{x['topk']}: {x['latency_ms']} ms, {x['memory_MB']} MB" for x in pub)
            if timing:
                last = timing[-1]
                ms = 1000 * last["search_s"] / max(results[src]["result"]["steps"][-1]["queries"], 1)
                index_mb = results[src]["result"]["steps"][-1].get("index_mb")
                rows.append([r, f"{ms:.1f}", _fmt(index_mb), f"{last['rss_mb']:.0f}", pub_text or "—"])
                record["rows"][r] = {"latency_ms_top10": ms, "index_mb": index_mb, "rss_mb": last["rss_mb"]}
            else:
                rows.append([r, status_text(paper, r, status), "", "", pub_text or "—"])
        lines.append(markdown_table(["system", "ours: ms a query (top 10, whole batch / queries)", "ours: index MB",
                                     "ours: process MB", "published"], rows))
        lines.append("")
        lines.append("Ours: the last step's search over every test query, on this machine; the published figures' "
                     "hardware and what their memory counts are not stated.")
        return "\n".join(lines), record
    kinds = ["initial", "new"] if measure == "both" else [measure]
    lengths = [len(results[paper.source(r)]["result"]["P"]) for r in t["rows"] if paper.source(r) in results]
    n = (lengths[0] if lengths else 6) - 1
    for kind in kinds:
        rows, ours_summary, pub_summary = [], {}, {}
        for r in t["rows"]:
            src = paper.source(r)
            res = results.get(src, {}).get("result")
            pub = t["published"].get(r, {})
            if measure == "both":
                pub = {"NQ": pub.get(kind)} if pub.get(kind) else {}
            if res is not None:
                vals = _rows_of(res, kind)
                summ = _summary(vals, kind)
                ours_summary[r] = summ
                rows.append([r, "ours", *map(_fmt, vals), _fmt(summ)])
                record["rows"].setdefault(r, {})[kind] = {"ours": vals, "summary": summ}
            else:
                rows.append([r, "ours", status_text(paper, r, status), *[""] * (n + 1)])
            for ds, vals in pub.items():
                summ = _summary(vals, kind)
                if ds == "NQ":
                    pub_summary[r] = summ
                rows.append([r, f"published {ds}", *map(_fmt, vals), _fmt(summ)])
                record["rows"].setdefault(r, {}).setdefault(kind, {})[f"published_{ds}"] = vals
        name = f"F_{n} ↓" if kind == "initial" else f"GA_{n} ↑"
        lines += [f"{'Initial' if kind == 'initial' else 'New'} documents", "",
                  markdown_table(["system", "", *[f"D{o}" for o in range(n + 1)], name], rows), ""]
        both = [r for r in ours_summary if r in pub_summary]
        lower = kind == "initial"
        ours_order = _ordering({r: ours_summary[r] for r in both}, lower)
        pub_order = _ordering({r: pub_summary[r] for r in both}, lower)
        if len(both) >= 2:
            lines.append(f"Ordering by {name[:-2]} (best first), ours: {' > '.join(ours_order)}; "
                         f"published (NQ): {' > '.join(pub_order)}; Kendall τ {kendall_tau(ours_order, pub_order):.2f}")
            lines.append("")
        record[f"ordering_{kind}"] = {"ours": ours_order, "published_NQ": pub_order,
                                      "kendall_tau": kendall_tau(ours_order, pub_order) if len(both) >= 2 else None}
    return "\n".join(lines), record


def kendall_tau(a: Sequence[str], b: Sequence[str]) -> float:
    """Kendall's τ between two orderings of the same names (1: the same order, −1: reversed)."""
    pos_b = {x: i for i, x in enumerate(b)}
    pairs = list(itertools.combinations(a, 2))
    if not pairs:
        return float("nan")
    agree = sum(1 if pos_b[x] < pos_b[y] else -1 for x, y in pairs)
    return agree / len(pairs)


def status_text(paper: Paper, row: str, status: dict) -> str:
    src = paper.source(row)
    s = paper.systems[src]
    if "missing" in s:
        return f"no run: {s['missing']}"
    st = status.get(src, {})
    if st.get("status") == "failed":
        return f"failed (exit {st['exit_code']}; {st['log']})"
    if st.get("status") == "skipped":
        return f"not run: {st['why']}"
    return "no result"


def plot(paper: Paper, results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in paper.tables.get("table1", {"rows": []})["rows"] if paper.source(r) in results]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, kind, title in ((axes[0], "initial", "initial documents (Q0)"), (axes[1], "new", "new documents (Qo)")):
        for i, r in enumerate(rows):
            vals = _rows_of(results[paper.source(r)]["result"], kind)
            ax.plot(range(len(vals)), vals, "-o", color=f"C{i % 10}", label=r, markersize=3)
        ax.set_title(title)
        ax.set_xlabel("after indexing D_o")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("Hit@10")
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def reproduce(paper_name: str, output_dir: str, dataset_files: Sequence[str] = (), bindings: Sequence[str] = (),
              quick: bool = False, rerun: Sequence[str] = (), search_paths: Sequence[str] = (),
              only: Optional[Sequence[str]] = None, jobs: int = 2) -> dict:
    """Runs the systems of a paper's tables (module docstring) and writes OUTPUT_DIR/paper/. `jobs`: systems run at
    once (each its own process and directory; a system that starts from another waits for it): on a CPU one
    process compiles while the other computes."""
    paper = load_paper(paper_name, search_paths)
    out = Path(output_dir)
    wanted = [r for t in paper.tables.values() for r in t["rows"]]
    if only:
        unknown = [n for n in only if n not in paper.systems]
        if unknown:
            raise ReproduceError(f"--only names unknown systems {unknown}; {paper.path} has {list(paper.systems)}")
        wanted = list(only)
    unknown = [n for n in rerun if n not in paper.systems]
    if unknown:
        raise ReproduceError(f"--rerun names unknown systems {unknown}; {paper.path} has {list(paper.systems)}")
    for f in dataset_files:
        gin_utils.resolve(f, search_paths)  # a missing dataset file stops the command before anything runs
    runnable = order(paper, wanted)
    status: dict = {}
    previous = read_json(out / "reproduce_status.json", "reproduce status") \
        if (out / "reproduce_status.json").is_file() else {}
    finished = {name: threading.Event() for name in runnable}
    held = threading.Lock()

    def one(name: str) -> None:
        try:
            for n in paper.systems[name].get("needs", []):
                if n in finished:  # started earlier (the order puts it first, and workers take systems in order)
                    finished[n].wait()
            model_dir = out / "systems" / directory_name(name)
            with held:
                failed_needs = [n for n in paper.systems[name].get("needs", [])
                                if status.get(n, {}).get("status") in ("failed", "skipped")]
            if failed_needs:
                result = {"status": "skipped", "why": f"{failed_needs} failed"}
            else:
                if name in rerun and model_dir.exists():
                    log.warning("%s: run again as asked; the earlier run is kept as %s", name, keep_aside(model_dir))
                argv = command(paper, name, out, dataset_files, bindings, quick)
                needs = {n: out / "systems" / directory_name(n) for n in paper.systems[name].get("needs", [])}
                result = run_system(name, argv, model_dir, search_paths, needs, RunDir(out).compilation_cache,
                                    shared=jobs > 1)
                log.info("%s: %s", name, result)
            with held:
                status[name] = result
                ordered = {n: status[n] for n in runnable if n in status}  # the paper's order, not finishing order
                write_status(out, previous, ordered)  # after every system: a command stopped later keeps it
        finally:
            finished[name].set()

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, int(jobs))) as pool:
        for f in [pool.submit(one, name) for name in runnable]:
            f.result()
    status = {n: status[n] for n in runnable if n in status}
    # systems not run this time (--only) whose results are current still fill their rows
    shown = dict(status)
    for name in order(paper, [r for t in paper.tables.values() for r in t["rows"]]):
        if name not in shown and _current(paper, name, out, dataset_files, bindings, quick, search_paths):
            shown[name] = {"status": "reused"}
    results, hits = {}, {}
    for name in shown:
        d = out / "systems" / directory_name(name)
        if shown[name]["status"] in ("ran", "reused"):
            results[name] = {"result": read_json(d / "dynamic" / "dynamic.json", "dynamic result"),
                             "timings": read_json(d / "dynamic_timing.json", "dynamic timing")
                             if (d / "dynamic_timing.json").is_file() else None}
            if (d / "dynamic" / "per_query.json").is_file():
                hits[name] = read_json(d / "dynamic" / "per_query.json", "per-query hits")
    md = [f"# {paper.spec.get('paper', paper.name)}", "",
          f"Ours: {'a quick run (' + ', '.join(paper.spec.get('quick', [])) + ')' if quick else 'full settings'}"
          f"{'; dataset files ' + ', '.join(dataset_files) if dataset_files else ' on the demo corpus'}. "
          f"Published: {paper.spec.get('published_note', '')}", ""]
    record: dict = {"paper": paper.name, "quick": quick, "dataset_files": list(dataset_files), "tables": {}}
    tests: dict = {}
    for tname, t in paper.tables.items():
        text, rec = table_markdown(paper, tname, results, shown)
        md += [text, ""]
        record["tables"][tname] = rec
        if t["measure"] != "cost":
            tests[tname] = significance(paper, t, hits)
    with atomic_dir(out / "paper", keep_previous=True) as tmp:
        (tmp / "tables.md").write_text("\n".join(md))
        (tmp / "tables.json").write_text(json_text(record, indent=1))
        (tmp / "significance.json").write_text(json_text(
            {"test": f"paired randomisation, two-sided, {PERMUTATIONS} permutations, seeded", "tables": tests},
            indent=1))
        if results:
            plot(paper, results, tmp / "tables.png")
    # what ran and how long: beside the results, not in them (a reused run gives the same paper/ again)
    write_status(out, previous, status)
    return {**record, "status": status, "markdown": "\n".join(md)}
