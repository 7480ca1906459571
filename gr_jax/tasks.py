"""seqio task registrations over our readers (the adapter for users who feed t5x-style pipelines).

Imported only when seqio (and so TensorFlow) is installed: `pip install -e '.[seqio]'`. Nothing else in
gr_jax imports this module, so training, decoding and evaluation run without TensorFlow. It sits at the top of
the package, not in data/, because it joins the readers and pair builders with evaluation's metrics.

Tasks are text to text: `inputs` is a document (indexing) or a query (retrieval), `targets` the docid
*string* — by default the document's own id (DSI's "naive string" docid); pass `docid_text` to use another
scheme's string form. Splits: "train" = indexing pairs + training queries; "validation" (and "test" where the
dataset has one) = queries only, each example carrying the tab-joined docid strings of all its relevant
documents in `relevant`, which `postprocess_fn` hands to `retrieval_metrics` as the target.

    register_demo(vocab_file)                        → task "gr_jax_demo"
    register_nq320k(data_dir, vocab_file, layout)    → "gr_jax_nq320k"
    register_msmarco(data_dir, vocab_file)           → "gr_jax_msmarco"
    register_mmarco(data_dir, lang, vocab_file)      → "gr_jax_mmarco_<lang>"
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import seqio
import tensorflow as tf

from gr_jax.data import demo, readers
from gr_jax.evaluation.metrics import evaluate
from gr_jax.data.trec import run_from_rankings
from gr_jax.data.vocab import SentencePieceVocabulary
from gr_jax.data.pairs import indexing_pairs, query_pairs

log = logging.getLogger(__name__)

RANKING_METRICS = ("Hit@1", "Hit@10", "MRR@10")


def vocabulary(vocab_file: str | os.PathLike, extra_ids: int = 0) -> seqio.SentencePieceVocabulary:
    """seqio's SentencePiece vocabulary over a local model file, checked for T5's pad/eos/unk ids first."""
    SentencePieceVocabulary(vocab_file, extra_ids)  # raises a clear error for a wrong or missing file
    return seqio.SentencePieceVocabulary(str(vocab_file), extra_ids=extra_ids)


def retrieval_metrics(targets: Sequence, predictions: Sequence) -> dict[str, float]:
    """seqio metric_fn. `targets[i]`: the relevant docid strings of query i; `predictions[i]`: one docid string
    (top-1 decoding) or a ranked list of them (beam output). Returns Hit@1, Hit@10, MRR@10."""
    if len(targets) != len(predictions):
        raise ValueError(f"{len(targets)} targets but {len(predictions)} predictions")
    qrels, rankings = {}, {}
    for i, (rel, pred) in enumerate(zip(targets, predictions)):
        rel = [rel] if isinstance(rel, str) else list(rel)
        qrels[str(i)] = {d: 1 for d in rel}
        rankings[str(i)] = [pred] if isinstance(pred, str) else list(pred)
    return evaluate(run_from_rankings(rankings), qrels, RANKING_METRICS, missing_as_zero=True)


def _postprocess(output, example=None, is_target=False):
    if is_target and example is not None:
        rel = example["relevant"]
        rel = rel.decode("utf-8") if isinstance(rel, bytes) else str(rel)
        return rel.split("\t")
    return output.strip() if isinstance(output, str) else output


def _split_examples(dataset: readers.Dataset, split: str, query_split: str,
                    docid_text: Callable[[int], str]) -> dict[str, list[str]]:
    corpus = dataset.corpus
    if split == "train":
        parts = [indexing_pairs(corpus), query_pairs(dataset.queries[query_split], dataset.qrels[query_split],
                                                     corpus, name=f"{query_split} queries")]
        inputs = [t for p in parts for t in p.texts]
        targets = [docid_text(int(r)) for p in parts for r in p.rows]
        return {"inputs": inputs, "targets": targets, "relevant": targets}
    queries, qrels = dataset.queries[query_split], dataset.qrels[query_split]
    text_of = dict(zip(queries.qids, queries.texts))
    inputs, targets, relevant = [], [], []
    for qid, judged in qrels.items():
        docs = [d for d, g in sorted(judged.items(), key=lambda kv: (-kv[1], kv[0])) if g > 0]
        if not docs:
            continue
        inputs.append(text_of[qid])
        targets.append(docid_text(corpus.index_of(docs[0])))
        relevant.append("\t".join(docid_text(corpus.index_of(d)) for d in docs))
    return {"inputs": inputs, "targets": targets, "relevant": relevant}


def register_task(name: str, load: Callable[[], readers.Dataset], vocab_file: str | os.PathLike,
                  splits: Mapping[str, str], extra_ids: int = 0,
                  docid_text: Optional[Callable[[readers.Dataset], Callable[[int], str]]] = None) -> seqio.Task:
    """Register a retrieval task. `splits` maps seqio split names to the dataset's query splits, e.g.
    {"train": "train", "validation": "dev"}. `load` runs once, on first use of the task's data."""
    vocab = vocabulary(vocab_file, extra_ids)

    @functools.lru_cache(maxsize=1)
    def loaded() -> readers.Dataset:
        return load()

    def dataset_fn(split: str, shuffle_files: bool, seed: Optional[int] = None) -> tf.data.Dataset:
        del shuffle_files, seed  # examples are built in memory; seqio's shuffle buffer does the shuffling
        ds = loaded()
        to_text = docid_text(ds) if docid_text else (lambda row: str(ds.corpus.doc_ids[row]))
        ex = _split_examples(ds, split, splits[split], to_text)
        return tf.data.Dataset.from_tensor_slices({k: tf.constant(v, dtype=tf.string) for k, v in ex.items()})

    features = {"inputs": seqio.Feature(vocab, add_eos=True), "targets": seqio.Feature(vocab, add_eos=True)}
    if name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(name)
    return seqio.TaskRegistry.add(
        name,
        source=seqio.FunctionDataSource(dataset_fn, splits=list(splits)),
        preprocessors=[seqio.preprocessors.tokenize, seqio.CacheDatasetPlaceholder(),
                       seqio.preprocessors.append_eos_after_trim],
        output_features=features,
        postprocess_fn=_postprocess,
        metric_fns=[retrieval_metrics],
    )


