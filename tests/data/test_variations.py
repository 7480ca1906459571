"""Query variations: intent-preserving by construction (reordering keeps the multiset of words, naturality
removes only stop words, misspelling changes at most the configured number of characters, synonyms come from
WordNet's entry of the word), deterministic per seed (the same file twice), independent of query order, and
saved variation sets reused or refused — never regenerated silently."""

import json

import pytest

from gr_jax.data import demo
from gr_jax.data import variations as V
from gr_jax.data.readers import QuerySet
from gr_jax.runtime.provenance import ProvenanceError

QUERIES = ["What is the capital of France?", "how do I bake sourdough bread", "running dogs are faster than cats",
           "who was the first president of the united states", "buy a used car", "ancient arches", "of the",
           "Sourdough"]


def _queries():
    d = demo.generate(num_docs=60, seed=4)
    qs = d.queries["test"]
    texts = list(qs.texts[:40]) + QUERIES
    return texts, [f"q{i:03d}" for i in range(len(texts))]


def edit_distance(a: str, b: str) -> int:  # the test's own Levenshtein (row by row, full table)
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        for j in range(len(b) + 1):
            if i == 0 or j == 0:
                table[i][j] = i + j
            else:
                table[i][j] = min(table[i - 1][j] + 1, table[i][j - 1] + 1,
                                  table[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return table[-1][-1]


@pytest.mark.parametrize("max_edits", [1, 2, 3])
def test_misspelling_changes_at_most_the_configured_characters(max_edits):
    texts, qids = _queries()
    for seed in V.SEEDS:
        out = V.Misspeller(max_words=2, max_edits=max_edits).vary(texts, qids, seed)
        dist = [edit_distance(a, b) for a, b in zip(texts, out)]
        assert max(dist) <= max_edits
        eligible = [t for t in texts if any(len(w.strip("?.,")) >= 4 and w.strip("?.,").isalpha() for w in t.split())]
        changed = sum(a != b for a, b in zip(texts, out))
        assert changed >= len(eligible) - 1  # nearly every query with a word of ≥ 4 letters gets a typo
        assert out[texts.index("of the")] == "of the"  # nothing long enough to misspell


def test_misspelling_uses_the_dictionary_and_keyboard():
    m = V.Misspeller(max_words=1, max_edits=3)
    keyboard, spelling, _ = m._resources()
    assert "s" in keyboard["a"] and "q" in keyboard["a"] and "p" not in keyboard["a"]  # QWERTY neighbours
    word = next(w for w in ("beautiful", "necessary", "definitely") if w in spelling)
    out = m.vary([word], ["x"], 5)[0]
    assert out in spelling[word] or edit_distance(out, word) == 1
    # a word absent from the dictionary gets one keyboard substitution
    out = V.Misspeller(max_words=1, max_edits=2).vary(["zqxjkv"], ["y"], 5)[0]
    i = next(i for i, (a, b) in enumerate(zip("zqxjkv", out)) if a != b)
    assert edit_distance(out, "zqxjkv") == 1 and out[i] in keyboard["zqxjkv"[i]]


def test_reordering_keeps_the_multiset_of_words():
    texts, qids = _queries()
    for seed in V.SEEDS:
        out = V.Reorderer(swaps=2).vary(texts, qids, seed)
        for a, b in zip(texts, out):
            assert sorted(a.split()) == sorted(b.split())
        assert sum(a != b for a, b in zip(texts, out)) >= len(texts) - 2  # "Sourdough" alone cannot move
    assert V.Reorderer().vary(["a a a"], ["q"], 1) == ["a a a"]


def test_naturality_removes_only_stop_words_and_ignores_the_seed():
    texts, qids = _queries()
    stops = V.stop_words()
    out = V.Naturalizer().vary(texts, qids, 1999)
    assert out == V.Naturalizer().vary(texts, qids, 5)
    for a, b in zip(texts, out):
        kept, words = b.split(), a.split()
        it = iter(words)
        assert all(w in it for w in kept)  # a subsequence, order kept
        removed = list(words)
        for w in kept:
            removed.remove(w)
        assert all(V.split_word(w)[1].lower() in stops for w in removed)
    assert out[texts.index("What is the capital of France?")] == "capital France?"
    assert out[texts.index("of the")] == "of the"  # only stop words: kept as it is


def test_synonyms_come_from_wordnet_by_hand():
    syn = V.Synonymizer(max_words=1)
    wn = syn._wordnet()
    # WordNet 3.0: car.n.01 = {car, auto, automobile, machine, motorcar}; buy.v.01 = {buy, purchase}
    assert set(wn.synonyms("car")) == {"auto", "automobile", "machine", "motorcar"}
    assert set(wn.synonyms("cars")) == set(wn.synonyms("car"))  # base form by WordNet's detachment rules
    assert wn.synonyms("buy") == ["purchase"]
    assert wn.synonyms("Corvinpe") == []
    out = syn.vary(["buy a car"], ["q"], 27)[0].split()
    assert out[1] == "a" and ((out[0] == "purchase" and out[2] == "car")
                              or (out[0] == "buy" and out[2] in {"auto", "automobile", "machine", "motorcar"}))
    assert syn.vary(["of the"], ["q"], 27) == ["of the"]  # stop words are never replaced


def test_rule_paraphrases_by_hand():
    p = V.RuleParaphraser()
    assert p.vary(["What is a dog?"], ["q"], 1)[0] in {"define dog", "dog definition", "explain dog"}
    assert p.vary(["how do I bake bread"], ["q"], 1)[0] in {"how to bake bread", "ways to bake bread",
                                                            "steps to bake bread"}
    lead = p.vary(["ancient arches"], ["q"], 1)[0]
    assert lead in {t.format("ancient arches") for t in V.LEADS}


@pytest.mark.parametrize("variation", V.VARIATIONS)
def test_same_file_twice_order_independent_and_reused(variation, tmp_path):
    texts, qids = _queries()
    queries = QuerySet(qids, texts)
    gen = V.generator_for(variation)
    a = V.variation_set(tmp_path / "a.jsonl", gen, queries, 2016, variation)
    V.variation_set(tmp_path / "b.jsonl", V.generator_for(variation), queries, 2016, variation)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert a.qids == qids and sum(x != y for x, y in zip(a.texts, texts)) > len(texts) // 2
    # permuted queries: the same variation per query id
    permuted = gen.vary(texts[::-1], qids[::-1], 2016)
    assert dict(zip(qids[::-1], permuted)) == dict(zip(a.qids, a.texts))
    if variation != "naturality":  # deterministic by design; the others depend on the seed
        assert V.generator_for(variation).vary(texts, qids, 27) != a.texts
    rows = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert rows[0]["built_from"]["seed"] == 2016 and rows[0]["built_from"]["variation"] == variation
    assert rows[1] == {"qid": qids[0], "text": a.texts[0], "source": texts[0]}
    # reused as written; another seed or other queries are refused, the file untouched
    before = (tmp_path / "a.jsonl").read_bytes()
    assert V.variation_set(tmp_path / "a.jsonl", gen, queries, 2016, variation).texts == a.texts
    with pytest.raises(ProvenanceError, match="a.jsonl: the variation set was built with another seed"):
        V.variation_set(tmp_path / "a.jsonl", gen, queries, 5, variation)
    with pytest.raises(ProvenanceError, match="another queries"):
        V.variation_set(tmp_path / "a.jsonl", gen, QuerySet(qids[:-1], texts[:-1]), 2016, variation)
    assert (tmp_path / "a.jsonl").read_bytes() == before


def test_misspelling_settings_are_part_of_the_provenance(tmp_path):
    texts, qids = _queries()
    queries = QuerySet(qids, texts)
    V.variation_set(tmp_path / "m.jsonl", V.Misspeller(max_edits=2), queries, 5, "misspelling")
    with pytest.raises(ProvenanceError, match="another settings"):
        V.variation_set(tmp_path / "m.jsonl", V.Misspeller(max_edits=1), queries, 5, "misspelling")
    with pytest.raises(ValueError, match="unknown query variation 'typo'"):
        V.generator_for("typo")
