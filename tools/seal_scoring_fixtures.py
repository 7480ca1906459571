"""Writes tests/fixtures/seal_parity/scoring.json: SEAL's own document scoring, run by SEAL's code, on a small token-id corpus.

What it calls (facebookresearch/SEAL, written against commit fdaf30795982958706882d790f81d2d3545d2406):
- `seal.index.FMIndex` (seal/index.py over the compiled seal/cpp_modules): `initialize(docs, in_memory=True)`
  over the corpus below, then `get_count` for every n-gram (the counts SEAL's scoring uses);
- `seal.keys.aggregate_evidence` (seal/keys.py), the function `SEALSearcher.retrieve_from_keys`
  (seal/retrieval.py) ranks documents with, called with the keyword arguments `retrieve_from_keys` passes,
  taken from `SEALSearcher.DEFAULTS` (the NQ search defaults) and from a few variants of them (VARIANTS).
Nothing of SEAL is copied here: the tool only builds inputs, calls SEAL, and writes what SEAL returns.

The corpus: 300 documents (seeded), each `title + [3] + body + [2]`: 3..60 content tokens drawn Zipf-like
(weight 1/rank**1.1) from ids 4..203, the first 1..3 of them the title; 2 is EOS (SEAL ends every passage with
EOS, and `aggregate_evidence` scores a document as `[2] + doc[:-1]`), 3 stands for BART's " @@" (49314), the
title delimiter of SEAL's corpora ("title @@ body"). The queries: 50, each 5..30 distinct n-grams with negative
LM scores (SEAL de-duplicates its keys before scoring): substrings of one target document's body (some
overlapping), of other documents, SEAL-style title keys `[2] + title + [3]`, frequent unigrams, n-grams that
cross a document boundary of the index text, and n-grams that occur nowhere; a few share a score. Each query
also has a log-softmax vector over the 204 ids (SEAL's `unigram_scores`, from `compute_unigram_scores`).

The JSON (schema 1): "seal" (commit if SEAL's checkout is a git work tree, import mode), "corpus" (docs, ids,
n_tokens = len(index)), "variants" (name -> the exact keyword arguments, and whether unigram scores are passed),
"queries": per query "ngrams" [[tokens, lm_score], ...], "kinds", "seal_counts" (SEAL's `get_count`),
"naive_counts" (occurrences in the text SEAL indexes: the documents concatenated last to first), and
"unigram_scores"; and "outputs": per variant either {"error": "..."} (SEAL raised) or
{"n_docs": how many documents SEAL scored fully, "ranking": [[doc, score], ...] (SEAL's order, all of them),
"top": the first --detail_docs (5) documents as {"doc", "score", "ngrams": [[tokens, score], ...] (the n-grams
SEAL counted for the document, in its order, unigram bonuses last), "best": [tokens, score]},
"all_ngrams": [[tokens, score], ...] (SEAL's per-n-gram scores, its order)}.

Run (SEAL installed as its README says: sdsl-lite, swig, `pip install -e .` in a SEAL checkout; plus torch,
tqdm and more_itertools, which seal/keys.py imports):

    PYTHONPATH=path/to/SEAL python tools/seal_scoring_fixtures.py [--out tests/fixtures/seal_parity/scoring.json] [--seed 0]

SEAL's package `__init__` also imports seal/retrieval.py and seal/beam_search.py, which need transformers 4.13
(`transformers.generation_utils`, gone from current transformers) — not fairseq. When `import seal` fails, the
tool loads `seal/index.py` and `seal/keys.py` by path from SEAL's `seal` directory (found on sys.path, or
--seal_dir) as submodules of an empty `seal` package, without running `seal/__init__.py`. Exit status 2 when
SEAL cannot be imported either way.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.machinery
import importlib.util
import json
import logging
import math
import random
import subprocess
import sys
import types
from itertools import accumulate
from pathlib import Path

log = logging.getLogger("seal_scoring_fixtures")

SCHEMA = 1
SEAL_COMMIT_WRITTEN_AGAINST = "fdaf30795982958706882d790f81d2d3545d2406"
VOCAB_SIZE = 204            # ids 0..203
EOS = 2                     # SEAL: BART's </s>; every document ends with it
TITLE_EOS = 3               # stands for BART's " @@" (49314), SEAL's title delimiter
CONTENT = list(range(4, VOCAB_SIZE))
N_DOCS = 300
N_QUERIES = 50

# SEALSearcher.DEFAULTS (seal/retrieval.py), mapped to aggregate_evidence's keywords exactly as
# SEALSearcher.retrieve_from_keys passes them (max_occurrences_2 and single_key_add_unigrams are not passed).
NQ_KWARGS = {
    "max_occurrences_1": 1500,            # max_hits
    "n_docs_complete_score": 1500,        # fully_score
    "alpha": 2.0,                         # score_exponent
    "beta": 0.8,                          # repetition_penalty
    "length_penalty": 0.0,                # scoring_length_penalty
    "use_fm_index_frequency": True,
    "add_best_unigrams_to_ngrams": True,
    "use_top_k_unigrams": 5000,           # use_top_k_ngrams
    "sort_by_length": False,
    "sort_by_freq": False,
    "smoothing": 5.0,
    "allow_overlaps": False,
    "single_key": 0.0,
    "unigrams_ignore_free_places": False,
}
# name -> (keyword overrides, whether unigram scores are passed; SEAL's default unigram_scores=True passes them)
VARIANTS = {
    "nq_defaults": ({}, True),
    "no_unigram_scores": ({}, False),
    "small_cutoffs": ({"max_occurrences_1": 10, "n_docs_complete_score": 20, "use_top_k_unigrams": 50}, True),
    "single_key": ({"single_key": 1.0}, True),
    "allow_overlaps": ({"allow_overlaps": True}, True),
    "no_fm_index_frequency": ({"use_fm_index_frequency": False}, False),
}


class SealImportError(RuntimeError):
    pass


def _drop_seal_modules():
    for name in [m for m in sys.modules if m == "seal" or m.startswith("seal.")]:
        del sys.modules[name]


def import_seal(seal_dir: str | None):
    """SEAL's FMIndex class and keys module, and how they were imported ("package" or "by_path")."""
    errors = []
    if seal_dir is None:
        try:
            import seal  # noqa: F401  (SEAL's own __init__: index, retrieval, beam_search)
            from seal import keys
            from seal.index import FMIndex
            return FMIndex, keys, "package", Path(keys.__file__).resolve().parent
        except Exception as exc:  # noqa: BLE001  (transformers API drift, missing extras, ...: try by path)
            errors.append(f"import seal: {type(exc).__name__}: {exc}")
            _drop_seal_modules()
        spec = importlib.util.find_spec("seal")  # a top-level spec: finds the package without running it
        if spec is None or not spec.submodule_search_locations:
            raise SealImportError("; ".join(
                errors + ["no package `seal` on sys.path (put SEAL's checkout on PYTHONPATH)"]))
        locations = list(spec.submodule_search_locations)
    else:
        locations = [str(Path(seal_dir).resolve())]
    if not any((Path(p) / "keys.py").is_file() and (Path(p) / "index.py").is_file() for p in locations):
        raise SealImportError("; ".join(errors + [f"no seal/keys.py and seal/index.py in {locations}"]))
    pkg = types.ModuleType("seal")
    pkg.__path__ = locations
    pkg.__spec__ = importlib.machinery.ModuleSpec("seal", None, is_package=True)
    pkg.__spec__.submodule_search_locations = locations
    sys.modules["seal"] = pkg
    try:
        index_mod = importlib.import_module("seal.index")       # needs the compiled seal/cpp_modules/_fm_index
        pkg.FMIndex = index_mod.FMIndex                          # seal/keys.py does `from seal import FMIndex`
        keys = importlib.import_module("seal.keys")              # needs torch, tqdm, more_itertools
    except Exception as exc:
        _drop_seal_modules()
        raise SealImportError("; ".join(errors + [f"by path from {locations}: {type(exc).__name__}: {exc}"])) from exc
    return index_mod.FMIndex, keys, "by_path", Path(keys.__file__).resolve().parent


