"""Writes tests/fixtures/seal_parity/<shape>/scoring.json: SEAL's own document scoring, run by SEAL's code, on a small token-id corpus.

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

    PYTHONPATH=path/to/SEAL python tools/seal_scoring_fixtures.py [--out tests/fixtures/seal_parity/d300_v204/scoring.json] [--seed 0] [--vocab_size 204 --n_docs 300 --max_len 60]

SEAL's package `__init__` also imports seal/retrieval.py and seal/beam_search.py, which need transformers 4.13
(`transformers.generation_utils`, gone from current transformers) — not fairseq. When `import seal` fails, the
tool loads `seal/index.py` and `seal/keys.py` by path from SEAL's `seal` directory (found on sys.path, or
--seal_dir) as submodules of an empty `seal` package, without running `seal/__init__.py`. Exit status 2 when
SEAL cannot be imported either way.

Another package's keys.py (MINDER, liyongqi67/MINDER, ships a modified copy of SEAL's `seal` package whose
`aggregate_evidence` adds 14 to the LM score of keys starting with " ||" (45056), capped at -1.0):
--keys_from DIR loads `DIR/keys.py` (and `DIR/index.py` if DIR has one) as `seal.keys` (`seal.index`), always by
path; the compiled `seal.cpp_modules` still comes from SEAL's package (sys.path or --seal_dir), imported first.
--keys_repo/--keys_commit only label the header ("keys_from"), which also records the files' git blob ids.
--query_start TOKEN (MINDER: 45056) makes the corpus MINDER-like and adds query-view keys: about 60% of the
documents get 1..3 pseudo-query segments `[TOKEN] + q + [3]` after the body (MINDER's identifier layout
"title @@ body || q1 @@ || q2 @@", " @@" = 3 here), each q 2..8 tokens, mostly from the document's own content; each
query gets 1..4 keys `[TOKEN] + q + [3]` (a segment of the target document, of another document, a truncated
segment, or random tokens) with LM scores in [-40, -0.5] (above and below MINDER's -15 cap point), before the
other kinds; n-grams of other documents may also start with TOKEN. The unigram scores then cover ids 0..203 and
TOKEN: per query a log-softmax over those 205 ids, stored aligned with corpus["unigram_ids"] (corpus also gets
"query_start", "pseudo_queries", "layout", "unigram_length", "unigram_layout"); the scoring
function gets a list of length TOKEN + 1 with -inf at every other id (it indexes unigram scores by token id,
TOKEN included, since documents contain it). Per query, "query_view" flags the keys starting with TOKEN.
--duplicate_keys P: with probability P a query repeats 1..3 of its keys (same or new score, at a random place;
kind "duplicate"), as MINDER's retrieval, which drops SEAL's `deduplicate`, may pass them. --variants picks
variants, --n_queries the number of queries, --no_all_ngrams drops "all_ngrams". MINDER's fixture:

    PYTHONPATH=path/to/SEAL python tools/seal_scoring_fixtures.py --keys_from path/to/MINDER/seal \
        --keys_repo liyongqi67/MINDER --keys_commit COMMIT --query_start 45056 --duplicate_keys 0.3 \
        --variants nq_defaults,no_unigram_scores --out tests/fixtures/seal_parity/d300_v204/minder_scoring.json

(MINDER's seal/cpp_modules sources are SEAL's; a checkout's `seal` directory works as DIR without building it.)
"""

from __future__ import annotations

import argparse
import copy
import hashlib
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


from gr_jax.runtime import cli  # the argument validators every tool uses
from gr_jax.runtime.io_utils import write_text


def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a probability in [0, 1]")
    return value
log = logging.getLogger("seal_scoring_fixtures")

SCHEMA = 1
SEAL_COMMIT_WRITTEN_AGAINST = "fdaf30795982958706882d790f81d2d3545d2406"
VOCAB_SIZE = 204            # ids 0..203
EOS = 2                     # SEAL: BART's </s>; every document ends with it
TITLE_EOS = 3               # stands for BART's " @@" (49314), SEAL's title delimiter
CONTENT = list(range(4, VOCAB_SIZE))
N_DOCS = 300
N_QUERIES = 50
MAX_LEN = 60                 # content tokens of a document at most (flags --vocab_size, --n_docs, --max_len)


