"""A method is a combination: a toy method defined entirely in this file — a docid scheme, an objective with
metric keys of its own, a ranker and a decoding bonus — is bound with gin, trained, evaluated, restored by
`infer` and run in the dynamic-corpora protocol, with no library file knowing about it."""

import json

import gin
import jax.numpy as jnp
import numpy as np
import pytest

from gr_jax import dynamic as dynamic_cmd
from gr_jax import gin_utils
from gr_jax import infer as infer_cmd
from gr_jax import train as train_cmd
from gr_jax.docids.base import DocidScheme, DocidTable
from gr_jax.vocab import DocidTokenSpace

CALLS = {"bonus": 0, "state": 0}


@gin.configurable
class ToyDocids(DocidScheme):
    """The first `tokens` text tokens of a document's title: short, shared by similar titles (collisions)."""

    name = "toy_title_prefix"

    def __init__(self, tokens: int = 2):
        self.tokens = tokens
        self._vocab, self.text_vocab_size = None, 0

    def fit(self, corpus, context):
        self._vocab, self.text_vocab_size = context.vocab, int(context.vocab.size)
        return self

    def bind(self, vocab):
        self._vocab = vocab

    def assign(self, corpus, rows=None, embeddings=None):
        rows = np.arange(len(corpus)) if rows is None else np.asarray(rows)
        seqs = [self._vocab.encode(corpus.titles[int(r)])[: self.tokens] for r in rows]
        return DocidTable.from_lists(seqs, rows, DocidTokenSpace("text", self.text_vocab_size))

    def state(self):
        return {"tokens": self.tokens, "text_vocab_size": self.text_vocab_size}, {}

    def load_state(self, meta, arrays):
        self.tokens, self.text_vocab_size = meta["tokens"], meta["text_vocab_size"]


@gin.configurable
def toy_objective(model, params, batch, rng, first_token_weight: float = 2.0):
    """Token cross-entropy with the first docid token weighted up; its own metric keys."""
    logp, hit = model.token_log_probs(params, batch["inputs"], batch["targets"], rng)
    mask = model.head.target_mask(batch["targets"]).astype(jnp.float32)
    weight = mask.at[:, 0].multiply(first_token_weight)
    total = -(logp * weight).sum()
    return total / weight.sum(), {"toy_weighted_nll": (total, weight.sum()),
                                  "toy_first_token_hit": ((hit[:, 0] * mask[:, 0]).sum(), mask[:, 0].sum())}


@gin.configurable
class ToyRanker:
    """Documents by the rank of the first beam reaching them, the beam's score only breaking nothing."""

    def __call__(self, docs, valid, beam_scores):
        q, n, _ = np.nonzero(valid)
        d = docs[valid]
        o = np.lexsort((n, d, q))
        q, n, d = q[o], n[o], d[o]
        first = np.ones(len(q), bool)
        first[1:] = (q[1:] != q[:-1]) | (d[1:] != d[:-1])
        return q[first], d[first], -n[first].astype(np.float64)


@gin.configurable
def toy_bonus(level, child_nodes, state):
    CALLS["bonus"] += 1  # counted at trace time: the hook reached the beam search
    return jnp.where(child_nodes % 2 == 0, state[:, None, None], 0.0)


@gin.configurable
def toy_query_state(model, params, query_tokens):
    CALLS["state"] += 1
    return jnp.full((query_tokens.shape[0],), 0.01, jnp.float32)


TOY = """
include 'runs/train.gin'
include 'models/t5_tiny.gin'
MIXTURE_OR_TASK_NAME = 'demo'
load_dataset.demo_docs = 60
TRAIN_STEPS = 4
BATCH_SIZE = 16
TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 4}
prepare.vocab_size = 300
prepare.docid_scheme = @ToyDocids()
ToyDocids.tokens = 2
GenerativeRetriever.objective = @toy_objective
toy_objective.first_token_weight = 3.0
GenerativeRetriever.ranker = @ToyRanker()
GenerativeRetriever.bonus_fn = @toy_bonus
GenerativeRetriever.query_state_fn = @toy_query_state
train.progress = False
train.log_period = 2
EvalConfig.split = 'dev'
EvalConfig.num_beams = 5
"""


@pytest.mark.slow
def test_a_toy_method_defined_here_trains_evaluates_and_runs_in_the_dynamic_protocol(tmp_path, capsys):
    exp = tmp_path / "toy.gin"
    exp.write_text(TOY)
    model_dir = tmp_path / "toy"
    assert train_cmd.main([f"--gin_file={exp}", f"--gin.MODEL_DIR='{model_dir}'"]) == 0, capsys.readouterr().err
    logged = [json.loads(line) for line in (model_dir / "train_metrics.jsonl").read_text().splitlines()]
    assert {"toy_weighted_nll", "toy_first_token_hit", "grad_norm"} <= set(logged[-1])  # the objective's keys
    assert "loss" not in logged[-1]  # the trainer logs what the objective returns, nothing hard-wired
    final = json.loads((model_dir / "final_metrics.json").read_text())
    assert final["ranker"] == "ToyRanker"
    assert 0.0 <= final["metrics"]["Hit@10"] <= 1.0 and final["queries"] > 0
    assert CALLS["bonus"] > 0 and CALLS["state"] > 0  # the decoding hooks were used
    # the ranker's scores are what the run holds: minus the first beam's rank, so at most 5 distinct values
    run = [line.split() for line in open(final["run"])]
    assert {float(r[4]) for r in run} <= {0.0, -1.0, -2.0, -3.0, -4.0}
    assert json.loads((model_dir / "docid_scheme" / "scheme.json").read_text())["name"] == "toy_title_prefix"

    gin.clear_config()  # restored by infer from the same gin file
    assert infer_cmd.main([f"--gin_file={exp}", "--gin_file=runs/eval.gin", f"--gin.MODEL_DIR='{model_dir}'",
                           "--gin.NUM_BEAMS=5"]) == 0, capsys.readouterr().err
    again = json.loads((model_dir / "runs" / "dev.step4.metrics.json").read_text())
    assert again["metrics"] == final["metrics"]

    gin.clear_config()  # and the dynamic-corpora protocol, the same pieces trained on D0
    dyn = tmp_path / "dyn.gin"
    dyn.write_text("include 'runs/dynamic.gin'\n" + TOY + "run_dynamic.method = 'gr'\nrun_dynamic.progress = False\n")
    assert dynamic_cmd.main([f"--gin_file={dyn}", f"--gin.MODEL_DIR='{tmp_path / 'dyn'}'"]) == 0, \
        capsys.readouterr().err
    result = json.loads((tmp_path / "dyn" / "dynamic" / "dynamic.json").read_text())
    assert result["method"] == "gr-toy_title_prefix" and len(result["P"]) == 6
    assert all(v is None or -3 <= v <= 1 for v in result["idbi"])


def test_the_library_does_not_know_the_toy_method():
    import pathlib

    names = ("ToyDocids", "toy_objective", "ToyRanker", "toy_bonus", "toy_query_state", "toy_title_prefix")
    root = pathlib.Path(gin_utils.__file__).parent
    files = [*root.rglob("*.py"), *(root.parent / "gin_configs").rglob("*.gin")]
    assert len(files) > 40
    assert not [(p, n) for p in files for n in names if n in p.read_text()]
