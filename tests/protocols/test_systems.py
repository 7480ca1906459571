"""`TrainedSystem.add` for docids decoded by the model (GLEN, GenRET): the new documents' docids are the trained
model's decodings of their tokens, inserted into the prefix tree beside the trained ones; the scheme's `assign`
is never asked. A stub model decodes by a rule that can be checked by hand."""

import types

import numpy as np

from gr_jax.data.readers import Corpus
from gr_jax.docids.base import DocidTable
from gr_jax.protocols.systems import TrainedSystem
from gr_jax.data.vocab import DocidTokenSpace

L, V = 2, 4
SPACE = DocidTokenSpace.codebook(L, V)


class _Vocab:
    size = 50

    def encode(self, text):  # a word's id is its length + 2 (ids 0/1 are pad/end)
        return [len(w) + 2 for w in text.split()]


class _Scheme:
    name = "stub"
    decoded_by_model = True
    adds_tokens_per_document = False
    needs_embeddings = False

    def table(self, tokens, weights, rows, vocab_size):
        return DocidTable(tokens, np.full(len(rows), L), rows, SPACE, weights)

    def assign(self, *args, **kwargs):
        raise AssertionError("docids decoded by the model are never assigned by the scheme")


class _Model:
    config = types.SimpleNamespace(vocab_size=50)
    seen = None

    def decode_docids(self, params, tokens):
        """codes = the first two token ids mod V, weights = params × the ids."""
        tokens = np.asarray(tokens)
        return tokens[:, :L] % V, params * tokens[:, :L].astype(np.float32)

    def use_docids(self, table):
        self.seen = table


def test_new_documents_get_the_models_decodings():
    corpus = Corpus(["d0", "d1", "d2", "d3"], ["a bb", "ccc dddd", "ee f", "gggggg hhh"])
    trained = _Scheme().table(np.array([[3, 0], [1, 2]]), np.zeros((2, L)), np.array([0, 1]), 50)
    setup = types.SimpleNamespace(scheme=_Scheme(), model=_Model(), vocab=_Vocab(), table=trained,
                                  feature_lengths={"inputs": 8, "documents": 4}, index=trained.index(),
                                  dataset=types.SimpleNamespace(corpus=Corpus(["d0", "d1"], ["a bb", "ccc dddd"])))
    system = TrainedSystem(setup, 2.0, num_beams=2, batch_size=2, corpus=corpus)
    out = system.add([2, 3])
    # "ee f" → ids [4, 3] → codes [0, 3]; "gggggg hhh" → ids [8, 5] → codes [0, 1]
    expect = {2: ([0, 3], [8.0, 6.0]), 3: ([0, 1], [16.0, 10.0])}
    for row, (codes, weights) in expect.items():
        i = int(np.flatnonzero(system.table.doc_rows == row)[0])
        assert system.table.sequences[i].tolist() == codes
        assert system.table.weights[i].tolist() == weights
        leaf = setup.index.lookup(np.array([codes]))[0]
        assert leaf >= 0 and row in setup.index.documents(leaf).tolist()
    assert out["documents"] == 4 and out["docids_added"] == 2
    assert setup.model.seen is system.table and len(system.table) == 4
