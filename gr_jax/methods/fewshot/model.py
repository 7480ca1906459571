"""Few-Shot GR (003_fewshot_gr.txt): training-free indexing with a pretrained decoder-only LM.

* **Prompt** (`FewShotPrompt`, the paper's Fig. 1): three demonstrations "Query: … / Identifier: a-b-c", then
  "Query: {text}" and "Identifier:"; the LM continues with a free-text docid, ended by a newline.
* **Indexing** (`DocidWriter`): n docids per document. Paper mode (`inputs='pseudo_queries'`, Eq. 1): an
  InPars-style generator (`PseudoQueryGenerator`) samples n pseudo-queries from the document, and each is
  turned into one docid greedily; `inputs='document'`: the document itself fills the query slot and n docids
  are sampled from it; `inputs='title'`: a document's docid is its title (pydoc's qualified name, `json.dumps`),
  nothing is generated — Few-Shot GR with titles as docids, so no indexing pass (one docid per document).
  Docids have 3–15 tokens (min/max new tokens; a title is kept whole). The few-shot prefix is prefilled once for
  every prompt; a document's prompt is prefilled once and shared by its n samples (`lm_generate`).
* **Bank** (`DocidBank`): every generated (document, docid) pair is kept; `resolve(policy)` gives the index's
  pairs — a docid written for several documents belongs to one of them: `'first'` (the smallest document id;
  a documented key, so the bank does not depend on the order documents were added) or `'drop'` (nobody);
  repeats within a document count once; what was dropped is reported. Documents can be added and removed:
  removal drops their pairs and may hand a shared docid to the next owner.
* **Retrieval** (`FewShotRetriever`): the query in the same prompt, constrained beam search over the bank's
  prefix tree (every docid ends with the newline token), the few-shot prefix's keys/values computed once and
  shared by all queries and beams; a docid maps to its document (one-to-many: a document is ranked at its
  best docid, `rankers.FirstOccurrence`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from pathlib import Path
from typing import Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.api import (
    Capabilities,
    clean_text,
    Count,
    leaf_documents,
    llama,
    lm_batches as batches,
    lm_generate,
    LMContext,
    Positive,
    PseudoQueryGenerator,
    rankers,
    read_records,
    records_text,
    Searcher,
    Signed,
    TrieIndex,
    write_text,
)

log = logging.getLogger(__name__)

# The demonstrations of the paper's prompt (Fig. 1: NQ training queries, docids written by its authors).
PAPER_DEMONSTRATIONS = (("Provide list of the olympic games?", "olympic-games-list"),
                        ("What is minority interest in accounting?", "subsidiary-corporation-parent"),
                        ("How does photosynthesis work in plants?", "photosynthesis-plant-process"))

@gin.configurable
@dataclasses.dataclass(frozen=True)
class FewShotPrompt:
    """The docid prompt: `prefix()` (demonstrations, shared) + `slot(text)` (one query or document)."""

    demonstrations: tuple = PAPER_DEMONSTRATIONS
    query_label: str = "Query:"
    docid_label: str = "Identifier:"

    def prefix(self) -> str:
        return "".join(f"{self.query_label} {q}\n{self.docid_label} {d}\n\n" for q, d in self.demonstrations)

    def slot(self, text: str) -> str:
        return f"{self.query_label} {clean_text(text)}\n"

    def describe(self) -> dict:
        return {"prefix": self.prefix(), "slot": self.slot("{text}") + self.docid_label}


def train_demonstrations(dataset, count: int, split: str = "train") -> tuple:
    """`count` (query, title of its relevant document) pairs of `split` for the prompt: the queries with the
    smallest blake2b hashes of their ids (a documented key: the choice depends on neither the file's order nor
    the Python process), in that order; a query judging several documents takes the smallest document id."""
    if count <= 0:
        return ()
    corpus = dataset.corpus
    if corpus.titles is None:
        raise ValueError("run_fewshot.train_demonstrations needs titles: this corpus has none")
    if split not in dataset.queries:
        raise ValueError(f"run_fewshot.train_demonstrations: no {split!r} split (the dataset has "
                         f"{sorted(dataset.queries)})")
    title = dict(zip(corpus.doc_ids, corpus.titles))
    queries, qrels = dataset.queries[split], dataset.qrels[split]
    text = dict(zip(queries.qids, queries.texts))
    key = lambda q: (hashlib.blake2b(q.encode(), digest_size=8).digest(), q)
    judged = sorted((q for q in queries.qids if any(d in title for d, g in qrels.get(q, {}).items() if g > 0)),
                    key=key)
    if len(judged) < count:
        raise ValueError(f"run_fewshot.train_demonstrations = {count}, but the {split!r} split has only "
                         f"{len(judged)} judged queries")
    return tuple((clean_text(text[q]), clean_text(title[min(d for d, g in qrels[q].items() if g > 0 and d in title)]))
                 for q in judged[:count])


@gin.configurable
@dataclasses.dataclass
class DocidWriter:
    """Writes n docids per document with the LM (see the module docstring for the two input modes)."""

    num_docids: Count = 10
    min_tokens: Count = 3
    max_tokens: Count = 15
    inputs: str = "pseudo_queries"  # or 'document', 'title'
    batch_size: Count = 16  # documents per generation batch
    max_document_tokens: Count = 160
    temperature: Positive = 1.0
    top_k: Count = 40
    seed: int = 0
    prompt: FewShotPrompt = FewShotPrompt()
    query_generator: PseudoQueryGenerator = PseudoQueryGenerator()

    def __post_init__(self):
        if self.inputs not in ("pseudo_queries", "document", "title"):
            raise ValueError(f"DocidWriter.inputs must be 'pseudo_queries', 'document' or 'title', got "
                             f"{self.inputs!r}")
        if self.inputs == "title" and self.num_docids != 1:
            raise ValueError(f"DocidWriter.inputs = 'title' writes one docid per document (its title): set "
                             f"DocidWriter.num_docids = 1, got {self.num_docids}")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"DocidWriter needs 1 ≤ min_tokens ≤ max_tokens, got {self.min_tokens}, "
                             f"{self.max_tokens}")
        if self.num_docids < 1 or self.batch_size < 1:
            raise ValueError("DocidWriter.num_docids and batch_size must be ≥ 1")

    def settings(self) -> dict:
        """What the docids depend on (a bank built with other settings is not reused): `batch_size` included, since
        a batch's documents and seed (`data.batches`) decide the samples."""
        return {"num_docids": self.num_docids, "min_tokens": self.min_tokens, "max_tokens": self.max_tokens,
                "inputs": self.inputs, "batch_size": self.batch_size, "max_document_tokens": self.max_document_tokens,
                "temperature": self.temperature, "top_k": self.top_k, "seed": self.seed,
                "prompt": None if self.inputs == "title" else self.prompt.describe(),  # titles: no prompt
                "query_generator": dataclasses.asdict(self.query_generator) if self.inputs == "pseudo_queries"
                else None}

    def _docid_prompt_tokens(self, lm: LMContext, text: str, max_text_tokens: Optional[int] = None) -> list[int]:
        """Slot tokens of `text`, then "Identifier:" (tokenized apart, so every prompt ends the same way)."""
        body = lm.encode(f"{self.prompt.query_label} ")
        t = lm.encode(clean_text(text))
        if max_text_tokens is not None:
            t = t[:max_text_tokens]
        return body + t + [lm.newline_id] + lm.encode(self.prompt.docid_label)

    def pseudo_queries(self, lm: LMContext, texts: Sequence[str], seed: int, progress=None) -> list[list[str]]:
        """n sampled pseudo-queries per text (`PseudoQueryGenerator.generate`)."""
        return self.query_generator.generate(lm, texts, self.num_docids, seed, self.batch_size, progress)

    def write(self, lm: LMContext, texts: Sequence[str], progress=None,
              titles: Optional[Sequence[str]] = None) -> tuple[list[list[list[int]]], list]:
        """(docid token lists per text — n each, repeats possible —, the inputs they were written from). With
        `inputs='title'` the docids are `titles` (the documents' own), tokenized as the prompt's docids are."""
        if self.inputs == "title":
            if titles is None or len(titles) != len(texts) or not all(t and t.strip() for t in titles):
                raise ValueError("DocidWriter.inputs = 'title' needs every document's title; this corpus has "
                                 "documents without one")
            if progress is not None:
                progress.update(len(texts))
            return [[lm.encode(f" {clean_text(t)}")] for t in titles], [[clean_text(t)] for t in titles]
        prefix = lm.prefix_cache(self.prompt.prefix())
        kw = dict(max_new_tokens=self.max_tokens, min_new_tokens=self.min_tokens, stop_ids=lm.line_stops,
                  prefix=prefix)
        n = self.num_docids
        if self.inputs == "document":
            sources = [[clean_text(t)] for t in texts]
            docids = []
            for start, end in batches(len(texts), self.batch_size):
                prompts = [self._docid_prompt_tokens(lm, t, self.max_document_tokens) for t in texts[start:end]]
                gen = lm_generate.generate(lm.model, lm.generation_params, prompts, num_samples=n, greedy=False,
                                           temperature=self.temperature, top_k=self.top_k,
                                           seed=self.seed + start, **kw)
                docids += [gen[i * n:(i + 1) * n] for i in range(end - start)]
                if progress is not None:
                    progress.update(end - start)
            return docids, sources
        sources = self.pseudo_queries(lm, texts, self.seed, progress)
        prompts = [self._docid_prompt_tokens(lm, q) for qs in sources for q in qs]
        # greedy docids of prompts batched by length (ties by position), padded to a multiple of 8 tokens:
        # about half the padded prefill of batches in document order
        order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
        gen: list = [None] * len(prompts)
        for start, end in batches(len(order), self.batch_size * n):
            rows = order[start:end]
            width = lm_generate.bucket_length(max(len(prompts[i]) for i in rows), 8)
            out = lm_generate.generate(lm.model, lm.generation_params, [prompts[i] for i in rows], greedy=True,
                                       pad_length=width, **kw)
            for i, g in zip(rows, out):
                gen[i] = g
        return [gen[i * n:(i + 1) * n] for i in range(len(texts))], sources


