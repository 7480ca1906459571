"""The robustness protocol (004 §3.4, §4.5, §5.2): every retriever of the library under intent-preserving query
variations, with PAG's plan-drift diagnostics where there is a planner and their analogues where there is not.

For each split, the clean queries and every variation × seed (`data.variations`, saved once in
VARIATIONS_DIR and reused, so several systems see the same variations) are retrieved by the system; then

* effectiveness of each of the system's runs and the degradation Δ = M(q) − M(q̃) (Table 6 shape);
* CandOverlap@K — of the planner's candidates (PAG: the s_simul ranking, i.e. the SimulOnly run) or of the
  final top-K (any other retriever); TokJaccard@ℓ of the planner tokens (PAG); SeqGain and PlanSwapDrop (PAG:
  the counterfactual run that decodes q̃ under the clean query's plan) (Table 7 shape);
* plan collapse (Eq. 12; per condition τ = the p-th percentile of CandOverlap@K; ΔM is the SimulOnly change
  for PAG, the end-to-end change otherwise), with sweeps over the percentile and δ (Table 8 shape);
* mean ± std over seeds and the tail quantiles p10–p90; boxplots of CandOverlap@K and TokJaccard@ℓ per split
  (Figs. 2–3).

Systems (`run_robustness.system`): 'trained' — the generative retriever in MODEL_DIR as its experiment file
configures it (DSI with any docid scheme, GLEN, MDGR, a decoder-only backbone; PAG when the model is a
`PagRetriever`); 'bm25'; 'dense' (exact inner-product search with `run_robustness.embedder`).

Outputs in OUTPUT_DIR (default MODEL_DIR/robustness): runs/<split>.<condition>.<run>.run,
robustness.json, robustness.md and <diagnostic>_<split>.png, written atomically; a result that differs from
an earlier one there is kept as `.prev-<n>`.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import gin
import numpy as np

from gr_jax.runtime import gin_checks, validation
from gr_jax.data import sources
from gr_jax.data import variations as V
from gr_jax.data.readers import Dataset, QuerySet
from gr_jax.data.trec import Run, write_run
from gr_jax.evaluation import drift
from gr_jax.evaluation.metrics import mean_metric, metric_values
from gr_jax.evaluation.retrieval import evaluation_settings
from gr_jax.evaluation.report import fmt, markdown_table
from gr_jax.runtime.progress import bar as progress_bar
from gr_jax.runtime.io_utils import write_text, json_text
from gr_jax.protocols.systems import BM25System, DenseSystem, Probe, TrainedSystem, probe, run_names
from gr_jax.runtime.validation import Count
from gr_jax.runtime.run_dir import RunDir

log = logging.getLogger(__name__)

# a trained system's beams and batch are EvalConfig's (the experiment's); these were their names here
gin_checks.renamed("EvalConfig.num_beams", "run_robustness.num_beams")
gin_checks.renamed("EvalConfig.batch_size", "run_robustness.batch_size")

CLEAN = "clean"


# ----------------------------------------------------------------------------------------------------------
# systems
# ----------------------------------------------------------------------------------------------------------


def build_system(system: str, model_dir: Optional[str], task: Optional[str], num_beams: int, batch_size: int,
                 depth: int, embedder, k: int):
    """(the system under test, its dataset, a description for the report)."""
    if system == "trained":
        if not model_dir:
            raise ValueError("run_robustness.system = 'trained' needs MODEL_DIR (a trained model)")
        sut, step = TrainedSystem.restore(model_dir, num_beams, batch_size)
        planner = sut.planner
        name = type(planner).__name__
        if planner is not None and planner.mode != planner.planned_mode:
            raise ValueError(f"the robustness protocol runs {name} in its mode {planner.planned_mode!r} (it adds the "
                             f"planning-only run and the plan swap itself), got {name}.mode = {planner.mode!r}")
        if planner is not None and k > planner.planning_size:  # D_K is a truncation of the planning set D_n
            raise ValueError(f"run_robustness.k = {k} exceeds {name}.planning_size = {planner.planning_size}: "
                             f"CandOverlap@K compares the top K of the planned candidates; lower k or raise the "
                             f"planning size")
        return sut, sut.setup.dataset, f"{sut.describe()} step {step}"
    if system not in ("bm25", "dense"):
        raise ValueError(f"run_robustness.system must be 'trained', 'bm25' or 'dense', got {system!r}")
    if not task:
        raise ValueError(f"run_robustness.system = {system!r} needs MIXTURE_OR_TASK_NAME")
    dataset = sources.load_dataset(task)
    if system == "bm25":
        return BM25System(dataset.corpus, depth), dataset, system
    if embedder is None:
        raise ValueError("run_robustness.system = 'dense' needs run_robustness.embedder (e.g. "
                         "@TfidfSvdEmbedder() or @MiniLMEmbedder())")
    return DenseSystem(dataset.corpus, depth, embedder), dataset, system


# ----------------------------------------------------------------------------------------------------------
# one condition
# ----------------------------------------------------------------------------------------------------------


def condition_diagnostics(names: tuple[str, Optional[str]], clean: Probe, varied: Probe, swapped: Optional[Run],
                          qrels, metrics: Sequence[str], primary_metric: str, threshold: int, k: int, ell: int,
                          percentile: float, delta: float, sweep_percentiles: Sequence[float],
                          sweep_deltas: Sequence[float]) -> dict:
    """Per-query values of one (split, variation, seed) against the clean queries (names in the module
    docstring); `metric values` per run, then the diagnostics on `primary_metric`. `names`: the system's
    (end-to-end run, planning-only run or None), `run_names`."""
    primary, planning = names
    out: dict[str, Any] = {"metrics": {}, "per_query": {}}
    for name in varied.runs:
        for m in metrics:
            out["metrics"][f"{name}/{m}"] = mean_metric(varied.runs[name], qrels, m, threshold)
    pm = {name: metric_values(run, qrels, primary_metric, threshold) for name, run in varied.runs.items()}
    pm_clean = {name: metric_values(run, qrels, primary_metric, threshold) for name, run in clean.runs.items()}
    pq = out["per_query"]
    for name in varied.runs:
        pq[f"degradation/{name}"] = drift.difference(pm_clean[name], pm[name])  # Δ = M(q) − M(q̃)
    candidates = planning or primary
    pq["cand_overlap"] = drift.per_query_overlap(clean.runs[candidates], varied.runs[candidates], k)
    pq["tok_jaccard"] = drift.per_query_jaccard(clean.tokens, varied.tokens, ell) if varied.tokens else None
    planning_change = drift.difference(pm[candidates], pm_clean[candidates])  # ΔM_SimulOnly (or end to end)
    pq["delta_planning"] = planning_change
    if planning:
        pq["seq_gain"] = drift.difference(pm[primary], pm[planning])
    if swapped is not None:
        pq["plan_swap_drop"] = drift.difference(pm[primary], metric_values(swapped, qrels, primary_metric,
                                                                            threshold))
    tau, flags = drift.collapse(pq["cand_overlap"], planning_change, pq["tok_jaccard"], percentile, delta)
    pq["collapsed"] = {q: float(f) for q, f in flags.items()}
    out["tau"] = tau
    out["sweep"] = drift.collapse_sweep(pq["cand_overlap"], planning_change, pq["tok_jaccard"], sweep_percentiles,
                                        sweep_deltas)
    return out


# ----------------------------------------------------------------------------------------------------------
# the protocol
# ----------------------------------------------------------------------------------------------------------


def _ordered(variations: Mapping) -> list:
    """(variation, values) in the taxonomy's order (a result read back from JSON has its keys sorted)."""
    rank = {v: i for i, v in enumerate(V.VARIATIONS)}
    return sorted(variations.items(), key=lambda kv: rank.get(kv[0], len(rank)))


