"""The objectives-config hook: pairs become examples through the run's objectives config (DSI's by default)."""

import numpy as np

from gr_jax.data.pairs import Pairs
from gr_jax.docids.base import DocidTable
from gr_jax.training.objectives import Objectives, ObjectivesConfig, example_store
from gr_jax.data.vocab import DocidTokenSpace


class _Chars:
    size = 40

    def encode(self, text):
        return [2 + (ord(c) % 30) for c in text]


def test_default_examples_are_the_rows_primary_docids():
    table = DocidTable.from_lists([[5, 6], [7], [8, 9]], [0, 1, 1], DocidTokenSpace("text", 20))
    pairs = Pairs("indexing", ["ab", "cd"], np.array([1, 0]))
    lengths = {"inputs": 6, "targets": 4}
    base = ObjectivesConfig().examples(pairs, table, _Chars(), lengths)
    assert base.features["targets"].tolist() == [[7, 1, 0, 0], [5, 6, 1, 0]]  # the rows' primary docids + EOS
    # all_docids shapes the training mixture, not continued training: replay keeps the primary docids
    every = Objectives(all_docids=True).examples(pairs, table, _Chars(), lengths)
    want = example_store(pairs, table, _Chars(), lengths, all_docids=False)
    assert every.features["targets"].tolist() == want.features["targets"].tolist() == base.features["targets"].tolist()
