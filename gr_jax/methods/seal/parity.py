"""SEAL against its authors' code: the substring index against SEAL's FM-index, and the document scoring against
SEAL's `aggregate_evidence`, on the answers SEAL's own code wrote (`tools/check_parity.py --method seal
--fixture tests/fixtures/seal_parity/<shape>`; a shape's folder holds fm_index.json from tools/seal_fm_fixtures.py and
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
scores only because of such a key are counted apart (`seal_only_documents`), not compared; one that holds a key
SEAL weighed (of two tokens or more) fails the check (`seal_only_documents_holding_a_key`).
Variants compared: SEAL's NQ defaults, without unigram scores, and with small cut-offs (max_hits 10,
fully_score 20, top-k unigrams 50: the first pass decides which documents are scored, where the first-pass
deviation in `ranker` shows as documents in one ranking only; their count is reported).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from gr_jax.methods.api import SubstringIndex, chosen, read_json
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
    repeats included (the last one that weighs anything counts; every repeat counts towards the number of best
    unigrams)."""
    corpus, kw = fixture["corpus"], fixture["variants"][variant]["kwargs"]
    query_start = fixture.get("query_start")
    texts, table, counts = view if view is not None else corpus_view(corpus)
    positions, size = int(corpus["n_tokens"]), len(counts)
    given = {}
    for (g, lm), seal_count in zip(query["ngrams"], query["seal_counts"]):
        if query_start is not None and g and g[0] == query_start:
            lm = min(lm + MINDER_QUERY_BOOST, -1.0)
        if tuple(g) not in given or weight(lm, seal_count, positions, kw["smoothing"], kw["alpha"]) > 0:
            given[tuple(g)] = (lm, seal_count)  # a repeated key: the last one that weighs anything (MINDER's keys.py
            # skips a zero weight before it stores the key's weight)
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
    view = corpus_view(fixture["corpus"])
    scorer = DeviceScorer(np.arange(len(view[1])), view[1]) if device else None
    return _check_queries(fixture, fixture["queries"], variants, view, scorer, rel)


def _weighing_keys(query: dict, variant: str) -> list[tuple]:
    """The keys of two tokens or more SEAL weighed above zero for the query under the variant (its own record,
    `all_ngrams`). One-token entries are left out: the record lists SEAL's best unigrams too, which nearly every
    document holds, and a single token cannot span a document boundary, the one way SEAL alone meets a document."""
    if "all_ngrams" not in query["outputs"][variant]:
        raise ValueError("a SEAL scoring fixture without `all_ngrams` (written with --no_all_ngrams): the check of "
                         "the documents only SEAL scored needs SEAL's record of its keys' weights")
    return [tuple(g) for g, sc in query["outputs"][variant]["all_ngrams"] if sc > 0 and len(g) > 1]