def _pm(s: Mapping) -> str:
    return f"{fmt(s['mean'], 3)} ± {fmt(s['std'], 3)}" if s and not math.isnan(s["mean"]) else "–"


@gin.configurable
def run_robustness(model_dir: Optional[str] = None, task: Optional[str] = None, system: str = "trained",
                   output_dir: Optional[str] = None, variations_dir: Optional[str] = None,
                   splits: Sequence[str] = ("test",), variations: Sequence[str] = V.VARIATIONS,
                   seeds: Sequence[int] = V.SEEDS, generators: Optional[Mapping[str, Any]] = None,
                   max_queries: int = 0, metrics: Sequence[str] = ("MRR@10", "Hit@10"),
                   primary_metric: Any = "MRR@10", rel_threshold: Any = 1, k: Count = 100, ell: Count = 100,
                   num_beams: Optional[Count] = None, batch_size: Optional[Count] = None,
                   depth: Count = 100, embedder=None,
                   percentile: float = 10.0, delta: float = 0.05, sweep_percentiles: Sequence[float] = (5, 10, 25),
                   sweep_deltas: Sequence[float] = (0.025, 0.05, 0.1), progress: bool = True) -> dict:
    """The protocol (module docstring). `primary_metric` and `rel_threshold`: one value or {split: value}
    (TREC DL: nDCG@10 and 2). `generators`: {variation: generator} overriding `data.variations.generator_for`
    (e.g. the LM paraphraser). `max_queries`: the first N judged queries of each split by id (0: all). A trained
    system searches with `EvalConfig.num_beams` and `.batch_size` (`num_beams`, `batch_size`: their earlier
    names in gin; from Python, values that replace them)."""
    evaluation = evaluation_settings(num_beams=num_beams, batch_size=batch_size)
    for name, v in (("k", k), ("ell", ell), ("depth", depth)):
        validation.integer(f"run_robustness.{name}", v)
    validation.integer("run_robustness.max_queries (0: all)", max_queries, minimum=0)
    unknown = [v for v in variations if v not in V.VARIATIONS]
    if unknown or not variations:
        raise ValueError(f"run_robustness.variations: unknown {unknown} (known: {', '.join(V.VARIATIONS)})")
    if not seeds:
        raise ValueError("run_robustness.seeds is empty")
    per_split = lambda value, split: value.get(split) if isinstance(value, Mapping) else value  # noqa: E731
    sut, dataset, described = build_system(system, model_dir, task, evaluation.num_beams, evaluation.batch_size,
                                           depth, embedder, k)
    out_dir = Path(output_dir) if output_dir else (RunDir(model_dir).robustness if model_dir else None)
    if out_dir is None:
        raise ValueError("run_robustness needs OUTPUT_DIR (or MODEL_DIR)")
    var_dir = Path(variations_dir) if variations_dir else out_dir / "variations"
    missing = [s for s in splits if s not in dataset.queries]
    if missing or not splits:
        raise ValueError(f"run_robustness.splits: {missing or 'none'} not in the dataset (it has "
                         f"{sorted(dataset.queries)})")
    given = dict(generators or {})
    generators = {v: given.get(v) or V.generator_for(v) for v in variations}  # built before the check of
    gin_checks.check_bindings_used(("run_robustness",))                      # unused bindings
    out_dir.mkdir(parents=True, exist_ok=True)

    bar = progress_bar(total=len(splits) * (1 + len(variations) * len(seeds)), desc="robustness", unit="condition",
               disable=not progress)
    diagnostics = dict(k=k, ell=ell, percentile=percentile, delta=delta, sweep_percentiles=sweep_percentiles,
                       sweep_deltas=sweep_deltas)
    result: dict[str, Any] = {"system": described, "splits": {}, "k": k, "ell": ell, "percentile": percentile,
                              "delta": delta, "seeds": list(seeds)}
    for split in splits:
        queries, qrels = _judged_queries(dataset, split, max_queries)
        conditions = {v: [(seed, V.variation_set(var_dir / f"{split}.{v}.{seed}.jsonl", generators[v], queries,
                                                 seed, v)) for seed in seeds] for v in variations}
        result["splits"][split] = _split_result(
            sut, split, queries, qrels, conditions, metrics, per_split(primary_metric, split),
            int(per_split(rel_threshold, split) or 1), RunDir(out_dir).runs, diagnostics, bar.update)
    bar.close()
    primary, planning = run_names(sut)
    result["system_runs"] = {"primary": primary, "planning": planning}
    # config.gin with the results it produced: a run refused on the way (a reused file built from other
    # settings) leaves the one beside the earlier results as it was
    write_text(RunDir(out_dir).config, gin.config_str(), keep_previous=True)
    write_text(out_dir / "robustness.json", json_text(result, indent=1, sort_keys=True), keep_previous=True)
    write_text(out_dir / "robustness.md", tables_markdown(result), keep_previous=True)
    plot(result, out_dir, var_dir)
    return result


