"""Pseudo-query and n-gram docids: several docids per document, all in the text vocabulary."""

import json

import numpy as np
import pytest

from gr_jax.data import demo
from gr_jax.data.readers import Corpus, DataError
from gr_jax.docids.base import FitContext, load_scheme_state, save_scheme
from gr_jax.docids.ngram import NgramDocids, multi_docid_stats
from gr_jax.docids.pseudo_query import PseudoQueryDocids, queries_by_document, read_queries_file
from gr_jax.data.vocab import train_sentencepiece


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    ds = demo.generate(num_docs=30, seed=3)
    vocab = train_sentencepiece(list(ds.corpus.texts) + list(ds.queries["train"].texts),
                                tmp_path_factory.mktemp("v") / "v.model", vocab_size=200)
    return ds, vocab


def test_pseudo_query_docids_from_training_queries(data, tmp_path):
    ds, vocab = data
    by_doc = queries_by_document(ds, "train")
    scheme = PseudoQueryDocids(per_document=2).fit(ds.corpus, FitContext(vocab=vocab, queries=by_doc))
    table = scheme.assign(ds.corpus)
    rows = table.doc_rows.tolist()
    assert sorted(set(rows)) == list(range(30))
    # every document's docids are its first ≤ 2 training queries, primary first, in the text vocabulary
    for r, doc in enumerate(ds.corpus.doc_ids):
        mine = [table.sequence(i) for i in np.flatnonzero(table.doc_rows == r)]
        expect = [vocab.encode(t)[:32] for t in by_doc.get(doc, [])[:2]] or [vocab.encode(ds.corpus.texts[r])[:32]]
        assert mine == expect
    assert table.space.kind == "text" and table.space.end == vocab.size
    assert int(table.sequences.max()) < vocab.size
    # the trie finds a document from any of its docids
    index = table.index()
    i = int(np.flatnonzero(table.doc_rows == 4)[-1])
    leaf = index.lookup([table.sequence(i) + [1]])[0]
    assert 4 in index.documents(leaf).tolist()
    # state round trip (queries kept) and no refit for new documents
    save_scheme(scheme, tmp_path / "s")
    back = load_scheme_state(PseudoQueryDocids(per_document=2), tmp_path / "s")
    back.bind(vocab)
    again = back.assign(ds.corpus)
    np.testing.assert_array_equal(again.sequences, table.sequences)
    np.testing.assert_array_equal(again.doc_rows, table.doc_rows)


def test_pseudo_query_new_documents_and_errors(data, tmp_path):
    ds, vocab = data
    by_doc = queries_by_document(ds, "train")
    scheme = PseudoQueryDocids().fit(ds.corpus, FitContext(vocab=vocab, queries=by_doc))
    new = Corpus(["fresh-1"], ["zebra quartz lantern harbour"])
    table = scheme.assign(new)  # no queries for it: the leading text, same token space
    assert table.sequence(0) == vocab.encode("zebra quartz lantern harbour")[:32]
    with pytest.raises(ValueError, match="'fresh-1' has no query"):
        PseudoQueryDocids(fallback="error").fit(ds.corpus, FitContext(vocab=vocab, queries=by_doc)).assign(new)
    with pytest.raises(ValueError, match="need the training queries"):
        PseudoQueryDocids().fit(ds.corpus, FitContext(vocab=vocab))
    with pytest.raises(ValueError, match="source must be one of"):
        PseudoQueryDocids(source="llm")


