"""Readers on small files in each layout, written here; malformed rows and bad bytes give file:line errors."""

import json

import pytest

from gr_jax.data import readers
from gr_jax.data.readers import DataError


def _write(path, text: str | bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _nci(d, doc_rows=None):
    _write(d / "NQ_doc_content.tsv", doc_rows or "0\t\t\tfirst document text\t\t\ten\n1\t\t\tsecond one\t\t\ten\n")
    _write(d / "nq_train_doc_newid.tsv", "who wrote it\t111\t0\t1-2-3\nwhen was it\t112\t1\t4-5\n")
    _write(d / "nq_dev_doc_newid.tsv", "what is first\t113\t0\t1-2-3\n")
    _write(d / "nq_512_qg.tsv", "pseudo query\t0\t1\t4-5\n")


def test_nq320k_nci(tmp_path):
    _nci(tmp_path)
    ds = readers.read_nq320k_nci(tmp_path)
    assert list(ds.corpus.doc_ids) == ["0", "1"] and ds.corpus.texts[1] == "second one"
    assert ds.queries["train"].texts == ["who wrote it", "when was it"]
    assert ds.qrels["train"] == {"train-1": {"0": 1}, "train-2": {"1": 1}}
    assert ds.qrels["pseudo"] == {"pseudo-1": {"1": 1}}
    assert ds.extras["semantic_ids"] == {"0": (1, 2, 3), "1": (4, 5)}


@pytest.mark.parametrize("rows, match", [
    ("0\t\t\ttext\t\ten\n", r"NQ_doc_content.tsv:1: expected 7 tab-separated fields"),
    ("0\t\t\ttext\t\t\ten\n0\t\t\tagain\t\t\ten\n", r"NQ_doc_content.tsv:2: duplicate docid '0'"),
    ("0\t\t\t  \t\t\ten\n", r"NQ_doc_content.tsv:1: empty document text"),
    (b"0\t\t\tcaf\xe9\t\t\ten\n", r"NQ_doc_content.tsv:1: not valid UTF-8"),
])
def test_nq320k_nci_bad_rows(tmp_path, rows, match):
    _nci(tmp_path, rows)
    with pytest.raises(DataError, match=match):
        readers.read_nq320k_nci(tmp_path)


def test_nq320k_nci_unknown_document_and_semantic_id(tmp_path):
    _nci(tmp_path)
    _write(tmp_path / "nq_dev_doc_newid.tsv", "q\t1\t7\t1-2\n")
    with pytest.raises(DataError, match=r"nq_dev_doc_newid.tsv:1: document '7' is not in the corpus"):
        readers.read_nq320k_nci(tmp_path)
    _write(tmp_path / "nq_dev_doc_newid.tsv", "q\t1\t0\tone-two\n")
    with pytest.raises(DataError, match=r"nq_dev_doc_newid.tsv:1: semantic id 'one-two'"):
        readers.read_nq320k_nci(tmp_path)


def test_nq320k_glen(tmp_path):
    _write(tmp_path / "DOC_NQ_first64.tsv", "oldid\tdoc_content\nd1\talpha text\nd2\tbeta text\n")
    _write(tmp_path / "GTQ_NQ_train.tsv", "query\toldid\nq one\td1\n")
    _write(tmp_path / "GTQ_NQ_dev.tsv", "query\toldid\nseen q\td1\nnew q\td2\n")
    _write(tmp_path / "GTQ_NQ_dev_seen.tsv", "query\toldid\nseen q\td1\n")
    _write(tmp_path / "GTQ_NQ_dev_unseen.tsv", "query\toldid\nnew q\td2\n")
    ds = readers.read_nq320k_glen(tmp_path)
    assert ds.queries["dev_seen"].texts == ["seen q"] and ds.queries["dev_unseen"].texts == ["new q"]
    assert list(ds.qrels["dev_unseen"].values()) == [{"d2": 1}]
    _write(tmp_path / "GTQ_NQ_train.tsv", "question\toldid\nq\td1\n")
    with pytest.raises(DataError, match=r"GTQ_NQ_train.tsv:1: expected header"):
        readers.read_nq320k_glen(tmp_path)


def test_nq320k_genret(tmp_path):
    _write(tmp_path / "corpus_lite.json", json.dumps(["doc zero", "doc one", "doc two"]))
    _write(tmp_path / "train.json", json.dumps([["tq", 0], ["tq2", 2]]))
    _write(tmp_path / "dev.json", json.dumps([["dq0", 1], ["dq1", 2]]))
    _write(tmp_path / "dev.json.seen", "[1]")
    _write(tmp_path / "dev.json.unseen", "0\n")
    ds = readers.read_nq320k_genret(tmp_path)
    assert ds.qrels["train"] == {"train-0": {"0": 1}, "train-1": {"2": 1}}
    assert ds.queries["dev_seen"].texts == ["dq1"] and ds.queries["dev_unseen"].texts == ["dq0"]
    _write(tmp_path / "dev.json", json.dumps([["dq0", 9]]))
    with pytest.raises(DataError, match=r"dev.json: row 0 points to document 9"):
        readers.read_nq320k_genret(tmp_path)
    _write(tmp_path / "dev.json", '[["dq0", 1],\n oops]')
    with pytest.raises(DataError, match=r"dev.json:2: invalid JSON"):
        readers.read_nq320k_genret(tmp_path)


def test_msmarco_and_trec_dl_and_mmarco(tmp_path):
    _write(tmp_path / "collection.tsv", "0\tThe cafÃ© is open\n1\tSecond passage\n2\tThird\n")
    _write(tmp_path / "queries.dev.tsv", "100\twhere is the cafe\n101\tsecond\n")
    _write(tmp_path / "qrels.dev.tsv", "100\t0\t0\t1\n101\t0\t1\t1\n")
    _write(tmp_path / "queries.train.tsv", "200\tthird\n")
    _write(tmp_path / "qrels.train.tsv", "200\t0\t2\t1\n")
    ds = readers.read_msmarco(tmp_path, repair_utf8=True)
    assert ds.corpus.texts[0] == "The café is open" and list(ds.corpus.doc_ids) == ["0", "1", "2"]
    assert isinstance(ds.corpus.texts, readers.PackedStrings)
    assert ds.qrels["dev"] == {"100": {"0": 1}, "101": {"1": 1}}
    assert readers.read_msmarco(tmp_path).corpus.texts[0] == "The cafÃ© is open"  # repair is opt-in
    # TREC DL: space-separated graded qrels and a topics file
    _write(tmp_path / "2019qrels-pass.txt", "100 Q0 0 3\n100 Q0 1 0\n101 Q0 1 2\n")
    dl = readers.read_qrels_checked(tmp_path / "2019qrels-pass.txt", ds.queries["dev"])
    assert dl["100"] == {"0": 3, "1": 0}
    # mMARCO: translated queries joined to the English qrels
    _write(tmp_path / "portuguese_queries.dev.tsv", "100\tonde fica o café\n999\tnão julgada\n")
    q, qr = readers.read_mmarco_queries(tmp_path / "portuguese_queries.dev.tsv", ds.qrels["dev"])
    assert q.qids == ["100"] and qr == {"100": {"0": 1}}
    _write(tmp_path / "collection.tsv", "0\tok\n1 no tab here\n")
    with pytest.raises(DataError, match=r"collection.tsv:2: expected 2 tab-separated fields"):
        readers.read_msmarco_collection(tmp_path / "collection.tsv")
    _write(tmp_path / "collection.tsv", b"0\tok\n1\tbad \xff byte\n")
    with pytest.raises(DataError, match=r"collection.tsv:2: not valid UTF-8"):
        readers.read_msmarco_collection(tmp_path / "collection.tsv")
    _write(tmp_path / "qrels.bad.tsv", "100\t0\t0\n")
    with pytest.raises(DataError, match=r"qrels.bad.tsv:1: expected 4 fields"):
        readers.read_qrels_checked(tmp_path / "qrels.bad.tsv")
    _write(tmp_path / "queries.dup.tsv", "1\ta\n1\tb\n")
    with pytest.raises(DataError, match=r"queries.dup.tsv:2: duplicate qid '1' \(first at line 1\)"):
        readers.read_queries_tsv(tmp_path / "queries.dup.tsv")
    _write(tmp_path / "queries.empty.tsv", "1\t \n")
    with pytest.raises(DataError, match=r"queries.empty.tsv:1: empty query"):
        readers.read_queries_tsv(tmp_path / "queries.empty.tsv")


def test_generic_jsonl_and_tsv(tmp_path):
    _write(tmp_path / "c.jsonl", '{"id": "a", "text": "alpha", "title": "A", "url": "x/a"}\n{"_id": "b", "contents": "beta"}\n')
    c = readers.read_corpus(tmp_path / "c.jsonl")
    assert list(c.doc_ids) == ["a", "b"] and c.titles == ["A", ""] and c.urls == ["x/a", ""]
    _write(tmp_path / "c.tsv", "a\talpha\tTitle A\nb\tbeta\tTitle B\n")
    c = readers.read_corpus(tmp_path / "c.tsv")
    assert c.titles == ["Title A", "Title B"] and c.urls is None and c.index_of("b") == 1
    _write(tmp_path / "q.jsonl", '{"qid": "1", "query": "what"}\n')
    assert readers.read_queries(tmp_path / "q.jsonl").texts == ["what"]
    _write(tmp_path / "bad.jsonl", '{"id": "a"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: no text field"):
        readers.read_corpus(tmp_path / "bad.jsonl")
    _write(tmp_path / "bad2.jsonl", '{"id": "a", "text": "x"}\n[1, 2]\n')
    with pytest.raises(DataError, match=r"bad2.jsonl:2: expected a JSON object"):
        readers.read_corpus(tmp_path / "bad2.jsonl")
    with pytest.raises(DataError, match=r"nothing.tsv: no such file"):
        readers.read_corpus(tmp_path / "nothing.tsv")


def test_fix_double_utf8():
    assert readers.fix_double_utf8("naÃ¯ve â€œquotesâ€\x9d") == "naïve “quotes”"
    assert readers.fix_double_utf8("plain café") == "plain café"  # already correct: unchanged


def test_a_corpus_in_seals_layout_keeps_titles_and_skips_dprs_header(tmp_path):
    """DPR's and SEAL's psgs_w100.tsv: id, text, title with a header line, which is not a document; the `tsv`
    dataset reads it as corpus.tsv beside TREC-style queries and qrels."""
    from gr_jax.data import sources

    (tmp_path / "corpus.tsv").write_text("id\ttext\ttitle\n1\tAaron is a prophet\tAaron\n2\tBread is food\tBread\n")
    (tmp_path / "queries.test.tsv").write_text("q1\twho is aaron\n")
    (tmp_path / "qrels.test.tsv").write_text("q1\t0\t1\t1\n")
    ds = sources.load_dataset("tsv", str(tmp_path))
    assert list(ds.corpus.doc_ids) == ["1", "2"] and list(ds.corpus.titles) == ["Aaron", "Bread"]
    assert list(ds.queries["test"].qids) == ["q1"] and ds.qrels["test"] == {"q1": {"1": 1}}
