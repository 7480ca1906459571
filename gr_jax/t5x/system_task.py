"""The system a `RetrieverModel` built, as a seqio task: what `t5x.eval` and `t5x.infer` read, score and write.

`register(name, setup, eval_config)` adds the task `name` (the experiment's MIXTURE_OR_TASK_NAME). Its examples
are the judged queries of a split of the experiment's dataset, taken by query id and tokenized with the run's
vocabulary exactly as `gr_jax.infer` does (`compose.evaluate_split`), so t5x decodes what we decode:

  inputs                 the query's tokens (`ModelVocabulary`: the run's vocabulary as seqio's)
  targets                the docid tokens of its best judged document (what `score_batch` scores; ties of grade by
                         document id), or nothing when the docids are not target sequences (substring indexes)
  qid, split, inputs_pretokenized, targets_pretokenized (the query's judgements as JSON)

The model's predictions are ranked corpus rows: id r + 1 is row r, 0 pads (`DocumentVocabulary`, which decodes
them to document ids), with their scores in the aux value "scores". The metric function gives our metrics
(`EvalConfig.metrics`: Hit@k, MRR@10, nDCG@10, ... at the split's relevance threshold) from our evaluation code,
so `t5x.eval` reports what `gr_jax.infer` (runs/eval.gin) reports. `write_run_chunk` / `merge_runs` are t5x.infer's
`write_fn` / `merge_fn`: a TREC run, `INFER_OUTPUT_DIR/<task>.<split>.step<N>.run`, written as `gr_jax.infer`
writes one (atomic, an earlier different file kept as `.prev-<n>`).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import seqio
import tensorflow as tf

from gr_jax.data.pipeline import tokenize
from gr_jax.data.trec import write_run
from gr_jax.evaluation.metrics import evaluate
from gr_jax.runtime.io_utils import read_json, write_text
from gr_jax.data.vocab import PAD_ID

log = logging.getLogger(__name__)

Spec = seqio.FeatureConverter.FeatureSpec


class DocumentVocabulary(seqio.Vocabulary):
    """The output vocabulary of a retrieval task: id r + 1 is corpus row r, 0 pads; a sequence decodes to its
    document ids joined by tabs (a document id holds no tab: the readers refuse one)."""

    def __init__(self, doc_ids: Sequence, fingerprint: str):
        self.doc_ids = [str(d) for d in doc_ids]
        self.fingerprint = fingerprint
        self._row = {d: i for i, d in enumerate(self.doc_ids)}
        super().__init__(extra_ids=0)

    @property
    def eos_id(self) -> Optional[int]:
        return None  # a ranked list has no end marker: padding ends it

    @property
    def unk_id(self) -> Optional[int]:
        return None

    @property
    def _base_vocab_size(self) -> int:
        return len(self.doc_ids) + 1

    def _encode(self, s: str) -> list[int]:
        unknown = [d for d in s.split("\t") if d and d not in self._row]
        if unknown:
            raise ValueError(f"document ids not in the corpus: {unknown[:3]}")
        return [self._row[d] + 1 for d in s.split("\t") if d]

    def _decode(self, ids) -> str:
        n = len(self.doc_ids)
        return "\t".join(self.doc_ids[int(i) - 1] for i in ids if 0 < int(i) <= n)

    def _encode_tf(self, s):
        table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant(self.doc_ids), tf.range(1, len(self.doc_ids) + 1, dtype=tf.int32)), default_value=0)
        return table.lookup(tf.strings.split(s, "\t"))

    def _decode_tf(self, ids):
        names = tf.constant([""] + self.doc_ids)
        ids = tf.cast(ids, tf.int32)
        inside = (ids > 0) & (ids <= len(self.doc_ids))  # as `_decode`: padding and unknown ids dropped
        kept = tf.ragged.boolean_mask(tf.gather(names, tf.where(inside, ids, 0)), inside)
        return tf.strings.reduce_join(kept, axis=-1, separator="\t")

    def __eq__(self, other) -> bool:
        return isinstance(other, DocumentVocabulary) and other.fingerprint == self.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)


class ModelVocabulary(seqio.Vocabulary):
    """The run's vocabulary (gr_jax/data/vocab.py: SentencePiece, a tokenizer.json, an LM's) as seqio's, for the task's
    inputs; the inputs come tokenized, so it only decodes them for t5x's logs."""

    def __init__(self, vocab):
        self.vocab = vocab
        super().__init__(extra_ids=0)

    @property
    def eos_id(self) -> Optional[int]:
        return None

    @property
    def unk_id(self) -> Optional[int]:
        return None

    @property
    def _base_vocab_size(self) -> int:
        return int(self.vocab.size)

    def _encode(self, s: str) -> list[int]:
        return list(self.vocab.encode(s))

    def _decode(self, ids) -> str:
        return self.vocab.decode([int(i) for i in ids if int(i) != PAD_ID])

    def _encode_tf(self, s):
        return tf.numpy_function(lambda b: np.asarray(self._encode(b.decode("utf-8")), np.int32), [s], tf.int32)

    def _decode_tf(self, ids):
        return tf.numpy_function(lambda a: self._decode(np.asarray(a).reshape(-1)).encode("utf-8"), [ids], tf.string)

    def __eq__(self, other) -> bool:
        return isinstance(other, ModelVocabulary) and other.vocab.fingerprint == self.vocab.fingerprint

    def __hash__(self) -> int:
        return hash(self.vocab.fingerprint)


