"""The seqio adapter, end to end on the demo corpus with a tiny SentencePiece model trained here."""

import numpy as np
import pytest

from gr_jax.data import demo
from gr_jax.data.vocab import SentencePieceVocabulary, train_sentencepiece
from tests.conftest import require


@pytest.fixture(scope="module")
def tasks_and_vocab(tmp_path_factory):
    require("seqio")
    from gr_jax import tasks

    d = tmp_path_factory.mktemp("spm")
    ds = demo.generate(num_docs=40, seed=5)
    vocab_file = d / "demo.model"
    train_sentencepiece(list(ds.corpus.texts) + list(ds.queries["train"].texts), vocab_file, vocab_size=400)
    return tasks, vocab_file, ds


def test_demo_task_end_to_end(tasks_and_vocab):
    tasks, vocab_file, ds = tasks_and_vocab
    task = tasks.register_demo(vocab_file, num_docs=40, seed=5, name="gr_jax_demo_test")
    import seqio

    assert "gr_jax_demo_test" in seqio.TaskRegistry.names()
    lengths = {"inputs": 24, "targets": 16}
    train = list(task.get_dataset(lengths, split="train", shuffle=False).as_numpy_iterator())
    n_train_pairs = len(ds.corpus) + sum(len(v) for v in ds.qrels["train"].values())
    assert len(train) == n_train_pairs
    ours = SentencePieceVocabulary(vocab_file)
    first = train[0]  # the first indexing example: document 0 → its id
    assert first["inputs"].shape[0] <= 24 and first["inputs"][-1] == 1  # trimmed, EOS appended
    np.testing.assert_array_equal(first["inputs"][:-1], ours.encode(ds.corpus.texts[0])[:23])
    assert ours.decode(first["targets"]) == ds.corpus.doc_ids[0]

    valid = list(task.get_dataset(lengths, split="validation", shuffle=False).as_numpy_iterator())
    assert len(valid) == len(ds.qrels["dev"])
    qid, judged = next(iter(ds.qrels["dev"].items()))
    assert valid[0]["inputs_pretokenized"].decode() == dict(zip(ds.queries["dev"].qids, ds.queries["dev"].texts))[qid]
    target = task.postprocess_fn(valid[0]["targets_pretokenized"].decode(), example=valid[0], is_target=True)
    assert target == sorted(judged)

    # metric_fns over top-1 strings and over ranked lists
    targets = [task.postprocess_fn("", example=v, is_target=True) for v in valid[:4]]
    perfect = task.metric_fns[0](targets, [t[0] for t in targets])
    assert perfect == {"Hit@1": 1.0, "Hit@10": 1.0, "MRR@10": 1.0}
    second = task.metric_fns[0](targets, [["nope", t[0]] for t in targets])
    assert second == {"Hit@1": 0.0, "Hit@10": 1.0, "MRR@10": 0.5}


def test_registration_errors(tasks_and_vocab, tmp_path):
    tasks, vocab_file, _ = tasks_and_vocab
    with pytest.raises(ValueError, match="missing.model: cannot read"):
        tasks.register_demo(tmp_path / "missing.model")
    with pytest.raises(ValueError, match="unknown NQ320k layout 'beir'"):
        tasks.register_nq320k(tmp_path, vocab_file, layout="beir")
    task = tasks.register_nq320k(tmp_path, vocab_file, name="gr_jax_nq_empty")  # data is read lazily...
    with pytest.raises(Exception, match="NQ_doc_content.tsv"):  # ...and a missing file is named on first use
        list(task.get_dataset({"inputs": 8, "targets": 4}, split="train", shuffle=False).take(1))
