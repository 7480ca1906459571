"""Few-Shot GR's own command (`python -m gr_jax.methods.fewshot.command`, or `python -m gr_jax.fewshot`), the
protocol of 003_fewshot_gr.txt: index a corpus with an LM-written docid bank (no training),
retrieve with the same LM under the bank's prefix tree, and report effectiveness for several bank sizes n
(docids per document; the paper's Fig. 2), the indexing time and the latency per query (Table 3 shape), with
BM25 on the same queries.

The bank is written once to MODEL_DIR/docid_bank.jsonl, in batches of documents taken in document-id order
(so it does not depend on the corpus order) and saved after each batch: an interrupted run resumes where it
stopped and gives the same bank. A bank written by another LM, another corpus or other writer settings is
refused (its first line records what it was built from). The bank of a smaller n is the first n docids of
each document of the n_max bank (the samples of a document are drawn independently).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import gin

from gr_jax.methods.api import (
    batch_seed,
    BM25,
    Command,
    Corpus,
    Count,
    evaluate,
    evaluation_settings,
    gin_checks,
    json_text,
    LMContext,
    markdown_table,
    normalized,
    pending_batches,
    progress_bar,
    restrict,
    retrieve,
    reuse,
    RunDir,
    sources,
    write_qrels,
    write_run,
    write_text,
)
from gr_jax.methods.fewshot import model as fewshot

log = logging.getLogger(__name__)

# the split, beams and query batch are EvalConfig's; these were their names here
gin_checks.renamed("EvalConfig.split", "run_fewshot.split")
gin_checks.renamed("EvalConfig.num_beams", "run_fewshot.num_beams")
gin_checks.renamed("EvalConfig.batch_size", "run_fewshot.batch_size")

BANK_FILE = "docid_bank.jsonl"


def build_bank(lm: LMContext, corpus: Corpus, writer: fewshot.DocidWriter, path: Path,
               built_from: dict, progress: bool = True, on_start=None) -> fewshot.DocidBank:
    """Writes (or resumes, or reuses) the docid bank of `corpus` at `path`. `on_start()` runs once a bank already
    there has been accepted (a refused run has written nothing by then)."""
    bank = reuse(path, built_from, fewshot.DocidBank.load, "the docid bank")
    if on_start is not None:
        on_start()
    if bank is None:
        bank = fewshot.DocidBank(built_from=normalized(built_from))
    todo = pending_batches(corpus, writer.batch_size, set(bank.documents()), path)
    if not todo:
        return bank
    bar = progress_bar(total=len(corpus), initial=len(corpus) - sum(len(r) for _, r in todo), desc="docid bank",
               unit="doc", disable=not progress, mininterval=5.0)
    t0 = time.time()
    for b, rows in todo:
        w = dataclasses.replace(writer, seed=batch_seed(writer.seed, b))
        t = time.time()
        titles = [corpus.titles[r] for r in rows] if corpus.titles is not None else None
        docids, srcs = w.write(lm, [corpus.texts[r] for r in rows], titles=titles)
        bank.add([corpus.doc_ids[r] for r in rows], docids, lm.tok.decode, srcs)
        bank.stats["generation_seconds"] = round(bank.stats.get("generation_seconds", 0.0) + time.time() - t, 1)
        bank.save(path)
        bar.update(len(rows))
    bar.close()
    log.info("docid bank: %d documents in %.0f s", len(corpus), time.time() - t0)
    return bank


@gin.configurable
def run_fewshot(model_dir: str = gin.REQUIRED, task: str = gin.REQUIRED, lm: str = "smollm2_135m",
                writer: Optional[fewshot.DocidWriter] = None, bank_sizes: Sequence[int] = (1, 3, 10),
                policy: str = "first", split: Optional[str] = None, num_beams: Optional[Count] = None,
                batch_size: Optional[Count] = None,
                max_queries: int = 0, max_documents: int = 0, max_query_tokens: Count = 48,
                metrics: Sequence[str] = ("Hit@1", "Hit@10", "MRR@10"), compare_bm25: bool = True,
                train_demonstrations: int = 0) -> dict:
    """Few-Shot GR on `task`: the docid bank, then retrieval of `split` for each bank size; writes
    MODEL_DIR/{docid_bank.jsonl, fewshot.json, fewshot.md, runs/<split>.fewshot_n<n>.run}. The split, beams and
    query batch are `EvalConfig`'s (`split`, `num_beams`, `batch_size`: their earlier names in gin; from Python,
    values that replace them). `train_demonstrations` > 0: the prompt's demonstrations are that many training
    queries with their documents' titles (`fewshot.train_demonstrations`; for title docids)."""
    writer = writer if writer is not None else fewshot.DocidWriter()
    sizes = sorted(set(int(n) for n in bank_sizes))
    if not sizes or sizes[0] < 1 or sizes[-1] > writer.num_docids:
        raise ValueError(f"run_fewshot.bank_sizes must lie in 1..DocidWriter.num_docids ({writer.num_docids}), "
                         f"got {list(bank_sizes)}")
    evaluation = evaluation_settings(split, num_beams, batch_size)
    split, num_beams, batch_size = evaluation.split, evaluation.num_beams, evaluation.batch_size
    model_dir = Path(model_dir)
    dataset = restrict(sources.load_dataset(task), max_documents)
    if split not in dataset.queries:
        raise ValueError(f"split {split!r} not in the dataset (it has {sorted(dataset.queries)})")
    if train_demonstrations:
        demos = fewshot.train_demonstrations(dataset, train_demonstrations)
        writer = dataclasses.replace(writer, prompt=dataclasses.replace(writer.prompt, demonstrations=demos))
    ctx, lm_digest = LMContext.load(lm)
    retriever = fewshot.FewShotRetriever(ctx, writer.prompt, max_query_tokens=max_query_tokens)
    gin_checks.check_bindings_used(("run_fewshot",))
    model_dir.mkdir(parents=True, exist_ok=True)
    built_from = {"lm": lm_digest, "corpus": dataset.corpus.fingerprint(), "writer": writer.settings()}
    t0 = time.time()
    bank = build_bank(ctx, dataset.corpus, writer, model_dir / BANK_FILE, built_from,
                      on_start=lambda: write_text(RunDir(model_dir).config, gin.config_str(), keep_previous=True))
    index_seconds = time.time() - t0

    qrels = dataset.qrels[split]
    queries = dataset.queries[split]
    qids = sorted(q for q in queries.qids if q in qrels)
    if max_queries:
        qids = qids[:max_queries]
    text_of = dict(zip(queries.qids, queries.texts))
    tokens = retriever.query_tokens([text_of[q] for q in qids])
    sub = {q: qrels[q] for q in qids}
    rows = {d: i for i, d in enumerate(dataset.corpus.doc_ids)}

    results = {"lm": lm, "split": split, "queries": len(qids), "documents": len(dataset.corpus),
               "num_beams": num_beams, "policy": policy, "writer": writer.settings(),
               "prompt": writer.prompt.describe(), "bank_sizes": {}}
    # timings change from run to run: kept apart from the results, so that a re-run writes the same results
    timing = {"bank_generation_seconds": bank.stats.get("generation_seconds"),
              "bank_seconds_this_run": round(index_seconds, 1), "ms_per_query": {}}
    for n in sizes:
        index, report = bank.index(rows, ctx.model.config.vocab_size, ctx.newline_id, policy=policy, per_document=n)
        report["documents_without_docid"] = len(report["documents_without_docid"])
        retriever.rank(retriever.params, tokens[:batch_size], index, num_beams)  # compile, not timed
        t = time.time()
        run = retrieve(retriever, retriever.params, tokens, qids, index, dataset.corpus.doc_ids, num_beams,
                       batch_size)
        ms = 1000 * (time.time() - t) / max(len(qids), 1)
        write_run(RunDir(model_dir).run_file(f"{split}.fewshot_n{n}.run"), run)
        results["bank_sizes"][str(n)] = {"metrics": evaluate(run, sub, list(metrics), 1, missing_as_zero=True),
                                         "bank": report}
        timing["ms_per_query"][str(n)] = round(ms, 1)
        log.info("n = %d: %s (%.0f ms/query)", n, results["bank_sizes"][str(n)]["metrics"], ms)
    if compare_bm25:
        bm25 = BM25.build(list(dataset.corpus.doc_ids), list(dataset.corpus.texts))
        bm25_run = bm25.search(qids, [text_of[q] for q in qids], k=max(10, num_beams))
        results["bm25_metrics"] = evaluate(bm25_run, sub, list(metrics), 1, missing_as_zero=True)
    # the qrels of the evaluated queries: any other system's run compares on the same queries with
    # python -m gr_jax.eval --run RUN --qrels MODEL_DIR/runs/<split>.qrels --msmarco_official
    write_qrels(RunDir(model_dir).run_file(f"{split}.qrels"), sub)
    write_text(model_dir / "fewshot.json", json_text(results, indent=1), keep_previous=True)
    write_text(model_dir / "fewshot.md", tables_markdown(results) + "\n", keep_previous=True)
    write_text(model_dir / "timing.json", json_text(timing, indent=1))  # a measurement of this run only
    results["timing"] = timing
    return results