def seal_commit(package_dir: Path) -> str | None:
    """HEAD of SEAL's checkout when the `seal` directory sits at the top of a git work tree."""
    try:
        out = subprocess.run(["git", "-C", str(package_dir), "rev-parse", "--show-toplevel", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != package_dir.parent:
        return None
    return lines[1]


def make_corpus(rng: random.Random):
    cum = list(accumulate(1.0 / (r + 1) ** 1.1 for r in range(len(CONTENT))))
    docs, titles = [], []
    for _ in range(N_DOCS):
        n = rng.randint(3, 60)
        content = rng.choices(CONTENT, cum_weights=cum, k=n)
        t = rng.randint(1, min(3, n - 1))
        titles.append(content[:t])
        docs.append(content[:t] + [TITLE_EOS] + content[t:] + [EOS])
    return docs, titles


def naive_count(text: list[int], ngram: list[int]) -> int:
    n = len(ngram)
    return sum(1 for i in range(len(text) - n + 1) if text[i:i + n] == ngram)


def log_softmax(logits):
    top = max(logits)
    lse = top + math.log(math.fsum(math.exp(x - top) for x in logits))
    return [x - lse for x in logits]


def make_query(rng: random.Random, docs, titles, text, occurring):
    """5..30 distinct n-grams with LM scores, and their kinds."""
    target = rng.randrange(len(docs))
    body = docs[target][len(titles[target]) + 1:-1] or docs[target][:-1]
    m = rng.randint(5, 30)
    picked: dict[tuple, str] = {}

    def add(gram, kind):
        gram = tuple(gram)
        if gram and gram not in picked:
            picked[gram] = kind

    # overlapping substrings of the target's body
    start = rng.randrange(len(body))
    for _ in range(rng.randint(2, 6)):
        n = rng.randint(1, 6)
        add(body[start:start + n], "target_body")
        start = min(len(body) - 1, max(0, start + rng.randint(-2, 3)))
    if rng.random() < 0.7:
        add([EOS] + titles[target] + [TITLE_EOS], "target_title")
    attempts = 0
    while len(picked) < m and attempts < 1000:
        attempts += 1
        r = rng.random()
        if r < 0.35:
            d = docs[rng.randrange(len(docs))][:-1]
            n = rng.randint(1, 5)
            s = rng.randrange(max(1, len(d) - n + 1))
            add(d[s:s + n], "other_doc")
        elif r < 0.5:
            s = rng.randrange(len(body))
            add(body[s:s + rng.randint(2, 8)], "target_body")
        elif r < 0.6:
            # the last document starts the index text: no EOS precedes its title there, so its title key is absent
            d = len(docs) - 1 if rng.random() < 0.2 else rng.randrange(len(docs))
            add([EOS] + titles[d] + [TITLE_EOS], "title")
        elif r < 0.7:
            add([rng.choice(CONTENT[:12])], "frequent_unigram")
        elif r < 0.8:
            # across a boundary of the index text (documents last to first: doc d is followed by doc d-1)
            d = rng.randrange(1, len(docs))
            k = rng.randint(1, 2)
            add(docs[d][-k:] + docs[d - 1][:rng.randint(1, 3)], "cross_boundary")
        else:
            while True:
                gram = tuple(rng.choice(CONTENT) for _ in range(rng.randint(2, 5)))
                if gram not in occurring and naive_count(text, list(gram)) == 0:
                    break
            add(gram, "absent")
    grams = list(picked.items())
    rng.shuffle(grams)
    scores = []
    for i in range(len(grams)):
        if i and rng.random() < 0.1:
            scores.append(scores[-1])                      # a tie
        elif rng.random() < 0.1:
            scores.append(-round(rng.uniform(1e-4, 0.05), 6))  # near-certain n-grams
        else:
            scores.append(-round(rng.uniform(0.05, 15.0), 6))
    unigram_scores = [round(x, 6) for x in log_softmax([rng.gauss(0.0, 2.0) for _ in range(VOCAB_SIZE)])]
    return {
        "target_doc": target,
        "ngrams": [[list(g), s] for (g, _), s in zip(grams, scores)],
        "kinds": [k for _, k in grams],
        "unigram_scores": unigram_scores,
    }


def _tokens(ngram):
    return [int(t) for t in ngram]


def run_variant(keys, index, query, kwargs, with_unigrams, detail_docs):
    ngrams_and_scores = [(list(g), float(s)) for g, s in query["ngrams"]]
    unigram_scores = list(query["unigram_scores"]) if with_unigrams else None
    try:
        results, all_ngrams = keys.aggregate_evidence(
            ngrams_and_scores=ngrams_and_scores, unigram_scores=unigram_scores, index=index, **copy.deepcopy(kwargs))
    except Exception as exc:  # noqa: BLE001  (SEAL's own failure is part of what it does: recorded)
        log.warning("SEAL raised on a query: %s: %s", type(exc).__name__, exc)
        return {"error": f"{type(exc).__name__}: {exc}"}
    ranking, top = [], []
    for rank, (doc, value) in enumerate(results.items()):
        score, doc_ngrams, _, _, best = value
        ranking.append([int(doc), float(score)])
        if rank < detail_docs:
            top.append({"doc": int(doc), "score": float(score),
                        "ngrams": [[_tokens(n), float(s)] for n, s in doc_ngrams],
                        "best": [_tokens(best[0]), float(best[1])]})
    return {"n_docs": len(ranking), "ranking": ranking, "top": top,
            "all_ngrams": [[_tokens(n), float(s)] for n, s in all_ngrams.items()]}


def build(FMIndex, keys, seed: int, detail_docs: int):
    rng = random.Random(seed)
    docs, titles = make_corpus(rng)
    index = FMIndex()
    index.initialize(docs, in_memory=True)
    index.labels = [str(i) for i in range(len(docs))]
    text = [t for d in reversed(docs) for t in d]        # the text SEAL's index holds, read forward
    occurring = {tuple(text[i:i + n]) for n in range(2, 6) for i in range(len(text) - n + 1)}
    queries = []
    for q in range(N_QUERIES):
        query = make_query(rng, docs, titles, text, occurring)
        query["seal_counts"] = [int(index.get_count(list(g))) for g, _ in query["ngrams"]]
        query["naive_counts"] = [naive_count(text, list(g)) for g, _ in query["ngrams"]]
        query["outputs"] = {}
        for name, (overrides, with_unigrams) in VARIANTS.items():
            query["outputs"][name] = run_variant(keys, index, query, {**NQ_KWARGS, **overrides}, with_unigrams,
                                                 detail_docs)
        queries.append(query)
        log.info("query %d/%d: %d n-grams", q + 1, N_QUERIES, len(query["ngrams"]))
    return {
        "corpus": {"vocab_size": VOCAB_SIZE, "eos": EOS, "title_eos": TITLE_EOS, "n_docs": len(docs),
                   "n_tokens": len(index), "docs": docs, "titles": titles,
                   "index_text": "SEAL's FMIndex.initialize stores each document reversed, concatenated in order, so "
                                 "the indexed text read forward is the documents last to first; locate() gives "
                                 "positions in the reversed concatenation"},
        "variants": {name: {"kwargs": {**NQ_KWARGS, **overrides}, "unigram_scores": with_unigrams}
                     for name, (overrides, with_unigrams) in VARIANTS.items()},
        "queries": queries,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="tests/fixtures/seal_parity/scoring.json", help="the JSON to write")
    parser.add_argument("--seed", type=int, default=0, help="seeds the corpus, the queries and their scores")
    parser.add_argument("--seal_dir", default=None,
                        help="SEAL's `seal` package directory, loaded by path (default: `seal` on sys.path)")
    parser.add_argument("--detail_docs", type=int, default=5,
                        help="per query and variant, how many top documents keep their n-gram lists")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        FMIndex, keys, mode, package_dir = import_seal(args.seal_dir)
    except SealImportError as exc:
        log.error("cannot import SEAL (facebookresearch/SEAL, built as its README says, on PYTHONPATH; "
                  "or --seal_dir): %s", exc)
        return 2
    commit = seal_commit(package_dir)
    log.info("SEAL imported (%s), commit %s", mode, commit or "unknown")
    fixture = {"schema": SCHEMA, "generator": "tools/seal_scoring_fixtures.py", "seed": args.seed,
               "seal": {"repo": "facebookresearch/SEAL", "commit": commit,
                        "written_against": SEAL_COMMIT_WRITTEN_AGAINST, "import_mode": mode,
                        "function": "seal.keys.aggregate_evidence", "index": "seal.index.FMIndex"},
               **build(FMIndex, keys, args.seed, args.detail_docs)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(fixture, separators=(",", ":")) + "\n", encoding="utf-8")
    log.info("wrote %s (%d bytes)", out, out.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
