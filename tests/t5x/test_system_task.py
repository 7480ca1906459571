"""The seqio side of the t5x adapter (gr_jax/t5x/system_task.py, RetrieverModel's host ranking) on hand-worked
cases: the document vocabulary both ways, the converter's shapes, the metric function's figures, trec order of
tied scores by document id (never by corpus row), and t5x.infer's chunked TREC run."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest

seqio = pytest.importorskip("seqio", reason="seqio comes with t5x's extra: pip install --no-deps ../shared/wheels/*.whl && "
                    "pip install -e '.[t5x]' (README, 'With t5x itself')")
import tensorflow as tf  # noqa: E402

from gr_jax.t5x import system_task  # noqa: E402


def test_document_vocabulary_both_ways():
    vocab = system_task.DocumentVocabulary(["d0", "d1", "d2"], "fp")
    assert vocab.decode([3, 1, 0, 0]) == "d2\td0"  # row r is id r + 1; 0 pads
    assert vocab.encode("d2\td0") == [3, 1]
    assert vocab.decode_tf(tf.constant([[3, 1, 0], [2, 0, 0]])).numpy().tolist() == [b"d2\td0", b"d1"]
    assert vocab.encode_tf(tf.constant("d1\td2")).numpy().tolist() == [2, 3]
    with pytest.raises(ValueError, match="not in the corpus"):
        vocab.encode("d9")
    assert vocab == system_task.DocumentVocabulary(["d0", "d1", "d2"], "fp")
    assert vocab != system_task.DocumentVocabulary(["d0", "d1", "d2"], "other corpus")


def test_converter_pads_to_the_models_lengths_whatever_t5x_asks():
    ds = tf.data.Dataset.from_generator(
        lambda: iter([{"inputs": np.array([5, 6, 1], np.int32), "targets": np.array([9, 1], np.int32)}]),
        output_signature={"inputs": tf.TensorSpec([None], tf.int32), "targets": tf.TensorSpec([None], tf.int32)})
    out = system_task.SystemConverter({"inputs": 5, "targets": 3})(ds, {"inputs": 99, "targets": 1})
    assert {k: v.shape.as_list() for k, v in out.element_spec.items()} == {"inputs": [5], "targets": [3]}
    ex = next(out.as_numpy_iterator())
    assert ex["inputs"].tolist() == [5, 6, 1, 0, 0] and ex["targets"].tolist() == [9, 1, 0]


def test_metric_function_by_hand():
    """q1: relevant d2 at rank 2 → Hit@1 0, Hit@10 1, RR 1/2; q2: relevant d0 (grade 2) at rank 1 → 1, 1, 1.
    Means: Hit@1 0.5, Hit@10 1, MRR@10 0.75. The scores, not the list order, decide the rank (as in a run file)."""
    cfg = types.SimpleNamespace(metrics=("Hit@1", "Hit@10", "MRR@10"), threshold=lambda split: 1)
    fn = system_task.metric_fn_for(cfg)
    targets = [("dev", "q1", {"d2": 1}), ("dev", "q2", {"d0": 2, "d5": 0})]
    predictions = [["d2", "d1"], ["d0", "d1"]]
    scores = np.array([[-2.0, -1.0], [-0.5, -3.0]], np.float32)  # q1: d1 outscores d2 though listed second
    got = fn(targets, predictions, {"scores": scores})
    assert got == pytest.approx({"Hit@1": 0.5, "Hit@10": 1.0, "MRR@10": 0.75}, abs=1e-12)
    # postprocess: what seqio hands the metric function
    ex = {"qid": b"q1", "split": b"dev"}
    assert system_task.postprocess(b'{"d2": 1}', example=ex, is_target=True) == ("dev", "q1", {"d2": 1})
    assert system_task.postprocess("d2\td1") == ["d2", "d1"] and system_task.postprocess("") == []


def test_host_ranking_orders_ties_by_document_id_not_row():
    """Two beams reach rows 0 ("b") and 2 ("c") with the same score, row 1 ("a") scores higher: trec order is
    a, then the tie by document id descending: c before b — with the corpus rows in either order."""
    from gr_jax.decoding.rankers import FirstOccurrence
    from gr_jax.t5x.models import RetrieverModel

    def ranked(doc_ids, beams):
        model = RetrieverModel.__new__(RetrieverModel)  # only the host ranking: no system to build
        model.setup = types.SimpleNamespace(model=types.SimpleNamespace(ranker=FirstOccurrence()),
                                            dataset=types.SimpleNamespace(corpus=types.SimpleNamespace(
                                                doc_ids=doc_ids)))
        docs = np.array([[[r] for r, _ in beams]])
        scores = np.array([[s for _, s in beams]], np.float32)
        rows, out = model._ranked_on_host(docs, np.ones_like(docs, bool), scores)
        return [(doc_ids[r - 1], float(s)) for r, s in zip(rows[0], out[0]) if r]

    expected = [("a", -1.0), ("c", -2.0), ("b", -2.0)]
    assert ranked(["b", "a", "c"], [(0, -2.0), (1, -1.0), (2, -2.0)]) == expected
    assert ranked(["c", "a", "b"], [(2, -2.0), (1, -1.0), (0, -2.0)]) == expected


def test_infer_writer_chunks_merge_into_one_run(tmp_path):
    vocab = system_task.DocumentVocabulary(["d0", "d1", "d2"], "fp")
    name = "demo-predict_with_aux.run-00000-of-00001"
    tmp = tmp_path / "tmp"

    def chunk(qids, rows, scores, i):
        ds = tf.data.Dataset.from_tensor_slices({"qid": qids, "targets_pretokenized": ['{"d0": 1}'] * len(qids)})
        system_task.write_run_chunk(str(tmp / f"{name}-chunk{i:05d}"), (np.array(rows), {"scores": np.array(scores)}),
                                    ds, "predict_with_aux", vocab)

    stamp = {"checkpoint": "m/checkpoint_7", "split": "dev", "num_beams": 2}
    system_task.inference_stamp(tmp, stamp, ["q1", "q2", "q3", "q4"])
    system_task.inference_stamp(tmp, stamp, ["q1", "q2", "q3", "q4"])  # the same settings: resumed
    with pytest.raises(ValueError, match="another inference"):  # other settings: t5x would reuse these chunks
        system_task.inference_stamp(tmp, {**stamp, "checkpoint": "m/checkpoint_9"}, ["q1"])
    chunk(["q1", "q2"], [[3, 1], [2, 0]], [[-1.0, -2.0], [-0.5, 0.0]], 0)
    chunk(["q4"], [[1, 2]], [[-3.0, -3.0]], 2)
    with pytest.raises(ValueError, match="not 00000.. in a row"):  # chunk 1 is missing
        system_task.merge_runs(str(tmp_path), name, str(tmp), 7)
    chunk(["q3"], [[0, 0]], [[0.0, 0.0]], 1)  # a query without documents still counts as inferred
    system_task.merge_runs(str(tmp_path), name, str(tmp), 7)
    lines = (tmp_path / "demo.dev.step7.run").read_text().splitlines()
    assert [line.split()[:4] for line in lines] == [
        ["q1", "Q0", "d2", "1"], ["q1", "Q0", "d0", "2"], ["q2", "Q0", "d1", "1"],
        ["q4", "Q0", "d1", "1"], ["q4", "Q0", "d0", "2"]]  # q4's tie: d1 before d0 (document id descending)
    chunk(["q4"], [[3]], [[-1.0]], 3)  # a query twice: an error, not a silently merged run
    with pytest.raises(ValueError, match="the split 'dev' 4"):
        system_task.merge_runs(str(tmp_path), name, str(tmp), 7)


def test_score_mode_names_the_scored_document(tmp_path):
    ds = tf.data.Dataset.from_tensor_slices({"qid": ["q1"], "targets_pretokenized": [json.dumps({"d5": 1, "d3": 1})]})
    path = tmp_path / "chunk"
    system_task.write_run_chunk(str(path), (np.array([-1.5]), {}), ds, "score")
    assert json.loads(path.read_text()) == {"qid": "q1", "docid": "d3", "log_likelihood": -1.5}  # tie: smaller id
    ds = tf.data.Dataset.from_tensor_slices({"qid": ["q2"], "targets_pretokenized": [json.dumps({"d5": 0})]})
    system_task.write_run_chunk(str(path), (np.array([0.0]), {}), ds, "score")
    assert json.loads(path.read_text()) == {"qid": "q2", "docid": None, "log_likelihood": None}  # nothing scored


class _Words:
    """A by-hand vocabulary: word i of `words` is id i + 3 (0 pad, 1 EOS, 2 unknown)."""

    fingerprint = "words-v1"

    def __init__(self, words):
        self.ids = {w: i + 3 for i, w in enumerate(words)}
        self.size = len(words) + 3

    def encode(self, text):
        return [self.ids.get(w, 2) for w in text.split()]

    def decode(self, ids):
        return " ".join(str(i) for i in ids)


def test_the_task_over_an_mmarco_layout_holds_the_judged_queries_as_gr_jax_infer_reads_them(tmp_path):
    """MS MARCO's files with a translated dev split (mMARCO: `load_dataset.query_files`), written here: the task's
    split holds the judged queries by query id, tokenized with the run's vocabulary (+ EOS), each with its best
    judged document's docid tokens and its judgements."""
    from gr_jax.data import sources
    from gr_jax.docids.atomic import AtomicDocids
    from gr_jax.docids.base import FitContext

    (tmp_path / "collection.tsv").write_text("7\tcats sit\n3\tdogs run\n5\tbirds fly\n")
    (tmp_path / "queries.train.tsv").write_text("1\tcats\n")
    (tmp_path / "qrels.train.tsv").write_text("1 0 7 1\n")
    (tmp_path / "pt_queries.dev.tsv").write_text("20\tcães correm\n10\tpássaros\n30\tnada\n")
    (tmp_path / "qrels.dev.tsv").write_text("20 0 3 1\n10 0 5 1\n10 0 7 2\n30 0 3 0\n")
    ds = sources.load_dataset("msmarco", str(tmp_path), query_files={
        "train": ["queries.train.tsv", "qrels.train.tsv"], "dev_pt": ["pt_queries.dev.tsv", "qrels.dev.tsv"]})
    vocab = _Words(["cães", "correm", "pássaros"])
    scheme = AtomicDocids().fit(ds.corpus, FitContext(vocab=vocab))
    table = scheme.assign(ds.corpus)
    setup = types.SimpleNamespace(dataset=ds, vocab=vocab, table=table, feature_lengths={"inputs": 6, "targets": 2})
    cfg = types.SimpleNamespace(metrics=("Hit@1",), threshold=lambda split: 1)
    task = system_task.register("gr_jax_test_mmarco", setup, cfg)
    assert set(task.splits) == {"train", "dev_pt"}
    got = list(task.get_dataset(sequence_length=None, split="dev_pt", shuffle=False).as_numpy_iterator())
    # query 30 has no relevant document but is judged: kept, as evaluate_split keeps it (it scores 0)
    assert [ex["qid"].decode() for ex in got] == ["10", "20", "30"]
    assert [ex["inputs"].tolist() for ex in got] == [[5, 1], [3, 4, 1], [2, 1]]
    doc = {d: table.sequence(int(r))[0] for d, r in zip(ds.corpus.doc_ids, range(len(ds.corpus)))}
    assert got[0]["targets"].tolist() == [doc["7"], 1]  # grade 2 beats grade 1; EOS after the docid token
    assert got[1]["targets"].tolist() == [doc["3"], 1] and got[2]["targets"].tolist() == []
    assert json.loads(got[0]["targets_pretokenized"]) == {"5": 1, "7": 2}
    with pytest.raises(ValueError, match="set EVAL_SPLIT"):
        system_task.split_examples(setup, "dev")
    # a codebook docid holds code 0 as a token: the targets keep it (never filtered as padding)
    from gr_jax.docids.base import DocidTable
    from gr_jax.data.vocab import DocidTokenSpace

    codes = DocidTable(np.array([[0, 1], [2, 0], [0, 0]]), np.array([2, 2, 2]), np.arange(3),
                       DocidTokenSpace.codebook(2, 4))
    coded = system_task.split_examples(types.SimpleNamespace(**{**vars(setup), "table": codes}), "dev_pt")
    assert coded["targets"] == [[0, 1], [2, 0], []]  # q10: doc "7" (row 0); q20: doc "3" (row 1); q30: none
    vocabs = seqio.get_mixture_or_task("gr_jax_test_mmarco").output_features
    assert vocabs["targets"].vocabulary.decode([2, 1]) == "3\t7"  # rows in corpus order: 7, 3, 5


