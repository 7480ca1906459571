"""k-means, product quantization (PQ) and residual quantization (RQ) in JAX: jit-compiled, deterministic
under a seed, with a mini-batch option for corpora whose distance matrix does not fit at once.

* `kmeans(x, k)` — k-means++ seeding, then Lloyd iterations (or mini-batch updates) until the relative
  inertia change falls below `tol`. An empty cluster is re-seeded with the point farthest from its centre,
  as scikit-learn does, so every centroid stays in use.
* `ProductQuantizer(m, k)` — the vector split into m contiguous sub-vectors, k-means with k centroids on
  each; codes [N, m] (Ultron-PQ; 000_dynamic_corpora.txt uses m = 4, k from 64 to 8192).
* `ResidualQuantizer(levels, k, beam)` — level l quantizes the residual left by levels < l (RIPOR / PAG
  docids). Encoding keeps the `beam` best partial code sequences per vector (beam 1 = greedy), as faiss'
  ResidualQuantizer does with its `max_beam_size`.

Distances are computed in blocks of `block` rows, so memory stays O(block × k).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

log = logging.getLogger(__name__)


def _check(x: np.ndarray, k: int, what: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"{what}: expected a [N, D] matrix, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{what}: the matrix has NaN or Inf entries")
    if k < 1:
        raise ValueError(f"{what}: the number of clusters must be ≥ 1, got {k}")
    if k > x.shape[0]:
        raise ValueError(f"{what}: {k} clusters but only {x.shape[0]} points; lower K or add documents")
    return x


@jax.jit
def _sq_dists(x_NxD, c_KxD):
    return (jnp.sum(x_NxD * x_NxD, -1, keepdims=True) - 2.0 * x_NxD @ c_KxD.T
            + jnp.sum(c_KxD * c_KxD, -1)[None, :])


def _assign(x: jnp.ndarray, c: jnp.ndarray, block: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Nearest centroid and its squared distance for every row, `block` rows at a time."""
    ids, dists = [], []
    for s in range(0, x.shape[0], block):
        d = _sq_dists(x[s:s + block], c)
        ids.append(jnp.argmin(d, -1))
        dists.append(jnp.maximum(jnp.min(d, -1), 0.0))
    return jnp.concatenate(ids), jnp.concatenate(dists)


@functools.partial(jax.jit, static_argnums=(1,))
def _kmeans_pp(x_NxD, k: int, key):
    """k-means++ seeding (one candidate per step, D² sampling)."""
    N = x_NxD.shape[0]
    key, sub = jax.random.split(key)
    first = jax.random.randint(sub, (), 0, N)
    centers = jnp.zeros((k, x_NxD.shape[1]), x_NxD.dtype).at[0].set(x_NxD[first])
    mind = jnp.sum((x_NxD - x_NxD[first]) ** 2, -1)

    def body(i, carry):
        centers, mind, key = carry
        key, sub = jax.random.split(key)
        p = mind / jnp.maximum(mind.sum(), 1e-30)
        j = jax.random.choice(sub, N, p=p)
        centers = centers.at[i].set(x_NxD[j])
        mind = jnp.minimum(mind, jnp.sum((x_NxD - x_NxD[j]) ** 2, -1))
        return centers, mind, key

    centers, _, _ = jax.lax.fori_loop(1, k, body, (centers, mind, key))
    return centers


@functools.partial(jax.jit, static_argnums=(3,))
def _update(x_NxD, ids_N, dists_N, k: int, old_KxD):
    sums = jax.ops.segment_sum(x_NxD, ids_N, num_segments=k)
    counts = jax.ops.segment_sum(jnp.ones_like(dists_N), ids_N, num_segments=k)
    new = jnp.where(counts[:, None] > 0, sums / jnp.maximum(counts, 1.0)[:, None], old_KxD)
    # empty clusters take the points farthest from their centres (distinct points, largest first)
    empty = counts == 0
    far = jnp.argsort(-dists_N)[:k]
    rank = jnp.cumsum(empty) - 1
    return jnp.where(empty[:, None], x_NxD[far[jnp.clip(rank, 0, k - 1)]], new), empty.sum()


@dataclasses.dataclass
class KMeansResult:
    centroids: np.ndarray  # [K, D]
    assignments: np.ndarray  # [N]
    inertia: float  # sum of squared distances to the assigned centroid
    iterations: int