def test_pseudo_query_file_formats(data, tmp_path):
    ds, vocab = data
    tsv = tmp_path / "q.tsv"
    tsv.write_text(f"{ds.corpus.doc_ids[0]}\twhere is the harbour\n{ds.corpus.doc_ids[0]}\twho built it\n")
    got = read_queries_file(tsv)
    assert got == {ds.corpus.doc_ids[0]: ["where is the harbour", "who built it"]}
    jl = tmp_path / "q.jsonl"
    jl.write_text(json.dumps({"doc_id": ds.corpus.doc_ids[1], "queries": ["a b", "c d"]}) + "\n")
    scheme = PseudoQueryDocids(source="file", queries_file=str(jl)).fit(ds.corpus, FitContext(vocab=vocab))
    table = scheme.assign(ds.corpus, rows=[1])
    assert [table.sequence(i) for i in range(len(table))] == [vocab.encode("a b"), vocab.encode("c d")]
    bad = tmp_path / "bad.tsv"
    bad.write_text("d1\tok\nd2 no tab\n")
    with pytest.raises(DataError, match=r"bad.tsv:2: expected 'doc_id<TAB>query'"):
        read_queries_file(bad)
    badj = tmp_path / "bad.jsonl"
    badj.write_text('{"doc_id": "d1", "query": ""}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: empty query"):
        read_queries_file(badj)
    with pytest.raises(DataError, match="not found"):
        read_queries_file(tmp_path / "missing.tsv")


class _Chars:
    """A character-level 'vocabulary' for hand-checkable n-grams."""
    size = 128

    def encode(self, text):
        return [ord(c) for c in text]


def test_ngram_spans_by_hand():
    scheme = NgramDocids(n=3, stride=2)
    assert scheme.spans([1, 2, 3, 4, 5, 6]) == [(1, 2, 3), (3, 4, 5), (5, 6)]
    assert scheme.spans([1, 2]) == [(1, 2)]
    assert NgramDocids(n=2, stride=1).spans([7, 7, 7]) == [(7, 7)]  # duplicates within a document dropped
    corpus = Corpus(["a", "b", "c"], ["abcdef", "abcxyz", "qq"], titles=["T", "U", "V"])
    s = NgramDocids(n=3, stride=3, title_first=True).fit(corpus, FitContext(vocab=_Chars()))
    table = s.assign(corpus)
    got = [("".join(map(chr, table.sequence(i))), int(table.doc_rows[i])) for i in range(len(table))]
    assert got == [("T", 0), ("abc", 0), ("def", 0), ("U", 1), ("abc", 1), ("xyz", 1), ("V", 2), ("qq", 2)]
    np.testing.assert_array_equal(table.primary([0, 1, 2]), [0, 3, 6])  # the title is the primary docid
    stats = multi_docid_stats(table)
    assert stats["docids"] == 8 and stats["distinct_docids"] == 7
    assert stats["identifying_fraction"] == pytest.approx(6 / 7)  # "abc" names two documents
    assert stats["documents_per_docid_max"] == 2 and stats["documents_with_identifying_docid"] == 1.0
    index = table.index(vocab_size=128)
    leaf = index.lookup([[ord("a"), ord("b"), ord("c"), 1]])[0]
    assert sorted(index.documents(leaf).tolist()) == [0, 1]
    with pytest.raises(ValueError, match="no titles"):
        NgramDocids(title_first=True).fit(Corpus(["a"], ["x"]), FitContext(vocab=_Chars()))


def test_ngram_docids_on_demo_corpus(data, tmp_path):
    ds, vocab = data
    scheme = NgramDocids(n=6, stride=3, max_per_document=10).fit(ds.corpus, FitContext(vocab=vocab))
    table = scheme.assign(ds.corpus)
    counts = np.bincount(table.doc_rows, minlength=30)
    assert counts.min() >= 1 and counts.max() <= 10
    assert table.lengths.max() <= 6
    save_scheme(scheme, tmp_path / "s")
    back = load_scheme_state(NgramDocids(), tmp_path / "s")
    back.bind(vocab)
    assert back.n == 6 and back.stride == 3
    np.testing.assert_array_equal(back.assign(ds.corpus).sequences, table.sequences)
    stats = multi_docid_stats(table)
    assert 0.5 < stats["identifying_fraction"] <= 1.0


def test_all_docids_expands_rows_in_order():
    from gr_jax.docids.base import DocidTable
    from gr_jax.data.vocab import DocidTokenSpace

    table = DocidTable.from_lists([[5], [6, 7], [8], [9], [10]], [0, 0, 1, 2, 2], DocidTokenSpace("text", 20))
    pos, idx = table.all_docids([2, 0, 2])
    assert pos.tolist() == [0, 0, 1, 1, 2, 2] and idx.tolist() == [3, 4, 0, 1, 3, 4]
    np.testing.assert_array_equal(table.targets_of(idx[:2], 3), [[9, 1, 0], [10, 1, 0]])
    with pytest.raises(ValueError, match="no docid in this table"):
        table.all_docids([7])
