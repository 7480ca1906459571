"""A retriever's run over a query set, and how a trained system is evaluated.

* `EvalConfig` (gin) — split, beams, batch, metrics, relevance threshold of an evaluation: the one place every
  command reads the number of beams, the evaluation batch size and the split from (`evaluation_settings`;
  their earlier per-command names are read as these, `gin_checks.renamed`);
* `retrieve(model, params, query tokens, ...)` — constrained search of every query through the model
  contract's `rank` (or `rank_with_plan` with a planning model and plan tokens) → a run holding the ranker's
  scores, read in trec_eval's order.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

import gin
import numpy as np

from gr_jax.runtime import gin_checks, validation
from gr_jax.data.pipeline import ExampleStore, eval_batches
from gr_jax.data.trec import Run, check_finite
from gr_jax.runtime.progress import bar as progress_bar
from gr_jax.runtime.validation import Count


@gin.configurable
@dataclasses.dataclass
class EvalConfig:
    """How a trained system is evaluated (which documents a beam's docid yields is the model's ranker)."""

    split: str = "dev"
    final_split: Optional[str] = None  # None: same as `split`
    num_beams: Count = 10
    batch_size: Count = 32
    max_queries: int = 0  # 0: all (periodic evaluation only; the final evaluation uses every query)
    metrics: Sequence[str] = ("Hit@1", "Hit@10", "MRR@10")
    compare_bm25: bool = False
    # binary measures count grades ≥ this as relevant: one value, or {split: value} (others 1; TREC DL: 2)
    rel_threshold: Any = 1

    def threshold(self, split: str) -> int:
        t = self.rel_threshold.get(split, 1) if isinstance(self.rel_threshold, Mapping) else self.rel_threshold
        validation.integer(f"EvalConfig.rel_threshold ({split})", t)
        return int(t)

    def validate(self) -> "EvalConfig":
        validation.integer("EvalConfig.num_beams", self.num_beams)
        if isinstance(self.rel_threshold, Mapping):
            for split in self.rel_threshold:
                self.threshold(split)
        else:
            self.threshold(self.split)
        validation.integer("EvalConfig.batch_size", self.batch_size)
        validation.integer("EvalConfig.max_queries (0: all)", self.max_queries, minimum=0)
        return self


# earlier names of EvalConfig's fields in the library's own gin files and commands (a command's own earlier
# parameter is declared by its module); each keeps working, logged once, and is read as the field
gin_checks.renamed("EvalConfig.num_beams", "NUM_BEAMS", "infer.num_beams")
gin_checks.renamed("EvalConfig.split", "EVAL_SPLIT", "infer.split")
gin_checks.renamed("EvalConfig.batch_size", "infer.batch_size")


def evaluation_settings(split: Optional[str] = None, num_beams: Optional[int] = None,
                        batch_size: Optional[int] = None) -> EvalConfig:
    """The evaluation settings a command runs with: `EvalConfig` as the gin configuration binds it, with the
    values a Python caller passes in place of its fields (None: the configuration's)."""
    given = {k: v for k, v in (("split", split), ("num_beams", num_beams), ("batch_size", batch_size))
             if v is not None}
    return dataclasses.replace(gin_checks.call_configured(EvalConfig), **given).validate()


def retrieve(model, params, query_tokens: np.ndarray, qids: Sequence[str], index, doc_ids: Sequence[str],
             num_beams: int, batch_size: int, plan_tokens: Optional[np.ndarray] = None) -> Run:
    """Constrained beam search for every query → a run holding the ranker's scores. The beams' documents are
    gathered on the device and ranked as arrays (`model.rank`); documents with equal scores (a docid shared
    by several documents, equal MDGR scores) are ordered by document id when the run is read, as trec_eval
    orders them — never by corpus row, so the run does not depend on the corpus order. With `plan_tokens`
    (a planning model, row by row with the queries), each query is searched under the plan of its row there
    (`model.rank_with_plan`)."""
    run: Run = {}
    ids = np.asarray(doc_ids, dtype=object)
    qids = [str(q) for q in qids]
    done = 0
    store = {"inputs": query_tokens} if plan_tokens is None else {"inputs": query_tokens, "plan": plan_tokens}
    # a search of many batches says how far it is (SEAL's host scoring took minutes without a word)
    bar = progress_bar(total=len(qids), desc=f"search ({type(model).__name__})", unit="query",
                       disable=len(qids) <= batch_size, mininterval=2.0)
    for batch, mask in eval_batches(ExampleStore(store), batch_size):  # one compiled shape
        if plan_tokens is None:
            q, d, s = model.rank(params, batch["inputs"], index, num_beams)
        else:
            q, d, s = model.rank_with_plan(params, batch["inputs"], batch["plan"], index, num_beams)
        o = np.argsort(q, kind="stable")  # grouped by query (the library's rankers already are)
        q, names, scores = np.asarray(q)[o], ids[np.asarray(d)[o]], np.asarray(s, np.float64)[o].tolist()
        bounds = np.searchsorted(q, np.arange(len(mask) + 1))
        for b in range(int(np.sum(mask))):
            run[qids[done + b]] = dict(zip(names[bounds[b]:bounds[b + 1]], scores[bounds[b]:bounds[b + 1]]))
        done += int(np.sum(mask))
        bar.update(int(np.sum(mask)))
    bar.close()
    check_finite(run, "beam search")
    return run
