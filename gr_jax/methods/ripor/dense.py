"""RIPOR's dense phase for its T5 layout (`t5_layout`): the T5 as a dense retriever whose vector of a text is the
decoder's state at position 0, the decoder reading RIPOR's start vector and attending to the encoded text (RIPOR's
`T5SeqAQEncoder.query_encode`; scores are inner products, not normalised). The same state is position 0's h_0 of
`RiporT5Retriever`, so a model started from this T5 scores a docid's first code by ⟨dense query vector, centroid⟩.

* `RiporT5Embedder` — the `Embedder` of a T5 directory (HF layout; `ripor_start.npy` beside it holds the start
  vector, else the embedding of the decoder start token): `prepare.embedder` of experiments/msmarco/ripor.gin,
  whose document vectors `RiporDocids` quantises.
* `train_dense` — the dense training (`python -m gr_jax.methods.ripor.command`): query → judged document with the
  batch's other documents and BM25 negatives as negatives (softmax cross-entropy over inner products), through the
  core's training loop (checkpoints, exact resume); writes OUTPUT_DIR/t5 (an HF T5 directory with its tokenizer
  and `ripor_start.npy`), which the RIPOR experiment reads as INITIAL_CHECKPOINT_PATH. RIPOR trains this phase
  with a cross-encoder teacher's MarginMSE; offline there is no teacher, and the issue that specifies this route
  asks for in-batch and BM25 negatives.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import shutil
from pathlib import Path
from typing import Optional

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from gr_jax.methods.api import (Count, DataError, Embedder, ExampleStore, MixtureIterator, PAD_ID, atomic_dir,
                                file_digest, hard_negatives, load_vocabulary, query_pairs, seq2seq, sources,
                                t5_convert, tokenize, trainer)

log = logging.getLogger(__name__)
START_FILE = "ripor_start.npy"  # the learned start vector [D], beside the T5's weights


def start_states(network, net_params, start_D, tokens_BxL):
    """The decoder's state at position 0 [B, D] float32: the start vector read against the encoded text."""
    mask = tokens_BxL != PAD_ID
    variables = {"params": net_params}
    encoded = network.apply(variables, tokens_BxL, mask, True, method="encode")
    x = jnp.broadcast_to(start_D.astype(encoded.dtype), (tokens_BxL.shape[0], 1, start_D.shape[-1]))
    hidden = network.apply(variables, encoded, mask, x, True, method="decode_hidden_embedded")
    return hidden[:, 0].astype(jnp.float32)


def load_t5(path) -> tuple:
    """(config, network params, start vector) of a T5 directory (HF layout), the start from `ripor_start.npy` when
    present, else the embedding of the decoder start token."""
    config, params = t5_convert.load_hf(path)
    start_file = Path(path) / START_FILE
    if start_file.is_file():
        start = np.load(start_file, allow_pickle=False).astype(np.float32).reshape(-1)
        if start.shape != (config.d_model,):
            raise ValueError(f"{start_file}: a start vector of {start.shape} for a T5 of d_model {config.d_model}")
    else:
        start = np.asarray(params["embedding"][config.decoder_start_token_id], np.float32)
    return config, params, start


@gin.configurable
@dataclasses.dataclass
class RiporT5Embedder(Embedder):
    """`checkpoint`: a T5 directory (the dense phase's OUTPUT_DIR/t5); `vocabulary`: its tokenizer (default the
    directory itself); `length`: tokens per text."""

    checkpoint: Optional[str] = None
    vocabulary: Optional[str] = None
    length: Count = 64
    batch_size: Count = 64
    name = "ripor_t5"

    def __post_init__(self):
        self._loaded = None

    def load(self):
        if self._loaded is None:
            if not self.checkpoint:
                raise ValueError("RiporT5Embedder.checkpoint: the T5 directory of RIPOR's dense phase (python -m "
                                 "gr_jax.methods.ripor.command writes OUTPUT_DIR/t5)")
            config, params, start = load_t5(self.checkpoint)
            vocab = load_vocabulary(self.vocabulary or self.checkpoint)
            network = seq2seq.network(config)
            fn = jax.jit(functools.partial(start_states, network))
            self._loaded = (config, jax.tree_util.tree_map(jnp.asarray, params), jnp.asarray(start), vocab, fn)
        return self._loaded

    def fit(self, texts) -> "RiporT5Embedder":
        self.load()
        return self

    def embed(self, texts) -> np.ndarray:
        config, params, start, vocab, fn = self.load()
        tokens = tokenize(list(texts), vocab, self.length, what="RiporT5Embedder texts")
        out = [np.asarray(fn(params, start, jnp.asarray(tokens[s:s + self.batch_size], jnp.int32)))
               for s in range(0, len(tokens), self.batch_size)]
        return np.concatenate(out) if out else np.zeros((0, config.d_model), np.float32)

    def recipe(self) -> dict:
        files = sorted(p.name for p in Path(self.checkpoint).iterdir() if p.suffix in (".safetensors", ".npy"))
        return {"class": type(self).__name__, "length": int(self.length), "batch_size": int(self.batch_size),
                "files": {name: file_digest(Path(self.checkpoint) / name, "RIPOR's T5") for name in files}}


