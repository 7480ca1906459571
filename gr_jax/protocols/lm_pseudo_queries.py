"""Pseudo-queries written by a decoder-only LM (InPars-style, `models.lm.PseudoQueryGenerator`) for every document
of a corpus, saved once with their provenance and reused:

* `PseudoQueryDocids(source='file', queries_file=...)` names documents by them (docT5query / DSI-QG style);
* `Objectives.pseudo_queries_file` trains on them (generated query → document: the synthetic-query objective
  of DSI-QG / MDGR), for the documents the run trains on;
* Few-Shot GR's docid writer draws its pseudo-queries the same way (`DocidWriter(inputs='pseudo_queries')`).

File (`MODEL_DIR/pseudo_queries.jsonl`): the first line `{"built_from": {...}, "stats": {...}}` (LM file digest,
corpus fingerprint, generator settings, n, seed, batch size), then `{"doc_id": ..., "queries": [...]}` per
document, in document-id order. It is written batch by batch (documents in document-id order, `batch_size` a
batch, batch b sampled with its own seed), so an interrupted run resumes where it stopped and gives the same
file as an uninterrupted one; a file built from anything else is refused, never overwritten.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Optional

import gin

from gr_jax.runtime import gin_checks, validation
from gr_jax.data import sources
from gr_jax.data.readers import Corpus, DataError
from gr_jax.runtime.progress import bar as progress_bar
from gr_jax.runtime.io_utils import write_text
from gr_jax.backbones.lm import LMContext, PseudoQueryGenerator
from gr_jax.data.batches import batch_seed, pending_batches, restrict
from gr_jax.runtime.provenance import normalized, read_records, records_text, reuse
from gr_jax.runtime.validation import Count
from gr_jax.runtime.run_dir import RunDir

log = logging.getLogger(__name__)

QUERIES_FILE = "pseudo_queries.jsonl"


@dataclasses.dataclass
class GeneratedQueries:
    """doc_id → its generated queries (in sampling order, repeats kept), with what they were built from."""

    queries: dict
    built_from: dict
    stats: dict = dataclasses.field(default_factory=dict)

    def save(self, path: Path) -> None:
        rows = [{"doc_id": d, "queries": self.queries[d]} for d in sorted(self.queries)]
        write_text(path, records_text({"built_from": self.built_from, "stats": self.stats}, rows))

    @classmethod
    def load(cls, path: Path) -> "GeneratedQueries":
        head, rows = read_records(path, "pseudo-query file")
        bad = [i for i, r in enumerate(rows) if not (isinstance(r, dict) and isinstance(r.get("doc_id"), str)
                                                     and isinstance(r.get("queries"), list))]
        if not isinstance(head, dict) or "built_from" not in head or bad:
            raise DataError(f"{path}: not a pseudo-query file of this library (line {bad[0] + 2 if bad else 1}); "
                            f"delete it to regenerate")
        return cls({r["doc_id"]: r["queries"] for r in rows}, head["built_from"], head.get("stats", {}))


def generate_for_corpus(lm: LMContext, corpus: Corpus, generator: PseudoQueryGenerator,
                        num_queries: int, seed: int, batch_size: int, path: Path, built_from: dict,
                        progress: bool = True, on_start=None) -> GeneratedQueries:
    """Writes (or resumes, or reuses) the pseudo-queries of every document of `corpus` at `path`. `on_start()`
    runs once a file already there has been accepted (a refused run has written nothing by then)."""
    held = reuse(path, built_from, GeneratedQueries.load, "the pseudo-query file")
    if on_start is not None:
        on_start()
    if held is None:
        held = GeneratedQueries({}, normalized(built_from))
    todo = pending_batches(corpus, batch_size, set(held.queries), path)
    if not todo:
        return held
    bar = progress_bar(total=len(corpus), initial=len(corpus) - sum(len(r) for _, r in todo), desc="pseudo-queries",
               unit="doc", disable=not progress, mininterval=5.0)
    for b, rows in todo:
        t = time.time()
        texts = generator.generate(lm, [corpus.texts[r] for r in rows], num_queries, batch_seed(seed, b),
                                   batch_size=len(rows))
        held.queries.update({corpus.doc_ids[r]: qs for r, qs in zip(rows, texts)})
        held.stats["generation_seconds"] = round(held.stats.get("generation_seconds", 0.0) + time.time() - t, 1)
        held.save(path)
        bar.update(len(rows))
    bar.close()
    return held


@gin.configurable
def write_pseudo_queries(model_dir: str = gin.REQUIRED, task: str = gin.REQUIRED, lm: str = "smollm2_135m",
                         generator: Optional[PseudoQueryGenerator] = None, num_queries: Count = 5,
                         seed: int = 0, batch_size: Count = 16, max_documents: int = 0) -> dict:
    """`num_queries` pseudo-queries for every document of `task` (the first `max_documents` by id; 0: all),
    written to MODEL_DIR/pseudo_queries.jsonl. Returns a summary (file, documents, queries, distinct, seconds)."""
    generator = generator if generator is not None else PseudoQueryGenerator()
    for name, v in (("num_queries", num_queries), ("batch_size", batch_size)):
        validation.integer(f"write_pseudo_queries.{name}", v)
    model_dir = Path(model_dir)
    corpus = restrict(sources.load_dataset(task), max_documents).corpus
    ctx, lm_digest = LMContext.load(lm)
    gin_checks.check_bindings_used(("write_pseudo_queries",))
    model_dir.mkdir(parents=True, exist_ok=True)
    built_from = {"lm": lm_digest, "corpus": corpus.fingerprint(), "generator": dataclasses.asdict(generator),
                  "num_queries": num_queries, "seed": seed, "batch_size": batch_size}
    path = model_dir / QUERIES_FILE
    held = generate_for_corpus(ctx, corpus, generator, num_queries, seed, batch_size, path, built_from,
                               on_start=lambda: write_text(RunDir(model_dir).config, gin.config_str(),
                                                           keep_previous=True))
    summary = {"file": str(path), "documents": len(held.queries),
               "queries": sum(len(q) for q in held.queries.values()),
               "distinct_per_document": round(sum(len(set(q)) for q in held.queries.values())
                                              / max(1, len(held.queries)), 3),
               "generation_seconds": held.stats.get("generation_seconds", 0.0)}
    log.info("pseudo-queries: %s", summary)
    return summary