class SystemConverter(seqio.FeatureConverter):
    """Task features → the model's: `inputs` padded to TASK_FEATURE_LENGTHS['inputs'] and `targets` to ['targets']
    of the experiment — the lengths the model was built with, whatever lengths t5x's DatasetConfig passes (they
    only bound seqio's own trimming), so a batch has the shapes `gr_jax.infer` compiles."""

    TASK_FEATURES = {"inputs": Spec(dtype=tf.int32), "targets": Spec(dtype=tf.int32)}
    MODEL_FEATURES = {"inputs": Spec(dtype=tf.int32), "targets": Spec(dtype=tf.int32)}
    PACKING_FEATURE_DTYPES = None

    def __init__(self, lengths: dict, **kwargs):
        super().__init__(pack=False, **kwargs)
        self.lengths = {"inputs": int(lengths["inputs"]), "targets": int(lengths["targets"])}

    def __call__(self, ds, task_feature_lengths=None):
        return self._convert_features(ds, task_feature_lengths)

    def _convert_features(self, ds, task_feature_lengths=None):
        L, T = self.lengths["inputs"], self.lengths["targets"]

        def pad(x, n):
            x = tf.cast(x[:n], tf.int32)
            return tf.ensure_shape(tf.pad(x, [[0, n - tf.shape(x)[0]]], constant_values=PAD_ID), [n])

        return ds.map(lambda ex: {"inputs": pad(ex["inputs"], L), "targets": pad(ex["targets"], T)},
                      num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths=None):
        return dict(self.lengths)


def judged_qids(dataset, split: str) -> list[str]:
    """The judged queries of `split` by query id, as `compose.evaluate_split` takes them."""
    if split not in dataset.queries or split not in dataset.qrels:
        raise ValueError(f"split {split!r} has no judged queries in the experiment's dataset (it has "
                         f"{sorted(set(dataset.queries) & set(dataset.qrels))}); set EVAL_SPLIT")
    return sorted(q for q in dataset.queries[split].qids if q in dataset.qrels[split])


def split_examples(setup, split: str) -> dict[str, list]:
    """The judged queries of `split` (`judged_qids`) with their tokens, best judged document's docid and
    judgements."""
    ds = setup.dataset
    qids = judged_qids(ds, split)
    queries, qrels = ds.queries[split], ds.qrels[split]
    text_of = dict(zip(queries.qids, queries.texts))
    texts = [text_of[q] for q in qids]
    tokens = tokenize(texts, setup.vocab, setup.feature_lengths["inputs"], what=split)
    table, corpus = setup.table, ds.corpus
    scored = table is not None and table.index_kind != "substrings"
    targets = []
    for q in qids:
        if not scored:
            targets.append([])
            continue
        best = best_judged(qrels[q])
        if best is None:
            targets.append([])
            continue
        idx = table.primary([corpus.index_of(best)])
        # the docid's own tokens (+ EOS for text docids), never filtered by value: a codebook docid's code 0 is a
        # token, not padding
        n = int(table.lengths[idx[0]]) + (0 if table.fixed_length else 1)
        targets.append([int(t) for t in table.targets_of(idx, setup.feature_lengths["targets"])[0][:n]])
    return {"qid": qids, "split": [split] * len(qids), "inputs_pretokenized": texts,
            "inputs": [[int(t) for t in row if int(t) != PAD_ID] for row in tokens], "targets": targets,
            "targets_pretokenized": [json.dumps({d: int(g) for d, g in qrels[q].items()}, sort_keys=True)
                                     for q in qids]}


