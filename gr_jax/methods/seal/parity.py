"""SEAL against its authors' code: the substring index against SEAL's FM-index, and the document scoring against
SEAL's `aggregate_evidence`, on the answers SEAL's own code wrote (`tools/check_parity.py --method seal
--fixture tests/fixtures/seal_parity`; the folder holds fm_index.json from tools/seal_fm_fixtures.py and
scoring.json from tools/seal_scoring_fixtures.py, both run against facebookresearch/SEAL @ fdaf307).

Index: every n-gram's count, allowed next tokens with counts, and documents equal SEAL's (tests/index/
test_substring_seal.py states the two classes where they differ on purpose, which are counted here apart).

Scoring: for each query and each compared variant of SEAL's settings, the keys (n-gram, log P(n|q)) and the
unigram log-probabilities SEAL was given are ranked by `ranker.rank_documents` over SEAL's document texts
(`[EOS] + document[:-1]`, what SEAL's full scoring reads): every document's score must equal SEAL's within
`tolerance` of its magnitude, and the order of the documents must be SEAL's except within runs of equal scores
(SEAL keeps those in the order its first pass met them; here by row). Where SEAL's index counts a key differently
from the documents' own text (n-grams across a document boundary; the title of the first document of SEAL's
reversed text), the key weighs what SEAL's count gives and occurs where the text holds it, and the documents SEAL
scores only because of such a key are counted apart (`seal_only_documents`), not compared.
Variants compared: SEAL's NQ defaults, without unigram scores, and with small cut-offs (max_hits 10,
fully_score 20, top-k unigrams 50: the first pass decides which documents are scored, where the first-pass
deviation in `ranker` shows as documents in one ranking only; their count is reported).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from gr_jax.methods.api import SubstringIndex, read_json
from gr_jax.methods.seal.device_ranker import DeviceScorer
from gr_jax.methods.seal.ranker import Key, best_unigrams, occurrences, rank_documents, type_scores, weight

VARIANTS = ("nq_defaults", "no_unigram_scores", "small_cutoffs")
MINDER_VARIANTS = ("nq_defaults", "no_unigram_scores")
MINDER_QUERY_BOOST = 14.0  # MINDER's keys.py: a pseudo-query key's log P + 14, at most -1 (SealSearch.query_view_boost)


def _occurrences(texts: list[list[int]], g: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(rows, starts) of every occurrence of g in the texts."""
    hits = [(r, int(p)) for r, t in enumerate(texts) for p in occurrences(t, g)]
    return np.asarray([r for r, _ in hits], np.int64), np.asarray([p for _, p in hits], np.int64)


def corpus_view(corpus: dict):
    """(SEAL's full-scoring texts `[EOS] + document[:-1]`, the same as a −1-padded table, SEAL's unigram counts) of a
    fixture's corpus: made once for all its queries."""
    texts = [[corpus["eos"]] + d[:-1] for d in corpus["docs"]]
    width = max(len(t) for t in texts)
    table = np.array([t + [-1] * (width - len(t)) for t in texts])
    counts = np.zeros(int(corpus.get("unigram_length", corpus["vocab_size"])), np.int64)
    for t in texts:
        np.add.at(counts, np.asarray(t[1:]), 1)  # SEAL counts every token of the text, the EOS once per document
    counts[corpus["eos"]] = len(texts)
    return texts, table, counts


def rank_like_seal(fixture: dict, query: dict, variant: str, view=None, scorer=None) -> list[tuple]:
    """Our ranking of one fixture query under one of SEAL's settings: [(document, score)], best first. A MINDER
    fixture (`query_start`: its pseudo-query view's first token) adds MINDER's view boost to the keys that start
    with it (`SealSearch.query_view_boost` 14: log P + 14, at most −1) and passes keys as MINDER's retrieval does,
    repeats included (the last one's score counts; every repeat counts towards the number of best unigrams)."""
    corpus, kw = fixture["corpus"], fixture["variants"][variant]["kwargs"]
    query_start = fixture.get("query_start")
    texts, table, counts = view if view is not None else corpus_view(corpus)
    positions, size = int(corpus["n_tokens"]), len(counts)
    given = {}
    for (g, lm), seal_count in zip(query["ngrams"], query["seal_counts"]):
        if query_start is not None and g and g[0] == query_start:
            lm = min(lm + MINDER_QUERY_BOOST, -1.0)
        given[tuple(g)] = (lm, seal_count)  # a repeated key: the last one's score
    keys, found = [], []
    for g, (lm, seal_count) in given.items():
        rows, starts = _occurrences(texts, g)
        w = weight(lm, seal_count, positions, kw["smoothing"], kw["alpha"])
        keys.append(Key(g, lm, len(rows), weight=w))
        found.append((rows, starts))
    types = None
    if fixture["variants"][variant]["unigram_scores"]:
        excluded = {0, 1, 2} | {k.tokens[0] for k in keys if len(k.tokens) == 1}
        ids = corpus.get("unigram_ids", range(len(query["unigram_scores"])))
        log_probs = np.full(size, -np.inf)
        log_probs[np.asarray(list(ids))] = query["unigram_scores"]
        types = type_scores(log_probs, counts, positions, excluded, kw["use_top_k_unigrams"], kw["smoothing"])
        if kw["add_best_unigrams_to_ngrams"]:
            for t in best_unigrams(types, len(query["ngrams"])):
                rows, starts = _occurrences(texts, (t,))
                keys.append(Key((t,), 0.0, len(rows), weight=float(types[t])))
                found.append((rows, starts))
    for i, k in enumerate(keys):  # keys more frequent than max_hits make no candidates (SEAL's "frequent")
        if k.count > kw["max_occurrences_1"]:
            found[i] = None
    options = dict(max_hits=kw["max_occurrences_1"], smoothing=kw["smoothing"], exponent=kw["alpha"], beta=kw["beta"],
                   fully_score=kw["n_docs_complete_score"])
    if scorer is not None:  # a DeviceScorer over the view's table
        return scorer.rank([(keys, found, types)], positions, **options)[0]
    return rank_documents(keys, found, lambda rows: table[rows], positions, types=types, **options)