class DenseT5:
    """The dense phase as the training loop sees it. Parameters {"network": T5 params, "start": [D]}."""

    def __init__(self, config):
        self.config, self.network = config, seq2seq.network(config)

    def loss_fn(self, params, batch, dropout_rng=None):
        encode = functools.partial(start_states, self.network, params["network"], params["start"])
        q_BxD = encode(batch["inputs"])
        d_CxD = jnp.concatenate([encode(batch["targets"]), encode(batch["negatives"])])
        logits = q_BxD @ d_CxD.T  # in-batch positives of the other queries and every BM25 negative
        labels = jnp.arange(q_BxD.shape[0])
        loss_B = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        n = jnp.asarray(q_BxD.shape[0], jnp.float32)
        right = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
        return loss_B.mean(), {"loss": (loss_B.sum(), n), "accuracy": (right.sum(), n)}

    def param_axes(self, params):
        return {"network": seq2seq.param_axes(self.config), "start": P()}


@gin.configurable("ripor_dense")
def train_dense(checkpoint: str = gin.REQUIRED, output_dir: str = gin.REQUIRED, task: str = gin.REQUIRED,
                vocabulary: Optional[str] = None, split: str = "train", steps: Count = 1000, batch_size: Count = 32,
                learning_rate: float = 1e-4, bm25_depth: Count = 30, query_length: Count = 32,
                document_length: Count = 64, seed: int = 0, progress: bool = True) -> dict:
    """Trains the T5 of `checkpoint` (an HF directory) as RIPOR's dense retriever on the judged `split` queries of
    dataset `task`: each example a query, its judged document and one of its top-`bm25_depth` BM25 documents (not
    judged), drawn with `seed`. Writes `output_dir`/t5 (see the module docstring) and returns its summary."""
    ds = sources.load_dataset(task)
    if split not in ds.queries:
        raise DataError(f"ripor_dense: the dataset has no {split!r} queries (it has {sorted(ds.queries)})")
    config, net, start = load_t5(checkpoint)
    vocab = load_vocabulary(vocabulary or checkpoint)
    pairs = query_pairs(ds.queries[split], ds.qrels[split], ds.corpus)
    if len(pairs) < batch_size:
        raise DataError(f"ripor_dense: {len(pairs)} judged pairs cannot fill a batch of {batch_size}")
    order = sorted(range(len(pairs)), key=lambda i: (pairs.qids[i], ds.corpus.doc_ids[int(pairs.rows[i])]))
    qids = [pairs.qids[i] for i in order]
    texts = [pairs.texts[i] for i in order]
    rows = np.asarray(pairs.rows)[order]
    mined = hard_negatives(ds.corpus, qids, texts, rows, bm25_depth)  # [n, depth], −1 where BM25 has fewer
    rng = np.random.default_rng(seed)
    negatives = np.array([rng.choice(c[c >= 0]) if (c >= 0).any() else rng.integers(len(ds.corpus)) for c in mined])
    doc_tokens = tokenize(ds.corpus.texts, vocab, document_length, what="documents")
    store = ExampleStore({"inputs": tokenize(texts, vocab, query_length, what="queries"),
                          "targets": doc_tokens[rows], "negatives": doc_tokens[negatives]})
    iterator = MixtureIterator([store], batch_size, seed=seed, names=["dense"])
    out = Path(output_dir)
    model = DenseT5(config)
    params = {"network": jax.tree_util.tree_map(jnp.asarray, net), "start": jnp.asarray(start)}
    meta = {"method": "ripor_dense", "checkpoint": {p.name: file_digest(p, "the T5") for p in
                                                    sorted(Path(checkpoint).glob("*.safetensors"))},
            "corpus": ds.corpus.fingerprint(), "steps": int(steps), "batch_size": int(batch_size),
            "bm25_depth": int(bm25_depth), "seed": int(seed), "lengths": [int(query_length), int(document_length)]}
    tx = trainer.make_optimizer("adamw", learning_rate, warmup_steps=min(100, steps // 10), decay="linear",
                                total_steps=steps, weight_decay=0.01)
    loop = trainer.LoopConfig(steps, batch_size, seed=seed, log_period=max(1, min(50, steps)),
                              checkpoint_period=max(1, min(500, steps)), keep_checkpoints=1, progress=progress,
                              name="ripor_dense")
    result = trainer.fit(model, params, iterator, tx, run_dir=out / "dense", loop=loop, meta=meta)
    trained = jax.device_get(result["state"]["params"])
    with atomic_dir(out / "t5", overwrite=True, keep_previous=True) as tmp:
        t5_convert.save_hf(trained["network"], config, tmp / "hf")
        for f in (tmp / "hf").iterdir():
            f.rename(tmp / f.name)
        (tmp / "hf").rmdir()
        np.save(tmp / START_FILE, np.asarray(trained["start"], np.float32))
        source = Path(vocabulary or checkpoint)
        for name in ("spiece.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (source / name).is_file():
                shutil.copyfile(source / name, tmp / name)
            elif source.is_file() and source.name == name:
                shutil.copyfile(source, tmp / name)
    log.info("RIPOR's dense T5 written to %s (%d steps)", out / "t5", result["step"])
    return {"output_dir": str(out / "t5"), "steps": int(result["step"]), "pairs": len(pairs)}