def best_judged(judged) -> Optional[str]:
    """The document a query's `targets` hold: the highest grade, ties by the smaller document id; None if none
    is relevant."""
    best = min(((-g, d) for d, g in judged.items() if g > 0), default=None)
    return None if best is None else best[1]


def postprocess(output, example=None, is_target: bool = False):
    """Targets → (split, query id, {document: grade}); predictions → the document ids, best first."""
    text = output.decode("utf-8") if isinstance(output, bytes) else str(output)
    if is_target:
        def s(key):
            v = example[key]
            return v.decode("utf-8") if isinstance(v, bytes) else str(v)
        return s("split"), s("qid"), json.loads(text)
    return [d for d in text.split("\t") if d]


def metric_fn_for(eval_config):
    """The seqio metric function of our metrics, read from a run as `gr_jax.infer` writes it."""

    def retrieval_metrics(targets, predictions, aux_values):
        scores = np.asarray(aux_values["scores"], np.float64)
        run, qrels, split = {}, {}, None
        for i, ((split, qid, judged), docs) in enumerate(zip(targets, predictions)):
            qrels[qid] = judged
            run[qid] = {d: float(x) for d, x in zip(docs, scores[i, :len(docs)])}
        if split is None:
            return {}
        return evaluate(run, qrels, eval_config.metrics, eval_config.threshold(split), missing_as_zero=True)

    return retrieval_metrics


def register(name: str, setup, eval_config) -> seqio.Task:
    """Adds (or replaces an earlier registration of ours of) the task `name` over the built system."""
    if name in seqio.TaskRegistry.names():
        held = seqio.TaskRegistry.get(name)
        if not isinstance(held.output_features["targets"].vocabulary, DocumentVocabulary):
            raise ValueError(f"a seqio task named {name!r} is already registered (not by gr_jax): MIXTURE_OR_TASK_NAME "
                             f"is the experiment's dataset, which the gr_jax model registers as its task; rename the "
                             f"other task")
        seqio.TaskRegistry.remove(name)
    splits = sorted(s for s in setup.dataset.queries if s in setup.dataset.qrels)
    cache: dict[str, dict] = {}

    def dataset_fn(split: str, shuffle_files: bool = False, seed: Optional[int] = None):
        del shuffle_files, seed  # queries in query-id order, as gr_jax.infer reads them
        if split not in cache:
            cache[split] = split_examples(setup, split)
        ex = cache[split]
        strings = ("qid", "split", "inputs_pretokenized", "targets_pretokenized")
        signature = {**{k: tf.TensorSpec([], tf.string) for k in strings},
                     "inputs": tf.TensorSpec([None], tf.int32), "targets": tf.TensorSpec([None], tf.int32)}

        def rows():
            for i in range(len(ex["qid"])):
                yield {k: (np.asarray(ex[k][i], np.int32) if k in ("inputs", "targets") else ex[k][i])
                       for k in signature}

        return tf.data.Dataset.from_generator(rows, output_signature=signature)

    corpus = setup.dataset.corpus
    features = {"inputs": seqio.Feature(ModelVocabulary(setup.vocab), add_eos=False, dtype=tf.int32),
                "targets": seqio.Feature(DocumentVocabulary(corpus.doc_ids, corpus.fingerprint()), add_eos=False,
                                         dtype=tf.int32)}
    return seqio.TaskRegistry.add(name, source=seqio.FunctionDataSource(dataset_fn, splits=splits),
                                  preprocessors=[], output_features=features, postprocess_fn=postprocess,
                                  metric_fns=[metric_fn_for(eval_config)])


