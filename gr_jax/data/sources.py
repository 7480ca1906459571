"""Datasets by name, for gin (`MIXTURE_OR_TASK_NAME`) — the non-seqio path the trainer uses.

    demo            the embedded demo corpus (no files; `demo_docs`, `demo_seed`)
    pydoc           the Python standard library's documentation, real English from the install itself
                    (no files; `data/pydoc.py`; `pydoc_documents` keeps a subset)
    nq320k_nci      NQ320k, NCI layout        nq320k_glen  GLEN layout      nq320k_genret  GenRET layout
    msmarco         MS MARCO passage (collection.tsv, queries.{train,dev}.tsv, qrels.{train,dev}.tsv)
    jsonl           corpus.jsonl + queries.<split>.jsonl + qrels.<split>.tsv (users' own data)
    tsv             corpus.tsv (id, text[, title]: DPR's and SEAL's psgs_w100.tsv, header included) +
                    queries.<split>.tsv (qid, query) + qrels.<split>.tsv

A name that needs files checks `data_dir` for them first and says which are missing and what to set.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Optional

import gin

from gr_jax.data import demo, pydoc, readers

_REQUIRED = {
    "nq320k_nci": ["NQ_doc_content.tsv", "nq_train_doc_newid.tsv", "nq_dev_doc_newid.tsv"],
    "nq320k_glen": ["DOC_NQ_*.tsv", "GTQ_NQ_train.tsv", "GTQ_NQ_dev.tsv"],
    "nq320k_genret": ["corpus_lite.json", "train.json", "dev.json"],
    "msmarco": ["collection.tsv", "queries.train.tsv", "queries.dev.tsv", "qrels.train.tsv", "qrels.dev.tsv"],
    "jsonl": ["corpus.jsonl", "queries.train.jsonl", "qrels.train.tsv"],
    "tsv": ["corpus.tsv", "queries.*.tsv", "qrels.*.tsv"],
}
BUILT_IN = ("demo", "pydoc")
NAMES = (*BUILT_IN, *_REQUIRED)


def _read_jsonl_dataset(d: Path, suffix: str = ".jsonl") -> readers.Dataset:
    corpus = readers.read_corpus(d / f"corpus{suffix}")
    queries, qrels = {}, {}
    for path in sorted(d.glob(f"queries.*{suffix}")):
        split = path.name[len("queries."):-len(suffix)]
        queries[split] = readers.read_queries(path)
        qrels[split] = readers.read_qrels_checked(d / f"qrels.{split}.tsv", queries[split], corpus)
    return readers.Dataset(corpus, queries, qrels)


def check_data_dir(name: str, data_dir: Optional[str]) -> None:
    if name not in NAMES:
        raise ValueError(f"unknown dataset {name!r} (MIXTURE_OR_TASK_NAME); one of {list(NAMES)}")
    if name in BUILT_IN:
        return
    if not data_dir:
        raise ValueError(f"dataset {name!r} needs its files: set --gin.DATA_DIR=\\\"path/to/{name}\\\"")
    d = Path(data_dir)
    if not d.is_dir():
        raise ValueError(f"DATA_DIR {d} is not a directory (dataset {name!r})")
    missing = [f for f in _REQUIRED[name] if not glob.glob(str(d / f))]
    if missing:
        raise ValueError(f"DATA_DIR {d} lacks the files of dataset {name!r}: {missing}; point --gin.DATA_DIR at "
                         f"the directory that holds them")


def _read_msmarco_splits(d: Path, query_files: dict) -> readers.Dataset:
    """MS MARCO's collection.tsv with query splits from the given files: {split: [queries file, qrels file]},
    relative to DATA_DIR (e.g. PAG's `raw.tsv` query files, TREC DL 19/20 topics and graded qrels)."""
    corpus = readers.read_msmarco_collection(d / "collection.tsv")
    queries, qrels = {}, {}
    for split, files in query_files.items():
        if not isinstance(files, (list, tuple)) or len(files) != 2:
            raise ValueError(f"load_dataset.query_files[{split!r}] must be [queries file, qrels file], got {files!r}")
        for f in files:
            if not (d / f).is_file():
                raise ValueError(f"load_dataset.query_files[{split!r}]: {d / f} does not exist")
        queries[split] = readers.read_queries_tsv(d / files[0])
        qrels[split] = readers.read_qrels_checked(d / files[1], queries[split], corpus)
    return readers.Dataset(corpus, queries, qrels)


@gin.configurable
def load_dataset(name: str = gin.REQUIRED, data_dir: Optional[str] = None, demo_docs: int = 2000,
                 demo_seed: int = 0, query_files: Optional[dict] = None, pydoc_documents: int = 0) -> readers.Dataset:
    """`query_files` (msmarco only): {split: [queries tsv, qrels]} under DATA_DIR instead of the default
    queries.{train,dev}.tsv / qrels.{train,dev}.tsv."""
    if query_files and name != "msmarco":
        raise ValueError(f"load_dataset.query_files is for the msmarco layout, not {name!r}")
    if query_files:
        if not data_dir or not Path(data_dir).is_dir() or not (Path(data_dir) / "collection.tsv").is_file():
            raise ValueError(f"dataset 'msmarco' needs DATA_DIR with collection.tsv (got {data_dir!r})")
        return _read_msmarco_splits(Path(os.fspath(data_dir)), dict(query_files))
    check_data_dir(name, data_dir)
    if name == "demo":
        return demo.generate(num_docs=demo_docs, seed=demo_seed)
    if name == "pydoc":
        return pydoc.generate(max_documents=pydoc_documents)
    d = Path(os.fspath(data_dir))
    loaders = {"nq320k_nci": readers.read_nq320k_nci, "nq320k_glen": readers.read_nq320k_glen,
               "nq320k_genret": readers.read_nq320k_genret, "msmarco": readers.read_msmarco,
               "jsonl": _read_jsonl_dataset, "tsv": lambda d: _read_jsonl_dataset(d, ".tsv")}
    return loaders[name](d)
