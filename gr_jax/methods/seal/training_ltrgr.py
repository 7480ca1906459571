"""LTRGR: MINDER (or SEAL) trained on further with a learning-to-rank loss over the passage scores that its own
generated identifiers give (Li et al., AAAI 2024; the authors' `MINDER_learn_to_rank` script).

Two stages after a trained MINDER run:

1. **Rank data** (`write_rank_data`, `python -m gr_jax.methods.seal.rank_data`): the trained model retrieves the
   top `top_k` documents of every training query, each with the keys that counted for it in the greedy
   intersective scoring, in that order (`scoring.rank_documents(matched=True)`), its first `keys_per_passage`
   kept. One JSON-lines file with what it was built from (`provenance.records_text`): the model directory, the
   checkpoint step and a digest of its parameters, the identifier table's digest, the settings.
   Without a file (`LtrgrPairs.rank_data` None) the same rows are made at the start of training by the model
   training starts from (INITIAL_CHECKPOINT_PATH, `ObjectiveInputs.start`): how the dynamic-corpora protocol
   runs LTRGR from the MINDER it trained on D0 (experiments/demo/dynamic_ltrgr.gin).
2. **Training** (`prepare.objectives_config = @LtrgrPairs()`, `SealRetriever.objective = @LtrgrObjective()`):
   per training query whose positive (a judged document) and a negative are both among its top_k, four passages:
   the top-ranked positive and negative, and a random positive and negative (a random other one of each kind
   when there is one, else the top one again). A query where the top positive already leads the top negative by
   the margin is dropped (LTRGR keeps the queries with s(pos) < s(neg) + margin).

   A passage's score is recomputed with gradient from its stored keys: each key is scored again by teacher
   forcing under its view's input (the tokens after a title's DOC_START or a pseudo-query's QUERY_START, under
   the query marked for that view), weighted by SEAL's w(n) with the stored F(n) and the index size N, times
   the key's coverage coefficient in the stored order, and summed over the passage's keys:

       s(p) = Σ_k  w(score_k, F_k) · (1 − β + β · new_k / types_k)

   (new_k: the key's token types not in the keys before it; the same sum as SEAL's document score over these
   keys, so before any update s(p) is the score the rank data recorded). The loss is

       L = ½ · mean max(0, s(neg_top) − s(pos_top) + m) + ½ · mean max(0, s(neg_rand) − s(pos_rand) + m + 100)
           + λ · L_gen

   with L_gen the token cross-entropy of the top positive's targets (its title, a span drawn by overlap with the
   query, a pseudo-query), m 300 and λ 1000 as the authors'. With MINDER's `query_view_boost` the recorded scores
   hold the boost and s(p) does not (as the authors': their rescoring drops it).

Differences from the authors' code: positives are the judged documents (qrels, as their MS MARCO setting; NQ's
answer-string match is not available here); the random positive and negative are drawn once per query (seeded by
its id), where theirs are drawn again at every epoch; the pseudo-query target is the first other pseudo-query,
theirs a random one (and their query-view loss reads the title target, a quirk not kept); a key's view is the
search that scored it (theirs: by its token pattern); a passage with fewer keys is masked where theirs repeats
its last key with count 10000; L_gen is the mean over all target tokens of the three views, theirs the mean of
the three views' means.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from pathlib import Path
from typing import Optional

import gin
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.methods.api import (
    Count,
    EOS_ID,
    ExampleStore,
    MixtureIterator,
    normalized,
    ObjectivesConfig,
    PAD_ID,
    pad_sequences,
    Positive,
    ProvenanceError,
    read_records,
    records_text,
    tokenize,
    UserError,
)
from gr_jax.methods.seal.model import _SealRanking, mark
from gr_jax.methods.seal.training import SealPairs, _rng

log = logging.getLogger(__name__)

PASSAGES = 4  # top positive, top negative, random positive, random negative
VIEW_IDS = {"body": 0, "title": 1, "query": 2}


class RankDataError(UserError, ValueError):
    """LTRGR's rank data cannot be built or used (no positive retrieved, another table, a wrong model)."""