def tables_markdown(results: dict) -> str:
    """The results table; with `results['timing']` (the command's printout) also ms/query of this run."""
    names = None
    rows = []
    timing = results.get("timing")
    for n, r in results["bank_sizes"].items():
        names = names or list(r["metrics"])
        ms = [f"{timing['ms_per_query'][n]:.0f}"] if timing else []
        rows.append([f"Few-Shot GR, n = {n}", *[f"{r['metrics'][m]:.4f}" for m in names], *ms,
                     str(r["bank"]["docids"])])
    if "bm25_metrics" in results:
        rows.append(["BM25", *[f"{results['bm25_metrics'][m]:.4f}" for m in names], *([""] if timing else []), ""])
    head = f"{results['split']}: {results['queries']} queries, {results['documents']} documents, LM {results['lm']}"
    if timing and timing.get("bank_generation_seconds") is not None:
        head += f"; docid bank written in {timing['bank_generation_seconds']:.0f} s"
    cols = ["system", *names, *(["ms/query"] if timing else []), "docids"]
    return head + "\n\n" + markdown_table(cols, rows)


FEWSHOT = Command("fewshot", """python -m gr_jax.fewshot --gin_file=FILE [--gin_file=...] [--gin.NAME=VALUE ...] [--gin_search_paths=A,B]

Few-Shot GR (methods/fewshot/command.py): an LM writes a docid bank for the corpus (no training), then retrieves
with constrained beam search over it; writes MODEL_DIR/{docid_bank.jsonl, fewshot.json, fewshot.md, runs/}
and prints the table (one row per bank size n, BM25 beside). E.g. experiments/demo/fewshot_smollm2.gin.""",
                  lambda: run_fewshot, lambda result: "\n" + tables_markdown(result) + "\n", root="run_fewshot")


def main(argv=None) -> int:
    return FEWSHOT.main(argv)


if __name__ == "__main__":
    sys.exit(main())