def test_device_and_host_ranking_in_the_infer_step_equal_rank(tmp_path):
    """`predict_batch_with_aux` ranks with the default ranker on the device and with any other on the host (through
    `jax.pure_callback`); both give what `rank` (gr_jax.infer's path) gives, in trec order."""
    import gin
    import jax

    from gr_jax.runtime import gin_utils
    from gr_jax.data.trec import ranked
    from gr_jax.decoding.rankers import FirstOccurrence
    from gr_jax.t5x.models import RetrieverModel

    class Another(FirstOccurrence):  # a method's own ranker (the same numbers): the host path
        pass

    gin_utils.parse(["experiments/demo/dsi_atomic.gin"], [f"MODEL_DIR = '{tmp_path / 'run'}'", "BATCH_SIZE = 8",
                                                           "load_dataset.demo_docs = 60", "prepare.vocab_size = 300",
                                                           "EvalConfig.num_beams = 6"])
    try:
        model = RetrieverModel()
        assert model.num_beams == 6  # the experiment's EvalConfig, as gr_jax.infer's
        ex = system_task.split_examples(model.setup, "dev")
        q = np.zeros((8, model.setup.feature_lengths["inputs"]), np.int32)
        for i, row in enumerate(ex["inputs"][:8]):
            q[i, :len(row)] = row
        params = model.setup.model.init_params(0)
        t5x_params = {k: v for k, v in params.items() if k != "head"}  # t5x's tree: no empty subtrees
        names = list(model.setup.dataset.corpus.doc_ids)
        qq, dd, ss = model.setup.model.rank(params, q, model.setup.index, 6)
        expected = [ranked({names[d]: float(s) for d, s in zip(dd[qq == b], ss[qq == b])}) for b in range(8)]
        for ranker in (FirstOccurrence(), Another()):
            model.setup.model.ranker = ranker
            rows, aux = jax.device_get(jax.jit(model.predict_batch_with_aux)(t5x_params, {"inputs": q}))
            got = [[names[r - 1] for r in row if r] for row in rows]
            assert got == expected, type(ranker).__name__
            for b in range(8):
                want = sorted(ss[qq == b].tolist(), reverse=True)
                np.testing.assert_allclose(aux["scores"][b, :len(want)], want, rtol=1e-5)
    finally:
        gin.clear_config()