# ----------------------------------------------------------------------------------------------------------
# The docid bank
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class DocidBank:
    """Every generated (document id, docid tokens, docid text, source) record, in generation order per
    document. Saved as JSON lines plus a header line of what it was built from; never pickled."""

    records: list = dataclasses.field(default_factory=list)  # dicts: doc_id, tokens, text, source, k
    built_from: dict = dataclasses.field(default_factory=dict)
    stats: dict = dataclasses.field(default_factory=dict)  # e.g. generation seconds (not compared on reuse)

    def add(self, doc_ids: Sequence[str], docids: Sequence[Sequence[Sequence[int]]], texts_of, sources) -> None:
        present = {r["doc_id"] for r in self.records}
        clash = sorted(set(map(str, doc_ids)) & present)
        if clash:
            raise ValueError(f"documents {clash[:5]} are already in the docid bank; remove them first")
        for d, ids, src in zip(doc_ids, docids, sources):
            for k, tokens in enumerate(ids):
                self.records.append({"doc_id": str(d), "k": k, "tokens": [int(t) for t in tokens],
                                     "text": texts_of(tokens), "source": src[min(k, len(src) - 1)]})

    def remove(self, doc_ids: Sequence[str]) -> int:
        drop = set(map(str, doc_ids))
        before = len(self.records)
        self.records = [r for r in self.records if r["doc_id"] not in drop]
        return before - len(self.records)

    def documents(self) -> list[str]:
        return sorted({r["doc_id"] for r in self.records})

    def resolve(self, policy: str = "first", per_document: Optional[int] = None):
        """The index's (document id, docid tokens) pairs and a report. `per_document`: use only each
        document's first k generated docids (the bank of a smaller n). Empty docids are dropped."""
        if policy not in ("first", "drop"):
            raise ValueError(f"dedup policy must be 'first' or 'drop', got {policy!r}")
        owners: dict[tuple, set] = {}
        report = {"generated": 0, "empty": 0, "repeated_within_document": 0, "shared": 0}
        for r in self.records:
            if per_document is not None and r["k"] >= per_document:
                continue
            report["generated"] += 1
            key = tuple(r["tokens"])
            if not key:
                report["empty"] += 1
                continue
            docs = owners.setdefault(key, set())
            if r["doc_id"] in docs:
                report["repeated_within_document"] += 1
            docs.add(r["doc_id"])
        pairs = []
        for key, docs in owners.items():
            if len(docs) > 1:
                report["shared"] += 1
                if policy == "drop":
                    continue
            pairs.append((min(docs), list(key)))
        pairs.sort(key=lambda p: (p[0], p[1]))
        covered = {d for d, _ in pairs}
        report.update({"docids": len(pairs), "documents": len(covered),
                       "documents_without_docid": sorted(set(r["doc_id"] for r in self.records) - covered)})
        return pairs, report

    def index(self, doc_rows: dict, vocab_size: int, end_id: int, policy: str = "first",
              per_document: Optional[int] = None) -> tuple[TrieIndex, dict]:
        """The prefix tree of the resolved bank: every docid followed by `end_id` (the newline), leaves
        carrying corpus rows (`doc_rows`: document id → row)."""
        pairs, report = self.resolve(policy, per_document)
        unknown = sorted({d for d, _ in pairs if d not in doc_rows})
        if unknown:
            raise ValueError(f"the docid bank has documents not in the corpus: {unknown[:5]}; rebuild the bank "
                             f"for this corpus")
        seqs = [tokens + [end_id] for _, tokens in pairs]
        rows = [doc_rows[d] for d, _ in pairs]
        # an LM vocabulary is large (49152 for SmolLM2): a dense [nodes, V] child table per level would cost
        # nodes × V × 4 bytes and make every beam step rank V candidates; only the root level stays dense
        budget = 4 * vocab_size
        return TrieIndex.build(seqs, rows, vocab_size=vocab_size, eos_id=end_id, dense_budget_bytes=budget,
                               source="docid bank"), report

    def save(self, path: str | Path) -> None:
        write_text(Path(path), records_text({"built_from": self.built_from, "stats": self.stats}, self.records))

    @classmethod
    def load(cls, path: str | Path) -> "DocidBank":
        path = Path(path)
        head, records = read_records(path, "docid bank")
        need = {"doc_id", "k", "tokens", "text", "source"}
        bad = [i for i, r in enumerate(records) if not isinstance(r, dict) or need - set(r)]
        if "built_from" not in head or bad:
            raise ValueError(f"{path}: not a docid bank (line {bad[0] + 2 if bad else 1} lacks fields "
                             f"{sorted(need)}); delete it to regenerate")
        return cls(records, head["built_from"], head.get("stats", {}))


