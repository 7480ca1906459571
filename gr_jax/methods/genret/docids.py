"""GenRET's learned docids: a document's docid is the code sequence the model itself assigns when it reads the
document (greedy: the argmax code at each position, fed back as the next position's input), T positions of K
codes each (`DocidTokenSpace.codebook(T, K)`, no EOS). The scheme holds no fitted state: the docids follow the
parameters, so it declares `decoded_by_model` and the composition decodes them before training, at every stage
boundary of the progressive training, before each evaluation, after the last step, when a checkpoint is restored,
and (dynamic corpora) for every added document with the trained parameters.

Documents whose codes coincide share a leaf of the prefix tree and are returned together (GenRET's released code
keeps such collisions; its collision-resolving stage is not built, see the package docstring). The decoded
docids of a run are written as `MODEL_DIR/docids/step<N>.tsv`: `doc_id<TAB>c1 c2 … cT<TAB>w1 w2 … wT`, the codes
and their raw logits.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gin
import numpy as np

from gr_jax.methods.api import Count, DocidScheme, DocidTable, DocidTokenSpace, write_text


@gin.configurable
@dataclasses.dataclass
class GenretDocids(DocidScheme):
    """`length` positions (T) of `codes` codes (K) each; decoded by `GenretRetriever.decode_docids`."""

    length: Count = 3
    codes: Count = 512
    name = "genret"
    decoded_by_model = True

    def __post_init__(self):
        for field in ("length", "codes"):
            v = getattr(self, field)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"GenretDocids.{field} must be an integer ≥ 1, got {v!r}")

    def space(self, vocab_size: int) -> DocidTokenSpace:
        return DocidTokenSpace.codebook(int(self.length), int(self.codes))

    def fit(self, corpus, context=None) -> "GenretDocids":
        return self

    def assign(self, corpus, rows=None, embeddings=None) -> DocidTable:
        raise ValueError("GenretDocids are decoded by the model from its parameters (the composition's "
                         "decode_model_docids), not assigned from the corpus alone")

    def table(self, tokens: np.ndarray, logits: np.ndarray, rows: np.ndarray, vocab_size: int) -> DocidTable:
        """Decoded codes [n, T] and their raw logits [n, T] of corpus rows `rows` as a DocidTable (by row)."""
        tokens, logits = np.asarray(tokens, np.int32), np.asarray(logits, np.float32)
        if tokens.shape != logits.shape or tokens.shape[1:] != (self.length,):
            raise ValueError(f"GenretDocids: codes {tokens.shape} and logits {logits.shape} must both be "
                             f"[n, {self.length}]")
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= self.codes):
            raise ValueError(f"GenretDocids: codes outside [0, {self.codes})")
        o = np.argsort(np.asarray(rows), kind="stable")
        return DocidTable(tokens[o], np.full(len(o), self.length, np.int32), np.asarray(rows)[o],
                          self.space(vocab_size), logits[o])

    def write_decoded(self, directory: Path, step: int, table: DocidTable, corpus, vocab) -> Path:
        path = Path(directory) / f"step{step}.tsv"
        lines = []
        for r, seq, w in zip(table.doc_rows, table.sequences, table.weights):
            lines.append(f"{corpus.doc_ids[r]}\t{' '.join(str(int(c)) for c in seq)}\t"
                         f"{' '.join(f'{float(x):.4f}' for x in w)}")
        write_text(path, "\n".join(lines) + "\n", keep_previous=True)
        return path

    def state(self):
        return {"length": int(self.length), "codes": int(self.codes)}, {}

    def load_state(self, meta: dict, arrays: dict) -> None:
        for field in ("length", "codes"):
            if int(meta.get(field, getattr(self, field))) != int(getattr(self, field)):
                raise ValueError(f"saved GenRET docids have {field} {meta.get(field)}, GenretDocids.{field} is "
                                 f"{getattr(self, field)}; set it to the saved value or use a new MODEL_DIR")
