"""Work over a corpus in document-id batches, resumable: LM-written outputs per document (docid banks,
pseudo-queries) are written a batch at a time and saved after each, so an interrupted run resumes where it
stopped and gives the same file as an uninterrupted one.

* `restrict(dataset, n)` — the first n documents by document id and the queries judged only on them;
* `pending_batches(corpus, batch_size, done, path)` — the batches still to write, cut in document-id order;
* `batch_seed(seed, b)` — batch b's sampling seed (a batch's samples do not depend on where a run stopped).
"""

from __future__ import annotations

from pathlib import Path

from gr_jax.data.readers import Corpus, Dataset


def restrict(dataset: Dataset, max_documents: int) -> Dataset:
    """The first `max_documents` documents by document id, and the queries whose relevant documents are all
    among them (qrels cut alike). 0: the whole dataset."""
    if not max_documents or max_documents >= len(dataset.corpus):
        return dataset
    c = dataset.corpus
    rows = sorted(range(len(c)), key=lambda r: c.doc_ids[r])[:max_documents]
    keep = {c.doc_ids[r] for r in rows}
    rows.sort()
    corpus = Corpus([c.doc_ids[r] for r in rows], [c.texts[r] for r in rows],
                    None if c.titles is None else [c.titles[r] for r in rows],
                    None if c.urls is None else [c.urls[r] for r in rows])
    qrels = {s: {q: rel for q, rel in qr.items() if set(rel) <= keep} for s, qr in dataset.qrels.items()}
    queries = {s: qs.subset(qrels.get(s, {})) for s, qs in dataset.queries.items()}
    return Dataset(corpus, queries, qrels, dataset.extras)


def batch_seed(seed: int, batch: int) -> int:
    """The sampling seed of batch `batch` of a corpus written in document-id order."""
    return seed + 1000003 * batch


def pending_batches(corpus: Corpus, batch_size: int, done: set, path: Path) -> list[tuple[int, list[int]]]:
    """(batch number, rows) of the batches still to write: the corpus in document-id order, cut every
    `batch_size` documents — so batches (and their seeds) do not depend on the corpus order or on where a
    run was interrupted. `done`: the document ids already in the file at `path`; a batch is written whole or
    not at all, so a partly written one means the file was edited (an error)."""
    order = sorted(range(len(corpus)), key=lambda r: corpus.doc_ids[r])
    todo = []
    for b, start in enumerate(range(0, len(order), batch_size)):
        rows = order[start:start + batch_size]
        written = sum(corpus.doc_ids[r] in done for r in rows)
        if written == len(rows):
            continue
        if written:
            raise ValueError(f"{path}: batch {b} is partly written; delete the file to write it again")
        todo.append((b, rows))
    return todo
