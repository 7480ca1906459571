"""The model contract: what the composition, the trainer and the protocols may ask of a retriever model object.

A model object (`GenerativeRetriever` and its subclasses, a method's own model, Few-Shot GR's retriever) is a
`Retriever`. What only some models can do is *declared* in `capabilities` and read from there — never probed
with `hasattr`/`getattr` (tests/test_methods.py checks the protocols and the composition for it):

  planner         the model plans candidates before it decodes, and is a `Planner` (PAG: the lexical planner,
                  its planning-only ranking, the plan-swap run and a planner aligned to another language);
  decodes_docids  the docids are a function of the parameters: `decode_docids(params, document tokens)` gives
                  every document's docid and token weights (GLEN; the docid scheme declares
                  `decoded_by_model` beside it);
  docid_weights   the ranker reads the docid table's token weights, which `use_docids` keeps (GLEN);
  decoding_bonus  a per-step bonus guides the search (a `bonus_fn`; PAG's look-ahead);
  traced_search   `beam_documents(params, query tokens, index, num_beams)` gives the beams' documents as device
                  arrays from a function a caller may trace inside its own jit (t5x's partitioned infer step),
                  and `rank` is the ranker of exactly these (DSI and the models built on `GenerativeRetriever`,
                  PAG; not SEAL's host-side n-gram scoring, nor docids decoded by the model).

`check(model)` turns a model object that misses part of the contract into an error that names the missing
members, when the composition builds it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ContextManager, Optional, Protocol, runtime_checkable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Capabilities:
    planner: bool = False
    decodes_docids: bool = False
    docid_weights: bool = False
    decoding_bonus: bool = False
    traced_search: bool = False


@runtime_checkable
class Retriever(Protocol):
    config: Any  # the network's config (`vocab_size`, `to_json()`)
    ranker: Any  # beams' documents → (query, document row, score) (decoding/rankers.py)

    @property
    def capabilities(self) -> Capabilities: ...

    def describe(self) -> str:
        """What retrieves, for result files (stable: no addresses)."""

    def init_params(self, seed: int = 0) -> dict: ...

    def param_axes(self, params) -> dict:
        """Logical sharding axes of the parameter tree (training/partitioning.py)."""

    def loss_fn(self, params, batch, dropout_rng=None):
        """(loss, {name: (sum, count)}) of one batch; the trainer logs every name."""

    def use_docids(self, table) -> None:
        """The docid table the index holds, handed over again whenever documents are added."""

    def rank(self, params, query_tokens_BxL, index, num_beams: int = 10):
        """(query [R], document row [R], score [R]) arrays, each pair once."""

    def decode_docids(self, params, doc_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Capability `decodes_docids`: (tokens [n, M], token weights [n, M]) of every document."""


@runtime_checkable
class Planner(Protocol):
    """Capability `planner`. Modes: `planned_mode` (plan, then decode under the plan), `planning_only_mode` (rank
    by the plan alone), `unplanned_mode` (decode without a plan)."""

    planning_size: int
    mode: str
    planned_mode: str
    planning_only_mode: str
    unplanned_mode: str

    def in_mode(self, mode: str) -> ContextManager[None]:
        """Temporarily retrieve in `mode`."""

    def planner_tokens(self, params, query_tokens_BxL, ell: int) -> list[list[int]]:
        """Each query's top-ℓ planner tokens."""

    def rank_with_plan(self, params, query_tokens_BxL, plan_tokens_BxL, index, num_beams: int = 10):
        """`rank`, each query decoded under the plan of the query at its row of `plan_tokens_BxL`."""

    def aligned_params(self, directory: str, params, teacher: dict):
        """The parameters with the planner aligned to another language, read from `directory` (written for
        the teacher checkpoint `teacher`: an error otherwise)."""


@runtime_checkable
class TracedSearch(Protocol):
    """Capability `traced_search`."""

    def beam_documents(self, params, query_tokens_BxL, index, num_beams: int = 10):
        """(docs [B, N, P] corpus rows, valid [B, N, P], beam scores [B, N]) as device arrays from a function a
        caller may trace; `ranker(*jax.device_get(...))` is `rank`'s output."""


def check(model, what: str = "the model object") -> None:
    """An error naming what `model` lacks of the `Retriever` contract (and of `Planner` or `TracedSearch`, when it
    declares them)."""
    missing = _missing(model, Retriever)
    if not missing and model.capabilities.planner:
        missing = _missing(model, Planner)
    if not missing and model.capabilities.traced_search:
        missing = _missing(model, TracedSearch)
    if missing:
        raise TypeError(f"{what} ({type(model).__name__}) does not follow the model contract "
                        f"(gr_jax/retriever/contract.py): it has no {', '.join(missing)}")


def _missing(obj, protocol) -> list[str]:
    wanted = set(protocol.__annotations__) | {n for n in vars(protocol) if not n.startswith("_")}
    return sorted(n for n in wanted if not hasattr(obj, n))


def planner_of(model) -> Optional[Planner]:
    """The model as a `Planner` when it declares one, else None."""
    return model if model.capabilities.planner else None