def set_shape(vocab_size: int, n_docs: int, max_len: int) -> None:
    """The corpus's shape (module defaults: the stored fixture's). The ids 0..3 stay special."""
    global VOCAB_SIZE, CONTENT, N_DOCS, MAX_LEN
    if vocab_size < 16 or max_len < 4:
        raise ValueError("--vocab_size ≥ 16 (ids 0..3 are special, the frequent unigrams are ids 4..15), "
                         "--max_len ≥ 4")
    VOCAB_SIZE, N_DOCS, MAX_LEN = vocab_size, n_docs, max_len
    CONTENT = list(range(4, VOCAB_SIZE))

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


def import_seal(seal_dir: str | None, keys_from: str | None = None):
    """SEAL's FMIndex class and keys module, and how they were imported ("package", "by_path", "keys_from")."""
    errors = []
    if seal_dir is None and keys_from is None:
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
    elif seal_dir is None:
        spec = importlib.util.find_spec("seal")
        if spec is None or not spec.submodule_search_locations:
            raise SealImportError("no package `seal` on sys.path for the compiled seal.cpp_modules (or --seal_dir)")
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
        if keys_from is not None:
            keys_dir = Path(keys_from).resolve()
            if not (keys_dir / "keys.py").is_file():
                raise FileNotFoundError(f"no keys.py in {keys_dir}")
            importlib.import_module("seal.cpp_modules.fm_index")  # SEAL's compiled module, before DIR is searched
            pkg.__path__ = [str(keys_dir)] + locations            # keys.py (and index.py, if there) from DIR
            pkg.__spec__.submodule_search_locations = pkg.__path__
        index_mod = importlib.import_module("seal.index")       # needs the compiled seal/cpp_modules/_fm_index
        pkg.FMIndex = index_mod.FMIndex                          # seal/keys.py does `from seal import FMIndex`
        keys = importlib.import_module("seal.keys")              # needs torch, tqdm, more_itertools
    except Exception as exc:
        _drop_seal_modules()
        raise SealImportError("; ".join(errors + [f"by path from {locations}: {type(exc).__name__}: {exc}"])) from exc
    mode = "by_path" if keys_from is None else "keys_from"
    return index_mod.FMIndex, keys, mode, Path(keys.__file__).resolve().parent


