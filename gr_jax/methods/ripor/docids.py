"""RIPOR's docids: the residual quantisation (RQ) of a dense retriever's document vectors, M codes of K values
(RIPOR's `aq_smtid`; `RQDocids` of the core, fitted on D0's vectors and frozen). A document added later gets its
codes from its vector through the stored quantiser, with no training.

The docid table also carries the quantiser's codebooks ([M, K, D], as scheme constants: base64 float32), so the
model can set its per-position code embeddings to the centroids ("relevance-based docid initialisation",
`model.RiporRetriever.init_params`): a docid's score Σ_l ⟨q, c_l(d_l)⟩ then starts as the dense score of the
document's reconstructed vector."""

from __future__ import annotations

import base64
import dataclasses
from typing import Optional, Sequence

import gin
import numpy as np

from gr_jax.methods.api import DocidTable, RQDocids

CODEBOOKS = "codebooks_f32_b64"  # the table constant: the codebooks' float32 bytes, base64
SHAPE = "codebooks_shape"  # [M, K, D]


def pack_codebooks(codebooks: np.ndarray) -> dict:
    books = np.ascontiguousarray(codebooks, dtype="<f4")
    return {CODEBOOKS: base64.b64encode(books.tobytes()).decode("ascii"), SHAPE: list(books.shape)}


def unpack_codebooks(constants: Optional[dict]) -> np.ndarray:
    """[M, K, D] float32 from a table's constants; an error when the table is not RIPOR's."""
    if not constants or CODEBOOKS not in constants:
        raise ValueError("RiporRetriever needs RiporDocids (prepare.docid_scheme = @RiporDocids()): a docid table "
                         "that carries the quantiser's codebooks")
    raw = np.frombuffer(base64.b64decode(constants[CODEBOOKS]), dtype="<f4")
    return raw.reshape(constants[SHAPE]).astype(np.float32)


@gin.configurable
@dataclasses.dataclass
class RiporDocids(RQDocids):
    """`levels` M and `k` K of the RQ; `beam`: the RQ encoder's beam (faiss's `max_beam_size`)."""

    name = "ripor"

    def assign(self, corpus, rows: Optional[Sequence[int]] = None, embeddings=None) -> DocidTable:
        table = super().assign(corpus, rows, embeddings)
        return dataclasses.replace(table, constants=pack_codebooks(self.q.codebooks))