# ----------------------------------------------------------------------------------------------------------
# stage 1: rank data
# ----------------------------------------------------------------------------------------------------------


def params_digest(params) -> str:
    """One digest of a parameter tree (every array's dtype, shape and bytes, in key order)."""
    h = hashlib.blake2b(digest_size=12)
    for path, leaf in sorted(jax.tree_util.tree_flatten_with_path(jax.device_get(params))[0],
                             key=lambda x: jax.tree_util.keystr(x[0])):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{jax.tree_util.keystr(path)}{a.dtype.str}{a.shape}".encode())
        h.update(a.view(np.uint8).reshape(-1) if a.size else b"")
    return h.hexdigest()


def training_queries(dataset, split: str, max_queries: int = 0) -> tuple[list, list]:
    """(query ids, texts) of the judged queries of `split`, sorted by id (the first `max_queries` when > 0)."""
    if split not in dataset.queries:
        raise RankDataError(f"the dataset has no query split {split!r}; it has {sorted(dataset.queries)}")
    judged = dataset.qrels.get(split, {})
    text_of = dict(zip(dataset.queries[split].qids, dataset.queries[split].texts))
    qids = sorted(q for q in text_of if any(g >= 1 for g in judged.get(q, {}).values()))
    qids = qids[:max_queries] if max_queries else qids
    return qids, [text_of[q] for q in qids]


def rank_data_rows(model, params, index, doc_ids, qids: list, tokens: np.ndarray, top_k: int,
                   keys_per_passage: int, num_beams: int, batch_size: int) -> list:
    """One row per query: its top_k documents (by score, ties by document id) with their first keys."""
    from gr_jax.methods.api import progress_bar

    if not isinstance(model, _SealRanking):
        raise RankDataError(f"LTRGR's rank data needs a SEAL or MINDER model (SealRetriever, SealDecoderOnly); "
                            f"this one is {type(model).__name__}")
    if model.search.document_score != "intersective":
        raise RankDataError(f"LTRGR's passage scores are SEAL's intersective scores; this model ranks by "
                            f"SealSearch.document_score = {model.search.document_score!r}")
    rows = []
    bar = progress_bar(len(qids), "rank data", unit="query")
    try:
        for start in range(0, len(qids), batch_size):
            ranked = model.ranked(params, tokens[start:start + batch_size], index, num_beams)
            for qid, docs in zip(qids[start:start + batch_size], ranked):
                docs = sorted(((doc_ids[r], v, keys) for r, v, keys in docs), key=lambda x: (-x[1], x[0]))
                rows.append({"qid": qid, "docs": [
                    {"doc_id": d, "score": float(v),
                     "keys": [[list(map(int, t)), int(c), view] for t, c, view in keys[:keys_per_passage]]}
                    for d, v, keys in docs[:top_k]]})
            bar.update(min(batch_size, len(qids) - start))
    finally:
        bar.close()
    return rows


def _with_positive(rows: list, judged: dict) -> int:
    return sum(any(judged.get(r["qid"], {}).get(d["doc_id"], 0) >= 1 for d in r["docs"]) for r in rows)


def _queries_digest(qids: list, texts: list) -> str:
    return hashlib.blake2b("\n".join(f"{q}\t{t}" for q, t in zip(qids, texts)).encode(), digest_size=12).hexdigest()