# ----------------------------------------------------------------------------------------------------------
# Retrieval
# ----------------------------------------------------------------------------------------------------------


@gin.configurable
class FewShotRetriever:
    """Constrained beam search of the LM over a docid bank's prefix tree. Queries are token rows of the slot
    prompt without its last token ("Identifier:" ends in ':' — the first decoding step feeds it), left-padded
    with −1; `query_tokens` makes them. It follows the model contract (`retriever/contract.py`), so
    `evaluation.retrieval.retrieve` evaluates it like any other model; nothing is trained (its parameters are
    the LM's, and `loss_fn` / `param_axes` refuse)."""

    def __init__(self, lm: LMContext, prompt: FewShotPrompt = FewShotPrompt(), max_query_tokens: Count = 48,
                 ranker=None, length_penalty: Signed = 0.0):
        self.lm, self.prompt, self.max_query_tokens = lm, prompt, max_query_tokens
        self.length_penalty = length_penalty  # finished beams score / len ** length_penalty (0: the paper's sum)
        self.ranker = ranker if ranker is not None else rankers.FirstOccurrence()
        tail = lm.encode(prompt.docid_label)
        self.start_token = tail[-1]
        self._tail = tail[:-1]
        self._searchers: dict[int, Searcher] = {}
        # no demonstrations (zero-shot): no shared prefix
        self.params = {"lm": lm.params, "prefix": lm.prefix_cache(prompt.prefix()) if prompt.prefix() else None}

    @property
    def config(self):
        return self.lm.model.config

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities()

    def describe(self) -> str:
        return f"FewShotRetriever(lm={self.lm.name!r})"

    def init_params(self, seed: int = 0) -> dict:
        return self.params  # the pretrained LM and its prefilled prompt: nothing random

    def _training_free(self, what: str):
        raise ValueError(f"Few-Shot GR is training-free: FewShotRetriever has no {what}")

    def param_axes(self, params) -> dict:
        self._training_free("sharded training state (param_axes)")

    def loss_fn(self, params, batch, dropout_rng=None):
        self._training_free("objective (loss_fn)")

    def use_docids(self, table) -> None:
        """The bank's index carries its documents; no docid table is read."""

    def decode_docids(self, params, doc_tokens):
        raise ValueError("FewShotRetriever writes docids with an LM prompt (DocidWriter), it does not decode them "
                         "from parameters")

    def query_tokens(self, texts: Sequence[str]) -> np.ndarray:
        rows = []
        for t in texts:
            body = self.lm.encode(clean_text(t))[:self.max_query_tokens]
            rows.append(self.lm.encode(f"{self.prompt.query_label} ") + body + [self.lm.newline_id] + self._tail)
        return lm_generate.left_pad(rows, -1)[0]  # −1 marks padding (`_cache` masks it)

    def _cache(self, params, query_tokens, max_length: int):
        model = self.lm.model
        B, T = query_tokens.shape
        mask = query_tokens >= 0
        cache = model.apply({"params": params["lm"]}, B, T + max_length + 1, params["prefix"],
                            method=llama.Llama.init_cache)
        _, cache = model.apply({"params": params["lm"]}, cache, jnp.maximum(query_tokens, 0), mask,
                               method=llama.Llama.prefill_hidden)
        return cache

    def _step(self, params, cache, tokens):
        return self.lm.model.apply({"params": params["lm"]}, cache, tokens, method=llama.Llama.decode_step)

    def _search_params(self, params):
        """The LM's layers stacked once a search (`llama.with_stacked_layers`), when its network scans them."""
        if self.lm.model.scan_layers:
            return {**params, "lm": llama.with_stacked_layers(params["lm"], self.lm.model.config)}
        return params

    def searcher(self, num_beams: int) -> Searcher:
        if num_beams not in self._searchers:
            self._searchers[num_beams] = Searcher(
                self._step, self._cache, start_token=self.start_token, eos_id=self.lm.newline_id,
                vocab_size=self.lm.model.config.vocab_size, num_beams=num_beams, score_mode="log_softmax",
                length_penalty=self.length_penalty,
                tile_fn=lambda cache, n: cache.repeat(n), params_fn=self._search_params,
                scan_levels=True)  # the bank's runs of levels as one body each: a new bank compiles 2.6× faster
        return self._searchers[num_beams]

    def predict_arrays(self, params, query_tokens, index, num_beams: int = 10):
        # int32 always: the evaluation batches store narrower ints, and another dtype would compile again
        query_tokens = np.asarray(query_tokens).astype(np.int32)
        res = self.searcher(num_beams).search(params, query_tokens, index.device())
        docs, valid = leaf_documents(index.device_payload(), jnp.where(res.valid, res.leaf_ids, -1))
        return jax.device_get((docs, valid, res.scores))

    def rank(self, params, query_tokens, index, num_beams: int = 10):
        docs, valid, scores = self.predict_arrays(params, query_tokens, index, num_beams)
        return self.ranker(docs, valid, scores)
