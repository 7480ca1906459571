"""MDGR docids (000_dynamic_corpora.txt §6.1): one PQ docid per document chunk, with constrained expansion.

* Chunks: a sliding window of `window` vocabulary tokens with stride `stride` (paper: 256 / 128) over the
  document; each window is decoded back to text.
* Chunk embeddings come from a frozen embedder (any of docids/embed.py; the paper uses BERT-base, the demo
  TF-IDF + SVD, `MiniLMEmbedder` is the offline sentence encoder). A fitted embedder (TF-IDF) is fitted on
  the D0 chunks only.
* PQ with `m` sub-vectors × `k` clusters (paper: 4 × 1024) fitted on the D0 chunk embeddings.
* Constrained docid expansion (`constrain=True`): every chunk takes the *existing* D0 docid whose PQ
  reconstruction is nearest to its embedding, so new documents only reuse docids the model was trained on.
  A D0 chunk keeps its own code (its PQ code is the nearest point of the whole product grid, and it is in
  the D0 set). With `constrain=False` new chunks take their own PQ code ("w/o constrain" ablation).
* `multi_docid=False` ("w/o multi-docid" ablation): one docid per document, from the mean of its chunk
  embeddings.

A document's docids are its distinct chunk codes, in chunk order (the first is the primary docid).
`training_pairs` gives the "chunk → its docid" training objective; documents are ranked by the MDGR ranker
(`methods/mdgr/ranker.py`: `GenerativeRetriever.ranker = @MDGRRanker()`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional, Sequence

import gin
import numpy as np

from gr_jax.methods.api import Count, DocidScheme, DocidTable, DocidTokenSpace, FitContext, Pairs, ProductQuantizer

log = logging.getLogger(__name__)


@gin.configurable
@dataclasses.dataclass
class ChunkedPQDocids(DocidScheme):
    window: Count = 256
    stride: Count = 128
    m: Count = 4
    k: Count = 1024
    constrain: bool = True
    multi_docid: bool = True
    seed: int = 0
    embedder: object = None  # default: TF-IDF + SVD (64 d), fitted on the D0 chunks
    name = "mdgr"
    q: Optional[ProductQuantizer] = None
    allowed: Optional[np.ndarray] = None  # [E, m] the distinct D0 docids (constrained expansion)
    _vocab: object = dataclasses.field(default=None, repr=False)
    _chunks: Optional[tuple] = dataclasses.field(default=None, repr=False)  # of the last assign

    def __post_init__(self):
        if self.window < 1 or not 1 <= self.stride <= self.window:
            raise ValueError(f"ChunkedPQDocids: need window ≥ 1 and 1 ≤ stride ≤ window "
                             f"(got {self.window}, {self.stride})")
        if self.embedder is None:
            from gr_jax.methods.api import TfidfSvdEmbedder

            self.embedder = TfidfSvdEmbedder(dim=64)

    # -- chunks ---------------------------------------------------------------------------------------------

    def chunks(self, text: str) -> list[str]:
        """Sliding windows over the document's vocabulary tokens, decoded to text (the last one reaches the
        end of the document)."""
        ids = self._vocab.encode(text)
        if not ids:
            return []
        starts = list(range(0, max(len(ids) - self.window, 0) + 1, self.stride))
        if starts[-1] + self.window < len(ids):
            starts.append(len(ids) - self.window)
        out = [self._vocab.decode(ids[s:s + self.window]) for s in starts]
        return [c for c in out if c.strip()]

    def _chunk_corpus(self, corpus, rows) -> tuple[list[str], np.ndarray]:
        texts, owners = [], []
        for r in rows.tolist():
            cs = self.chunks(corpus.texts[r])
            if not cs:
                raise ValueError(f"MDGR docids: document {corpus.doc_ids[r]!r} has no text to chunk")
            texts += cs
            owners += [r] * len(cs)
        return texts, np.asarray(owners, np.int64)

    def _embed(self, texts: Sequence[str], owners: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        emb = np.asarray(self.embedder.embed(list(texts)), np.float32)
        if self.multi_docid:
            return emb, owners
        pooled = np.stack([emb[owners == r].mean(0) for r in rows.tolist()])  # one vector per document
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12), rows

    # -- the scheme -----------------------------------------------------------------------------------------

    def fit(self, corpus, context: FitContext = FitContext()) -> "ChunkedPQDocids":
        vocab = context.vocab
        if vocab is None:
            raise ValueError("MDGR docids need the text vocabulary (to cut token windows)")
        self._vocab = vocab
        rows = np.arange(len(corpus))
        texts, owners = self._chunk_corpus(corpus, rows)
        self.embedder.fit(texts)
        emb, _ = self._embed(texts, owners, rows)
        if self.k > len(emb):
            raise ValueError(f"MDGR docids: k = {self.k} clusters but only {len(emb)} "
                             f"{'chunks' if self.multi_docid else 'documents'} in D0; lower ChunkedPQDocids.k")
        self.q = ProductQuantizer(self.m, self.k, seed=self.seed).fit(emb)
        self.allowed = np.unique(self.q.encode(emb), axis=0).astype(np.int32)
        log.info("MDGR docids: %d D0 %s → %d distinct docids (m %d × k %d)", len(emb),
                 "chunks" if self.multi_docid else "documents", len(self.allowed), self.m, self.k)
        return self

    def bind(self, vocab) -> None:
        self._vocab = vocab

    def encode(self, emb: np.ndarray) -> np.ndarray:
        """PQ codes, projected onto the D0 docids when `constrain` (nearest reconstruction, exact)."""
        if not self.constrain:
            return self.q.encode(emb)
        from gr_jax.methods.api import exact_search

        recon = self.q.decode(self.allowed).astype(np.float32)  # [E, D]
        # argmin |x - r|² = argmax [x, 1]·[r, -|r|²/2]: an exact inner-product search over the D0 docids
        x1 = np.concatenate([emb, np.ones((len(emb), 1), np.float32)], axis=1)
        r1 = np.concatenate([recon, -0.5 * (recon * recon).sum(1, keepdims=True)], axis=1)
        _, best = exact_search(x1, r1, k=1)
        return self.allowed[best[:, 0]]

    def assign(self, corpus, rows: Optional[Sequence[int]] = None, embeddings=None) -> DocidTable:
        if self.q is None or self._vocab is None:
            raise ValueError("ChunkedPQDocids.assign before fit() (or bind(vocab) after loading)")
        rows = np.arange(len(corpus)) if rows is None else np.asarray(rows, dtype=np.int64)
        texts, owners = self._chunk_corpus(corpus, rows)
        emb, emb_owner = self._embed(texts, owners, rows)
        codes = self.encode(emb)
        seqs, doc_rows, index_of = [], [], {}
        chunk_index = np.empty(len(texts), np.int64)
        for i, (code, r) in enumerate(zip(map(tuple, codes.tolist()), emb_owner.tolist())):
            key = (r, code)
            if key not in index_of:
                index_of[key] = len(seqs)
                seqs.append(code)
                doc_rows.append(r)
            if self.multi_docid:
                chunk_index[i] = index_of[key]
        if not self.multi_docid:
            first = {r: i for i, r in reversed(list(enumerate(doc_rows)))}
            chunk_index = np.array([first[r] for r in owners.tolist()], np.int64)
        self._chunks = (texts, owners, chunk_index)
        return DocidTable(np.asarray(seqs, np.int32).reshape(len(seqs), self.m), np.full(len(seqs), self.m),
                          np.asarray(doc_rows, np.int64), DocidTokenSpace.codebook(self.m, self.k))

    def training_pairs(self) -> list:
        """MDGR's chunk objective: each chunk of the last assigned documents → its own docid."""
        if self._chunks is None:
            raise ValueError("ChunkedPQDocids.training_pairs before assign()")
        texts, owners, index = self._chunks
        return [Pairs("chunk", list(texts), np.asarray(owners, np.int64), docid_index=index)]

    # -- state ----------------------------------------------------------------------------------------------

    def state(self):
        meta = {"window": self.window, "stride": self.stride, "m": self.m, "k": self.k, "constrain": self.constrain,
                "multi_docid": self.multi_docid, "seed": self.seed, "embedder": self.embedder.name}
        arrays = {"codebooks": self.q.codebooks, "allowed": self.allowed}
        if hasattr(self.embedder, "state"):
            emb_meta, emb_arrays = self.embedder.state()
            meta["embedder_state"] = emb_meta
            arrays.update({f"embedder.{k}": v for k, v in emb_arrays.items()})
        return meta, arrays

    def load_state(self, meta, arrays) -> None:
        if meta["embedder"] != self.embedder.name:
            raise ValueError(f"saved MDGR docids used embedder {meta['embedder']!r}, configured "
                             f"{self.embedder.name!r}")
        for key in ("window", "stride", "m", "k", "seed"):
            setattr(self, key, int(meta[key]))
        self.constrain, self.multi_docid = bool(meta["constrain"]), bool(meta["multi_docid"])
        self.q = ProductQuantizer(self.m, self.k, seed=self.seed)
        self.q.codebooks = np.asarray(arrays["codebooks"])
        self.allowed = np.asarray(arrays["allowed"], np.int32)
        if "embedder_state" in meta:
            self.embedder.load_state(meta["embedder_state"],
                                     {k[len("embedder."):]: v for k, v in arrays.items() if k.startswith("embedder.")})