@gin.configurable
def write_rank_data(model_dir: str, output: Optional[str] = None, split: str = "train", top_k: Count = 100,
                    keys_per_passage: Count = 40, num_beams: Count = 15, batch_size: Count = 32,
                    max_queries: int = 0) -> dict:
    """Stage 1 (module docstring): writes `output` (default MODEL_DIR/ltrgr_rank_data.jsonl) and returns its
    header. Training queries are taken sorted by id (the first `max_queries` when > 0). A file already there that
    was built from the same checkpoint, table and settings is kept; one built from anything else is an error."""
    from gr_jax.methods.api import restore
    from gr_jax.methods.api import write_text

    if max_queries < 0:
        raise ValueError(f"write_rank_data.max_queries must be ≥ 0 (0: all), got {max_queries}")
    setup, params, step = restore(model_dir)
    data = setup.dataset
    qids, texts = training_queries(data, split, max_queries)
    output = Path(output) if output else Path(model_dir) / "ltrgr_rank_data.jsonl"
    built_from = normalized({
        "model_dir": str(model_dir), "step": int(step), "network": params_digest(params["network"]),
        "table": setup.table.digest(), "split": split, "top_k": top_k, "keys_per_passage": keys_per_passage,
        "num_beams": num_beams, "search": setup.model.describe(), "queries": _queries_digest(qids, texts)})
    if output.exists():
        head, _ = read_records(output, "LTRGR rank data")
        if head["built_from"] == built_from:
            log.info("%s: rank data already built from this checkpoint and these settings; kept", output)
            return head
        differs = sorted(k for k in set(head["built_from"]) | set(built_from)
                         if head["built_from"].get(k) != built_from.get(k))
        raise ProvenanceError(f"{output}: LTRGR rank data built with another {', '.join(differs)}; pass another "
                              f"write_rank_data.output or delete the file to build it again")
    tokens = tokenize(texts, setup.vocab, setup.feature_lengths["inputs"], what=f"{split} queries")
    rows = rank_data_rows(setup.model, params, setup.index, data.corpus.doc_ids, qids, tokens, top_k,
                          keys_per_passage, num_beams, batch_size)
    found = _with_positive(rows, data.qrels[split])
    head = {"built_from": built_from, "positions": int(setup.index.num_positions), "queries_with_a_positive": found}
    write_text(output, records_text(head, rows), keep_previous=True)
    head = read_records(output, "LTRGR rank data")[0]  # with its row count and digest
    log.info("rank data: %d training queries, %d with a judged document in their top %d → %s", len(rows), found,
             top_k, output)
    return head


# ----------------------------------------------------------------------------------------------------------
# stage 2: the training data
# ----------------------------------------------------------------------------------------------------------


def coverage_counts(keys: list) -> tuple[list, list]:
    """(new_k, types_k) of each key in order: its token types not in the keys before it, and all its types."""
    seen, new, types = set(), [], []
    for tokens in keys:
        t = set(tokens)
        new.append(len(t - seen))
        types.append(len(t))
        seen |= t
    return new, types


