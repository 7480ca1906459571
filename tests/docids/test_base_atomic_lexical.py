import numpy as np
import pytest

from gr_jax.data import demo
from gr_jax.data.readers import Corpus
from gr_jax.docids.atomic import AtomicDocids, NaiveDocids
from gr_jax.docids.base import DocidTable, FitContext, load_scheme_state, save_scheme
from gr_jax.docids.lexical import FieldDocids
from gr_jax.data.vocab import DocidTokenSpace, train_sentencepiece


@pytest.fixture(scope="module")
def corpus_and_vocab(tmp_path_factory):
    ds = demo.generate(num_docs=30, seed=2)
    vocab = train_sentencepiece(list(ds.corpus.texts) + list(ds.corpus.urls), tmp_path_factory.mktemp("v") / "v.model",
                                vocab_size=200)
    return ds.corpus, vocab


def test_table_targets_index_and_stats():
    table = DocidTable.from_lists([[5, 6], [5, 7, 8], [9], [5, 6]], [0, 1, 2, 3], DocidTokenSpace("text", 20))
    assert table.target_length == 4
    np.testing.assert_array_equal(table.targets([1, 0], 5), [[5, 7, 8, 1, 0], [5, 6, 1, 0, 0]])
    with pytest.raises(ValueError, match="shorter than the longest docid"):
        table.targets([0], 3)
    with pytest.raises(ValueError, match="no docid in this table"):
        table.primary([7])
    index = table.index()
    leaf = index.lookup([[5, 6, 1]])[0]
    assert sorted(index.documents(leaf).tolist()) == [0, 3]  # a collision keeps both documents
    stats = table.stats()
    assert stats["collision_rate"] == 0.5 and stats["distinct_docids"] == 3 and stats["distinct_tokens"] == 5
    code = DocidTable(np.array([[0, 1], [1, 0]]), [2, 2], [0, 1], DocidTokenSpace.codebook(2, 2))
    assert code.target_length == 2 and code.targets([1]).tolist() == [[1, 0]]  # code 0 is a real code
    with pytest.raises(ValueError, match="must all have length 3"):
        DocidTable(np.array([[0, 1]]), [2], [0], DocidTokenSpace.codebook(3, 2))


def test_table_save_load(tmp_path):
    table = DocidTable.from_lists([[5, 6], [9]], [0, 1], DocidTokenSpace("text", 20, offset=3))
    table.save(tmp_path / "t")
    back = DocidTable.load(tmp_path / "t")
    np.testing.assert_array_equal(back.sequences, table.sequences)
    assert back.space == table.space
    assert back.constants is None
    marked = DocidTable.from_lists([[5, 6]], [2], table.space, constants={"markers": {"end": [7, 8]}})
    marked.save(tmp_path / "c")
    assert DocidTable.load(tmp_path / "c").constants == {"markers": {"end": [7, 8]}}
    assert DocidTable.concatenate([marked, marked]).constants == marked.constants
    with pytest.raises(ValueError, match="different scheme constants"):
        DocidTable.concatenate([table, marked])
    (tmp_path / "bad").mkdir()
    with pytest.raises(ValueError, match="not a saved DocidTable"):
        DocidTable.load(tmp_path / "bad")


def test_atomic_new_documents_continue_the_count(corpus_and_vocab, tmp_path):
    corpus, vocab = corpus_and_vocab
    scheme = AtomicDocids().fit(corpus, FitContext(vocab=vocab))
    first = scheme.assign(corpus, rows=range(20))
    assert first.sequences[:, 0].tolist() == list(range(vocab.size, vocab.size + 20))
    assert first.space.offset == vocab.size and first.space.end == vocab.size + 20
    save_scheme(scheme, tmp_path / "s")
    again = load_scheme_state(AtomicDocids(), tmp_path / "s")
    more = again.assign(corpus, rows=range(15, 30))  # 15..19 keep their tokens, 20..29 get new ones
    assert more.sequences[:5, 0].tolist() == first.sequences[15:, 0].tolist()
    assert more.sequences[5:, 0].tolist() == list(range(vocab.size + 20, vocab.size + 30))
    with pytest.raises(ValueError, match="holds the state of scheme 'atomic', not 'naive'"):
        load_scheme_state(NaiveDocids(), tmp_path / "s")