def kmeans(x, k: int, *, iters: int = 100, tol: float = 1e-4, seed: int = 0, batch_size: Optional[int] = None,
           block: int = 8192, init: Optional[np.ndarray] = None) -> KMeansResult:
    """k-means on the rows of `x` [N, D]. `batch_size` switches to mini-batch updates (per-centre learning
    rate 1 / count, as in Sculley 2010), `iters` then counts mini-batches."""
    x_np = _check(x, k, "kmeans")
    x_j = jnp.asarray(x_np)
    key = jax.random.PRNGKey(seed)
    key, sub = jax.random.split(key)
    if init is not None:
        c = jnp.asarray(np.asarray(init, np.float32))
        if c.shape != (k, x_np.shape[1]):
            raise ValueError(f"kmeans: init has shape {c.shape}, expected {(k, x_np.shape[1])}")
    else:
        seed_rows = x_j if x_np.shape[0] <= 200_000 else x_j[jax.random.permutation(sub, x_np.shape[0])[:200_000]]
        c = _kmeans_pp(seed_rows, k, key)
    prev = np.inf
    it = 0
    if batch_size:
        counts = jnp.zeros((k,), jnp.float32)
        rng = np.random.default_rng(seed)
        for it in range(1, iters + 1):
            rows = rng.choice(x_np.shape[0], size=min(batch_size, x_np.shape[0]), replace=False)
            xb = x_j[rows]
            ids, _ = _assign(xb, c, block)
            c, counts = _minibatch_step(xb, ids, c, counts, k)
    else:
        for it in range(1, iters + 1):
            ids, dists = _assign(x_j, c, block)
            inertia = float(dists.sum())
            c, _ = _update(x_j, ids, dists, k, c)
            if prev - inertia <= tol * max(inertia, 1e-30):
                break
            prev = inertia
    ids, dists = _assign(x_j, c, block)
    return KMeansResult(np.asarray(c), np.asarray(ids), float(dists.sum()), it)


@functools.partial(jax.jit, static_argnums=(4,))
def _minibatch_step(xb, ids, c, counts, k: int):
    sums = jax.ops.segment_sum(xb, ids, num_segments=k)
    n = jax.ops.segment_sum(jnp.ones((xb.shape[0],), jnp.float32), ids, num_segments=k)
    counts = counts + n
    lr = jnp.where(n > 0, n / jnp.maximum(counts, 1.0), 0.0)[:, None]
    mean = sums / jnp.maximum(n, 1.0)[:, None]
    return c + lr * (mean - c), counts


# ----------------------------------------------------------------------------------------------------------
# PQ / RQ
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ProductQuantizer:
    m: int = 4
    k: int = 256
    iters: int = 25
    seed: int = 0
    batch_size: Optional[int] = None
    codebooks: Optional[np.ndarray] = None  # [m, k, D/m]

    def fit(self, x) -> "ProductQuantizer":
        x = _check(x, self.k, "ProductQuantizer")
        if x.shape[1] % self.m:
            raise ValueError(f"ProductQuantizer: dimension {x.shape[1]} is not divisible by m = {self.m}")
        sub = x.shape[1] // self.m
        books = []
        for j in range(self.m):
            res = kmeans(x[:, j * sub:(j + 1) * sub], self.k, iters=self.iters, seed=self.seed + j,
                         batch_size=self.batch_size)
            books.append(res.centroids)
        self.codebooks = np.stack(books)
        return self

    def _ready(self, x) -> np.ndarray:
        if self.codebooks is None:
            raise ValueError("ProductQuantizer: fit() first")
        x = np.asarray(x, np.float32)
        if x.ndim != 2 or x.shape[1] != self.codebooks.shape[0] * self.codebooks.shape[2]:
            raise ValueError(f"ProductQuantizer: expected [N, {self.codebooks.shape[0] * self.codebooks.shape[2]}] "
                             f"vectors, got {x.shape}")
        return x

    def encode(self, x, block: int = 8192) -> np.ndarray:
        x = self._ready(x)
        sub = self.codebooks.shape[2]
        return np.stack([np.asarray(_assign(jnp.asarray(x[:, j * sub:(j + 1) * sub]),
                                            jnp.asarray(self.codebooks[j]), block)[0])
                         for j in range(self.m)], axis=1).astype(np.int32)

    def decode(self, codes) -> np.ndarray:
        codes = np.asarray(codes)
        return np.concatenate([self.codebooks[j][codes[:, j]] for j in range(self.m)], axis=1)

    def reconstruction_error(self, x) -> float:
        """Mean over vectors of the squared L2 reconstruction error."""
        x = self._ready(x)
        return float(np.mean(np.sum((x - self.decode(self.encode(x))) ** 2, axis=1)))