def _judged_queries(dataset: Dataset, split: str, max_queries: int) -> tuple[QuerySet, dict]:
    """The judged queries of `split` in query-id order (never the file's), the first `max_queries` (0: all),
    and their qrels."""
    qrels_all = dataset.qrels[split]
    qids = sorted(q for q in dataset.queries[split].qids if q in qrels_all)
    if max_queries:
        qids = qids[:max_queries]
    text_of = dict(zip(dataset.queries[split].qids, dataset.queries[split].texts))
    return QuerySet(qids, [text_of[q] for q in qids]), {q: qrels_all[q] for q in qids}


def _split_result(sut, split: str, queries: QuerySet, qrels, conditions: Mapping, metrics: Sequence[str],
                  metric: str, threshold: int, runs_dir: Path, diagnostics: dict, done) -> dict:
    """One split: the clean runs, then every variation × seed (`conditions`: variation → [(seed, varied
    queries)]) with its runs written and its diagnostics summarised over seeds."""
    clean = probe(sut, queries, diagnostics["ell"])
    for name, run in clean.runs.items():
        write_run(runs_dir / f"{split}.{CLEAN}.{name}.run", run)
    done(1)
    clean_metrics = {f"{name}/{m}": mean_metric(run, qrels, m, threshold) for name, run in clean.runs.items()
                     for m in metrics}
    out: dict[str, Any] = {"queries": len(queries), "primary_metric": metric, "clean": clean_metrics,
                           "variations": {}}
    for variation, varied_sets in conditions.items():
        by_seed: dict[int, dict] = {}
        for seed, varied_q in varied_sets:
            varied = probe(sut, varied_q, diagnostics["ell"])
            swapped = sut.search_with_plan(varied_q, queries) if sut.planner is not None else None
            for name, run in varied.runs.items():
                write_run(runs_dir / f"{split}.{variation}.{seed}.{name}.run", run)
            if swapped is not None:
                write_run(runs_dir / f"{split}.{variation}.{seed}.swapped.run", swapped)
            by_seed[seed] = condition_diagnostics(run_names(sut), clean, varied, swapped, qrels, metrics, metric,
                                                  threshold, **diagnostics)
            done(1)
        out["variations"][variation] = summarize(by_seed)
    return out