# -- t5x.infer's writer ----------------------------------------------------------------------------------------
def write_run_chunk(path: str, inferences, task_ds, mode: str, vocabulary=None) -> None:
    """t5x.infer's `write_fn`: one chunk of queries as JSON lines — each query's documents and scores (mode
    predict_with_aux; `merge_runs` writes the TREC run) or its best judged document's log-likelihood (mode score)."""
    predictions, aux = inferences
    examples = list(task_ds.as_numpy_iterator())
    if len(examples) != len(predictions):
        raise ValueError(f"{path}: {len(predictions)} inferences for {len(examples)} queries")
    qids = [ex["qid"].decode("utf-8") for ex in examples]
    if mode == "score":
        best = [best_judged(json.loads(ex["targets_pretokenized"])) for ex in examples]
        lines = [json.dumps({"qid": q, "docid": d, "log_likelihood": None if d is None else float(s)})
                 for q, d, s in zip(qids, best, predictions)]  # no relevant document: nothing was scored
        write_text(path, "".join(line + "\n" for line in lines))
        return
    scores = np.asarray(aux["scores"], np.float64) if mode == "predict_with_aux" else None
    if scores is None:
        raise ValueError("a gr_jax retrieval run needs the documents' scores: run t5x.infer with "
                         "mode = 'predict_with_aux' (gr_jax/t5x/configs/runs/infer/t5x_run.gin)")
    lines = []
    for i, q in enumerate(qids):  # one line per query, also one with no document (a TREC file would drop it)
        docs = [d for d in vocabulary.decode(list(predictions[i])).split("\t") if d]
        lines.append(json.dumps({"qid": q, "run": {d: float(x) for d, x in zip(docs, scores[i, :len(docs)])}}))
    write_text(path, "".join(line + "\n" for line in lines))


STAMP = "gr_jax_infer.json"  # in t5x.infer's tmp folder: what its chunks are of (RetrieverModel writes it)


def inference_stamp(tmp_dir: Path, stamp: dict, qids: Sequence[str]) -> None:
    """Records what t5x.infer's chunks in `tmp_dir` are inferred with (checkpoint, split, beams, batch, chunk size,
    mode) and the split's queries; a folder left by a run with other settings is refused — t5x would reuse its
    finished chunks — rather than merged into a run it does not belong to."""
    path = Path(tmp_dir) / STAMP
    if path.is_file():
        held = read_json(path)
        if held.get("stamp") != stamp:
            raise ValueError(f"{tmp_dir} holds chunks of another inference ({held.get('stamp')}, now {stamp}); t5x "
                             f"would reuse them: delete that folder or choose a new INFER_OUTPUT_DIR")
        return
    if Path(tmp_dir).is_dir() and any(Path(tmp_dir).iterdir()):
        raise ValueError(f"{tmp_dir} holds chunks that gr_jax did not record; delete it or choose a new "
                         f"INFER_OUTPUT_DIR")
    write_text(path, json.dumps({"stamp": stamp, "qids": list(qids)}, sort_keys=True))


def merge_runs(output_dir: str, output_fname: str, tmp_dir: str, step: Optional[int]) -> None:
    """t5x.infer's `merge_fn`: the chunks → `<output_dir>/<task>.<split>.step<N>.run` (score mode: `.scores.jsonl`),
    checked: chunks 0..n-1 all there, and together exactly the split's judged queries, each once."""
    found = re.match(r"(.+)-(predict_with_aux|predict|score)\.", output_fname)
    if not found:
        raise ValueError(f"{output_fname}: not t5x.infer's output name (<task>-<mode>.<extension>-...)")
    task, mode = found.groups()
    stamp_path = Path(tmp_dir) / STAMP
    if not stamp_path.is_file():
        raise ValueError(f"{stamp_path} is missing: these chunks were not written by a gr_jax RetrieverModel")
    held = read_json(stamp_path)
    split, want = held["stamp"]["split"], held["qids"]
    chunks = sorted(Path(tmp_dir).glob(f"{output_fname}-chunk?????"))
    if [int(c.name[-5:]) for c in chunks] != list(range(len(chunks))) or not chunks:
        raise ValueError(f"{tmp_dir}: chunks {[c.name[-5:] for c in chunks]} are not 00000.. in a row")
    target = Path(output_dir) / f"{task}.{split}.step{step}.{'scores.jsonl' if mode == 'score' else 'run'}"
    text = "".join(c.read_text(encoding="utf-8") for c in chunks)
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    got = [r["qid"] for r in rows]
    if sorted(got) != sorted(want) or len(got) != len(set(got)):
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        raise ValueError(f"{tmp_dir}: the chunks hold {len(got)} queries, the split {split!r} {len(want)} (missing "
                         f"{missing[:3]}, not of the split {extra[:3]}); infer again into a new INFER_OUTPUT_DIR")
    if mode == "score":
        write_text(target, text, keep_previous=True)
    else:
        write_run(target, {r["qid"]: r["run"] for r in rows})
    log.info("wrote %s (%d chunks)", target, len(chunks))
