import numpy as np
import pytest

from gr_jax.data.readers import Corpus
from gr_jax.docids.base import FitContext, load_scheme_state, save_scheme
from gr_jax.docids.numeric import PQDocids, RQDocids, SemanticDocids


def _corpus(n):
    return Corpus([f"d{i}" for i in range(n)], [f"text {i}" for i in range(n)])


def _emb(n, d=16, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(12, d)) * 4
    return (centers[rng.integers(0, 12, n)] + rng.normal(size=(n, d))).astype(np.float32)


SCHEMES = {
    "pq": lambda: PQDocids(m=4, k=16),
    "rq": lambda: RQDocids(levels=3, k=16, beam=2),
    "semantic": lambda: SemanticDocids(k=5, c=20, depth=2),
}


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_numeric_scheme_contract(name, tmp_path):
    corpus, emb = _corpus(300), _emb(300)
    initial = np.arange(200)
    d0 = Corpus([corpus.doc_ids[i] for i in initial], [corpus.texts[i] for i in initial])
    scheme = SCHEMES[name]().fit(d0, FitContext(embeddings=emb[initial]))
    table = scheme.assign(d0, embeddings=emb[initial])
    L, V = table.space.length, table.space.size
    assert table.space.kind == "codebook" and table.sequences.shape == (200, L)
    assert table.sequences.min() >= 0 and table.sequences.max() < V
    assert (table.lengths == L).all()
    if name == "semantic":  # the leaf digit makes docids unique while leaves hold ≤ c documents
        assert table.stats()["collision_rate"] == 0.0
    # determinism: a second fit gives the same docids
    again = SCHEMES[name]().fit(d0, FitContext(embeddings=emb[initial])).assign(d0, embeddings=emb[initial])
    np.testing.assert_array_equal(again.sequences, table.sequences)
    # save / load, then new documents get docids in the same space without refitting
    save_scheme(scheme, tmp_path / "s")
    loaded = load_scheme_state(SCHEMES[name](), tmp_path / "s")
    new_rows = np.arange(200, 300)
    a = scheme.assign(corpus, rows=new_rows, embeddings=emb[new_rows])
    b = loaded.assign(corpus, rows=new_rows, embeddings=emb[new_rows])
    np.testing.assert_array_equal(a.sequences, b.sequences)
    assert a.space == table.space and a.doc_rows.tolist() == new_rows.tolist()
    index = table.index()
    index.insert(a.sequences, a.doc_rows)  # new docids go into the same trie
    assert (index.lookup(a.sequences) >= 0).all()


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_numeric_scheme_errors(name):
    corpus = _corpus(10)
    with pytest.raises(ValueError, match="need document embeddings"):
        SCHEMES[name]().fit(corpus)
    with pytest.raises(ValueError, match=r"embeddings have shape \(9, 16\), expected \[10, D\]"):
        SCHEMES[name]().fit(corpus, FitContext(embeddings=_emb(9)))
    if name != "semantic":  # semantic clusters small nodes with fewer centroids
        with pytest.raises(ValueError, match="16 clusters but only 10 points"):
            SCHEMES[name]().fit(corpus, FitContext(embeddings=_emb(10)))
    with pytest.raises(ValueError, match="before fit"):
        SCHEMES[name]().assign(corpus, embeddings=_emb(10))


def test_tfidf_svd_embedder_state_round_trip(tmp_path):
    from gr_jax.data import demo
    from gr_jax.docids.embed import TfidfSvdEmbedder

    texts = list(demo.generate(num_docs=60, seed=1).corpus.texts)
    emb = TfidfSvdEmbedder(dim=8).fit(texts)
    x = emb.embed(texts)
    assert x.shape == (60, 8)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    meta, arrays = emb.state()
    back = TfidfSvdEmbedder()
    back.load_state(meta, arrays)
    np.testing.assert_allclose(back.embed(texts[:5]), x[:5], atol=1e-5)
    np.testing.assert_allclose(TfidfSvdEmbedder(dim=8).fit(texts).embed(texts), x, atol=1e-5)  # deterministic
    with pytest.raises(ValueError, match="before fit"):
        TfidfSvdEmbedder().embed(texts)
