"""Numeric docids from document embeddings: semantic (hierarchical k-means), PQ and RQ.

All three are *codebook* docids (a per-position token space of L positions × V codes, `CodebookHead`), fitted
on the initial documents' embeddings and frozen: `assign` on new documents only encodes them with the kept
centroids (000_dynamic_corpora.txt §2.2, eq. 3 — the docid vocabulary and length never change).

* `SemanticDocids(k, c)` — DSI/NCI: k-means with k clusters, recursively inside every cluster larger than c,
  to a fixed depth; the last position numbers the documents that share a path (the leaf collision digit).
  Paths are padded to the deepest level with code 0 so that every docid has the same length L.
  A new document descends the tree by nearest centroid and takes the next free leaf digit (or collides on
  the last one when the leaf is full).
* `PQDocids(m, k)` — Ultron-PQ: m sub-vector codes of k values each (L = m, V = k).
* `RQDocids(levels, k)` — RIPOR/PAG: L = levels residual codes of k values each.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import gin
import numpy as np

from gr_jax.docids.base import DocidScheme, DocidTable, FitContext
from gr_jax.docids.quantize import ProductQuantizer, ResidualQuantizer, kmeans
from gr_jax.data.vocab import DocidTokenSpace
from gr_jax.runtime.validation import Count


def checked_embeddings(corpus, embeddings, rows, what: str) -> np.ndarray:
    """The embeddings given to a numeric scheme as float32 [documents, D], one row per document (of `rows`, or
    of the corpus); a missing or mis-shaped array is an error naming the scheme (`what`)."""
    if embeddings is None:
        raise ValueError(f"{what} docids need document embeddings (fit(corpus, embeddings=[N, D]))")
    e = np.asarray(embeddings, np.float32)
    n = len(corpus) if rows is None else len(rows)
    if e.ndim != 2 or e.shape[0] != n:
        raise ValueError(f"{what} docids: embeddings have shape {e.shape}, expected [{n}, D] (one row per "
                         f"document)")
    return e


def _rows(corpus, rows):
    return np.arange(len(corpus)) if rows is None else np.asarray(rows, dtype=np.int64)


class _QuantizedDocids(DocidScheme):
    """Shared by PQ and RQ docids: a quantizer fitted on D0 embeddings; its codes are the docid."""

    needs_embeddings = True
    q = None  # the fitted quantizer

    def _quantizer(self):
        raise NotImplementedError

    def _params(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "q"}

    def fit(self, corpus, context: FitContext = FitContext()):
        embeddings = context.embeddings
        self.q = self._quantizer().fit(checked_embeddings(corpus, embeddings, None, self.name.upper()))
        return self

    def assign(self, corpus, rows: Optional[Sequence[int]] = None, embeddings=None) -> DocidTable:
        if self.q is None or self.q.codebooks is None:
            raise ValueError(f"{type(self).__name__}.assign before fit()")
        codes = self.q.encode(checked_embeddings(corpus, embeddings, rows, self.name.upper()))
        L = codes.shape[1]
        return DocidTable(codes, np.full(len(codes), L), _rows(corpus, rows),
                          DocidTokenSpace.codebook(L, self.q.k))

    def state(self):
        return self._params(), {"codebooks": self.q.codebooks}

    def load_state(self, meta, arrays) -> None:
        for k, v in meta.items():
            if k != "name":
                setattr(self, k, type(getattr(self, k))(v))
        self.q = self._quantizer()
        self.q.codebooks = np.asarray(arrays["codebooks"])


@gin.configurable
@dataclasses.dataclass
class PQDocids(_QuantizedDocids):
    m: Count = 4
    k: Count = 256
    seed: int = 0
    q: Optional[ProductQuantizer] = None
    name = "pq"

    def _quantizer(self):
        return ProductQuantizer(self.m, self.k, seed=self.seed)


@gin.configurable
@dataclasses.dataclass
class RQDocids(_QuantizedDocids):
    levels: Count = 4
    k: Count = 256
    beam: Count = 1
    seed: int = 0
    q: Optional[ResidualQuantizer] = None
    name = "rq"

    def _quantizer(self):
        return ResidualQuantizer(self.levels, self.k, beam=self.beam, seed=self.seed)


@gin.configurable
@dataclasses.dataclass
class SemanticDocids(DocidScheme):
    """Hierarchical k-means paths of fixed depth `depth` (levels of clustering), then a leaf digit < c."""

    k: Count = 10
    c: Count = 100
    depth: Count = 2
    seed: int = 0
    name = "semantic"
    # tree: for node n (0 = root) the centroids of its children and the node ids of the children (-1: leaf)
    centroids: list = dataclasses.field(default_factory=list)
    children: list = dataclasses.field(default_factory=list)
    leaf_fill: dict = dataclasses.field(default_factory=dict)  # path tuple → next free leaf digit
    assigned: dict = dataclasses.field(default_factory=dict)  # document id → its docid (assign is idempotent)
    needs_embeddings = True

    @property
    def codes(self) -> int:
        return max(self.k, self.c)

    def fit(self, corpus, context: FitContext = FitContext()) -> "SemanticDocids":
        embeddings = context.embeddings
        e = checked_embeddings(corpus, embeddings, None, "semantic")
        if self.k < 2:
            raise ValueError("SemanticDocids.k must be ≥ 2")
        self.centroids, self.children, self.leaf_fill, self.assigned = [], [], {}, {}
        self._build(e, np.arange(len(e)), level=0, prefix=())
        return self

    def _build(self, e, idx, level, prefix) -> int:
        node = len(self.centroids)
        self.centroids.append(None)
        self.children.append(None)
        k = min(self.k, len(idx))
        res = kmeans(e[idx], k, seed=self.seed + node, iters=50) if k > 1 else None
        cents = res.centroids if res is not None else e[idx][:1]
        assign = res.assignments if res is not None else np.zeros(len(idx), np.int64)
        kids = []
        for j in range(len(cents)):
            members = idx[assign == j]
            if level + 1 < self.depth and len(members) > self.c:
                kids.append(self._build(e, members, level + 1, prefix + (j,)))
            else:
                kids.append(-1)
        self.centroids[node] = np.asarray(cents, np.float32)
        self.children[node] = kids
        return node

    def _path(self, v: np.ndarray) -> tuple[int, ...]:
        node, path = 0, []
        while node != -1:
            d = ((self.centroids[node] - v) ** 2).sum(-1)
            j = int(np.argmin(d))
            path.append(j)
            node = self.children[node][j]
        return tuple(path + [0] * (self.depth - len(path)))

    def assign(self, corpus, rows: Optional[Sequence[int]] = None, embeddings=None) -> DocidTable:
        if not self.centroids:
            raise ValueError("SemanticDocids.assign before fit()")
        e = checked_embeddings(corpus, embeddings, rows, "semantic")
        seqs = []
        for r, v in zip(_rows(corpus, rows), e):
            doc = corpus.doc_ids[int(r)]
            if doc not in self.assigned:
                path = self._path(v)
                digit = self.leaf_fill.get(path, 0)
                self.leaf_fill[path] = digit + 1
                self.assigned[doc] = list(path) + [min(digit, self.codes - 1)]
            seqs.append(self.assigned[doc])
        L = self.depth + 1
        return DocidTable(np.asarray(seqs, np.int32), np.full(len(seqs), L), _rows(corpus, rows),
                          DocidTokenSpace.codebook(L, self.codes))

    def state(self):
        arrays = {f"centroids_{i}": c for i, c in enumerate(self.centroids)}
        meta = {"k": self.k, "c": self.c, "depth": self.depth, "seed": self.seed, "children": self.children,
                "leaf_fill": [[list(p), n] for p, n in self.leaf_fill.items()],
                "assigned": self.assigned}
        return meta, arrays

    def load_state(self, meta, arrays) -> None:
        self.k, self.c, self.depth, self.seed = (int(meta[x]) for x in ("k", "c", "depth", "seed"))
        self.children = [list(c) for c in meta["children"]]
        self.centroids = [np.asarray(arrays[f"centroids_{i}"]) for i in range(len(self.children))]
        self.leaf_fill = {tuple(p): int(n) for p, n in meta["leaf_fill"]}
        self.assigned = {d: list(c) for d, c in meta["assigned"].items()}