def _same_order_up_to_ties(ours: list, theirs: list, rel: float) -> bool:
    """Both lists' documents in the same order, where a run of equal scores (within rel) may be in any order."""
    if sorted(d for d, _ in ours) != sorted(d for d, _ in theirs):
        return False
    i = 0
    while i < len(theirs):
        j = i
        while j + 1 < len(theirs) and abs(theirs[j + 1][1] - theirs[i][1]) <= rel * max(abs(theirs[i][1]), 1e-12):
            j += 1
        if {d for d, _ in ours[i:j + 1]} != {d for d, _ in theirs[i:j + 1]}:
            return False
        i = j + 1
    return True


def check_scoring(fixture: dict, rel: float = 1e-9, variants=VARIANTS, device: bool = False) -> dict:
    """Our scoring against SEAL's recorded rankings, per variant; `device`: by `DeviceScorer` (float32: compare with
    `rel` 1e-5) instead of the host scorer."""
    out, view = {}, corpus_view(fixture["corpus"])
    scorer = DeviceScorer(np.arange(len(view[1])), view[1]) if device else None
    for variant in variants:
        worst, docs, ordered, only_seal, only_ours, queries = 0.0, 0, 0, 0, 0, 0
        for q in fixture["queries"]:
            theirs = [(int(d), float(s)) for d, s in q["outputs"][variant]["ranking"] if s > 0]
            ours = rank_like_seal(fixture, q, variant, view, scorer)
            ours_by_doc = dict(ours)
            common = [(d, s) for d, s in theirs if d in ours_by_doc]
            only_seal += len(theirs) - len(common)
            only_ours += len(set(ours_by_doc) - {d for d, _ in theirs})
            for d, s in common:
                worst = max(worst, abs(ours_by_doc[d] - s) / max(abs(s), 1e-12))
            docs += len(common)
            queries += 1
            keep = {d for d, _ in common}
            ordered += _same_order_up_to_ties([x for x in ours if x[0] in keep], common, rel)
        out[variant] = {"queries": queries, "documents_compared": docs, "max_rel_diff_score": worst,
                        "queries_in_seal_order": ordered, "seal_only_documents": only_seal,
                        "our_only_documents": only_ours}
    return out


def _read(folder, names) -> list[dict]:
    folder = Path(folder)
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise ValueError(f"{folder}: no {', '.join(missing)}; not a SEAL parity fixture folder "
                         f"(tools/seal_fm_fixtures.py, tools/seal_scoring_fixtures.py write them)")
    return [read_json(folder / n, "SEAL parity fixture") for n in names]


def check_fixture(folder) -> dict:
    """The figures of both comparisons (module docstring)."""
    fm, scoring = _read(folder, ("fm_index.json", "scoring.json"))
    return {"fixture": str(folder), "seal_commit": fm["seal"].get("commit"), "index": check_index(fm),
            "scoring": check_scoring(scoring)}


def check_minder_fixture(folder) -> dict:
    """MINDER's scoring (its keys.py: SEAL's with the pseudo-query view's boost) on minder_scoring.json."""
    fm, minder = _read(folder, ("fm_index.json", "minder_scoring.json"))
    return {"fixture": str(folder), "minder_commit": minder["keys_from"].get("commit"), "index": check_index(fm),
            "scoring": check_scoring(minder, variants=MINDER_VARIANTS)}


def check_index(fm: dict) -> dict:
    eos = fm["layout"]["eos"]
    docs = [d + [eos] for d in fm["corpus"]]
    index = SubstringIndex.build(docs, vocab_size=max(max(d) for d in docs) + 1)
    equal = crossing = differ = 0
    for q in fm["queries"]:
        g = q["ngram"]
        if not g:
            continue
        want = q.get("seal_quirk", q)
        count = index.count(g)
        if eos in g[:-1]:
            crossing += 1
            differ += count != 0
            continue
        if count == want["count"]:
            equal += 1
        else:
            differ += 1
    return {"ngrams_equal": equal, "ngrams_across_documents": crossing, "ngrams_differing": differ}


def within(result: dict, tolerance: float = 1e-4) -> bool:
    """Every compared document within tolerance of SEAL's score, the order SEAL's on its own settings, the index
    equal on every n-gram."""
    s = result["scoring"]
    ok = result["index"]["ngrams_differing"] == 0
    for variant, r in s.items():
        ok &= r["max_rel_diff_score"] <= tolerance and math.isfinite(r["max_rel_diff_score"])
        if variant != "small_cutoffs":  # there the first pass may pick other documents (module docstring)
            ok &= r["queries_in_seal_order"] == r["queries"] and r["our_only_documents"] == 0
    return ok


# `tools/check_parity.py --method NAME`: the family's methods and their checks. LTRGR retrieves with MINDER's code
# (its training script's rank loss is written inline in the script's loop, with no function to run on a fixture:
# tests/methods/seal/test_training_ltrgr.py checks ours against that formula by hand), so its check is MINDER's.
CHECKS = {"seal": check_fixture, "minder": check_minder_fixture, "ltrgr": check_minder_fixture}
