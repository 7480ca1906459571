"""Cross-lingual query shift with the index fixed (004 §4.6, §5.3; Table 9, Fig. 5): non-English queries
(mMARCO translations of an English split, same query ids, the English qrels) against the English corpus, its
docids and prefix tree unchanged. Settings (`run_cross_lingual.settings`):

* `naive` — the non-English query as it is;
* `seq_only` — PAG without its planner (sequential decoding, raw scores; PAG models only);
* `translate` — the query translated to English first (`translator`), then the unchanged system;
* `aligned` — PAG with a planner aligned to English by KL distillation (`methods.pag.align`), read from
  `aligned_dirs[language]`.

Diagnostics against the English reference (same query id): TokJaccard@ℓ of the planner tokens, CandOverlap@K of
the planned candidates (PAG) or of the final top-K (other systems), and the 10th percentile of TokJaccard@ℓ;
effectiveness of every run. Translations are saved once per language with their provenance
(`data.variations.variation_set`) and reused.

Translators (`translate(texts, language) -> texts`, `settings()`):
* `FileTranslator` — translations made elsewhere (e.g. M2M100, as 004 uses, or mMARCO's English originals):
  one `qid<TAB>text` file per language; a query without a translation is an error naming the file.
* `LMTranslator` — a decoder-only LM (default SmolLM2-135M-Instruct, offline) with a few-shot prompt, greedy.
  A 135M model translates poorly; it is what runs offline here, and the file translator is the faithful path.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import gin
import numpy as np

from gr_jax.runtime import gin_checks, validation
from gr_jax.data import variations as V
from gr_jax.data.readers import DataError, QuerySet, read_mmarco_queries, read_queries_tsv
from gr_jax.evaluation import drift
from gr_jax.evaluation.report import fmt, markdown_table
from gr_jax.runtime.io_utils import atomic_file, write_text, json_text
from gr_jax.runtime.provenance import file_digest
from gr_jax.evaluation.metrics import mean_metric
from gr_jax.evaluation.retrieval import evaluation_settings
from gr_jax.protocols.systems import Probe, TrainedSystem, probe, run_names
from gr_jax.runtime.validation import Count
from gr_jax.runtime.run_dir import RunDir

log = logging.getLogger(__name__)

# the split, beams and batch are EvalConfig's (the experiment's); these were their names here
gin_checks.renamed("EvalConfig.split", "run_cross_lingual.split", "CROSS_LINGUAL_SPLIT")
gin_checks.renamed("EvalConfig.num_beams", "run_cross_lingual.num_beams")
gin_checks.renamed("EvalConfig.batch_size", "run_cross_lingual.batch_size")

SETTINGS = ("naive", "seq_only", "translate", "aligned")
LANGUAGE_NAMES = {"de": "German", "fr": "French", "nl": "Dutch", "zh": "Chinese", "es": "Spanish", "it": "Italian",
                  "pt": "Portuguese", "ru": "Russian", "ja": "Japanese", "ar": "Arabic", "hi": "Hindi",
                  "id": "Indonesian", "vi": "Vietnamese"}


# ----------------------------------------------------------------------------------------------------------
# translators
# ----------------------------------------------------------------------------------------------------------


@gin.configurable
@dataclasses.dataclass(frozen=True)
class FileTranslator:
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)  # language → qid<TAB>English text

    def settings(self) -> dict:
        return {"translator": "file", "files": {k: str(v) for k, v in sorted(self.files.items())},
                "digests": {k: file_digest(v, f"FileTranslator.files[{k!r}]") for k, v in sorted(self.files.items())}}

    def translate(self, texts: Sequence[str], qids: Sequence[str], language: str) -> list[str]:
        if language not in self.files:
            raise ValueError(f"FileTranslator has no file for language {language!r} (it has {sorted(self.files)})")
        path = self.files[language]
        held = read_queries_tsv(path)
        text_of = dict(zip(held.qids, held.texts))
        missing = [q for q in qids if q not in text_of]
        if missing:
            raise DataError(f"{path}: no translation for {len(missing)} queries, e.g. {missing[:3]}")
        return [text_of[q] for q in qids]


# two demonstrations per language of our own (English side first), used by LMTranslator
TRANSLATION_DEMOS = {
    "de": (("where is the oldest bridge in the city", "wo ist die älteste Brücke der Stadt"),
           ("how long does it take to boil an egg", "wie lange dauert es, ein Ei zu kochen")),
    "fr": (("where is the oldest bridge in the city", "où est le plus vieux pont de la ville"),
           ("how long does it take to boil an egg", "combien de temps faut-il pour cuire un œuf")),
    "nl": (("where is the oldest bridge in the city", "waar is de oudste brug van de stad"),
           ("how long does it take to boil an egg", "hoe lang duurt het om een ei te koken")),
    "zh": (("where is the oldest bridge in the city", "城市里最古老的桥在哪里"),
           ("how long does it take to boil an egg", "煮鸡蛋需要多长时间")),
}


@gin.configurable
@dataclasses.dataclass(frozen=True)
class LMTranslator:
    lm: str = "smollm2_135m"
    max_new_tokens: Count = 32
    batch_size: Count = 16
    _loaded: Optional[tuple] = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def _context(self):
        """The LM, loaded on first use: (context, weight digest) kept on the translator."""
        if self._loaded is None:
            from gr_jax.backbones.lm import LMContext

            object.__setattr__(self, "_loaded", LMContext.load(self.lm))
        return self._loaded[0]

    def prefix(self, language: str) -> str:
        name = LANGUAGE_NAMES.get(language, language)
        demos = TRANSLATION_DEMOS.get(language, ())
        return "".join(f"{name}: {src}\nEnglish: {en}\n\n" for en, src in demos)

    def settings(self) -> dict:
        self._context()
        return {"translator": "lm", "lm": self._loaded[1], "max_new_tokens": self.max_new_tokens,
                "demonstrations": {k: [list(d) for d in v] for k, v in sorted(TRANSLATION_DEMOS.items())}}

    def translate(self, texts: Sequence[str], qids: Sequence[str], language: str) -> list[str]:
        from gr_jax.backbones import lm_generate

        ctx = self._context()
        prefix = ctx.prefix_cache(self.prefix(language))
        name = LANGUAGE_NAMES.get(language, language)
        out = []
        for start in range(0, len(texts), self.batch_size):
            prompts = [ctx.encode(f"{name}: {' '.join(t.split())}") + [ctx.newline_id] + ctx.encode("English:")
                       for t in texts[start:start + self.batch_size]]
            gen = lm_generate.generate(ctx.model, ctx.params, prompts, max_new_tokens=self.max_new_tokens,
                                       min_new_tokens=1, stop_ids=ctx.line_stops, prefix=prefix)
            out += [ctx.tok.decode(g).strip() or t for g, t in zip(gen, texts[start:start + self.batch_size])]
        return out


@dataclasses.dataclass(frozen=True)
class _AsGenerator:
    """A translator in the shape `data.variations.variation_set` saves and reuses (the seed is unused)."""

    translator: Any
    language: str

    def settings(self) -> dict:
        return {"language": self.language, **self.translator.settings()}

    def vary(self, texts, qids, seed):
        return self.translator.translate(list(texts), list(qids), self.language)


# ----------------------------------------------------------------------------------------------------------
# the protocol
# ----------------------------------------------------------------------------------------------------------


@gin.configurable
def run_cross_lingual(model_dir: str = gin.REQUIRED, languages: Mapping[str, str] = gin.REQUIRED,
                      split: Optional[str] = None, output_dir: Optional[str] = None, settings: Sequence[str] = SETTINGS,
                      translator=None, aligned_dirs: Optional[Mapping[str, str]] = None, max_queries: int = 0,
                      metrics: Sequence[str] = ("MRR@10", "Recall@10"), primary_metric: str = "MRR@10",
                      rel_threshold: int = 1, k: Count = 100, ell: Count = 100, num_beams: Optional[Count] = None,
                      batch_size: Optional[Count] = None) -> dict:
    """`languages`: {language code: mMARCO query file (qid<TAB>text) of the split's queries}. Settings that
    need what is not given are refused: 'translate' without a translator, 'aligned' without a directory per
    language, 'seq_only' for a model without that mode. The split, beams and batch size are `EvalConfig`'s
    (`split`, `num_beams`, `batch_size`: their earlier names in gin; from Python, values that replace them)."""
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown or not settings:
        raise ValueError(f"run_cross_lingual.settings: unknown {unknown} (known: {', '.join(SETTINGS)})")
    if not languages:
        raise ValueError("run_cross_lingual.languages is empty: give {language: mMARCO query file}")
    if "translate" in settings and translator is None:
        raise ValueError("setting 'translate' needs run_cross_lingual.translator (@FileTranslator() or "
                         "@LMTranslator())")
    aligned_dirs = dict(aligned_dirs or {})
    if "aligned" in settings and set(languages) - set(aligned_dirs):
        raise ValueError(f"setting 'aligned' needs run_cross_lingual.aligned_dirs for "
                         f"{sorted(set(languages) - set(aligned_dirs))} (python -m gr_jax.align_planner)")
    evaluation = evaluation_settings(split, num_beams, batch_size)
    split = evaluation.split
    for name, v in (("k", k), ("ell", ell)):
        validation.integer(f"run_cross_lingual.{name}", v)
    system, step = TrainedSystem.restore(model_dir, evaluation.num_beams, evaluation.batch_size)
    planner = system.planner
    if ("seq_only" in settings or "aligned" in settings) and planner is None:
        raise ValueError("settings 'seq_only' and 'aligned' need a model that plans (PAG in mode 'pag'); "
                         f"{system.describe()} does not")
    if planner is not None and k > planner.planning_size:
        raise ValueError(f"run_cross_lingual.k = {k} exceeds {type(planner).__name__}.planning_size = "
                         f"{planner.planning_size}: lower k or raise the planning size")
    out_dir = Path(output_dir) if output_dir else RunDir(model_dir).cross_lingual
    ds = system.setup.dataset
    if split not in ds.queries:
        raise ValueError(f"split {split!r} not in the dataset (it has {sorted(ds.queries)})")
    foreign_sets = _foreign_query_sets(languages, ds, split, max_queries)  # every file read before any write
    gin_checks.check_bindings_used(("run_cross_lingual",))
    out_dir.mkdir(parents=True, exist_ok=True)

    english_text = dict(zip(ds.queries[split].qids, ds.queries[split].texts))
    result: dict[str, Any] = {"system": f"{system.describe()} step {step}", "split": split, "k": k, "ell": ell,
                              "primary_metric": primary_metric, "languages": {}}
    for lang, q_l in foreign_sets.items():
        q_en = QuerySet(q_l.qids, [english_text[q] for q in q_l.qids])
        probes: dict[str, Probe] = {"english": probe(system, q_en, ell)}
        if "naive" in settings:
            probes["naive"] = probe(system, q_l, ell)
        if "seq_only" in settings:
            with planner.in_mode(planner.unplanned_mode):
                probes["seq_only"] = Probe({"seq_only": system.search(q_l)})
        if "translate" in settings:
            gen = _AsGenerator(translator, lang)
            q_t = V.variation_set(out_dir / "translations" / f"{split}.{lang}.jsonl", gen, q_l, 0, f"translate-{lang}")
            probes["translate"] = probe(system, q_t, ell)
        if "aligned" in settings:
            teacher = {"model_dir": str(model_dir), "step": int(step)}
            student = system.with_params(planner.aligned_params(aligned_dirs[lang], system.params, teacher))
            probes["aligned"] = probe(student, q_l, ell)
        qrels = {q: ds.qrels[split][q] for q in q_l.qids}
        result["languages"][lang] = {"queries": len(q_l), "settings": _setting_rows(
            probes, qrels, metrics, rel_threshold, run_names(system), k, ell)}
    # config.gin with the results it produced: a run refused on the way (a reused file built from other
    # settings) leaves the one beside the earlier results as it was
    write_text(RunDir(out_dir).config, gin.config_str(), keep_previous=True)
    write_text(out_dir / "cross_lingual.json", json_text(result, indent=1, sort_keys=True), keep_previous=True)
    write_text(out_dir / "cross_lingual.md", cross_lingual_markdown(result), keep_previous=True)
    plot_effectiveness(result, out_dir / "cross_lingual.png")
    return result


def _foreign_query_sets(languages: Mapping[str, str], ds, split: str, max_queries: int) -> dict[str, QuerySet]:
    """language → its judged queries of `split` that have an English original, in query-id order."""
    qrels_all = ds.qrels[split]
    english = set(ds.queries[split].qids)
    out = {}
    for lang, path in sorted(languages.items()):
        foreign, _ = read_mmarco_queries(path, qrels_all)
        qids = sorted(q for q in foreign.qids if q in english)
        if not qids:
            raise DataError(f"{path}: none of its judged query ids are in the English {split!r} queries")
        qids = qids[:max_queries] if max_queries else qids
        text_of = dict(zip(foreign.qids, foreign.texts))
        out[lang] = QuerySet(qids, [text_of[q] for q in qids])
    return out


def _setting_rows(probes: Mapping[str, Probe], qrels, metrics: Sequence[str], rel_threshold: int,
                  names: tuple, k: int, ell: int) -> dict:
    """Per setting: every run's metrics; against the English reference, CandOverlap@K of the planned candidates
    (or of the final top-K without a planner) and TokJaccard@ℓ of the planner tokens (with p10)."""
    reference = probes["english"]
    primary, planning = names
    candidates = planning or primary
    rows: dict[str, Any] = {}
    for name, got in probes.items():
        row: dict[str, Any] = {"metrics": {f"{r}/{m}": mean_metric(run, qrels, m, rel_threshold)
                                           for r, run in got.runs.items() for m in metrics}}
        if name != "english" and candidates in got.runs:
            cand = drift.per_query_overlap(reference.runs[candidates], got.runs[candidates], k)
            row["cand_overlap"] = float(np.mean(list(cand.values())))
            if got.tokens:
                vals = list(drift.per_query_jaccard(reference.tokens, got.tokens, ell).values())
                row["tok_jaccard"] = float(np.mean(vals))
                row["tok_jaccard_p10"] = float(np.percentile(vals, 10))
        rows[name] = row
    return rows


def cross_lingual_markdown(result: Mapping) -> str:
    k, ell, metric = result["k"], result["ell"], result["primary_metric"]
    langs = result["languages"]
    settings = [s for s in ("naive", "aligned", "translate") if any(s in v["settings"] for v in langs.values())]
    parts = [f"# Cross-lingual query shift, index fixed: {result['system']} ({result['split']})\n",
             "## Overlap with the English reference (Table 9 shape)\n"]
    rows = []
    for lang, v in langs.items():
        for label, key in ((f"TokJaccard@{ell}", "tok_jaccard"), (f"CandOverlap@{k}", "cand_overlap"),
                           (f"p10(TokJaccard@{ell})", "tok_jaccard_p10")):
            cells = [fmt(v["settings"][s].get(key, math.nan), 3) if s in v["settings"] else "–" for s in settings]
            if any(c not in ("–", "nan") for c in cells):
                rows.append([f"{lang} ({v['queries']} q)", label] + cells)
    parts.append(markdown_table(["language", "diagnostic"] + settings, rows))
    names = ["english"] + [s for s in SETTINGS if any(s in v["settings"] for v in langs.values())]
    run_names = sorted({r.split("/")[0] for v in langs.values() for s in v["settings"].values() for r in s["metrics"]})
    rows = []
    for lang, v in langs.items():
        for s in names:
            if s in v["settings"]:
                m = v["settings"][s]["metrics"]
                rows.append([lang, s] + [fmt(m.get(f"{r}/{metric}", math.nan), 3) for r in run_names])
    parts.append(f"\n## Effectiveness, {metric} (Fig. 5 shape)\n")
    parts.append(markdown_table(["language", "setting"] + run_names, rows))
    return "\n".join(parts) + "\n"


def plot_effectiveness(result: Mapping, path: Path) -> None:
    """Bars of the end-to-end metric per language and setting (the English reference as a line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = result["primary_metric"]
    langs = list(result["languages"])
    settings = [s for s in SETTINGS if any(s in v["settings"] for v in result["languages"].values())]
    fig, ax = plt.subplots(figsize=(1.6 * max(2, len(langs)) + 2, 3.6))
    width = 0.8 / max(1, len(settings))
    for j, s in enumerate(settings):
        vals = []
        for lang in langs:
            row = result["languages"][lang]["settings"].get(s)
            got = [v for key, v in (row or {}).get("metrics", {}).items() if key.endswith(f"/{metric}")
                   and not key.startswith("simul_only/")]
            vals.append(got[0] if got else 0.0)
        ax.bar(np.arange(len(langs)) + j * width - 0.4 + width / 2, vals, width, label=s, color=f"C{j}")
    for i, lang in enumerate(langs):
        eng = [v for key, v in result["languages"][lang]["settings"]["english"]["metrics"].items()
               if key.endswith(f"/{metric}") and not key.startswith("simul_only/")]
        if eng:
            ax.plot([i - 0.45, i + 0.45], [eng[0]] * 2, "k--", linewidth=1)
    ax.set_xticks(range(len(langs)))
    ax.set_xticklabels(langs)
    ax.set_ylabel(f"{metric} (end to end; dashed: English)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    with atomic_file(path, "wb") as f:
        fig.savefig(f, format="png", dpi=120)
    plt.close(fig)
