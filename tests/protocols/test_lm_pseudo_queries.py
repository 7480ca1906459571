"""LM-written pseudo-queries: the resumable file (an interrupted run resumes to the same file; corpus order does
not matter; another setting is refused), and the two consumers — PseudoQueryDocids(source='file') and the
pseudo-query training objective (Objectives.pseudo_queries_file) — on hand-made and generated files."""

import json
from pathlib import Path

import numpy as np
import pytest

from gr_jax.data.pairs import document_query_pairs
from gr_jax.data.readers import Corpus, DataError
from gr_jax.docids.pseudo_query import read_queries_file
from gr_jax.backbones import lm as fewshot
from gr_jax.protocols import lm_pseudo_queries as pq


@pytest.fixture
def lm(tiny_lm):
    """The session's tiny LM and its demo dataset (tests/conftest.py), read-only."""
    return tiny_lm


def _corpus(d, rows):
    c = d.corpus
    return Corpus([c.doc_ids[r] for r in rows], [c.texts[r] for r in rows])


GEN = fewshot.PseudoQueryGenerator(max_document_tokens=24, max_query_tokens=5)


def test_file_resumes_to_the_same_content_and_ignores_corpus_order(lm, tmp_path, monkeypatch):
    ctx, d = lm
    rows = list(range(7))
    built = {"lm": "tiny", "n": 2}
    whole = pq.generate_for_corpus(ctx, _corpus(d, rows), GEN, 2, 5, 3, tmp_path / "a.jsonl", built,
                                   progress=False)
    assert sorted(whole.queries) == sorted(d.corpus.doc_ids[r] for r in rows)
    assert all(len(q) == 2 and all(isinstance(t, str) and t for t in q) for q in whole.queries.values())

    # interrupted after the first batch (3 documents by id), then resumed on the corpus in reverse order
    calls = []
    real = fewshot.PseudoQueryGenerator.generate

    def failing(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(fewshot.PseudoQueryGenerator, "generate", failing)
    with pytest.raises(KeyboardInterrupt):
        pq.generate_for_corpus(ctx, _corpus(d, rows), GEN, 2, 5, 3, tmp_path / "b.jsonl", built, progress=False)
    assert len(pq.GeneratedQueries.load(tmp_path / "b.jsonl").queries) == 3
    monkeypatch.setattr(fewshot.PseudoQueryGenerator, "generate", real)
    resumed = pq.generate_for_corpus(ctx, _corpus(d, rows[::-1]), GEN, 2, 5, 3, tmp_path / "b.jsonl", built,
                                     progress=False)
    assert resumed.queries == whole.queries
    body = lambda p: (tmp_path / p).read_text().splitlines()[1:]  # noqa: E731 (the stats line holds times)
    assert body("a.jsonl") == body("b.jsonl")

    # reused when complete; another setting is refused and the file is left as it was
    before = (tmp_path / "a.jsonl").read_text()
    assert pq.generate_for_corpus(ctx, _corpus(d, rows), GEN, 2, 5, 3, tmp_path / "a.jsonl", built,
                                  progress=False).queries == whole.queries
    with pytest.raises(ValueError, match="a.jsonl: the pseudo-query file was built with another n"):
        pq.generate_for_corpus(ctx, _corpus(d, rows), GEN, 3, 5, 3, tmp_path / "a.jsonl", {**built, "n": 3},
                               progress=False)
    assert (tmp_path / "a.jsonl").read_text() == before

    # the file is what PseudoQueryDocids(source='file') and the objective read (provenance line skipped)
    read = read_queries_file(tmp_path / "a.jsonl")
    assert read == {doc: list(dict.fromkeys(q.strip() for q in qs)) for doc, qs in whole.queries.items()}


def test_seeds_change_the_queries(lm, tmp_path):
    ctx, d = lm
    texts = [d.corpus.texts[0]] * 2
    a = GEN.generate(ctx, texts, 4, seed=1, batch_size=2)
    assert a == GEN.generate(ctx, texts, 4, seed=1, batch_size=2)
    assert a != GEN.generate(ctx, texts, 4, seed=2, batch_size=2)


def test_document_query_pairs_by_hand():
    corpus = Corpus(["d2", "d1", "d3"], ["two", "one", "three"])
    pairs = document_query_pairs({"d3": ["c"], "d1": ["a", "b"]}, corpus)
    assert pairs.texts == ["a", "b", "c"] and pairs.qids == ["d1#0", "d1#1", "d3#0"]
    np.testing.assert_array_equal(pairs.rows, [1, 1, 2])
    only = document_query_pairs({"d3": ["c"], "d1": ["a", "b"]}, corpus, restrict_rows=[2])
    assert only.texts == ["c"]
    with pytest.raises(DataError, match=r"q.jsonl: 1 document\(s\) not in the corpus, e.g. \['d9'\]"):
        document_query_pairs({"d9": ["x"]}, corpus, source="q.jsonl")
    with pytest.raises(DataError, match="no generated query"):
        document_query_pairs({"d3": ["c"]}, corpus, restrict_rows=[0])


def test_objective_and_docids_from_a_generated_file(tmp_path):
    """The pseudo-query objective trains generated query → its document; the docid scheme names documents by
    the same file (a hand-written file in the command's format)."""
    from gr_jax.compose import Objectives
    from gr_jax.data import demo
    from gr_jax.docids.base import FitContext
    from gr_jax.docids.pseudo_query import PseudoQueryDocids

    d = demo.generate(num_docs=12, seed=3)
    docs = sorted(d.corpus.doc_ids)[:4]
    path = tmp_path / "pseudo_queries.jsonl"
    lines = [json.dumps({"built_from": {"lm": "x"}, "stats": {}})]
    lines += [json.dumps({"doc_id": doc, "queries": [f"what is {doc}", f"about {doc}"]}) for doc in docs]
    path.write_text("\n".join(lines) + "\n")
    parts, rates = Objectives(indexing_rate=0.0, retrieval_rate=0.0, pseudo_query_rate=0.5,
                              pseudo_queries_file=str(path)).build(d, "train")
    assert rates == [0.5] and parts[0].name == "pseudo-query"
    got = sorted((t, d.corpus.doc_ids[r]) for t, r in zip(parts[0].texts, parts[0].rows))
    assert got == sorted((f"{w} {doc}", doc) for doc in docs for w in ("what is", "about"))
    with pytest.raises(ValueError, match="no split 'pseudo'.*pseudo_queries_file"):
        Objectives(pseudo_query_rate=1.0).build(d, "train")

    class Chars:  # one token per character, ids 3..
        size = 260

        def encode(self, text):
            return [3 + ord(c) for c in text]

    scheme = PseudoQueryDocids(source="file", queries_file=str(path), per_document=2, max_tokens=40)
    table = scheme.fit(d.corpus, FitContext(Chars())).assign(d.corpus)
    row = d.corpus.index_of(docs[0])
    named = sorted("".join(chr(t - 3) for t in table.sequence(i)) for i in np.flatnonzero(table.doc_rows == row))
    assert named == sorted([f"what is {docs[0]}", f"about {docs[0]}"])


@pytest.mark.slow
@pytest.mark.torch
def test_command_writes_reuses_and_refuses(tiny_hf_llama, tmp_path, capsys):
    """python -m gr_jax.pseudo_queries with a tiny random HF Llama directory as the LM."""
    import gin

    from gr_jax import pseudo_queries as entry

    hf = tiny_hf_llama
    args = ["--gin_file=experiments/demo/pseudo_queries_smollm2.gin", f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
            f"--gin.LM='{hf}'", "--gin.write_pseudo_queries.max_documents=5",
            "--gin.write_pseudo_queries.num_queries=2", "--gin.PseudoQueryGenerator.max_query_tokens=4"]
    assert entry.main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["documents"] == 5 and summary["queries"] == 10
    path = Path(summary["file"])
    first = path.read_text()
    gin.clear_config()
    assert entry.main(args) == 0 and path.read_text() == first  # reused, not written again
    gin.clear_config()
    capsys.readouterr()
    assert entry.main(args + ["--gin.write_pseudo_queries.seed=3"]) == 2
    err = capsys.readouterr().err
    assert "pseudo_queries.jsonl: the pseudo-query file was built with another seed" in err
    assert "Traceback" not in err and path.read_text() == first