@dataclasses.dataclass
class ResidualQuantizer:
    levels: int = 4
    k: int = 256
    beam: int = 1
    iters: int = 25
    seed: int = 0
    batch_size: Optional[int] = None
    codebooks: Optional[np.ndarray] = None  # [levels, k, D]

    def fit(self, x) -> "ResidualQuantizer":
        x = _check(x, self.k, "ResidualQuantizer")
        residual = x.copy()
        books = []
        for level in range(self.levels):
            res = kmeans(residual, self.k, iters=self.iters, seed=self.seed + level, batch_size=self.batch_size)
            books.append(res.centroids)
            self.codebooks = np.stack(books)
            # the next level trains on the residuals of the (beam) encoding so far, as it will be used
            codes = self._encode(x, len(books))
            residual = x - self._decode(codes, len(books))
        return self

    def _encode(self, x: np.ndarray, levels: int) -> np.ndarray:
        return np.asarray(_rq_beam_encode(jnp.asarray(x), jnp.asarray(self.codebooks[:levels]), self.beam))

    def _decode(self, codes: np.ndarray, levels: int) -> np.ndarray:
        return sum(self.codebooks[l][codes[:, l]] for l in range(levels))

    def encode(self, x) -> np.ndarray:
        if self.codebooks is None:
            raise ValueError("ResidualQuantizer: fit() first")
        x = np.asarray(x, np.float32)
        if x.ndim != 2 or x.shape[1] != self.codebooks.shape[2]:
            raise ValueError(f"ResidualQuantizer: expected [N, {self.codebooks.shape[2]}] vectors, got {x.shape}")
        return self._encode(x, self.levels).astype(np.int32)

    def decode(self, codes) -> np.ndarray:
        return self._decode(np.asarray(codes), self.levels)

    def reconstruction_error(self, x) -> float:
        x = np.asarray(x, np.float32)
        return float(np.mean(np.sum((x - self.decode(self.encode(x))) ** 2, axis=1)))


@functools.partial(jax.jit, static_argnums=(2,))
def _rq_beam_encode(x_NxD, books_LxKxD, beam: int):
    """Beam search over residual codes: keep the `beam` partial codes with the smallest residual norm."""
    N, D = x_NxD.shape
    L, K, _ = books_LxKxD.shape
    residual = x_NxD[:, None, :]  # [N, b, D] with b = 1 at the start
    codes = jnp.zeros((N, 1, 0), jnp.int32)
    for level in range(L):
        c = books_LxKxD[level]  # [K, D]
        # ||r - c||² for every (beam, code)
        d = (jnp.sum(residual ** 2, -1)[..., None] - 2.0 * jnp.einsum("nbd,kd->nbk", residual, c)
             + jnp.sum(c ** 2, -1)[None, None, :])
        b = residual.shape[1]
        keep = min(beam, b * K)
        flat = d.reshape(N, b * K)
        _, top = jax.lax.top_k(-flat, keep)
        parent, code = top // K, top % K
        residual = jnp.take_along_axis(residual, parent[..., None], axis=1) - c[code]
        codes = jnp.concatenate([jnp.take_along_axis(codes, parent[..., None], axis=1), code[..., None]], -1)
    return codes[:, 0, :]


# ----------------------------------------------------------------------------------------------------------
# exact nearest neighbours (dense retrieval, MDGR's constrained expansion)
# ----------------------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("k",))
def _block_topk(q_BxD, d_ExD, valid_E, best_s_BxN, best_i_BxN, offset, k: int):
    """Scores of one document block, merged with the running top-k (ties keep the earlier document)."""
    s_BxE = jnp.where(valid_E[None, :], q_BxD @ d_ExD.T, -jnp.inf)
    idx_E = offset + jnp.arange(d_ExD.shape[0], dtype=jnp.int32)
    all_s = jnp.concatenate([best_s_BxN, s_BxE], axis=1)
    all_i = jnp.concatenate([best_i_BxN, jnp.broadcast_to(idx_E, s_BxE.shape)], axis=1)
    top_s, pos = jax.lax.top_k(all_s, k)
    return top_s, jnp.take_along_axis(all_i, pos, axis=1)


def exact_search(queries_BxD: np.ndarray, docs_ExD: np.ndarray, k: int, query_block: int = 256,
                 doc_block: int = 65536) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k inner products: (scores [B, k'], document rows [B, k']) with k' = min(k, E), best first."""
    B, E = len(queries_BxD), len(docs_ExD)
    k = min(k, E)
    if E == 0 or B == 0:
        return np.zeros((B, 0), np.float32), np.zeros((B, 0), np.int64)
    doc_block = min(doc_block, E)
    n_blocks = -(-E // doc_block)
    padded = np.zeros((n_blocks * doc_block, docs_ExD.shape[1]), np.float32)
    padded[:E] = docs_ExD
    valid = np.arange(len(padded)) < E
    scores, rows = [], []
    for qs in range(0, B, query_block):
        q = np.zeros((query_block, queries_BxD.shape[1]), np.float32)  # fixed shape: one compilation
        nq = min(query_block, B - qs)
        q[:nq] = queries_BxD[qs:qs + nq]
        best_s = jnp.full((query_block, k), -jnp.inf, jnp.float32)
        best_i = jnp.full((query_block, k), -1, jnp.int32)
        for b in range(n_blocks):
            sl = slice(b * doc_block, (b + 1) * doc_block)
            best_s, best_i = _block_topk(jnp.asarray(q), jnp.asarray(padded[sl]), jnp.asarray(valid[sl]),
                                         best_s, best_i, jnp.int32(b * doc_block), k=k)
        scores.append(np.asarray(best_s)[:nq])
        rows.append(np.asarray(best_i, dtype=np.int64)[:nq])
    return np.concatenate(scores), np.concatenate(rows)
