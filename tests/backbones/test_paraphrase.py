"""The LM paraphraser: its acceptance rule by hand, and on a tiny random LM (which rarely writes an acceptable
paraphrase, so the rule-based fallback is exercised) a result that depends on the seed and the query set,
not on the query order."""

import pytest

from gr_jax.data import variations as V
from gr_jax.backbones.paraphrase import LMParaphraser


def test_acceptance_by_hand():
    p = LMParaphraser(min_shared=0.5)
    src = "who established the narrow canal"  # content words: established, narrow, canal
    assert p.acceptable(src, "who built the narrow canal")  # 2 of 3 kept
    assert not p.acceptable(src, "who founded the first highway")  # 0 of 3
    assert not p.acceptable(src, "Who established  the narrow canal")  # the query itself
    assert not p.acceptable(src, "")
    assert not p.acceptable(src, "narrow canal " * 6)  # more than twice as long
    assert p.acceptable("of the", "of a")  # no content word to keep


@pytest.fixture(scope="module")
def paraphraser(tiny_lm):
    ctx, d = tiny_lm
    p = LMParaphraser(samples=2, max_new_tokens=6, batch_size=3)
    object.__setattr__(p, "_ctx", ctx)
    object.__setattr__(p, "_digest", "tiny")
    return p, d


@pytest.mark.slow
def test_lm_paraphrases_are_order_independent(paraphraser):
    p, d = paraphraser
    qs = d.queries["test"]
    texts, qids = list(qs.texts[:7]), list(qs.qids[:7])
    out = p.vary(texts, qids, 2026)
    assert len(out) == 7 and all(isinstance(t, str) and t.strip() for t in out)
    assert 0 <= p.fallbacks <= 7
    rule = dict(zip(qids, V.RuleParaphraser().vary(texts, qids, 2026)))
    for q, t, o in zip(qids, texts, out):
        assert o == rule[q] or p.acceptable(t, o)
    again = p.vary(texts[::-1], qids[::-1], 2026)
    assert dict(zip(qids[::-1], again)) == dict(zip(qids, out))
    assert p.settings()["lm"] == "tiny" and p.settings()["samples"] == 2


@pytest.mark.slow
def test_saved_paraphrases_record_the_fallbacks(paraphraser, tmp_path):
    import json

    from gr_jax.data.readers import QuerySet

    p, d = paraphraser
    qs = d.queries["test"]
    V.variation_set(tmp_path / "p.jsonl", p, QuerySet(list(qs.qids[:5]), list(qs.texts[:5])), 5, "paraphrase")
    stats = json.loads((tmp_path / "p.jsonl").read_text().splitlines()[0])["stats"]
    assert stats["fallbacks"] == p.fallbacks and 0 <= stats["fallbacks"] <= 5
