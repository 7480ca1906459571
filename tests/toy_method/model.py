"""The toy's objective, ranker and decoding hooks, injected into the library's GenerativeRetriever by gin."""

import gin
import jax.numpy as jnp
import numpy as np

CALLS = {"bonus": 0, "state": 0}  # counted at trace time: the hooks reached the beam search


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
    """Documents by the rank of the first beam reaching them; the beam's score decides nothing."""

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
    CALLS["bonus"] += 1
    return jnp.where(child_nodes % 2 == 0, state[:, None, None], 0.0)


@gin.configurable
def toy_query_state(model, params, query_tokens):
    CALLS["state"] += 1
    return jnp.full((query_tokens.shape[0],), 0.01, jnp.float32)
