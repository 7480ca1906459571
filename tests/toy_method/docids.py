"""The toy's docid scheme: the first `tokens` text tokens of a document's title (short, shared by similar
titles: collisions)."""

import gin
import numpy as np

from gr_jax.methods.api import DocidScheme, DocidTable, DocidTokenSpace


@gin.configurable
class ToyDocids(DocidScheme):
    name = "toy_title_prefix"

    def __init__(self, tokens: int = 2):
        self.tokens = tokens
        self._vocab, self.text_vocab_size = None, 0

    def fit(self, corpus, context):
        self._vocab, self.text_vocab_size = context.vocab, int(context.vocab.size)
        return self

    def bind(self, vocab):
        self._vocab = vocab

    def assign(self, corpus, rows=None, embeddings=None):
        rows = np.arange(len(corpus)) if rows is None else np.asarray(rows)
        seqs = [self._vocab.encode(corpus.titles[int(r)])[: self.tokens] for r in rows]
        return DocidTable.from_lists(seqs, rows, DocidTokenSpace("text", self.text_vocab_size))

    def state(self):
        return {"tokens": self.tokens, "text_vocab_size": self.text_vocab_size}, {}

    def load_state(self, meta, arrays):
        self.tokens, self.text_vocab_size = meta["tokens"], meta["text_vocab_size"]
