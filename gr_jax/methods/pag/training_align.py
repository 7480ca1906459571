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
chosen epoch). The student trains through the library's loop (`trainer.fit`: checkpoints after every epoch, exact
resume, the non-finite guard) in `ALIGNED_DIR.training-<key>/` beside it.
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
    QuerySet,
    read_queries_tsv,
    RunDir,
    tokenize,
    trainer,
    validation,
    write_bytes,
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


class _AlignObjective:
    """The student's objective as the training loop's model: Eq. 13 against the teacher's planner weights."""

    def __init__(self, model, axes: dict, limit: int, tau: float, k: int):
        self.model, self.axes, self.limit, self.tau, self.k = model, axes, limit, tau, k

    def loss_fn(self, student, batch, rng):
        z = lexical_rep(self.model.network, student, batch["tokens"])[:, :self.limit]
        loss = align_loss(batch["target"], z, self.tau, self.k)
        return loss, {"loss": (loss, jnp.ones((), jnp.float32))}

    def param_axes(self, student) -> dict:
        return self.axes


class _AlignBatches:
    """The training pairs in a new order each epoch (one seeded generator, as many permutations as epochs), the
    last batch of an epoch the rest; resumable (`get_state`/`set_state`). It also carries the epochs' dev record
    (`record`: history, best epoch), which `_EpochEnd` keeps, so that each checkpoint holds it with the position."""

    def __init__(self, tokens: np.ndarray, targets: np.ndarray, batch_size: int, seed: int):
        self.tokens, self.targets, self.batch_size, self.seed = tokens, targets, int(batch_size), int(seed)
        self.per_epoch = -(-len(tokens) // self.batch_size)
        self.epoch, self.position, self._order = 0, 0, None
        self.record: dict = {"history": [], "best_epoch": 0}

    def _order_of(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        for _ in range(epoch):
            rng.permutation(len(self.tokens))
        return rng.permutation(len(self.tokens))

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        if self._order is None:
            self._order = self._order_of(self.epoch)
        rows = self._order[self.position * self.batch_size:(self.position + 1) * self.batch_size]
        self.position += 1
        if self.position == self.per_epoch:
            self.epoch, self.position, self._order = self.epoch + 1, 0, None
        return {"tokens": self.tokens[rows], "target": self.targets[rows]}

    def get_state(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "record": self.record}

    def set_state(self, state: dict) -> None:
        self.epoch, self.position, self._order = int(state["epoch"]), int(state["position"]), None
        self.record = {"history": list(state["record"]["history"]), "best_epoch": int(state["record"]["best_epoch"])}

    def epochs(self) -> list:
        return [self.epoch + self.position / self.per_epoch]


class _EpochEnd(trainer.Hook):
    """After each epoch: the student's dev TokJaccard (the paper's selection rule) into the record, and the
    student of a new best epoch kept as `students/epoch<e>.msgpack` in the loop's run directory (a resumed run
    repeats the epochs it lost, writing the same files)."""

    def __init__(self, batches: _AlignBatches, dev_jaccard, students: Path):
        self.batches, self.dev_jaccard, self.students = batches, dev_jaccard, students

    def on_start(self, ctx: trainer.LoopContext) -> None:
        if not self.batches.record["history"]:  # epoch 0: the teacher itself
            self.batches.record["history"] = [{"epoch": 0, "dev_tok_jaccard": self.dev_jaccard(ctx.params())}]

    def after_log(self, ctx: trainer.LoopContext) -> None:
        if ctx.step % self.batches.per_epoch:
            return
        epoch, record = ctx.step // self.batches.per_epoch, self.batches.record
        entry = {"epoch": epoch, "loss": ctx.logged["loss"], "dev_tok_jaccard": self.dev_jaccard(ctx.params())}
        record["history"] = record["history"][:epoch] + [entry]
        if entry["dev_tok_jaccard"] > record["history"][record["best_epoch"]]["dev_tok_jaccard"]:
            record["best_epoch"] = epoch
            write_bytes(self.students / f"epoch{epoch}.msgpack",
                        flax.serialization.to_bytes(jax.device_get(ctx.params())))


def train_aligned_planner(model, params, tokenize, train_pairs: tuple[QuerySet, QuerySet],
                          dev_pairs: tuple[QuerySet, QuerySet], out_dir: str | Path, teacher: dict,
                          tau: float = 2.0, k: int = 100, learning_rate: float = 1e-5, epochs: int = 5,
                          batch_size: int = 32, ell: int = 100, seed: int = 0, progress: bool = True,
                          run_dir: Optional[str | Path] = None) -> dict:
    """Trains the student (module docstring) through the training loop and writes it to `out_dir`. `model`: a
    PagRetriever with its docids in use; `tokenize(texts) -> [N, L] ids`; pairs: (English, other language) query
    sets whose query ids agree row by row; `teacher`: what the teacher is (MODEL_DIR, step), recorded in
    aligned.json. The loop checkpoints after every epoch in `run_dir` (default `<out_dir>.training-<key>` beside
    it, the key a digest of the teacher and the settings): a killed alignment resumes there and ends with the
    files of an uninterrupted one."""
    for (en, xx), what in ((train_pairs, "training"), (dev_pairs, "dev")):
        if list(en.qids) != list(xx.qids) or not len(en):
            raise ValueError(f"planner alignment: the {what} pairs must hold the same query ids in the same order")
    limit = int(model.docid_base)
    net = params["network"]
    t_en, t_xx = tokenize(list(train_pairs[0].texts)), tokenize(list(train_pairs[1].texts))
    d_en, d_xx = tokenize(list(dev_pairs[0].texts)), tokenize(list(dev_pairs[1].texts))
    teacher_rep = jax.jit(lambda tokens: lexical_rep(model.network, net, tokens)[:, :limit])
    z_teach = np.concatenate([np.asarray(teacher_rep(jnp.asarray(t_en[i:i + batch_size])))
                              for i in range(0, len(t_en), batch_size)])
    labels = jax.tree_util.tree_map(lambda m: "train" if m else "freeze", _trainable_mask(net))
    tx = optax.multi_transform({"train": optax.adamw(learning_rate, weight_decay=0.0),
                                "freeze": optax.set_to_zero()}, labels)

    def dev_jaccard(student_net) -> float:
        with_student = {**params, "network": student_net}
        got = {}
        for i in range(0, len(d_xx), batch_size):
            a = model.planner_tokens(params, d_en[i:i + batch_size], ell)
            b = model.planner_tokens(with_student, d_xx[i:i + batch_size], ell)
            got.update({q: drift.tok_jaccard(x, y, ell) for q, x, y in zip(dev_pairs[0].qids[i:i + batch_size], a, b)})
        return float(np.mean(list(got.values())))

    settings = {"tau": tau, "k": k, "ell": ell, "learning_rate": learning_rate, "epochs": epochs,
                "batch_size": batch_size, "trainable": list(TRAINABLE), "seed": seed,
                "pairs": fingerprint(train_pairs[0].qids, train_pairs[1].texts),
                "dev_pairs": fingerprint(dev_pairs[0].qids, dev_pairs[1].texts)}
    out_dir = Path(out_dir)
    if run_dir is None:  # one per teacher and settings: other settings train anew, the same ones resume
        key = hashlib.blake2b(json_text({"teacher": teacher, **settings}).encode(), digest_size=6).hexdigest()
        run_dir = out_dir.with_name(f"{out_dir.name}.training-{key}")
    run_dir = RunDir(run_dir)
    batches = _AlignBatches(t_xx, z_teach, batch_size, seed)
    loop = trainer.LoopConfig(epochs * batches.per_epoch, batch_size, seed=seed, log_period=batches.per_epoch,
                              checkpoint_period=batches.per_epoch, keep_checkpoints=1, progress=progress,
                              name="align")
    epoch_end = _EpochEnd(batches, dev_jaccard, run_dir.root / "students")
    student = jax.tree_util.tree_map(jnp.array, net)
    trainer.fit(_AlignObjective(model, model.param_axes(params)["network"], limit, tau, k), student, batches, tx,
                run_dir=run_dir, loop=loop, meta={"teacher": teacher, **settings}, hooks=[epoch_end])
    history, best_epoch = batches.record["history"], batches.record["best_epoch"]
    best_file = run_dir.root / "students" / f"epoch{best_epoch}.msgpack"
    try:
        blob = (flax.serialization.to_bytes(jax.device_get(net)) if best_epoch == 0 else best_file.read_bytes())
    except OSError as e:
        raise trainer.TrainingError(f"{best_file}: the student of the chosen epoch {best_epoch} cannot be read "
                                    f"({e.strerror}); delete {run_dir} and align again") from None
    meta = {"params_digest": hashlib.blake2b(blob, digest_size=12).hexdigest(), "teacher": teacher,
            "chosen_epoch": best_epoch, "history": history,
            **{k_: v for k_, v in settings.items() if k_ != "seed"}}
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