@gin.configurable
@dataclasses.dataclass
class LtrgrPairs(ObjectivesConfig):
    """LTRGR's training examples from the rank data file (module docstring, stage 2)."""

    rank_data: Optional[str] = None  # a file of write_rank_data; None: made at the start (below)
    generation: Optional[SealPairs] = None  # the span length and temperature of the generation targets (SEAL's)
    keys_per_passage: Count = 40
    margin: float = 300.0  # LTRGR's rank_margin: queries whose top positive leads by this much are dropped
    # without a rank data file: made by the model training starts from (INITIAL_CHECKPOINT_PATH, a trained
    # MINDER — in the dynamic-corpora protocol the one trained on D0), over these training queries
    top_k: Count = 100
    max_queries: int = 0  # the first ones by id; 0: all
    num_beams: Count = 15
    batch_size: Count = 32
    refresh_period = 0

    def _from_start(self, inp):
        """(header, rows) of rank data made now by the model training starts from."""
        start = inp.start() if inp.start is not None else None
        if start is None or not start.initial_checkpoint_path:
            raise RankDataError("LTRGR starts from a trained MINDER: set INITIAL_CHECKPOINT_PATH to its run (or name "
                                "a rank data file, LtrgrPairs.rank_data)")
        qids, texts = training_queries(inp.dataset, inp.train_split, self.max_queries)
        tokens = tokenize(texts, inp.vocab, inp.lengths["inputs"], what=f"{inp.train_split} queries")
        log.info("LTRGR rank data: %d training queries retrieved by the model of %s", len(qids),
                 start.initial_checkpoint_path)
        rows = rank_data_rows(start.model, start.params, start.index, inp.dataset.corpus.doc_ids, qids, tokens,
                              self.top_k, self.keys_per_passage, self.num_beams, self.batch_size)
        log.info("LTRGR rank data: %d of %d queries with a judged document in their top %d",
                 _with_positive(rows, inp.dataset.qrels[inp.train_split]), len(rows), self.top_k)
        return {"built_from": {"table": inp.table.digest(), "keys_per_passage": self.keys_per_passage},
                "positions": int(start.index.num_positions)}, rows

    def _read(self, inp):
        """(header, rows) of the rank data file, checked against this run: the identifier table, the training
        split, and the network training starts from (INITIAL_CHECKPOINT_PATH's must be the one that retrieved)."""
        head, rows = read_records(self.rank_data, "LTRGR rank data")
        built = head["built_from"]
        fix = ("build it again from the run this one starts from (INITIAL_CHECKPOINT_PATH): python -m "
               "gr_jax.methods.seal.rank_data, or delete LtrgrPairs.rank_data to make it at the start")
        if built.get("table") != inp.table.digest():
            raise ProvenanceError(f"{self.rank_data}: LTRGR rank data built over another identifier table "
                                  f"({built.get('table')}, this run's is {inp.table.digest()}); {fix}")
        if built.get("split", inp.train_split) != inp.train_split:
            raise ProvenanceError(f"{self.rank_data}: LTRGR rank data of the {built['split']!r} queries, this run "
                                  f"trains on {inp.train_split!r} (TRAIN_SPLIT); {fix}")
        if built.get("keys_per_passage", 0) < self.keys_per_passage:
            raise RankDataError(f"{self.rank_data}: holds {built.get('keys_per_passage')} keys per passage, fewer "
                                f"than LtrgrPairs.keys_per_passage = {self.keys_per_passage}; lower it or {fix}")
        start = inp.start() if inp.start is not None else None
        if start is not None and "network" in built:
            held = params_digest(start.params["network"])
            if held != built["network"]:
                origin = start.initial_checkpoint_path or "a random initialisation"
                raise ProvenanceError(f"{self.rank_data}: LTRGR rank data retrieved by another network than the "
                                      f"one this run starts from ({origin}: {held}, the file's: {built['network']} "
                                      f"from {built.get('model_dir')} step {built.get('step')}); {fix}")
        return head, rows

    def quadruples(self, head, rows, qrels, seed: int) -> tuple[list, dict]:
        """[(qid, [4 doc records])] of the kept queries, by query id, and the count of each reason to drop."""
        out, dropped = [], {"no positive retrieved": 0, "no negative retrieved": 0, "already by the margin": 0}
        for rec in sorted(rows, key=lambda r: r["qid"]):
            judged = qrels.get(rec["qid"], {})
            docs = sorted(rec["docs"], key=lambda d: (-d["score"], d["doc_id"]))
            pos = [d for d in docs if judged.get(d["doc_id"], 0) >= 1]
            neg = [d for d in docs if judged.get(d["doc_id"], 0) < 1]
            if not pos or not neg:
                dropped["no positive retrieved" if not pos else "no negative retrieved"] += 1
                continue
            if pos[0]["score"] >= neg[0]["score"] + self.margin:
                dropped["already by the margin"] += 1
                continue
            rng = _rng(seed, "ltrgr", rec["qid"])
            rand_pos = pos[1 + int(rng.integers(len(pos) - 1))] if len(pos) > 1 else pos[0]
            rand_neg = neg[1 + int(rng.integers(len(neg) - 1))] if len(neg) > 1 else neg[0]
            out.append((rec["qid"], [pos[0], neg[0], rand_pos, rand_neg]))
        return out, dropped

    def iterator(self, inp) -> MixtureIterator:
        SealPairs._identifiers(inp.table)  # refuses a table without identifier texts before any work
        head, rows = self._read(inp) if self.rank_data else self._from_start(inp)
        data = inp.dataset
        if inp.train_split not in data.queries:
            raise RankDataError(f"the dataset has no query split {inp.train_split!r} (TRAIN_SPLIT)")
        kept, dropped = self.quadruples(head, rows, data.qrels[inp.train_split], inp.seed)
        log.info("LTRGR: %d of %d training queries kept (dropped: %s)", len(kept), len(rows), dropped)
        if not kept:
            raise RankDataError(f"{self.rank_data or 'LTRGR rank data'}: no training query has both a judged "
                                f"document and another among its retrieved ones ({dropped}); retrieve more "
                                f"(top_k) or train the first stage longer")
        text_of = dict(zip(data.queries[inp.train_split].qids, data.queries[inp.train_split].texts))
        queries = tokenize([text_of[q] for q, _ in kept], inp.vocab, inp.lengths["inputs"], what="LTRGR queries")
        row_of = {d: r for r, d in enumerate(data.corpus.doc_ids)}
        store = self.store(kept, queries, head["positions"], inp.table, row_of, inp.lengths["targets"], inp.seed)
        return MixtureIterator([store], inp.batch_size, seed=inp.seed, rates=[1.0], names=["ltrgr"])

    def store(self, kept: list, queries: np.ndarray, positions: int, table, row_of: dict, target_length: int,
              seed: int) -> ExampleStore:
        """The examples of `quadruples`' kept queries (`queries`: their tokens, in that order); `row_of`: doc id →
        corpus row."""
        gen = dataclasses.replace(self.generation or SealPairs(), title_samples=1, span_samples=1, query_samples=1)
        m, identifier = gen._identifiers(table)
        T, K = target_length, self.keys_per_passage
        width = max((len(t) for _, ps in kept for p in ps for t, _, _ in p["keys"][:K]), default=1)
        feats = {k: [] for k in ("view_inputs", "gen_targets", "gen_views", "key_tokens", "key_views",
                                 "key_counts", "key_new", "key_types", "positions")}
        for (qid, passages), q in zip(kept, queries):
            ids = [int(t) for t in q if t not in (PAD_ID, EOS_ID)]
            feats["view_inputs"].append(np.concatenate([mark(q[None], v)[0] for v in
                                                        (m.view_body, m.view_title, m.view_query)]))
            targets = gen.supervised(qid, ids, identifier(row_of[passages[0]["doc_id"]]), 0, m, seed)
            order = {m.view_body: 0, m.view_title: 1, m.view_query: 2}
            pick = {}
            for _, marker, target in targets:  # one target per view
                pick.setdefault(order[marker], target)
            feats["gen_targets"].append(np.concatenate(
                [pad_sequences([pick.get(v, [])[:T]], T, add_eos=False, dtype=np.int32)[0] for v in range(3)]))
            feats["gen_views"].append([1 if v in pick else 0 for v in range(3)])
            toks, views, counts, new, types = [], [], [], [], []
            for p in passages:
                keys = [(tuple(t), c, VIEW_IDS[v]) for t, c, v in p["keys"][:K]]
                n, ty = coverage_counts([t for t, _, _ in keys])
                for j in range(K):
                    if j < len(keys):
                        t, c, view = keys[j]
                        target = list(t[1:] if view else t)  # a title or pseudo-query key: after its forced marker
                        toks.append(target + [PAD_ID] * (width - len(target)))
                        views.append(view)
                        counts.append(c)
                        new.append(n[j])
                        types.append(ty[j])
                    else:
                        toks.append([PAD_ID] * width)
                        views.append(-1)
                        counts.append(0)
                        new.append(0)
                        types.append(1)
            feats["key_tokens"].append(np.asarray(toks, np.int64).reshape(-1))
            for name, v in (("key_views", views), ("key_counts", counts), ("key_new", new), ("key_types", types)):
                feats[name].append(v)
            feats["positions"].append([positions >> 20, positions & ((1 << 20) - 1)])  # int32 features
        return ExampleStore({k: np.asarray(v, np.int64) for k, v in feats.items()})


