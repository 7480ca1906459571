"""Host-side input pipeline: tokenize to fixed feature lengths, batch, shuffle deterministically, resume.

Nothing here touches TensorFlow. Examples live in an `ExampleStore`: one fixed-width integer array per
feature (`inputs` [N, L], `targets` [N, T]), padded with PAD and truncated so that the last kept position
is EOS (seqio's "trim, then append EOS" convention). A store is cheap to index, so a batch is a numpy
gather.

`MixtureIterator` turns one or more stores into an endless stream of batches:

* every source is an endless sequence of epochs; epoch e of a source is the permutation
  `default_rng([seed, source_index, e]).permutation(N)` — so the order depends only on the seed, never on
  how far a previous run went;
* batch k takes `rows_k[i]` examples from source i, where the split of the batch over sources is drawn from
  `default_rng([seed, k])` with the mixing rates (one source: the whole batch);
* the state is `{"step", "positions"}` (plain ints, JSON-serialisable): restoring it and continuing gives
  exactly the batches an uninterrupted run would have produced. The trainer checkpoints it with the model.

For evaluation, `eval_batches` walks a store once, in order, padding the last batch and returning a mask.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np

from gr_jax.runtime.progress import bar as progress_bar
from gr_jax.data.vocab import EOS_ID, PAD_ID

log = logging.getLogger(__name__)


def _int_dtype(max_id: int) -> np.dtype:
    return np.dtype(np.uint16) if max_id < 2**16 else np.dtype(np.int32)


def pad_sequences(sequences: Iterable[Sequence[int]], length: int, add_eos: bool = True,
                  dtype: Optional[np.dtype] = None) -> np.ndarray:
    """Fixed-width [N, length] array: each sequence truncated to `length - 1` (or `length`) ids, then EOS.

    With `add_eos=False` sequences are only truncated/padded (docid targets that carry their own EOS).
    """
    if length < 1:
        raise ValueError(f"feature length must be ≥ 1, got {length}")
    seqs = [np.asarray(s, dtype=np.int64).reshape(-1) for s in sequences]
    max_id = max((int(s.max()) for s in seqs if s.size), default=EOS_ID)
    if any(s.size and int(s.min()) < 0 for s in seqs):
        raise ValueError("token ids must be non-negative")
    out = np.full((len(seqs), length), PAD_ID, dtype=dtype or _int_dtype(max(max_id, EOS_ID)))
    keep = length - 1 if add_eos else length
    for i, s in enumerate(seqs):
        s = s[:keep]
        out[i, : s.size] = s
        if add_eos:
            out[i, s.size] = EOS_ID
    return out


def tokenize(texts: Iterable[str], vocab, length: int, what: str = "text", progress: bool = False) -> np.ndarray:
    """Encode `texts` with `vocab` into a fixed-width [N, length] array (EOS-terminated, PAD-padded).

    An empty text is an error (it names `what` and the row): an example with no input teaches nothing and
    usually means a reader or a join went wrong.
    """
    texts = list(texts)
    if progress:
        texts_iter = progress_bar(iterable=texts, desc=f"tokenize {what}", unit="ex", mininterval=2.0)
    else:
        texts_iter = texts
    encoded = []
    for i, t in enumerate(texts_iter):
        if not t or not t.strip():
            raise ValueError(f"{what}: row {i} is empty")
        encoded.append(vocab.encode(t))
    return pad_sequences(encoded, length, add_eos=True, dtype=_int_dtype(vocab.size))


@dataclasses.dataclass
class ExampleStore:
    """Parallel fixed-width feature arrays; all have the same number of rows."""

    features: dict[str, np.ndarray]

    def __post_init__(self):
        if not self.features:
            raise ValueError("an ExampleStore needs at least one feature")
        sizes = {k: v.shape[0] for k, v in self.features.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"features have different numbers of rows: {sizes}")
        for k, v in self.features.items():
            if v.ndim != 2:
                raise ValueError(f"feature {k!r} must be [rows, length], got shape {v.shape}")

    def __len__(self) -> int:
        return next(iter(self.features.values())).shape[0]

    def take(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        return {k: v[rows].astype(np.int32) for k, v in self.features.items()}

    @classmethod
    def concatenate(cls, stores: Sequence["ExampleStore"]) -> "ExampleStore":
        keys = set(stores[0].features)
        if any(set(s.features) != keys for s in stores):
            raise ValueError("stores to concatenate must have the same features")
        feats = {}
        for k in stores[0].features:
            width = {s.features[k].shape[1] for s in stores}
            if len(width) != 1:
                raise ValueError(f"feature {k!r} has different lengths {sorted(width)} across stores")
            dtype = np.result_type(*[s.features[k].dtype for s in stores])
            feats[k] = np.concatenate([s.features[k].astype(dtype) for s in stores])
        return cls(feats)

    @property
    def feature_lengths(self) -> dict[str, int]:
        return {k: v.shape[1] for k, v in self.features.items()}


class MixtureIterator(Iterator[dict[str, np.ndarray]]):
    """Endless, deterministic, resumable batches from one or more `ExampleStore`s mixed by rates."""

    def __init__(self, sources: Sequence[ExampleStore], batch_size: int, seed: int = 0,
                 rates: Optional[Sequence[float]] = None, shuffle: bool = True,
                 names: Optional[Sequence[str]] = None):
        if not sources:
            raise ValueError("MixtureIterator needs at least one source")
        if batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
        self.names = list(names) if names is not None else [f"source{i}" for i in range(len(sources))]
        for name, s in zip(self.names, sources):
            if len(s) == 0:
                raise ValueError(f"source {name!r} has no examples")
        lengths = {tuple(sorted(s.feature_lengths.items())) for s in sources}
        if len(lengths) != 1:
            raise ValueError(f"sources have different features/lengths: {[s.feature_lengths for s in sources]}")
        rates = np.ones(len(sources)) if rates is None else np.asarray(rates, dtype=np.float64)
        if rates.shape != (len(sources),) or (rates < 0).any() or rates.sum() <= 0:
            raise ValueError(f"rates must be {len(sources)} non-negative numbers with a positive sum, got {rates}")
        self.sources = list(sources)
        self.rates = rates / rates.sum()
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.step = 0
        self.positions = [0] * len(sources)
        self._perm_cache: dict[tuple[int, int], np.ndarray] = {}

    # -- state -------------------------------------------------------------------------------------------
    def get_state(self) -> dict:
        return {"step": self.step, "positions": list(self.positions), "seed": self.seed,
                "sizes": [len(s) for s in self.sources], "batch_size": self.batch_size}

    def set_state(self, state: Mapping) -> None:
        expected = {"seed": self.seed, "sizes": [len(s) for s in self.sources], "batch_size": self.batch_size}
        got = {k: state.get(k) for k in expected}
        got["sizes"] = list(got["sizes"] or [])
        if got != expected:
            raise ValueError(f"data iterator state does not match this pipeline: saved {got}, now {expected}; "
                             f"resuming would change the data order")
        self.step = int(state["step"])
        self.positions = [int(p) for p in state["positions"]]

    # -- iteration ---------------------------------------------------------------------------------------
    def _perm(self, source: int, epoch: int) -> np.ndarray:
        key = (source, epoch)
        if key not in self._perm_cache:
            n = len(self.sources[source])
            perm = (np.random.default_rng([self.seed, source, epoch]).permutation(n) if self.shuffle
                    else np.arange(n))
            self._perm_cache = {k: v for k, v in self._perm_cache.items() if k[0] != source}  # keep one epoch
            self._perm_cache[key] = perm
        return self._perm_cache[key]

    def _rows(self, source: int, count: int) -> np.ndarray:
        n = len(self.sources[source])
        start = self.positions[source]
        idx = np.arange(start, start + count)
        out = np.empty(count, dtype=np.int64)
        for epoch in np.unique(idx // n):
            sel = idx // n == epoch
            out[sel] = self._perm(source, int(epoch))[idx[sel] % n]
        self.positions[source] = start + count
        return out

    def counts(self, step: int) -> np.ndarray:
        """How many examples of batch `step` come from each source."""
        if len(self.sources) == 1:
            return np.array([self.batch_size])
        return np.random.default_rng([self.seed, step]).multinomial(self.batch_size, self.rates)

    def __next__(self) -> dict[str, np.ndarray]:
        counts = self.counts(self.step)
        parts = [self.sources[i].take(self._rows(i, int(c))) for i, c in enumerate(counts) if c]
        batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        if len(parts) > 1:  # interleave sources within the batch, deterministically
            order = np.random.default_rng([self.seed, self.step, 1]).permutation(self.batch_size)
            batch = {k: v[order] for k, v in batch.items()}
        self.step += 1
        return batch

    def epochs(self) -> list[float]:
        return [p / len(s) for p, s in zip(self.positions, self.sources)]


def eval_batches(store: ExampleStore, batch_size: int) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    """Every example once, in order; the last batch is padded with copies of row 0 and a False mask."""
    n = len(store)
    for start in range(0, n, batch_size):
        rows = np.arange(start, min(start + batch_size, n))
        mask = np.ones(batch_size, dtype=bool)
        if rows.size < batch_size:
            mask[rows.size:] = False
            rows = np.concatenate([rows, np.zeros(batch_size - rows.size, dtype=rows.dtype)])
        yield store.take(rows), mask
