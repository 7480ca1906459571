"""Planner alignment for cross-lingual queries without re-indexing (004 §4.6 "Aligned", Eq. 13): the trained PAG
model is a frozen teacher on English queries q^en; a student initialised from it reads the paired non-English
query q^l (same query id) and learns the teacher's planner weights z[v] = max_t log(1 + ReLU(logit_t[v]))·m_t
over the English planning vocabulary (the ids below the docid tokens):

    L = τ² · KL(softmax(z_teach / τ) ‖ softmax(z_stud / τ)), on U = TopK(z_teach) ∪ TopK(z_stud), renormalised on U

with τ = 2 and K = 100, AdamW (lr 1e-5), 5 epochs of batch 32 (the paper's settings; gin may change them). Only
the query side is trained: the encoder and the output projection (the tied embedding matrix of a v1.0 model, as
in PAG's t5-base, or `lm_head` when untied); the decoder's layers stay frozen. After each epoch the student is
scored on dev pairs by TokJaccard@ℓ against the teacher on English (the paper's selection rule), and the best
epoch is kept. Documents, docids and the prefix tree never change.

Files (ALIGNED_DIR): `aligned_params.msgpack` (flax serialization of the network parameters — msgpack, no
pickle) and `aligned.json` (the teacher it came from, the pairs' digest, per-epoch loss and dev TokJaccard, the
chosen epoch).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Optional, Sequence

import flax
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax

from gr_jax.methods.api import (
    atomic_dir,
    Count,
    DataError,
    drift,
    fingerprint,
    gin_checks,
    json_text,
    Positive,
    progress_bar,
    QuerySet,
    read_queries_tsv,
    RunDir,
    tokenize,
    validation,
)
from gr_jax.methods.pag.model_aligned import META_FILE, PARAMS_FILE, load_aligned  # noqa: F401 (re-exported)
from gr_jax.methods.pag.model import PagRetriever, lexical_rep

log = logging.getLogger(__name__)

TRAINABLE = ("encoder", "embedding", "lm_head")  # the query side; "decoder" stays frozen


def align_loss(z_teach_BxV, z_stud_BxV, tau: float = 2.0, k: int = 100):
    """Eq. 13 averaged over the batch (the union U is chosen without gradient)."""
    V = z_teach_BxV.shape[1]
    k = min(k, V)
    _, it = jax.lax.top_k(jax.lax.stop_gradient(z_teach_BxV), k)
    _, is_ = jax.lax.top_k(jax.lax.stop_gradient(z_stud_BxV), k)
    rows = jnp.arange(z_teach_BxV.shape[0])[:, None]
    union = jnp.zeros(z_teach_BxV.shape, bool).at[rows, it].set(True).at[rows, is_].set(True)
    neg = jnp.finfo(jnp.float32).min
    log_p = jax.nn.log_softmax(jnp.where(union, z_teach_BxV / tau, neg), axis=-1)
    log_q = jax.nn.log_softmax(jnp.where(union, z_stud_BxV / tau, neg), axis=-1)
    kl = jnp.sum(jnp.where(union, jnp.exp(log_p) * (log_p - log_q), 0.0), axis=-1)
    return tau ** 2 * jnp.mean(kl)


def _trainable_mask(net_params):
    return {name: jax.tree_util.tree_map(lambda _: name in TRAINABLE, sub) for name, sub in net_params.items()}


def train_aligned_planner(model, params, tokenize, train_pairs: tuple[QuerySet, QuerySet],
                  dev_pairs: tuple[QuerySet, QuerySet], out_dir: str | Path, teacher: dict, tau: float = 2.0,
                  k: int = 100, learning_rate: float = 1e-5, epochs: int = 5, batch_size: int = 32, ell: int = 100,
                  seed: int = 0, progress: bool = True) -> dict:
    """Trains the student (module docstring) and writes it to `out_dir`. `model`: a PagRetriever with its
    docids in use; `tokenize(texts) -> [N, L] ids`; pairs: (English, other language) query sets whose query
    ids agree row by row; `teacher`: what the teacher is (MODEL_DIR, step), recorded in aligned.json."""
    for (en, xx), what in ((train_pairs, "training"), (dev_pairs, "dev")):
        if list(en.qids) != list(xx.qids) or not len(en):
            raise ValueError(f"planner alignment: the {what} pairs must hold the same query ids in the same order")
    limit = int(model.docid_base)
    net = params["network"]
    t_en, t_xx = tokenize(list(train_pairs[0].texts)), tokenize(list(train_pairs[1].texts))
    d_en, d_xx = tokenize(list(dev_pairs[0].texts)), tokenize(list(dev_pairs[1].texts))

    def rep(p, tokens):
        return lexical_rep(model.network, p, tokens)[:, :limit]

    teacher_rep = jax.jit(lambda tokens: rep(net, tokens))
    z_teach = np.concatenate([np.asarray(teacher_rep(jnp.asarray(t_en[i:i + batch_size])))
                              for i in range(0, len(t_en), batch_size)])
    labels = jax.tree_util.tree_map(lambda m: "train" if m else "freeze", _trainable_mask(net))
    tx = optax.multi_transform({"train": optax.adamw(learning_rate, weight_decay=0.0),
                                "freeze": optax.set_to_zero()}, labels)

    @jax.jit
    def step(student, opt_state, tokens, target):
        loss, grads = jax.value_and_grad(lambda s: align_loss(target, rep(s, tokens), tau, k))(student)
        updates, opt_state = tx.update(grads, opt_state, student)
        return optax.apply_updates(student, updates), opt_state, loss

    def dev_jaccard(student_net) -> float:
        with_student = {**params, "network": student_net}
        got = {}
        for i in range(0, len(d_xx), batch_size):
            a = model.planner_tokens(params, d_en[i:i + batch_size], ell)
            b = model.planner_tokens(with_student, d_xx[i:i + batch_size], ell)
            got.update({q: drift.tok_jaccard(x, y, ell) for q, x, y in zip(dev_pairs[0].qids[i:i + batch_size], a, b)})
        return float(np.mean(list(got.values())))

    student = jax.tree_util.tree_map(jnp.array, net)
    opt_state = tx.init(student)
    history = [{"epoch": 0, "dev_tok_jaccard": dev_jaccard(student)}]
    best, best_epoch = student, 0
    rng = np.random.default_rng(seed)
    n = len(t_xx)
    bar = progress_bar(total=epochs * ((n + batch_size - 1) // batch_size), desc="planner alignment", unit="step",
               disable=not progress)
    for epoch in range(1, epochs + 1):
        order = rng.permutation(n)
        losses = []
        for i in range(0, n, batch_size):
            rows = order[i:i + batch_size]
            student, opt_state, loss = step(student, opt_state, jnp.asarray(t_xx[rows]), jnp.asarray(z_teach[rows]))
            losses.append(float(loss))
            bar.update(1)
        history.append({"epoch": epoch, "loss": float(np.mean(losses)), "dev_tok_jaccard": dev_jaccard(student)})
        if history[-1]["dev_tok_jaccard"] > history[best_epoch]["dev_tok_jaccard"]:
            best, best_epoch = student, epoch
    bar.close()
    out_dir = Path(out_dir)
    blob = flax.serialization.to_bytes(jax.device_get(best))
    meta = {"params_digest": hashlib.blake2b(blob, digest_size=12).hexdigest(), "teacher": teacher,
            "chosen_epoch": best_epoch, "history": history, "tau": tau, "k": k, "ell": ell,
            "learning_rate": learning_rate, "epochs": epochs, "batch_size": batch_size, "trainable": list(TRAINABLE),
            "pairs": fingerprint(train_pairs[0].qids, train_pairs[1].texts),
            "dev_pairs": fingerprint(dev_pairs[0].qids, dev_pairs[1].texts)}
    with atomic_dir(out_dir, keep_previous=True) as tmp:  # parameters and report as one: a kept earlier
        (tmp / PARAMS_FILE).write_bytes(blob)                 # report keeps the parameters it describes
        (tmp / META_FILE).write_text(json_text(meta, indent=1))
    log.info("planner alignment: epoch %d chosen (dev TokJaccard@%d %.4f, before %.4f)", best_epoch, ell,
             history[best_epoch]["dev_tok_jaccard"], history[0]["dev_tok_jaccard"])
    return meta


def paired(english: QuerySet, other: QuerySet, qids: Optional[Sequence[str]] = None) -> tuple[QuerySet, QuerySet]:
    """The queries of both sets with the same id, in query-id order (optionally only `qids`)."""
    en, xx = dict(zip(english.qids, english.texts)), dict(zip(other.qids, other.texts))
    keep = sorted(set(en) & set(xx) & (set(qids) if qids is not None else set(en)))
    return QuerySet(keep, [en[q] for q in keep]), QuerySet(keep, [xx[q] for q in keep])


@gin.configurable
def align_planner(model_dir: str = gin.REQUIRED, language: str = gin.REQUIRED, train_file: str = gin.REQUIRED,
                  dev_file: Optional[str] = None, english_train_split: str = "train", dev_split: str = "dev",
                  output_dir: Optional[str] = None, max_train: int = 0, max_dev: int = 500, tau: Positive = 2.0,
                  k: Count = 100, learning_rate: Positive = 1e-5, epochs: Count = 5, batch_size: Count = 32,
                  ell: Count = 100) -> dict:
    """Aligns the planner of the PAG model in MODEL_DIR to `language` (methods.pag.align): training pairs are
    the English `english_train_split` queries and `train_file` (qid<TAB>text, same query ids); the dev pairs
    (checkpoint selection) the English `dev_split` queries and `dev_file` — their query ids must not be
    training ones. Writes MODEL_DIR/aligned/<language>/ (or `output_dir`)."""
    from gr_jax.methods.api import restore

    for name, v in (("epochs", epochs), ("batch_size", batch_size), ("k", k), ("ell", ell)):
        validation.integer(f"align_planner.{name}", v)
    validation.number("align_planner.learning_rate", learning_rate)
    setup, params, step = restore(model_dir)
    if not isinstance(setup.model, PagRetriever):
        raise ValueError(f"align_planner aligns PAG's planner: the model in MODEL_DIR is a "
                         f"{type(setup.model).__name__}, not a PagRetriever")
    ds = setup.dataset
    for split in (english_train_split, dev_split):
        if split not in ds.queries:
            raise ValueError(f"split {split!r} not in the dataset (it has {sorted(ds.queries)})")
    train = paired(ds.queries[english_train_split], read_queries_tsv(train_file))
    if max_train:
        train = (QuerySet(train[0].qids[:max_train], train[0].texts[:max_train]),
                 QuerySet(train[1].qids[:max_train], train[1].texts[:max_train]))
    if not len(train[0]):
        raise DataError(f"{train_file}: no query id in common with the English {english_train_split!r} queries")
    dev_other = read_queries_tsv(dev_file) if dev_file else None
    if dev_other is None:
        raise ValueError("align_planner.dev_file is needed: the checkpoint is chosen by dev TokJaccard@ℓ")
    dev = paired(ds.queries[dev_split], dev_other)
    dev = (QuerySet(dev[0].qids[:max_dev], dev[0].texts[:max_dev]), QuerySet(dev[1].qids[:max_dev],
                                                                                 dev[1].texts[:max_dev]))
    overlap = set(train[0].qids) & set(dev[0].qids)
    if overlap:
        raise DataError(f"{dev_file}: {len(overlap)} dev query ids are also training ones, e.g. {sorted(overlap)[:3]}")
    out = Path(output_dir) if output_dir else RunDir(model_dir).aligned(language)
    gin_checks.check_bindings_used(("align_planner",))
    length = setup.feature_lengths["inputs"]
    meta = train_aligned_planner(
        setup.model, params, lambda texts: tokenize(texts, setup.vocab, length, what="queries"), train, dev, out,
        {"model_dir": str(model_dir), "step": int(step)}, tau=tau, k=k, learning_rate=learning_rate, epochs=epochs,
        batch_size=batch_size, ell=ell)
    return {"output_dir": str(out), **meta}
