"""Answer accuracy (`Answer@k`) by hand: the tokenizer, contiguous matches, the share of answered queries, and
the files it reads."""

import pytest

from gr_jax.evaluation import answers


def test_tokens_split_letters_digits_and_other_characters():
    assert answers.tokens("Hello, World! 3.5 km") == ["hello", ",", "world", "!", "3", ".", "5", "km"]
    # NFD: the accent is a combining mark, part of its word (so "cafe" is another word than "café")
    assert answers.tokens("Café") == ["cafe\u0301"]
    assert answers.tokens("a\tb\u00a0c") == ["a", "b", "c"]  # separators and controls split, never tokens


def test_an_answer_matches_as_a_contiguous_run_of_tokens():
    passage = "The Eiffel Tower, in Paris, was completed in 1889."
    assert answers.has_answer(passage, ["eiffel tower"])
    assert answers.has_answer(passage, ["PARIS"])  # lower-cased both sides
    assert not answers.has_answer(passage, ["tower eiffel"])  # order matters
    assert not answers.has_answer(passage, ["Par"])  # whole tokens only
    assert not answers.has_answer(passage, ["1889 ."[:3]])  # "188" is not the token "1889"
    assert answers.has_answer(passage, ["nowhere", "1889"])  # any answer of the list
    assert not answers.has_answer(passage, [""])  # an empty answer matches nothing


def test_answer_accuracy_by_hand():
    texts = {"d1": "cats sit on mats", "d2": "dogs eat food", "d3": "the answer is forty two"}
    run = {"q1": ["d2", "d1"], "q2": ["d3", "d1"], "q3": ["d2"]}
    gold = {"q1": ["mats"], "q2": ["forty two"], "q3": ["mats"], "q4": ["mats"]}  # q4: no ranking → 0
    got = answers.answer_accuracy(run, gold, texts, [1, 2])
    assert got == {"Answer@1": pytest.approx(1 / 4), "Answer@2": pytest.approx(2 / 4)}


def test_answer_metrics_read_the_run_the_answers_and_only_the_needed_passages(tmp_path):
    (tmp_path / "corpus.tsv").write_text("id\ttext\ttitle\nd1\tcats sit on mats\tCats\nd2\tdogs eat food\tDogs\n"
                                         "d3\tnever retrieved\tX\n")
    (tmp_path / "answers.tsv").write_text('q1\t["mats"]\nq2\t["food", "x"]\n')
    (tmp_path / "r.run").write_text("q1 Q0 d2 1 2.0 t\nq1 Q0 d1 2 1.0 t\nq2 Q0 d2 1 5.0 t\n")
    got = answers.answer_metrics(tmp_path / "r.run", tmp_path / "answers.tsv", tmp_path / "corpus.tsv",
                                 ["Answer@1", "Answer@2"])
    assert got == {"Answer@1": 0.5, "Answer@2": 1.0}
    (tmp_path / "answers.tsv").write_text('q1\t"mats"\n')  # not a list: refused, naming the file and line
    with pytest.raises(ValueError, match=r"answers.tsv:1: the answers must be a JSON list"):
        answers.read_answers(tmp_path / "answers.tsv")
    (tmp_path / "r.run").write_text("q1 Q0 d9 1 2.0 t\n")
    (tmp_path / "answers.tsv").write_text('q1\t["mats"]\n')
    with pytest.raises(ValueError, match="not in this corpus"):
        answers.answer_metrics(tmp_path / "r.run", tmp_path / "answers.tsv", tmp_path / "corpus.tsv", ["Answer@1"])