# ----------------------------------------------------------------------------------------------------------
# stage 2: the loss
# ----------------------------------------------------------------------------------------------------------


def key_weights(scores, counts, positions, smoothing: float = 5.0, exponent: float = 2.0):
    """SEAL's w(n) (scoring.weight) on arrays, differentiable in `scores`: max(0, log-odds) ** exponent."""
    sr = jnp.minimum(scores, 0.0) - 1e-10
    snr = jnp.log((counts + smoothing) / (positions + smoothing))
    # log(1 − e^x) as log(−expm1(x)): exact for x near 0, where float32's 1 − e^x is 0
    odds = (sr + jnp.log(-jnp.expm1(snr))) - (snr + jnp.log(-jnp.expm1(sr)))
    return jnp.maximum(odds, 0.0) ** exponent


@gin.configurable
@dataclasses.dataclass
class LtrgrObjective:
    """The LTRGR loss for `LtrgrPairs` batches (bind `SealRetriever.objective = @LtrgrObjective()`)."""

    margin: Positive = 300.0
    random_pair_extra: float = 100.0
    generation_weight: float = 1000.0  # λ

    def passage_scores(self, model, params, batch, rng=None):
        """s(p) of the module docstring, [B, 4]; smoothing, exponent and β are the model's search settings (those
        that scored the rank data)."""
        B, K = batch["key_views"].shape[0], batch["key_views"].shape[1] // PASSAGES
        views = batch["key_views"].reshape(B, PASSAGES * K)
        tokens = batch["key_tokens"].reshape(B * PASSAGES * K, -1)
        inputs = batch["view_inputs"].reshape(B, 3, -1)
        rows = jnp.take_along_axis(inputs, jnp.maximum(views, 0)[:, :, None], axis=1).reshape(B * PASSAGES * K, -1)
        logp, _ = model.token_log_probs(params, rows, tokens, rng)
        scores = (logp * (tokens != PAD_ID)).sum(-1).reshape(B, PASSAGES * K)
        n = batch["positions"].astype(jnp.float32)
        positions = n[:, :1] * float(1 << 20) + n[:, 1:]
        search = model.search
        w = key_weights(scores, batch["key_counts"].astype(jnp.float32), positions, search.smoothing,
                        search.score_exponent)
        beta = search.repetition_penalty
        cover = 1.0 - beta + beta * batch["key_new"] / jnp.maximum(batch["key_types"], 1)
        return (w * cover * (views >= 0)).reshape(B, PASSAGES, K).sum(-1)

    def __call__(self, model, params, batch, rng=None):
        k_rank, k_gen = jax.random.split(rng) if rng is not None else (None, None)
        s = self.passage_scores(model, params, batch, k_rank)
        top = jnp.maximum(0.0, s[:, 1] - s[:, 0] + self.margin)
        rand = jnp.maximum(0.0, s[:, 3] - s[:, 2] + self.margin + self.random_pair_extra)
        l_rank = 0.5 * top.mean() + 0.5 * rand.mean()
        B = s.shape[0]
        targets = batch["gen_targets"].reshape(B * 3, -1)
        inputs = batch["view_inputs"].reshape(B * 3, -1)
        logp, hit = model.token_log_probs(params, inputs, targets, k_gen)
        mask = (targets != PAD_ID).astype(jnp.float32)
        tokens = mask.sum()
        l_gen = -(logp * mask).sum() / jnp.maximum(tokens, 1.0)
        loss = l_rank + self.generation_weight * l_gen
        ordered = (s[:, 0] > s[:, 1]).astype(jnp.float32)
        metrics = {"loss": (loss * B, jnp.float32(B)), "rank_loss": (l_rank * B, jnp.float32(B)),
                   "generation_loss": (-(logp * mask).sum(), tokens),
                   "token_accuracy": ((hit * mask).sum(), tokens),
                   "pairs_ordered": (ordered.sum(), jnp.float32(B))}
        return loss, metrics