def test_naive_and_field_docids(corpus_and_vocab):
    corpus, vocab = corpus_and_vocab
    naive = NaiveDocids().fit(corpus, FitContext(vocab=vocab)).assign(corpus)
    assert vocab.decode(naive.sequence(3)) == corpus.doc_ids[3]
    url = FieldDocids(field="url").fit(corpus, FitContext(vocab=vocab)).assign(corpus)
    assert vocab.decode(url.sequence(4)) == corpus.urls[4]
    assert url.space.kind == "text" and url.sequences.max() < vocab.size
    bare = Corpus(["a", "b"], ["text a", "text b"])
    with pytest.raises(ValueError, match="the corpus has no titles"):
        FieldDocids(field="title").fit(bare, FitContext(vocab=vocab))
    with pytest.raises(ValueError, match="field must be one of"):
        FieldDocids(field="body")
    with pytest.raises(ValueError, match="need the text vocabulary"):
        AtomicDocids().fit(bare)


def test_keyword_docids_by_bm25_weight(tmp_path, corpus_and_vocab):
    from gr_jax.docids.lexical import KeywordDocids

    corpus, vocab = corpus_and_vocab
    scheme = KeywordDocids(n=3).fit(corpus, FitContext(vocab=vocab))
    table = scheme.assign(corpus)
    assert table.lengths.max() <= 3 and table.sequences.max() < vocab.size
    # hand check for one document: recompute BM25 weights of its tokens directly
    ids = vocab.encode(corpus.texts[0])
    docs = [set(vocab.encode(t)) for t in corpus.texts]
    avg = np.mean([len(vocab.encode(t)) for t in corpus.texts])
    best = {}
    for t in set(ids):
        piece = vocab.id_to_piece(t).replace("▁", "")
        if not any(c.isalpha() for c in piece):
            continue
        df = sum(t in d for d in docs)
        idf = np.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
        tf = ids.count(t)
        best[t] = idf * tf * 1.9 / (tf + 0.9 * (0.6 + 0.4 * len(ids) / avg))
    expected = sorted(best, key=lambda t: (-best[t], t))[:3]
    assert table.sequence(0) == expected
    # collisions split with a suffix; state round trip keeps the docids
    split = KeywordDocids(n=1, split_collisions=True).fit(corpus, FitContext(vocab=vocab))
    t1 = split.assign(corpus)
    assert t1.stats()["collision_rate"] == 0.0
    assert KeywordDocids(n=1).fit(corpus, FitContext(vocab=vocab)).assign(corpus).stats()["collision_rate"] > 0
    save_scheme(split, tmp_path / "kw")
    back = load_scheme_state(KeywordDocids(n=1, split_collisions=True), tmp_path / "kw")
    back.bind(vocab)
    np.testing.assert_array_equal(back.assign(corpus).sequences, t1.sequences)


def test_fixed_length_keyword_docids_for_glen(corpus_and_vocab):
    from gr_jax.docids.lexical import KeywordDocids

    corpus, vocab = corpus_and_vocab
    scheme = KeywordDocids(n=2, fixed_length=True).fit(corpus, FitContext(vocab=vocab))
    table = scheme.assign(corpus)
    assert table.space.length == 2 and (table.lengths == 2).all()
    assert table.target_length == 2  # no EOS
    with pytest.raises(ValueError, match="fewer than KeywordDocids.n = 10000"):
        KeywordDocids(n=10000, fixed_length=True).fit(corpus, FitContext(vocab=vocab)).assign(corpus)
    with pytest.raises(ValueError, match="choose one"):
        KeywordDocids(fixed_length=True, split_collisions=True)
