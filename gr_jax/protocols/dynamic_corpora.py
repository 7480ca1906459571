"""The dynamic-corpora protocol of 000_dynamic_corpora.txt as one function (`python -m gr_jax.dynamic`).

1. Split the corpus (data/splits.py): D0 = 50% of the documents, D1..D5 = 10% each; training queries of D0
   documents are P0, test queries follow their relevant document into Q0..Q5.
2. Build the system on D0 only: BM25 over D0; a dense index with an embedder fitted on D0; or a generative
   retriever (any docid scheme, MDGR included) trained on D0 by `compose.train` (or restored from
   its checkpoint in OUTPUT_DIR/model when the command is re-run).
3. For o = 1..5: index D_o without refitting (BM25 re-indexed; dense: the D0 encoder encodes D_o; GR: the
   docid scheme assigns docids to D_o with its D0 centroids/codebooks/vocabulary and `TrieIndex.insert` adds
   them), optionally fine-tune (DSI++-style replay, `Replay`), then evaluate Hit@10 on Q0..Q_o.
4. Write P (P[o][j] = Hit@10 on Q_j after indexing D1..D_o), F_n and GA_n (n = 1..5), IDBI per step (over
   the queries Q0..Q_o, top-10), the time and memory of every step, markdown tables shaped like Tables 1–2
   of the paper, and a plot of Hit@10 over D0..D5 for initial vs new documents.

Corpus rows: the protocol reorders the corpus as D0, D1, ..., D5, so a D0 row is the same row in the D0
dataset the model is trained on and in the full corpus the index grows over.

Order never changes a number: the split is drawn over the sorted document ids, the rows of each part, the
training queries (sorted by id) and their judgements come in an order fixed by the ids, and every ranker and
baseline breaks score ties by document id (trec_eval's order) — so permuting the corpus rows, the queries or
the qrels leaves P, F_n, GA_n and IDBI unchanged (tests/protocols/test_dynamic_corpora.py checks it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import resource
import time
from pathlib import Path
from typing import Optional, Sequence

import gin
import numpy as np

from gr_jax.runtime import gin_checks, host_memory, validation
from gr_jax.data import sources
from gr_jax.data.readers import Corpus, Dataset, QuerySet
from gr_jax.data.splits import PROTOCOLS, DynamicSplit, dynamic_split, pooled_qrels
from gr_jax.evaluation import dynamic_measures as measures
from gr_jax.evaluation.metrics import evaluate
from gr_jax.data.trec import Run, ranked
from gr_jax.docids.embed import TfidfSvdEmbedder
from gr_jax.evaluation.retrieval import evaluation_settings
from gr_jax.runtime.compile_clock import CompileClock
from gr_jax.runtime.compile_clock import compilation_cache as compilation_cache_in
from gr_jax.runtime.progress import bar as progress_bar
from gr_jax.runtime.io_utils import atomic_dir, json_text, write_text
from gr_jax.runtime.provenance import file_digest
from gr_jax.protocols.systems import BM25System, DenseSystem, ProtocolError, TrainedSystem
from gr_jax.runtime.validation import Count, Fraction, Positive
from gr_jax.runtime.run_dir import RunDir

log = logging.getLogger(__name__)

gin_checks.renamed("EvalConfig.batch_size", "run_dynamic.eval_batch_size")  # its earlier name here

METHODS = ("bm25", "dense", "gr")


# ----------------------------------------------------------------------------------------------------------
# memory
# ----------------------------------------------------------------------------------------------------------


def rss_bytes() -> int:
    """Resident memory of this process now (Linux /proc; falls back to the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def available_bytes() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


@dataclasses.dataclass
class MemoryGuard:
    """Stops a step *before* it runs when its estimated need would push the process past `limit` bytes
    (default: 90% of what this process has now plus what the machine has available), so a too-large step
    fails with a message instead of sending the machine into swap."""

    limit: Optional[int] = None

    def __post_init__(self):
        if self.limit is None:
            avail = available_bytes()
            self.limit = int(0.9 * (rss_bytes() + avail)) if avail is not None else None

    def check(self, what: str, need_bytes: int) -> None:
        if self.limit is None:
            return
        now = rss_bytes()
        if now + need_bytes > self.limit:
            raise ProtocolError(f"{what}: needs about {need_bytes / 2**20:.0f} MiB more on top of "
                                f"{now / 2**20:.0f} MiB in use, above the memory limit of "
                                f"{self.limit / 2**20:.0f} MiB; use fewer documents per step, a smaller "
                                f"batch, or raise run_dynamic.memory_limit_mb")


# ----------------------------------------------------------------------------------------------------------
# the split as datasets
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class DynamicData:
    split: DynamicSplit
    full: Dataset  # corpus rows ordered D0, D1, ..., Dn
    d0: Dataset  # the first |D0| rows, P0 as its training split
    part_rows: list[np.ndarray]  # rows of D_o in `full`
    test_texts: dict[str, str]
    test_qrels: dict


def _subset(values, rows):
    return None if values is None else [values[int(r)] for r in rows]


def make_dynamic_data(dataset: Dataset, seed: int = 0, initial_fraction: float = 0.5, n_parts: int = 5,
                      train_split: str = "train", test_split: str = "test", split_protocol: str = "dataset",
                      test_fraction: float = 0.2) -> DynamicData:
    """The corpus reordered D0, D1, ..., Dn, D0 with its training queries P0, and the test queries of every part
    (`data.splits`: 'dataset' keeps the dataset's query splits, 'paper' pools them as 000 does)."""
    for split in (train_split, test_split):
        if split not in dataset.queries:
            raise ProtocolError(f"the dataset has no {split!r} queries (it has {sorted(dataset.queries)})")
    c = dataset.corpus
    try:
        split = dynamic_split(list(c.doc_ids), dataset.qrels[train_split], dataset.qrels[test_split], seed=seed,
                              initial_fraction=initial_fraction, n_parts=n_parts, protocol=split_protocol,
                              test_fraction=test_fraction)
    except ValueError as e:
        raise ProtocolError(f"run_dynamic: {e}") from None
    order = np.array([c.index_of(d) for part in split.parts for d in part], np.int64)
    full_corpus = Corpus([c.doc_ids[i] for i in order], [c.texts[i] for i in order], _subset(c.titles, order),
                         _subset(c.urls, order))
    bounds = np.cumsum([0] + [len(p) for p in split.parts])
    part_rows = [np.arange(bounds[o], bounds[o + 1]) for o in range(len(split.parts))]
    n0 = len(split.parts[0])
    d0_corpus = Corpus(full_corpus.doc_ids[:n0], full_corpus.texts[:n0], _subset(full_corpus.titles, range(n0)),
                       _subset(full_corpus.urls, range(n0)))
    train_q, test = dataset.queries[train_split], dataset.queries[test_split]
    train_qrels, test_qrels = dataset.qrels[train_split], dataset.qrels[test_split]
    text_of, test_text = dict(zip(train_q.qids, train_q.texts)), dict(zip(test.qids, test.texts))
    if split_protocol == "paper":  # both splits' queries are pooled, P0 and Q0 drawn from D0's
        clash = [q for q in sorted(set(text_of) & set(test_text)) if text_of[q] != test_text[q]]
        if clash:
            raise ProtocolError(f"query ids {clash[:3]} have other texts in the {train_split!r} and the "
                                f"{test_split!r} split; the paper's split pools them, so each id must name one query")
        text_of = test_text = {**text_of, **test_text}
        train_qrels = test_qrels = pooled_qrels(train_qrels, test_qrels)
    missing = [q for q in split.train_queries if q not in text_of]
    if missing:
        raise ProtocolError(f"{len(missing)} judged {train_split!r} queries have no text, e.g. {missing[:3]}")
    qids = list(split.train_queries)  # sorted by id: the training data do not depend on the query file's order
    d0_train = QuerySet(qids, [text_of[q] for q in qids])
    in_d0 = set(split.parts[0])
    d0_qrels = {q: {d: g for d, g in sorted(train_qrels[q].items()) if d in in_d0} for q in qids}
    d0 = Dataset(d0_corpus, {train_split: d0_train}, {train_split: d0_qrels})
    full = Dataset(full_corpus, dataset.queries, dataset.qrels)
    return DynamicData(split, full, d0, part_rows, test_text, test_qrels)


# ----------------------------------------------------------------------------------------------------------
# systems (protocols/systems.py): each indexes D0 at construction, then `add(rows)` and `search(queries)`
# ----------------------------------------------------------------------------------------------------------


@gin.configurable
@dataclasses.dataclass
class Replay:
    """DSI++-style incremental training after indexing each D_o: `steps` updates on `replay_pairs` (the new
    documents mixed with a `replay_fraction` share of old ones) through the trainer's loop (sharding, NaN guard,
    checkpoints in MODEL_DIR/model/replay/D<o>; a re-run resumes). `sam_rho` > 0 trains with sharpness-aware
    minimisation, as DSI++ does. `memory_file` (pseudo-queries, e.g. of `python -m gr_jax.pseudo_queries`) is
    DSI++'s generative memory: old documents are replayed by their pseudo-queries instead of their text, and
    the new documents' pseudo-queries join their indexing pairs."""

    steps: int = 100
    batch_size: Count = 32
    learning_rate: Positive = 1e-3
    replay_fraction: Fraction = 0.5
    seed: int = 0
    sam_rho: float = 0.0
    memory_file: Optional[str] = None

    def __post_init__(self):
        validation.number("Replay.sam_rho (0: no SAM)", self.sam_rho, positive=False, minimum=0.0)
        if self.memory_file is not None and not Path(self.memory_file).is_file():
            raise ProtocolError(f"Replay.memory_file: {self.memory_file} is not a file; write pseudo-queries "
                                f"with python -m gr_jax.pseudo_queries or unset it")

    def record(self) -> dict:
        """The settings as the replay checkpoints record them: the memory file by its digest; `sam_rho` and the
        memory only when set, so that the replay runs made before they existed resume."""
        out = dataclasses.asdict(self)
        if not out["sam_rho"]:
            del out["sam_rho"]
        if out["memory_file"] is None:
            del out["memory_file"]
        else:
            out["memory_file"] = file_digest(self.memory_file, "Replay.memory_file (pseudo-queries)")
        return out


def trained_system(data: DynamicData, model_dir: Path, k: int, eval_batch: Optional[int] = None) -> TrainedSystem:
    """A generative retriever trained on D0 by `compose.train` (or resumed from MODEL_DIR/model), over the whole
    corpus (its D0 rows first); new documents get docids from the frozen scheme and go into its prefix tree. It
    searches with EvalConfig's beams (at least k) and batch size (`eval_batch`, from Python, replaces it)."""
    from gr_jax import compose

    summary = gin_checks.call_configured(lambda: compose.train(model_dir=str(model_dir), dataset=data.d0,
                                                              final_eval=False))
    eval_config = evaluation_settings(batch_size=eval_batch)
    setup = dataclasses.replace(summary["setup"], iterator=None)  # the training data is not needed now
    if setup.table.index_kind == "substrings":  # room for every part: the search keeps its shapes over the run
        setup.index.reserve(sum(len(r) for r in data.part_rows) / max(len(data.part_rows[0]), 1))
    system = TrainedSystem(setup, summary["state"]["params"], max(eval_config.num_beams, k), eval_config.batch_size,
                           corpus=data.full.corpus)
    system.check_can_add()
    return system


def replay_pairs(data: DynamicData, new_rows, r: Replay, part: int) -> tuple[list, list]:
    """The pairs of DSI++'s continued training after indexing part `part`, with their mixture rates: the new
    documents' indexing pairs (and their pseudo-queries from the generative memory) at 1 − `replay_fraction`;
    a seeded sample of the earlier documents — as many as `replay_fraction` asks — replayed by their indexing
    pairs (or their pseudo-queries from the memory) and their P0 training queries, at `replay_fraction`."""
    from gr_jax.data.pairs import document_query_pairs, indexing_pairs, query_pairs
    from gr_jax.docids.pseudo_query import read_queries_file

    corpus = data.full.corpus
    rng = np.random.default_rng([r.seed, part])
    indexed = sum(len(p) for p in data.part_rows[:part])  # rows D0..D_{part-1}: the first ones of the corpus
    old = np.arange(indexed, dtype=np.int64)
    n_old = int(round(len(new_rows) * r.replay_fraction / max(1 - r.replay_fraction, 1e-9)))
    old_pick = np.sort(rng.choice(old, size=min(n_old, len(old)), replace=False)) if n_old and len(old) \
        else old[:0]
    memory = None if r.memory_file is None else read_queries_file(r.memory_file)
    remember = lambda rows, name: document_query_pairs(memory, corpus, name=name, restrict_rows=rows,  # noqa: E731
                                                       source=r.memory_file)
    new_parts = [indexing_pairs(corpus, new_rows)] + ([remember(new_rows, "memory-new")] if memory else [])
    new_parts = [p for p in new_parts if len(p)]
    parts, rates = list(new_parts), [(1.0 - r.replay_fraction) / len(new_parts)] * len(new_parts)
    if len(old_pick):
        d0 = data.d0
        split = next(iter(d0.queries))  # the training split the protocol kept for D0 (P0)
        old_parts = [remember(old_pick, "memory-old") if memory else indexing_pairs(corpus, old_pick),
                     query_pairs(d0.queries[split], d0.qrels[split], corpus, restrict_rows=old_pick)]
        old_parts = [p for p in old_parts if len(p)]
        parts += old_parts
        rates += [r.replay_fraction / len(old_parts)] * len(old_parts)
    return parts, rates


def replay_fine_tune(system: TrainedSystem, data: DynamicData, new_rows, r: Replay, part: int, model_dir: Path) -> None:
    """DSI++'s continued training after indexing part `part` on `replay_pairs` (with SAM when `r.sam_rho` > 0);
    checkpoints in MODEL_DIR/model/replay/D<part>."""
    from gr_jax import compose

    parts, rates = replay_pairs(data, new_rows, r, part)
    system.params = compose.fine_tune(
        system.setup, system.params, parts, rates, system.table, model_dir=model_dir / "replay" / f"D{part}",
        steps=r.steps, batch_size=r.batch_size, learning_rate=r.learning_rate, seed=r.seed + part,
        sam_rho=r.sam_rho, meta_extra={"replay_part": part, "replay": r.record()})


# ----------------------------------------------------------------------------------------------------------
# the protocol
# ----------------------------------------------------------------------------------------------------------


def summarize(P: np.ndarray) -> dict:
    """F_n and GA_n (n = 1..N) of a performance matrix, plus its rows as the paper's tables print them."""
    P = np.asarray(P, float)
    out = measures.from_matrix(P)
    out["initial_P_o0"] = P[:, 0].tolist()
    out["new_P_oo"] = np.diag(P).tolist()
    return out


def query_hits(run: Run, qrels, qids, k: int = 10) -> dict[str, int]:
    """Hit@k of each judged query (1: a relevant document among its first k in trec_eval's order)."""
    out = {}
    for q in qids:
        if q in qrels:
            relevant = {d for d, g in qrels[q].items() if g > 0}
            out[q] = int(any(d in relevant for d in ranked(run.get(q, {}))[:k]))
    return out


def _hit10(run: Run, qrels, qids) -> float:
    qids = [q for q in qids if q in qrels]
    if not qids:
        return float("nan")
    return evaluate({q: run.get(q, {}) for q in qids}, {q: qrels[q] for q in qids}, ["Hit@10"],
                    missing_as_zero=True)["Hit@10"]


@gin.configurable
def run_dynamic(output_dir: str = gin.REQUIRED, method: str = "gr", task: str = gin.REQUIRED, seed: int = 0,
                initial_fraction: Fraction = 0.5, n_parts: Count = 5, train_split: str = "train",
                test_split: str = "test", split_protocol: str = "dataset", test_fraction: Fraction = 0.2,
                k: Count = 10, embedder=None, replay: Optional[Replay] = None,
                eval_batch_size: Optional[Count] = None, max_test_queries_per_part: int = 0,
                memory_limit_mb: Optional[int] = None, label: Optional[str] = None, progress: bool = True,
                release_programs: bool = True, compilation_cache: bool = True) -> dict:
    """Runs the protocol for one system and writes OUTPUT_DIR/{dynamic.json, dynamic.md, dynamic.png}.
    `release_programs`: after a step that took new programs (its index took other shapes), drop the programs JAX
    holds (kept, they grew SEAL's demo run from 1.5 to 3.1 GB over five steps when its index changed shapes at every
    step, and a prefix tree's static tables stay referenced by them); a step that took none keeps them for the
    next, and so do D0's first search and the step after a drop. It empties JAX's caches for the whole process: a
    caller that runs the protocol beside programs of its own it wants kept sets it False.
    `compilation_cache`: XLA's programs are kept on disk (OUTPUT_DIR/xla_cache, or the folder
    JAX_COMPILATION_CACHE_DIR names: `reproduce` shares one over its systems), so a step whose index kept its shapes
    (a substring index within its reserved room, a prefix tree) reads its programs back instead of compiling them. A trained
    system searches with EvalConfig's beams and batch size (`eval_batch_size`: the batch's earlier name in gin;
    from Python, a value that replaces it)."""
    _validate(method, k, n_parts, seed, max_test_queries_per_part, memory_limit_mb,
              initial_fraction)
    out_dir = Path(output_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ProtocolError(f"MODEL_DIR {out_dir} is a file, not a directory; choose another MODEL_DIR")
    if split_protocol not in PROTOCOLS:
        raise ProtocolError(f"run_dynamic.split_protocol must be one of {PROTOCOLS}, got {split_protocol!r}")
    # the data is read and split before anything is made in MODEL_DIR: a refused run leaves it as it was
    data = make_dynamic_data(sources.load_dataset(task), seed, initial_fraction, n_parts, train_split, test_split,
                             split_protocol, test_fraction)
    cache = compilation_cache_in(RunDir(out_dir).compilation_cache, 0.0) if compilation_cache else \
        contextlib.nullcontext()
    with cache:  # the steps' programs, dropped from memory between steps, are read back, not recompiled
        guard = MemoryGuard(None if memory_limit_mb is None else int(memory_limit_mb) << 20)
        parts_q = [q[:max_test_queries_per_part] if max_test_queries_per_part else q for q in data.split.test_queries]
        log.info("dynamic split: %s documents, %s test queries", [len(p) for p in data.split.parts],
                 [len(q) for q in parts_q])

        t0 = time.perf_counter()
        d0_rows = data.part_rows[0]
        if method == "bm25":
            system = BM25System(data.full.corpus, k, rows=d0_rows)
        elif method == "dense":
            system = DenseSystem(data.full.corpus, k, embedder if embedder is not None else TfidfSvdEmbedder(),
                                 rows=d0_rows, training=(data.d0, train_split, RunDir(out_dir).model.root))
            label = label or f"dense-{system.embedder_name}"  # the embedder tells dense systems apart in a report
        else:
            system = trained_system(data, RunDir(out_dir).model.root, k, eval_batch_size)
            label = label or f"gr-{system.setup.scheme.name}" + ("++" if replay is not None else "")
        gin_checks.check_bindings_used("run_dynamic")
        released = False
        if release_programs:
            host_memory.release_between_steps()  # training's programs are not needed again
        steps = [{"step": 0, "documents": len(data.part_rows[0])}]
        timings = [{"step": 0, "index_s": time.perf_counter() - t0}]

        n = len(data.split.parts) - 1
        P = np.full((n + 1, n + 1), np.nan)
        per_query: list = []  # per_query[o][j]: {query id: Hit@10} of Q_j after indexing D_o
        idbi_per_step: list[Optional[float]] = [None]
        why_null = {"idbi[0]": "D0 only: no new documents to be biased against"}
        label = label or method
        bar = progress_bar(total=n + 1, desc=f"dynamic {label}", unit="step", disable=not progress)
        for o in range(n + 1):
            if o > 0:
                rows = data.part_rows[o]
                guard.check(f"step {o} (indexing {len(rows)} documents)", system.estimate_bytes(rows))
                t = time.perf_counter()
                with CompileClock() as clock:
                    info = system.add(rows)
                    if method == "gr" and replay is not None and replay.steps > 0:
                        replay_fine_tune(system, data, rows, replay, o, RunDir(out_dir).model.root)
                steps.append({"step": o, **info})
                timings.append({"step": o, "index_s": time.perf_counter() - t - clock.seconds,
                                "index_compile_s": clock.seconds})
                compiled, loaded = clock.programs, clock.loaded
            else:
                compiled = loaded = 0  # the first search's programs: the next step's, unless the index changes shapes
            P[o, : o + 1], idbi, timing = _evaluate_step(system, data, parts_q, o)
            per_query.append(timing.pop("hits"))
            steps[-1]["queries"] = timing.pop("queries")
            if release_programs:
                # a step that took new programs — compiled, or read back from the cache: the index took other
                # shapes — drops them all; one that took none keeps them, and so do D0's first search and the step
                # after a drop (it reads back what the drop took: only programs it compiled count there)
                new = compiled + timing["compiled_programs"]
                if not released:
                    new += loaded + timing["cached_programs"]
                released = o > 0 and new > 0
                host_memory.release_between_steps(programs=released)
            timings[-1].update(timing, rss_mb=host_memory.resident_mb())  # after indexing and evaluating D_o
            if o > 0:
                if not len(data.part_rows[o]):
                    idbi, why_null[f"idbi[{o}]"] = None, f"D{o} added no documents"
                elif idbi is None:
                    why_null[f"idbi[{o}]"] = "no test query returned a document"
                idbi_per_step.append(idbi)
            log.info("step %d: %s", o, {"P": [round(float(x), 4) for x in P[o, : o + 1]], **steps[-1], **timings[-1]})
            bar.set_postfix(P_oo=f"{P[o, o]:.3f}", P_o0=f"{P[o, 0]:.3f}")
            bar.update(1)
            if not np.isfinite(P[o]).any() and o == 0:
                raise ProtocolError("no test queries for D0: check test_split and the split of the dataset")
        bar.close()

        for o in range(n + 1):
            for j in range(o + 1):
                if not np.isfinite(P[o, j]):
                    why_null[f"P[{o}][{j}]"] = f"no test queries for D{j}"
        why_null["P[o][j], j > o"] = "not evaluated: D_j is not indexed yet at step o"
        result = {"method": label, "P": P.tolist(), "idbi": idbi_per_step, "steps": steps,
                  "parts": [len(p) for p in data.split.parts], "test_queries": [len(q) for q in parts_q],
                  "seed": seed, "split_protocol": split_protocol, **summarize(P), "null_means": why_null}
        write_outputs(out_dir, result, timings, per_query)
        return {**result, "timings": timings}


def _validate(method: str, k: int, n_parts: int, seed: int, max_test_queries_per_part: int,
              memory_limit_mb: Optional[int], initial_fraction: float) -> None:
    if method not in METHODS:
        raise ProtocolError(f"run_dynamic.method must be one of {METHODS}, got {method!r}")
    validation.integer("run_dynamic.k", k)
    validation.integer("run_dynamic.n_parts", n_parts)
    validation.integer("run_dynamic.seed", seed, minimum=0)
    validation.integer("run_dynamic.max_test_queries_per_part (0: all)", max_test_queries_per_part, minimum=0)
    if memory_limit_mb is not None:
        validation.integer("run_dynamic.memory_limit_mb", memory_limit_mb)
    if not 0 < validation.number("run_dynamic.initial_fraction", initial_fraction) < 1:
        raise ProtocolError(f"run_dynamic.initial_fraction must be in (0, 1), got {initial_fraction}")


def _evaluate_step(system, data: DynamicData, parts_q: Sequence[Sequence[str]], o: int):
    """After indexing D_o: Hit@10 on Q0..Q_o (row o of P), IDBI over those queries (None at step 0 or when no
    query returned anything), and the step's search time, query count and memory."""
    qids = [q for j in range(o + 1) for q in parts_q[j]]
    t = time.perf_counter()
    with CompileClock() as clock:
        run = system.search(QuerySet(qids, [data.test_texts[q] for q in qids])) if qids else {}
    elapsed = time.perf_counter() - t
    timing = {"search_s": elapsed - clock.seconds, "compile_s": clock.seconds, "compiled_programs": clock.programs,
              "cached_programs": clock.loaded, "compiled": clock.names, "queries": len(qids),
              "rss_mb": rss_bytes() / 2**20}
    row = np.array([_hit10(run, data.test_qrels, parts_q[j]) for j in range(o + 1)])
    hits = [query_hits(run, data.test_qrels, parts_q[j]) for j in range(o + 1)]
    for j, h in enumerate(hits):  # the per-query record must give the table's number
        if h and abs(np.mean(list(h.values())) - row[j]) > 1e-9:
            raise AssertionError(f"per-query Hit@10 of Q{j} at step {o} averages {np.mean(list(h.values()))}, "
                                 f"the evaluation gave {row[j]}")
    timing["hits"] = hits
    idbi = None
    if o > 0 and qids:
        initial = set(data.split.parts[0])
        rankings = {q: ranked(run.get(q, {})) for q in qids}
        n_total = sum(len(p) for p in data.split.parts[: o + 1])
        value = measures.idbi(rankings, initial, len(initial), n_total, k=10)
        idbi = value if np.isfinite(value) else None
    return row, idbi, timing


# ----------------------------------------------------------------------------------------------------------
# reports
# ----------------------------------------------------------------------------------------------------------


def tables_markdown(results: Sequence[dict]) -> str:
    """Tables 1 and 2 of the paper: Hit@10 on initial (P_o0) and new (P_oo) documents, F_n / GA_n."""
    from gr_jax.evaluation.report import markdown_table

    n = len(results[0]["P"]) - 1
    heads = [f"D{o}" for o in range(n + 1)]
    fmt = lambda x: "—" if x is None or not np.isfinite(x) else f"{x:.3f}"
    t1 = markdown_table(["method", *heads, f"F_{n} ↓"],
                        [[r["method"], *map(fmt, r["initial_P_o0"]), fmt(r[f"F_{n}"])] for r in results])
    t2 = markdown_table(["method", *heads, f"GA_{n} ↑"],
                        [[r["method"], *map(fmt, r["new_P_oo"]), fmt(r[f"GA_{n}"])] for r in results])
    t3 = markdown_table(["method", *[f"D{o}" for o in range(1, n + 1)]],
                        [[r["method"], *map(fmt, r["idbi"][1:])] for r in results])
    return (f"Initial documents (Hit@10 on Q0 after indexing D1..Do; Table 1)\n\n{t1}\n\n"
            f"New documents (Hit@10 on Qo after indexing Do; Table 2)\n\n{t2}\n\n"
            f"Initial-document bias IDBI (top 10, queries Q0..Qo; Figure 1)\n\n{t3}\n")


def plot(results: Sequence[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 3.8))
    for i, r in enumerate(results):
        xs = np.arange(len(r["P"]))
        color = f"C{i}"
        ax.plot(xs, r["initial_P_o0"], "-o", color=color, label=f"{r['method']}: initial (Q0)")
        ax.plot(xs, r["new_P_oo"], "--s", color=color, label=f"{r['method']}: new (Qo)")
    ax.set_xticks(np.arange(len(results[0]["P"])))
    ax.set_xticklabels([f"D{o}" for o in range(len(results[0]["P"]))])
    ax.set_ylabel("Hit@10")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(out_dir: Path, result: dict, timings: Optional[list] = None,
                  per_query: Optional[list] = None) -> None:
    """OUTPUT_DIR/dynamic/ (results: a re-run with equal results replaces it quietly, a different one is kept
    as dynamic.prev-<n>) and OUTPUT_DIR/dynamic_timing.json (the seconds and memory of the latest run only: per
    step index_s and search_s without compilation, index_compile_s and compile_s the compilation inside them,
    compiled_programs the programs XLA compiled for the search — 0 when the step reused the compiled search —,
    cached_programs those read back from the compilation cache instead, compiled the compiled ones by name).
    `per_query` goes to dynamic/per_query.json: {"hits": [[{query id: Hit@10} of Q_j, j ≤ o] after D_o]}, what
    paired significance tests between systems read."""
    with atomic_dir(out_dir / "dynamic", keep_previous=True) as tmp:
        (tmp / "dynamic.json").write_text(json_text(result, indent=1))
        if per_query is not None:
            (tmp / "per_query.json").write_text(json_text({"hits": per_query}))
        (tmp / "dynamic.md").write_text(tables_markdown([result]))
        plot([result], tmp / "dynamic.png")
    if timings is not None:
        write_text(out_dir / "dynamic_timing.json", json_text(timings, indent=1))