def git_blob_id(path: Path) -> str:
    """`git hash-object` of a file: compares it with a repository's blob without git."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


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


def make_corpus(rng: random.Random, query_start: int | None = None):
    cum = list(accumulate(1.0 / (r + 1) ** 1.1 for r in range(len(CONTENT))))
    docs, titles, bodies, pseudo = [], [], [], []
    for _ in range(N_DOCS):
        n = rng.randint(3, MAX_LEN)
        content = rng.choices(CONTENT, cum_weights=cum, k=n)
        t = rng.randint(1, min(3, n - 1))
        titles.append(content[:t])
        bodies.append(content[t:])
        queries = []
        if query_start is not None and rng.random() < 0.6:   # MINDER: "title @@ body || q1 @@ || q2 @@"
            for _ in range(rng.randint(1, 3)):
                queries.append([rng.choice(content) if rng.random() < 0.6 else rng.choices(CONTENT, cum_weights=cum)[0]
                                for _ in range(rng.randint(2, 8))])
        pseudo.append(queries)
        segments = [tok for q in queries for tok in [query_start, *q, TITLE_EOS]]
        docs.append(content[:t] + [TITLE_EOS] + content[t:] + segments + [EOS])
    return docs, titles, bodies, pseudo


def naive_count(text: list[int], ngram: list[int]) -> int:
    n = len(ngram)
    return sum(1 for i in range(len(text) - n + 1) if text[i:i + n] == ngram)


def log_softmax(logits):
    top = max(logits)
    lse = top + math.log(math.fsum(math.exp(x - top) for x in logits))
    return [x - lse for x in logits]


def make_query(rng: random.Random, docs, titles, text, occurring, bodies, pseudo, query_start=None,
               duplicate_keys=0.0):
    """5..30 distinct n-grams with LM scores, and their kinds (plus repeated keys with --duplicate_keys)."""
    target = rng.randrange(len(docs))
    body = bodies[target] or docs[target][:-1]
    m = rng.randint(5, 30)
    picked: dict[tuple, str] = {}

    def add(gram, kind):
        gram = tuple(gram)
        if gram and gram not in picked:
            picked[gram] = kind

    if query_start is not None:
        # MINDER's query view: keys [query_start] + q + [" @@"], first (its query keys are appended to the others)
        with_queries = [d for d in range(len(docs)) if pseudo[d]]
        for _ in range(rng.randint(1, 4)):
            r = rng.random()
            if r < 0.4 and pseudo[target]:
                add([query_start, *rng.choice(pseudo[target]), TITLE_EOS], "target_query")
            elif r < 0.6:
                add([query_start, *rng.choice(pseudo[rng.choice(with_queries)]), TITLE_EOS], "query")
            elif r < 0.75:
                q = rng.choice(pseudo[rng.choice(with_queries)])
                add([query_start, *q[:rng.randint(1, len(q) - 1)], TITLE_EOS], "query_truncated")
            else:
                while True:
                    gram = [query_start, *(rng.choice(CONTENT) for _ in range(rng.randint(2, 6))), TITLE_EOS]
                    if naive_count(text, gram) == 0:
                        break
                add(gram, "query_absent")

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

    def new_score(gram):
        if query_start is not None and gram[0] == query_start:
            return -round(rng.uniform(0.5, 40.0), 6)       # query-view keys: MINDER caps sr + 14 at -1.0
        if rng.random() < 0.1:
            return -round(rng.uniform(1e-4, 0.05), 6)      # near-certain n-grams
        return -round(rng.uniform(0.05, 15.0), 6)

    scores = []
    for i in range(len(grams)):
        if i and rng.random() < 0.1:
            scores.append(scores[-1])                      # a tie
        else:
            scores.append(new_score(grams[i][0]))
    ngrams = [[list(g), s] for (g, _), s in zip(grams, scores)]
    kinds = [k for _, k in grams]
    if duplicate_keys > 0 and rng.random() < duplicate_keys:
        for _ in range(rng.randint(1, 3)):
            g, s = ngrams[rng.randrange(len(ngrams))]
            dup = [list(g), s if rng.random() < 0.5 else new_score(g)]
            at = rng.randint(0, len(ngrams))
            ngrams.insert(at, dup)
            kinds.insert(at, "duplicate")
    n_ids = VOCAB_SIZE + (query_start is not None)
    unigram_scores = [round(x, 6) for x in log_softmax([rng.gauss(0.0, 2.0) for _ in range(n_ids)])]
    return {
        "target_doc": target,
        "ngrams": ngrams,
        "kinds": kinds,
        "unigram_scores": unigram_scores,
    }


def _tokens(ngram):
    return [int(t) for t in ngram]


def run_variant(keys, index, query, kwargs, with_unigrams, detail_docs, unigram_vector=None, keep_all_ngrams=True):
    ngrams_and_scores = [(list(g), float(s)) for g, s in query["ngrams"]]
    if not with_unigrams:
        unigram_scores = None
    elif unigram_vector is not None:
        unigram_scores = list(unigram_vector)
    else:
        unigram_scores = list(query["unigram_scores"])
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
    out = {"n_docs": len(ranking), "ranking": ranking, "top": top}
    if keep_all_ngrams:
        out["all_ngrams"] = [[_tokens(n), float(s)] for n, s in all_ngrams.items()]
    return out


def build(FMIndex, keys, seed: int, detail_docs: int, query_start: int | None = None, duplicate_keys: float = 0.0,
          variants=None, n_queries: int = N_QUERIES, keep_all_ngrams: bool = True):
    variants = {name: VARIANTS[name] for name in (variants or VARIANTS)}
    rng = random.Random(seed)
    docs, titles, bodies, pseudo = make_corpus(rng, query_start)
    unigram_ids = list(range(VOCAB_SIZE)) + ([query_start] if query_start is not None else [])
    index = FMIndex()
    index.initialize(docs, in_memory=True)
    index.labels = [str(i) for i in range(len(docs))]
    text = [t for d in reversed(docs) for t in d]        # the text SEAL's index holds, read forward
    occurring = {tuple(text[i:i + n]) for n in range(2, 6) for i in range(len(text) - n + 1)}
    queries = []
    for q in range(n_queries):
        query = make_query(rng, docs, titles, text, occurring, bodies, pseudo, query_start, duplicate_keys)
        unigram_vector = None
        if query_start is not None:    # indexed by token id: -inf at the ids no document holds
            unigram_vector = [float("-inf")] * (query_start + 1)
            for i, s in zip(unigram_ids, query["unigram_scores"]):
                unigram_vector[i] = s
            query["query_view"] = [g[0] == query_start for g, _ in query["ngrams"]]
        query["seal_counts"] = [int(index.get_count(list(g))) for g, _ in query["ngrams"]]
        query["naive_counts"] = [naive_count(text, list(g)) for g, _ in query["ngrams"]]
        query["outputs"] = {}
        for name, (overrides, with_unigrams) in variants.items():
            query["outputs"][name] = run_variant(keys, index, query, {**NQ_KWARGS, **overrides}, with_unigrams,
                                                 detail_docs, unigram_vector, keep_all_ngrams)
        queries.append(query)
        log.info("query %d/%d: %d n-grams", q + 1, n_queries, len(query["ngrams"]))
    corpus = {"vocab_size": VOCAB_SIZE, "eos": EOS, "title_eos": TITLE_EOS, "n_docs": len(docs),
              "n_tokens": len(index), "docs": docs, "titles": titles,
              "index_text": "SEAL's FMIndex.initialize stores each document reversed, concatenated in order, so "
                            "the indexed text read forward is the documents last to first; locate() gives "
                            "positions in the reversed concatenation"}
    if query_start is not None:
        corpus.update({
            "query_start": query_start, "pseudo_queries": pseudo,
            "layout": f"title + [{TITLE_EOS}] + body + concat([{query_start}] + q + [{TITLE_EOS}] for q in "
                      f"pseudo_queries[d]) + [{EOS}]: MINDER's identifier text 'title @@ body || q1 @@ || q2 @@' "
                      f"(scripts/build_fm_index.py --include_title --include_query --query_format stable); "
                      f"{query_start} is BART's ' ||', {TITLE_EOS} stands for ' @@' (49314), MINDER's title and "
                      f"query end",
            "unigram_ids": unigram_ids, "unigram_length": query_start + 1,
            "unigram_layout": "per query, unigram_scores is aligned with unigram_ids; the scoring function got a "
                              "list of length unigram_length (indexed by token id), -inf at every other id"})
    return {
        "corpus": corpus,
        "variants": {name: {"kwargs": {**NQ_KWARGS, **overrides}, "unigram_scores": with_unigrams}
                     for name, (overrides, with_unigrams) in variants.items()},
        "queries": queries,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="tests/fixtures/seal_parity/d300_v204/scoring.json", help="the JSON to write")
    parser.add_argument("--seed", type=cli.natural, default=0, help="seeds the corpus, the queries and their scores")
    parser.add_argument("--seal_dir", default=None,
                        help="SEAL's `seal` package directory, loaded by path (default: `seal` on sys.path)")
    parser.add_argument("--detail_docs", type=cli.natural, default=5,
                        help="per query and variant, how many top documents keep their n-gram lists")
    parser.add_argument("--keys_from", default=None,
                        help="a `seal` package directory (e.g. MINDER's) whose keys.py (and index.py, if there) are "
                             "loaded by path instead of SEAL's; the compiled cpp_modules stay SEAL's")
    parser.add_argument("--keys_repo", default=None, help="the repository --keys_from comes from (header only)")
    parser.add_argument("--keys_commit", default=None, help="its commit (header only)")
    parser.add_argument("--query_start", type=cli.natural, default=None,
                        help="MINDER's query-view token (45056, ' ||'): pseudo-query segments in the corpus, "
                             "query-view keys in the queries, unigram scores over ids 0..203 and this id")
    parser.add_argument("--duplicate_keys", type=_probability, default=0.0,
                        help="probability that a query repeats 1..3 of its keys (MINDER does not de-duplicate)")
    parser.add_argument("--variants", default=None,
                        help=f"comma-separated subset of {','.join(VARIANTS)} (default: all)")
    parser.add_argument("--n_queries", type=cli.count, default=N_QUERIES, help="how many queries")
    parser.add_argument("--no_all_ngrams", action="store_true", help="leave out each output's all_ngrams")
    parser.add_argument("--vocab_size", type=cli.count, default=VOCAB_SIZE, help="ids 0..VOCAB_SIZE-1 (4.. content)")
    parser.add_argument("--n_docs", type=cli.count, default=N_DOCS)
    parser.add_argument("--max_len", type=cli.count, default=MAX_LEN, help="content tokens of a document at most")
    args = parser.parse_args(argv)
    try:
        set_shape(args.vocab_size, args.n_docs, args.max_len)
    except ValueError as exc:
        parser.error(str(exc))
    variants = args.variants.split(",") if args.variants else None
    unknown = [v for v in variants or [] if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    if args.query_start is not None and args.query_start < VOCAB_SIZE:
        parser.error(f"--query_start must be >= {VOCAB_SIZE} (ids below are the corpus's)")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        FMIndex, keys, mode, package_dir = import_seal(args.seal_dir, args.keys_from)
    except SealImportError as exc:
        log.error("cannot import SEAL (facebookresearch/SEAL, built as its README says, on PYTHONPATH; "
                  "or --seal_dir): %s", exc)
        return 2
    if args.keys_from is not None:    # SEAL's checkout is where the compiled module came from
        package_dir = Path(sys.modules["seal.cpp_modules.fm_index"].__file__).resolve().parent.parent
    commit = seal_commit(package_dir)
    log.info("SEAL imported (%s), commit %s", mode, commit or "unknown")
    fixture = {"schema": SCHEMA, "generator": "tools/seal_scoring_fixtures.py", "seed": args.seed,
               "shape": {"vocab_size": VOCAB_SIZE, "n_docs": N_DOCS, "max_len": MAX_LEN},
               "seal": {"repo": "facebookresearch/SEAL", "commit": commit,
                        "written_against": SEAL_COMMIT_WRITTEN_AGAINST, "import_mode": mode,
                        "function": "seal.keys.aggregate_evidence", "index": "seal.index.FMIndex"}}
    if args.keys_from is not None:
        index_file = Path(sys.modules["seal.index"].__file__).resolve()
        keys_file = Path(keys.__file__).resolve()
        fixture["keys_from"] = {
            "repo": args.keys_repo, "commit": args.keys_commit,
            "keys_py": {"from": "keys_from", "git_blob": git_blob_id(keys_file)},
            "index_py": {"from": "keys_from" if index_file.parent == keys_file.parent else "seal",
                         "git_blob": git_blob_id(index_file)},
            "cpp_modules": "SEAL's compiled seal.cpp_modules.fm_index",
            "call": "seal.keys.aggregate_evidence with the keywords SEAL's retrieve_from_keys passes (MINDER's "
                    "also passes tokenizer=, used only in commented-out prints there; not passed)"}
    if args.query_start is not None or args.duplicate_keys:
        fixture["query_start"] = args.query_start
        fixture["duplicate_keys"] = args.duplicate_keys
    fixture.update(build(FMIndex, keys, args.seed, args.detail_docs, args.query_start, args.duplicate_keys,
                         variants, args.n_queries, not args.no_all_ngrams))
    out = Path(args.out)
    try:
        write_text(out, json.dumps(fixture, separators=(",", ":")) + "\n")
    except OSError as exc:
        log.error("%s", exc)
        return 2
    log.info("wrote %s (%d bytes)", out, out.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