def register_demo(vocab_file: str | os.PathLike, num_docs: int = 2000, seed: int = 0,
                  name: str = "gr_jax_demo", **kwargs) -> seqio.Task:
    return register_task(name, lambda: demo.generate(num_docs=num_docs, seed=seed), vocab_file,
                         {"train": "train", "validation": "dev", "test": "test"}, **kwargs)


_NQ_READERS = {"nci": readers.read_nq320k_nci, "glen": readers.read_nq320k_glen,
               "genret": readers.read_nq320k_genret}


def register_nq320k(data_dir: str | os.PathLike, vocab_file: str | os.PathLike, layout: str = "nci",
                    name: str = "gr_jax_nq320k", **kwargs) -> seqio.Task:
    if layout not in _NQ_READERS:
        raise ValueError(f"unknown NQ320k layout {layout!r}; one of {sorted(_NQ_READERS)}")
    return register_task(name, lambda: _NQ_READERS[layout](data_dir), vocab_file,
                         {"train": "train", "validation": "dev"}, **kwargs)


def register_msmarco(data_dir: str | os.PathLike, vocab_file: str | os.PathLike, name: str = "gr_jax_msmarco",
                     repair_utf8: bool = False, **kwargs) -> seqio.Task:
    return register_task(name, lambda: readers.read_msmarco(data_dir, repair_utf8=repair_utf8), vocab_file,
                         {"train": "train", "validation": "dev"}, **kwargs)


def register_mmarco(data_dir: str | os.PathLike, lang: str, vocab_file: str | os.PathLike,
                    query_file: Optional[str] = None, **kwargs) -> seqio.Task:
    """MS MARCO collection and qrels from `data_dir`, with the dev queries replaced by the `lang` translation
    (`data_dir/<lang>_queries.dev.tsv` unless `query_file` says otherwise). Training stays on the English
    training queries, as in the cross-lingual protocol: the index is fixed, only the queries change."""

    def load() -> readers.Dataset:
        ds = readers.read_msmarco(data_dir)
        path = Path(query_file) if query_file else Path(data_dir) / f"{lang}_queries.dev.tsv"
        ds.queries["dev"], ds.qrels["dev"] = readers.read_mmarco_queries(path, ds.qrels["dev"])
        return ds

    return register_task(f"gr_jax_mmarco_{lang}", load, vocab_file, {"train": "train", "validation": "dev"},
                         **kwargs)