def summarize(by_seed: Mapping[int, Mapping]) -> dict:
    """Seed-aggregated values of one (split, variation): effectiveness and every per-query diagnostic."""
    seeds = list(by_seed)
    first = by_seed[seeds[0]]
    out: dict[str, Any] = {"metrics": {}, "diagnostics": {}, "per_seed_per_query": {}}
    for name in first["metrics"]:
        vals = [by_seed[s]["metrics"][name] for s in seeds]
        out["metrics"][name] = {"mean": float(np.mean(vals)),
                                "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0}
    for name, values in first["per_query"].items():
        if values is None:
            continue
        per = {s: by_seed[s]["per_query"][name] for s in seeds}
        out["diagnostics"][name] = drift.over_seeds(per)
        if name in ("cand_overlap", "tok_jaccard"):
            out["per_seed_per_query"][name] = {str(s): v for s, v in per.items()}
    taus = [by_seed[s]["tau"] for s in seeds]
    out["tau_mean"] = float(np.nanmean(taus)) if taus else math.nan
    rows = {}
    for s in seeds:
        for r in by_seed[s]["sweep"]:
            rows.setdefault((r["percentile"], r["delta"]), []).append(r["rate"])
    out["sweep"] = [{"percentile": p, "delta": d, "rate_mean": float(np.nanmean(v)),
                     "rate_std": float(np.nanstd(v, ddof=1)) if len(v) > 1 else 0.0}
                    for (p, d), v in sorted(rows.items())]
    return out


def tables_markdown(result: Mapping) -> str:
    primary, planning = result["system_runs"]["primary"], result["system_runs"]["planning"]
    parts = [f"# Robustness: {result['system']}\n"]
    # Table 6 shape
    run_names = [n for n in (planning, primary) if n]
    metric_names = sorted({m.split("/", 1)[1] for s in result["splits"].values() for m in s["clean"]})
    header = ["split", "variation"] + [f"{n} {m}" for n in run_names for m in metric_names]
    rows = []
    for split, s in result["splits"].items():
        rows.append([split, CLEAN] + [fmt(s["clean"].get(f"{n}/{m}", math.nan), 3) for n in run_names
                                      for m in metric_names])
        for variation, v in _ordered(s["variations"]):
            cells = []
            for n in run_names:
                for m in metric_names:
                    got = v["metrics"].get(f"{n}/{m}")
                    clean = s["clean"].get(f"{n}/{m}", math.nan)
                    cells.append(f"{_pm(got)} (Δ {fmt(clean - got['mean'], 3)})" if got else "–")
            rows.append([split, variation] + cells)
    parts.append("## Effectiveness under query variation (Δ = M(q) − M(q̃), mean over seeds; Table 6 shape)\n")
    parts.append(markdown_table(header, rows))
    # Table 7 shape
    k, ell = result["k"], result["ell"]
    header = ["split", "variation", f"CandOverlap@{k}", f"TokJaccard@{ell}", "SeqGain", "PlanSwapDrop",
              "Δ end to end"]
    rows = []
    for split, s in result["splits"].items():
        for variation, v in _ordered(s["variations"]):
            d = v["diagnostics"]
            rows.append([split, variation, _pm(d.get("cand_overlap")), _pm(d.get("tok_jaccard")),
                         _pm(d.get("seq_gain")), _pm(d.get("plan_swap_drop")), _pm(d.get(f"degradation/{primary}"))])
    what = "planner candidates (SimulOnly top-K)" if planning else "final top-K"
    parts.append(f"\n## Stability (CandOverlap of the {what}) and plan sensitivity, on "
                 f"{', '.join(sorted({s['primary_metric'] for s in result['splits'].values()}))} "
                 f"(mean ± std over seeds; Table 7 shape)\n")
    parts.append(markdown_table(header, rows))
    # tails
    header = ["split", "variation", "diagnostic", "p10", "p25", "p50", "p75", "p90"]
    rows = []
    for split, s in result["splits"].items():
        for variation, v in _ordered(s["variations"]):
            for name in ("cand_overlap", "tok_jaccard"):
                d = v["diagnostics"].get(name)
                if d:
                    rows.append([split, variation, name] + [fmt(d[f"p{p}"], 3) for p in drift.QUANTILES])
    parts.append("\n## Tail quantiles (per-query values pooled over seeds)\n")
    parts.append(markdown_table(header, rows))
    # Table 8 shape and the sweep
    header = ["split", "variation", "collapse rate (%)", "E[τ]"]
    rows = [[split, variation, f"{fmt(100 * v['diagnostics']['collapsed']['mean'], 1)} ± "
             f"{fmt(100 * v['diagnostics']['collapsed']['std'], 1)}", fmt(v["tau_mean"], 3)]
            for split, s in result["splits"].items() for variation, v in _ordered(s["variations"])]
    parts.append(f"\n## Plan collapse (Eq. 12: δ = {result['delta']}, τ = p{fmt(result['percentile'], 0)} of "
                 f"CandOverlap@{k} per split × variation × seed; Table 8 shape)\n")
    parts.append(markdown_table(header, rows))
    header = ["split", "variation", "percentile", "δ", "collapse rate (%)"]
    rows = [[split, variation, fmt(r["percentile"], 0), fmt(r["delta"], 3),
             f"{fmt(100 * r['rate_mean'], 1)} ± {fmt(100 * r['rate_std'], 1)}"]
            for split, s in result["splits"].items() for variation, v in _ordered(s["variations"]) for r in v["sweep"]]
    parts.append("\n## Collapse sweep over the percentile of τ and δ\n")
    parts.append(markdown_table(header, rows))
    return "\n".join(parts) + "\n"


def plot(result: Mapping, out_dir: Path, var_dir: Path) -> None:
    for split, s in result["splits"].items():
        for name, label in (("cand_overlap", f"CandOverlap@{result['k']}"),
                            ("tok_jaccard", f"TokJaccard@{result['ell']}")):
            groups = {variation: {int(seed): vals for seed, vals in v["per_seed_per_query"][name].items()}
                      for variation, v in _ordered(s["variations"]) if name in v["per_seed_per_query"]}
            if groups:
                drift.plot_boxes(groups, out_dir / f"{name}_{split}.png", label,
                                 f"{result['system'].split('(')[0]} — {split}\nwhiskers p10–p90, box p25–p75, "
                                 f"◆ mean ± std over seeds")
