"""Ultron: the stage switching by hand (and its resume), the stages' pairs, the URL docids, and a small run that
trains in three stages and restores through gr_jax.infer."""

import json

import numpy as np
import pytest

from gr_jax.data.pipeline import ExampleStore, MixtureIterator
from gr_jax.data.readers import Corpus, Dataset, QuerySet
from gr_jax.methods.ultron.docids import ultron_url
from gr_jax.methods.ultron.training import StagedIterator, UltronStages, passages, top_terms
from tests.methods import assert_infer_repeats_the_final_run, train_small


def _stage(marker: int, n: int = 5) -> MixtureIterator:
    """Examples whose input is [marker, row]: a batch tells which stage and rows it came from."""
    store = ExampleStore({"inputs": np.array([[marker, r] for r in range(n)]), "targets": np.zeros((n, 1))})
    return MixtureIterator([store], batch_size=2, seed=marker)


def test_stage_switching_by_hand_and_resume():
    make = lambda: StagedIterator([_stage(1), _stage(2), _stage(3)], [3, 5])  # noqa: E731
    it = make()
    stages = [int(next(it)["inputs"][0, 0]) for _ in range(8)]
    assert stages == [1, 1, 1, 2, 2, 3, 3, 3]  # steps 0–2, 3–4, then the last stage runs on
    assert it.stage(2) == 0 and it.stage(3) == 1 and it.stage(5) == 2 and it.stage(10**6) == 2
    # a run stopped after step 4 (in stage 2) resumes into the batches of the uninterrupted run
    whole, part = make(), make()
    batches = [next(whole) for _ in range(9)]
    for _ in range(4):
        next(part)
    state = json.loads(json.dumps(part.get_state()))  # as a checkpoint keeps it
    resumed = make()
    resumed.set_state(state)
    for b in batches[4:]:
        got = next(resumed)
        assert all(np.array_equal(b[k], got[k]) for k in b)
    other = StagedIterator([_stage(1), _stage(2), _stage(3)], [2, 5])
    with pytest.raises(ValueError, match="saved stage bounds \\[3, 5\\], now \\[2, 5\\]"):
        other.set_state(state)


def test_the_stage_bounds_and_refusals():
    assert UltronStages(train_steps=100, pseudo_queries="sentences").bounds() == [25, 75]
    assert UltronStages(train_steps=10, stage_fractions=(0.2, 0.2, 0.6), pseudo_queries="sentences").bounds() == [2, 4]
    with pytest.raises(ValueError, match="summing to 1"):
        UltronStages(train_steps=10, stage_fractions=(0.5, 0.5, 0.5), pseudo_queries="sentences")
    with pytest.raises(ValueError, match="needs UltronStages.pseudo_queries_file"):
        UltronStages(train_steps=10)
    with pytest.raises(ValueError, match="supervised stage gets no step"):
        UltronStages(train_steps=2, stage_fractions=(0.5, 0.49, 0.01), pseudo_queries="sentences").bounds()


def test_the_stages_pairs_by_hand(tmp_path):
    corpus = Corpus(["a", "b"], ["One two. Three four five. Six.", "Seven eight."], titles=["Ta", "Tb"])
    data = Dataset(corpus, {"train": QuerySet(["q1"], ["find a"])}, {"train": {"q1": {"a": 1}}})
    memory = tmp_path / "pq.jsonl"
    memory.write_text(json.dumps({"doc_id": "b", "queries": ["what is b", "b again"]}) + "\n")
    general, search, supervised = UltronStages(train_steps=8, passage_words=4, pseudo_queries_file=str(memory)) \
        .stage_pairs(data, "train")
    assert general[0].texts == ["Ta One two.", "Ta Three four five.", "Ta Six.", "Tb Seven eight."]
    assert general[0].rows.tolist() == [0, 0, 0, 1]
    assert general[1].name == "terms" and general[1].rows.tolist() == [0, 1]
    assert search[0].texts == ["what is b", "b again"] and search[0].rows.tolist() == [1, 1]
    assert supervised[0].texts == ["find a"] and supervised[0].rows.tolist() == [0]
    _, sentences, _ = UltronStages(train_steps=8, pseudo_queries="sentences", queries_per_document=2) \
        .stage_pairs(data, "train")
    assert sentences[0].texts == ["One two.", "Three four five.", "Seven eight."]
    assert passages("T", "A b c d e f g h.", 4, 10) == ["T A b c"]  # a sentence longer than the room is cut
    assert top_terms(["x y y", "x z"], 1) == ["y", "z"]  # idf(x) = 0: the document's own terms win


def test_ultron_url_docids_by_hand():
    assert ultron_url("orchard/dramernu/bobeksor", "Bobeksor (orchard)") == "bobeksor dramernu orchard"
    assert ultron_url("https://www.Example.com/news/2021/big-story_now.html", "A long title here") == \
        "A long title here www.example.com"
    assert ultron_url("http://site.org/a-b/c2d.php?x=1", "Short") == "cd x a b site.org"  # digits dropped


@pytest.mark.slow
def test_a_small_ultron_run_trains_in_three_stages_and_restores_through_infer(tmp_path):
    exp, model_dir, metrics = train_small(tmp_path, "experiments/demo/ultron_url.gin", 12,
                                          "TASK_FEATURE_LENGTHS = {'inputs': 64, 'targets': 24}\n")
    assert [m["step"] for m in metrics][-1] == 12
    config = (model_dir / "config.gin").read_text()
    assert "UltronStages" in config and "UltronUrlDocids" in config
    assert_infer_repeats_the_final_run(tmp_path, exp, model_dir, 12)