def _check_queries(fixture: dict, queries: list, variants, view, scorer=None, rel: float = 1e-9) -> dict:
    out = {}
    for variant in variants:
        worst, docs, ordered, only_seal, only_ours, queries_seen, unexplained = 0.0, 0, 0, 0, 0, 0, 0
        for q in queries:
            theirs = [(int(d), float(s)) for d, s in q["outputs"][variant]["ranking"] if s > 0]
            ours = rank_like_seal(fixture, q, variant, view, scorer)
            ours_by_doc = dict(ours)
            common = [(d, s) for d, s in theirs if d in ours_by_doc]
            only_seal += len(theirs) - len(common)
            # a document SEAL scored and ours did not is explained only when no key that weighs anything occurs in
            # its text (SEAL met it through a key across a document boundary of its index text); with small cut-offs
            # the first pass picks the documents (module docstring)
            if variant != "small_cutoffs":
                keys = _weighing_keys(q, variant)
                unexplained += sum(any(len(occurrences(view[0][d], g)) for g in keys)
                                   for d, _ in theirs if d not in ours_by_doc)
            only_ours += len(set(ours_by_doc) - {d for d, _ in theirs})
            for d, s in common:
                worst = max(worst, abs(ours_by_doc[d] - s) / max(abs(s), 1e-12))
            docs += len(common)
            queries_seen += 1
            keep = {d for d, _ in common}
            ordered += _same_order_up_to_ties([x for x in ours if x[0] in keep], common, rel)
        out[variant] = {"queries": queries_seen, "documents_compared": docs, "max_rel_diff_score": worst,
                        "queries_in_seal_order": ordered, "seal_only_documents": only_seal,
                        "seal_only_documents_holding_a_key": unexplained,
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


def within(result: dict, tolerance: float = 1e-9) -> bool:
    """Every compared document within tolerance of SEAL's score (relative; 1e-9: our host scoring sums the same
    float64 terms as SEAL's and agrees to ~1e-15, while a key's weight changed under another key's cover moves a
    score by ~1e-5 of it), the order SEAL's on its own settings, the index
    equal on every n-gram."""
    s = result["scoring"]
    ok = result["index"]["ngrams_differing"] == 0
    for variant, r in s.items():
        ok &= r["max_rel_diff_score"] <= tolerance and math.isfinite(r["max_rel_diff_score"])
        ok &= r.get("seal_only_documents_holding_a_key", 0) == 0
        if variant != "small_cutoffs":  # there the first pass may pick other documents (module docstring)
            ok &= r["queries_in_seal_order"] == r["queries"] and r["our_only_documents"] == 0
    return ok


# `tools/check_parity.py --method NAME`: the family's methods and their checks. LTRGR retrieves with MINDER's code
# (its training script's rank loss is written inline in the script's loop, with no function to run on a fixture:
# tests/methods/seal/test_training_ltrgr.py checks ours against that formula by hand), so its check is MINDER's.
CHECKS = {"seal": check_fixture, "minder": check_minder_fixture, "ltrgr": check_minder_fixture}


def _swap_first_differing(values: list) -> list | None:
    """A copy with entry 0 swapped with the first entry that differs from it (None: all equal)."""
    j = next((i for i, v in enumerate(values) if v != values[0]), None)
    if j is None:
        return None
    out = list(values)
    out[0], out[j] = out[j], out[0]
    return out


def _swap_in_queried(fm: dict, d: int) -> list | None:
    """Document d with two tokens swapped, one of them inside an occurrence of a queried n-gram (one that does not
    cross a document end), such that the n-gram's number of occurrences in the document changes; None when no
    queried n-gram occurs in it."""
    doc, eos = fm["corpus"][d], fm["layout"]["eos"]
    for q in fm["queries"]:
        g = tuple(q["ngram"])
        if not g or eos in g[:-1]:
            continue
        here = occurrences(doc + [eos], g)
        for p in here:
            for a in range(int(p), min(int(p) + len(g), len(doc))):
                for b in range(len(doc)):
                    if doc[b] == doc[a]:
                        continue
                    out = list(doc)
                    out[a], out[b] = out[b], out[a]
                    if len(occurrences(out + [eos], g)) != len(here):
                        return out
    return None


def _mutated_query(query: dict, what: str, counts=(), unigram_ids=()) -> dict | None:
    q = dict(query)
    if what == "ngram_scores":  # the score of the key SEAL weighed highest (its own record, `all_ngrams`) lowered
        # to 2·score − 16: below MINDER's cap point (a view key's log P + 14 is capped at −1), so the key's weight moves
        # in SEAL's scoring and MINDER's. A swap of two keys' scores can change nothing they compute (two keys of one
        # document with equal counts trade weights; the cap). Left out: repeated keys (which repeat counts is their
        # own test's) and keys the fixture made across a document boundary (no document text holds them)
        keys, kinds = query["ngrams"], query.get("kinds", [""] * len(query["ngrams"]))
        seal_weight = {tuple(g): sc for g, sc in query["outputs"]["nq_defaults"].get("all_ngrams", [])}
        seen = [tuple(g) for g, _ in keys]
        weighed = [i for i, g in enumerate(seen) if seen.count(g) == 1 and seal_weight.get(g, 0.0) > 0
                   and kinds[i] != "cross_boundary"]
        ngrams = [list(k) for k in keys]
        if weighed:
            i = min(weighed, key=lambda i: (-seal_weight[seen[i]], i))
            ngrams[i][1] = 2.0 * keys[i][1] - 16.0
        else:  # SEAL weighed no key (the unigrams ranked alone): the first key SEAL counted given log P = −0.001
            i = next((i for i, g in enumerate(seen) if seen.count(g) == 1 and query["seal_counts"][i] > 0
                      and kinds[i] != "cross_boundary"), None)
            if i is None:
                return None
            ngrams[i][1] = -1e-3
        q["ngrams"] = ngrams
    else:  # the query's best and worst unigram log-probabilities exchanged, among the tokens SEAL gives a unigram
        # score (in the corpus; not 0, 1, 2 and not a one-token key)
        u = np.asarray(query["unigram_scores"], np.float64)
        ids = np.asarray(list(unigram_ids), np.int64)
        keyed = {g[0] for g, _ in query["ngrams"] if len(g) == 1} | {0, 1, 2}
        ok = np.array([int(t) not in keyed and int(t) < len(counts) and counts[int(t)] > 0 for t in ids])
        if ok.sum() < 2:
            return None
        cand = np.flatnonzero(ok)
        hi, lo = int(cand[np.argmax(u[cand])]), int(cand[np.argmin(u[cand])])
        u[[hi, lo]] = u[[lo, hi]]
        q["unigram_scores"] = u.tolist()
    return q


def mutations(folder, tolerance: float = 1e-9, names=None, sample: int = 0, seed: int = 0) -> dict:
    """{mutation: whether the check caught it}. SEAL's fixtures hold no weights: what the check feeds ours is the
    corpus and, per query, the keys' scores and the unigram scores. Mutations: two tokens of one document of the
    FM-index corpus swapped (`fm_index.docs[d]`; where a swap can change a queried n-gram's occurrences in the
    document, such a swap); per query of each scoring file, the score of the key SEAL weighed highest lowered to
    2·score − 16, or where SEAL weighed none, the first key it counted given log P −0.001
    (`<file>.queries[q].ngram_scores`, see `_mutated_query`), and the best and worst unigram log-probabilities among
    the tokens that get one exchanged (`<file>.queries[q].unigram_scores`): that query's comparison alone must fail.
    A query with no key SEAL weighed, or fewer than two tokens with a unigram score, counts as missed. `sample`:
    that many of the sorted names, drawn with `seed`."""
    folder = Path(folder)
    files = {"scoring": "scoring.json", "minder_scoring": "minder_scoring.json"}
    fm = _read(folder, ("fm_index.json",))[0]
    scorings = {k: _read(folder, (f,))[0] for k, f in files.items() if (folder / f).is_file()}
    cases = {f"fm_index.docs[{d}]": ("fm", d, None) for d in range(len(fm["corpus"]))}
    for key, fixture in scorings.items():
        for qi in range(len(fixture["queries"])):
            for what in ("ngram_scores", "unigram_scores"):
                cases[f"{key}.queries[{qi}].{what}"] = (key, qi, what)
    views = {key: corpus_view(fx["corpus"]) for key, fx in scorings.items()}
    out = {}
    for name in chosen(cases if names is None else names, sample, seed):
        key, i, what = cases[name]
        if key == "fm":
            doc = _swap_in_queried(fm, i)
            if doc is None:  # no queried n-gram's occurrences change with a swap here: the plain swap
                doc = _swap_first_differing(fm["corpus"][i])
            if doc is None:
                out[name] = False
                continue
            corpus = list(fm["corpus"])
            corpus[i] = doc
            out[name] = check_index({**fm, "corpus": corpus})["ngrams_differing"] > 0
            continue
        fixture = scorings[key]
        query = _mutated_query(fixture["queries"][i], what, views[key][2], fixture["corpus"].get(
            "unigram_ids", range(len(fixture["queries"][i]["unigram_scores"]))))
        if query is None:
            out[name] = False
            continue
        variants = MINDER_VARIANTS if key == "minder_scoring" else VARIANTS
        if what == "unigram_scores":
            variants = tuple(v for v in variants if v != "no_unigram_scores")
        result = {"index": {"ngrams_differing": 0},
                  "scoring": _check_queries(fixture, [query], variants, views[key])}
        out[name] = not within(result, tolerance)
    return out
