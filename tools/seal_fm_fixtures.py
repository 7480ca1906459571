"""Write reference fixtures from SEAL's own FM-index (facebookresearch/SEAL).

The tool builds SEAL's ``seal.index.FMIndex`` over a small deterministic corpus
of token ids and records, for several hundred n-gram queries, what SEAL's index
answers: the occurrence count, the allowed next tokens with their counts, and
the documents that contain the n-gram. The output is one JSON file (by default
``tests/fixtures/seal_parity/<shape>/fm_index.json``) that holds the corpus, the queries, the
answers and SEAL's layout conventions, so a test can compare our substring
index against SEAL without SEAL being installed.

This tool only *consumes* SEAL: it builds nothing. Build SEAL's C++ module by
following SEAL's own README (sdsl-lite, swig, ``pip install -e .``), then put
the SEAL checkout on ``PYTHONPATH`` and run::

    PYTHONPATH=path/to/SEAL python tools/seal_fm_fixtures.py \
        --out tests/fixtures/seal_parity/d300_v204/fm_index.json --seed 1

``seal/__init__.py`` imports SEAL's retrieval/beam-search code (fairseq-era
transformers, more_itertools, ...). When that fails, the tool imports only
``seal.index`` (and the swig module it wraps) without running the package's
``__init__``. The tool exits with status 2 if SEAL's index is not importable.

Layout facts recorded in the fixture (from ``seal/index.py``):
  * ``FMIndex.initialize(seqs)`` reverses every sequence, adds ``SHIFT`` (10)
    to every id and concatenates the reversed sequences in corpus order; sdsl
    appends its 0 sentinel. No separator is inserted by the index itself.
  * SEAL's ``scripts/build_fm_index.py`` appends the tokenizer's EOS (BART: 2)
    to every document before indexing; this tool does the same (``--eos``).
  * Queries are matched by backward search in forward token order over the
    reversed text, i.e. against the forward text
    ``doc[N-1]+[eos] + ... + doc[1]+[eos] + doc[0]+[eos]`` (documents in
    *reverse* corpus order), so n-grams crossing a boundary match
    "tail of doc i+1, eos, head of doc i", not "tail of doc i, head of doc i+1".
  * ``FMIndex.get_range`` starts from one row past the end, which makes SEAL's
    answers one row too large for one first token per index; affected entries
    carry a ``seal_quirk`` object with the corrected answers (see the
    fixture's ``seal_quirks``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
import types
from collections import Counter

import numpy as np


from gr_jax.runtime import cli  # the argument validators every tool uses
from gr_jax.runtime.io_utils import write_text
LOG = logging.getLogger("seal_fm_fixtures")

DEFAULT_OUT = os.path.join("tests", "fixtures", "seal_parity", "d300_v204", "fm_index.json")
FORMAT_VERSION = 1


# --------------------------------------------------------------------------
# SEAL import
# --------------------------------------------------------------------------
def import_seal_index():
    """Return (seal.index module, how it was imported) or raise ImportError."""
    try:
        mod = importlib.import_module("seal.index")
        return mod, "import seal.index"
    except ImportError as exc:  # seal/__init__.py pulls in heavy deps
        LOG.info("plain `import seal.index` failed (%s); importing the index "
                 "module without running seal/__init__.py", exc)
        for name in [n for n in sys.modules if n == "seal" or n.startswith("seal.")]:
            del sys.modules[name]
    spec = importlib.util.find_spec("seal")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("no `seal` package on sys.path")
    pkg = types.ModuleType("seal")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__package__ = "seal"
    sys.modules["seal"] = pkg
    mod = importlib.import_module("seal.index")
    return mod, "seal.index imported with a stub `seal` package (seal/__init__.py not run)"


def seal_commit(seal_index_module, override):
    if override:
        return override
    root = os.path.dirname(os.path.dirname(os.path.abspath(seal_index_module.__file__)))
    try:
        out = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=30, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# --------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------
def make_corpus(rng, n_docs, vocab_lo, vocab_hi, min_len, max_len):
    vocab = np.arange(vocab_lo, vocab_hi + 1)
    ranks = rng.permutation(len(vocab))
    weights = 1.0 / (ranks + 1.0) ** 1.1
    weights /= weights.sum()

    def fresh(n):
        return [int(t) for t in rng.choice(vocab, size=n, p=weights)]

    docs = []
    for i in range(n_docs):
        r = rng.random()
        if i < 10 or r < 0.55:
            doc = fresh(int(rng.integers(min_len, max_len + 1)))
        elif r < 0.70:  # exact repeat of an earlier document
            doc = list(docs[int(rng.integers(len(docs)))])
        elif r < 0.85:  # slice of an earlier document padded with fresh tokens
            src = docs[int(rng.integers(len(docs)))]
            a = int(rng.integers(len(src)))
            b = int(rng.integers(a + 1, len(src) + 1))
            doc = fresh(int(rng.integers(0, 6))) + src[a:b] + fresh(int(rng.integers(0, 6)))
        else:  # two slices of earlier documents joined
            s1 = docs[int(rng.integers(len(docs)))]
            s2 = docs[int(rng.integers(len(docs)))]
            a = int(rng.integers(len(s1)))
            b = int(rng.integers(len(s2)))
            doc = s1[a:a + int(rng.integers(2, 20))] + s2[b:b + int(rng.integers(2, 20))]
        if len(doc) < min_len:
            doc = doc + fresh(min_len - len(doc))
        docs.append(doc[:max_len])
    return docs


def doc_ngram_counts(docs, n):
    c = Counter()
    for d in docs:
        for i in range(len(d) - n + 1):
            c[tuple(d[i:i + n])] += 1
    return c


# --------------------------------------------------------------------------
# Queries
# --------------------------------------------------------------------------
def make_queries(rng, docs, eos, vocab_lo, vocab_hi, sizes):
    """Return a list of (kind, ngram) pairs, deduplicated, in a fixed order."""
    out = []
    seen = set()

    def add(kind, ng):
        ng = tuple(int(t) for t in ng)
        if ng in seen:
            return
        seen.add(ng)
        out.append((kind, list(ng)))

    n = len(docs)
    add("empty", ())

    # every unigram id from 0 to just past the vocabulary (absent ids included)
    for t in range(0, vocab_hi + 2):
        add("unigram", [t])

    # random sub-n-grams of documents, lengths 1..8
    for _ in range(sizes["substring"]):
        d = docs[int(rng.integers(n))]
        k = int(rng.integers(1, min(8, len(d)) + 1))
        a = int(rng.integers(0, len(d) - k + 1))
        add("substring", d[a:a + k])

    # most frequent n-grams inside documents, lengths 1..4
    per = max(1, sizes["frequent"] // 4)
    for k in range(1, 5):
        top = sorted(doc_ngram_counts(docs, k).items(), key=lambda kv: (-kv[1], kv[0]))
        for ng, _ in top[:per]:
            add("frequent", ng)

    # absent: random sequences that occur nowhere (not even across boundaries)
    flat = []
    for d in reversed(docs):  # SEAL's forward text order, see module docstring
        flat.extend(d + ([eos] if eos is not None else []))
    flat_s = "," + ",".join(map(str, flat)) + ","
    tries = 0
    n_absent = 0
    while n_absent < sizes["absent"] and tries < 100000:
        tries += 1
        k = int(rng.integers(2, 7))
        ng = [int(t) for t in rng.integers(vocab_lo, vocab_hi + 1, size=k)]
        if ("," + ",".join(map(str, ng)) + ",") in flat_s:
            continue
        before = len(out)
        add("absent", ng)
        n_absent += len(out) - before
    # ids never used in the corpus
    for ng in ([vocab_hi + 1], [vocab_hi + 50], [0], [1], [3], [vocab_lo, vocab_hi + 1]):
        add("absent_token", ng)

    # boundary crossing, corpus order: tail(doc i) [+eos] + head(doc i+1)
    # boundary crossing, index order:  tail(doc i+1) [+eos] + head(doc i)
    for _ in range(sizes["boundary"]):
        i = int(rng.integers(0, n - 1))
        for kind, first, second in (("boundary_corpus_order", docs[i], docs[i + 1]),
                                    ("boundary_index_order", docs[i + 1], docs[i])):
            t = int(rng.integers(1, min(4, len(first)) + 1))
            h = int(rng.integers(1, min(4, len(second)) + 1))
            mid = [eos] if (eos is not None and rng.random() < 0.75) else []
            add(kind, first[-t:] + mid + second[:h])

    # n-grams containing the EOS token
    if eos is not None:
        add("eos", [eos])
        add("eos", [eos, eos])
        for _ in range(sizes["eos"]):
            i = int(rng.integers(n))
            d = docs[i]
            t = int(rng.integers(1, min(5, len(d)) + 1))
            add("eos_suffix", d[-t:] + [eos])  # doc tail followed by its EOS
            if i > 0:  # EOS followed by the next document in index order
                h = int(rng.integers(1, min(4, len(docs[i - 1])) + 1))
                add("eos_prefix", [eos] + docs[i - 1][:h])
            mid = d[int(rng.integers(len(d)))]
            add("eos_absent", [mid, eos, mid, eos])
    return out


def quirk_queries(rng, docs, eos, tokens, per_token):
    """Document n-grams (lengths 2..6) that start with one of `tokens`."""
    out = []
    seqs = [d + ([eos] if eos is not None else []) for d in docs]
    for t in tokens:
        starts = [(i, p) for i, s in enumerate(seqs) for p, x in enumerate(s) if x == t]
        for j in rng.permutation(len(starts))[:per_token]:
            i, p = starts[int(j)]
            k = int(rng.integers(2, 7))
            out.append(seqs[i][p:p + k])
    return out


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------
def corrected_range(index, ngram, shift):
    """Backward search started from sdsl's full inclusive range [0, size()-1].

    SEAL's ``FMIndex.get_range`` starts from ``end_row = size()`` (one past the
    last row). sdsl's ``backward_search`` then ranks the BWT at ``size()+1``,
    which for one symbol per index overshoots by one row.
    """
    lo, hi = 0, index.size() - 1
    for t in ngram:
        lo, hi = index.backward_search_step(int(t) + shift, lo, hi)
    return int(lo), int(hi) + 1


def answers_for_rows(index, lo, hi):
    if hi <= lo:
        return 0, [], []
    toks, cnts = index.get_distinct_count(lo, hi)
    docs = sorted({int(index.get_doc_index_from_row(r)) for r in range(lo, hi)})
    return hi - lo, sorted([int(t), int(c)] for t, c in zip(toks, cnts)), docs


def query_index(index, ngram, shift):
    count = int(index.get_count(ngram))
    if ngram:
        lo, hi = index.get_range(ngram)
        toks, cnts = index.get_distinct_count(lo, hi) if hi > lo else ([], [])
        docs = sorted({int(d) for d in index.get_doc_indices(ngram)}) if hi > lo else []
        c_lo, c_hi = corrected_range(index, ngram, shift)
        if (int(lo), int(hi)) != (c_lo, c_hi) and not (hi <= lo and c_hi <= c_lo):
            c_count, c_next, c_docs = answers_for_rows(index, c_lo, c_hi)
            quirk = {"seal_range": [int(lo), int(hi)], "corrected_range": [c_lo, c_hi],
                     "count": c_count, "next": c_next, "documents": c_docs}
        else:
            quirk = None
    else:
        # SEAL's own empty-prefix path (beam_search.IndexBasedLogitsProcessor):
        # index.occurring_distinct / occurring_counts = get_distinct_count(0, len(index)).
        toks, cnts = index.occurring_distinct, index.occurring_counts
        # get_doc_indices([]) walks rows past the end of the index; restrict the
        # document lookup to the rows of real text positions.
        docs = sorted({int(index.get_doc_index_from_row(r)) for r in range(index.size())
                       if 0 <= int(index.get_token_index_from_row(r)) < len(index)})
        quirk = None
    nxt = sorted([int(t), int(c)] for t, c in zip(toks, cnts))
    entry = {"ngram": [int(t) for t in ngram], "count": count, "next": nxt,
             "documents": docs}
    if quirk is not None:
        entry["seal_quirk"] = quirk
    return entry


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=DEFAULT_OUT, help="output JSON path (default: %(default)s)")
    p.add_argument("--seed", type=cli.natural, default=1, help="corpus/query RNG seed (default: %(default)s)")
    p.add_argument("--n-docs", type=cli.count, default=300)
    p.add_argument("--vocab-lo", type=cli.natural, default=4)
    p.add_argument("--vocab-hi", type=cli.count, default=203)
    p.add_argument("--min-len", type=cli.count, default=3)
    p.add_argument("--max-len", type=cli.count, default=60)
    p.add_argument("--eos", type=cli.natural, default=2,
                   help="token appended to every document before indexing, as SEAL's "
                        "scripts/build_fm_index.py does (BART eos=2); -1 = append nothing")
    p.add_argument("--per_doc", type=cli.natural, default=1,
                   help="n-grams drawn from every document (0: none, the fixtures before 2026-12-05)")
    p.add_argument("--seal-commit", default=None,
                   help="SEAL commit to record (default: `git rev-parse HEAD` of the SEAL checkout)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        seal_index, how = import_seal_index()
    except Exception as exc:  # noqa: BLE001 - any failure means "SEAL not usable"
        LOG.error("cannot import SEAL's FM-index (seal.index / seal.cpp_modules.fm_index): %s. "
                  "Build SEAL's C++ module following SEAL's README and put the SEAL checkout "
                  "on PYTHONPATH.", exc)
        return 2
    LOG.info("SEAL index module: %s", how)
    eos = None if args.eos < 0 else args.eos

    rng = np.random.default_rng(args.seed)
    docs = make_corpus(rng, args.n_docs, args.vocab_lo, args.vocab_hi, args.min_len, args.max_len)
    sequences = [d + ([eos] if eos is not None else []) for d in docs]

    index = seal_index.FMIndex()
    index.initialize(sequences)  # default in_memory=False, as build_fm_index.py
    LOG.info("indexed %d documents, len(index)=%d, index.size()=%d",
             index.n_docs, len(index), index.size())

    sizes = {"substring": 260, "frequent": 60, "absent": 60, "boundary": 40, "eos": 30,
             "quirk_prefix": 20}
    queries = make_queries(rng, docs, eos, args.vocab_lo, args.vocab_hi, sizes)
    shift = int(getattr(seal_index, "SHIFT", 10))
    entries = []
    for kind, ng in queries:
        e = query_index(index, ng, shift)
        e["kind"] = kind
        entries.append(e)
    # Tokens whose unigram range SEAL gets wrong (see corrected_range): add
    # n-grams starting with them so the fixture shows how the error propagates.
    quirk_tokens = [e["ngram"][0] for e in entries
                    if e["kind"] == "unigram" and "seal_quirk" in e]
    seen = {tuple(e["ngram"]) for e in entries}
    for ng in quirk_queries(rng, docs, eos, quirk_tokens, sizes["quirk_prefix"]):
        if tuple(ng) not in seen:
            seen.add(tuple(ng))
            e = query_index(index, ng, shift)
            e["kind"] = "quirk_prefix"
            entries.append(e)
    # Follow the spurious row: extend each affected n-gram by the next tokens
    # SEAL reports but the corrected range does not (a few steps deep).
    frontier = [e for e in entries if "seal_quirk" in e]
    for _ in range(4):
        new = []
        for e in frontier:
            q = e["seal_quirk"]
            good = {t: c for t, c in q["next"]}
            for t, c in e["next"]:
                ng = e["ngram"] + [t]
                if good.get(t) != c and tuple(ng) not in seen:
                    seen.add(tuple(ng))
                    x = query_index(index, ng, shift)
                    x["kind"] = "quirk_spurious"
                    entries.append(x)
                    if "seal_quirk" in x:
                        new.append(x)
        frontier = new
    # one n-gram of every document (its own draws, after all the others: the queries above do not change), so that
    # every document is read by the check (`check_parity --mutate` swaps tokens of each)
    doc_rng = np.random.default_rng(args.seed + 1000)
    for d in docs if args.per_doc else []:
        for _ in range(args.per_doc):
            k = int(doc_rng.integers(2, min(6, len(d)) + 1)) if len(d) > 1 else 1
            a = int(doc_rng.integers(0, len(d) - k + 1))
            ng = d[a:a + k]
            if tuple(ng) not in seen:
                seen.add(tuple(ng))
                e = query_index(index, ng, shift)
                e["kind"] = "per_document"
                entries.append(e)
    n_quirk = sum("seal_quirk" in e for e in entries)
    LOG.info("answered %d queries; SEAL's get_range is off by one row for first token(s) %s "
             "(%d entries carry `seal_quirk`)", len(entries), quirk_tokens, n_quirk)

    empty_range = [int(x) for x in index.get_range([])]
    fixture = {
        "format_version": FORMAT_VERSION,
        "generator": {
            "tool": "tools/seal_fm_fixtures.py",
            "args": {"seed": args.seed, "n_docs": args.n_docs, "vocab_lo": args.vocab_lo,
                     "vocab_hi": args.vocab_hi, "min_len": args.min_len,
                     "max_len": args.max_len, "eos": args.eos, "per_doc": args.per_doc},
            "query_sizes": sizes,
        },
        "seal": {
            "repository": "facebookresearch/SEAL",
            "commit": seal_commit(seal_index, args.seal_commit),
            "import": how,
            "api": "seal.index.FMIndex: initialize(sequences) [in_memory=False]; count=get_count(ngram); "
                   "next=get_distinct_count(*get_range(ngram)) (empty ngram: occurring_distinct/"
                   "occurring_counts); documents=sorted(set(get_doc_indices(ngram)))",
        },
        "layout": {
            "indexed_sequences": "corpus[i] + [eos] for each i (eos appended by this tool, as SEAL's "
                                 "scripts/build_fm_index.py does; null eos = nothing appended)",
            "eos": eos,
            "shift": shift,
            "reversed": True,
            "stored_text": "concat_i reversed(corpus[i]+[eos]) with every id + shift, then sdsl "
                           "sentinel 0; no separator is added by FMIndex itself",
            "forward_text": "corpus[N-1]+[eos] + ... + corpus[1]+[eos] + corpus[0]+[eos] (documents "
                            "in reverse corpus order); counts are occurrences in this text",
            "boundary_crossing": "an n-gram matches across a boundary only as tail(doc i+1) [+eos] + "
                                 "head(doc i); tail(doc i) + head(doc i+1) is not adjacent",
            "documents": "document holding the LAST token of each occurrence (get_doc_index on "
                         "locate(row); the eos belongs to the document it ends)",
            "next": "[token, count] pairs of the token following each occurrence in forward_text; "
                    "the sdsl sentinel is dropped by SEAL, so an occurrence at the very end of "
                    "forward_text (ending with corpus[0]'s eos) has no next token; eos appears as "
                    "a normal token id",
            "reserved": "FMIndex reserves internal symbol 0 (sdsl sentinel); token ids t>=0 are "
                        "stored as t+shift. The corpus uses ids vocab_lo..vocab_hi, so ids below "
                        "vocab_lo (BART: 0 <s>/bos, 1 <pad>, 2 </s>/eos, 3 <unk>) stay free",
            "len_index": int(len(index)),
            "len_index_meaning": "sum of len(corpus[i]) + 1 per document (eos included); sentinel "
                                 "excluded",
            "index_size": int(index.size()),
            "index_size_meaning": "sdsl rows = len_index + 1 (sentinel)",
            "n_docs": int(index.n_docs),
            "beginnings": [int(b) for b in index.beginnings],
            "empty_prefix": {
                "get_range": empty_range,
                "get_count": int(index.get_count([])),
                "next_source": "index.occurring_distinct/occurring_counts = "
                               "get_distinct_count(0, len(index)): BWT rows [0, len_index), "
                               "the last row is not included",
                "documents_source": "rows whose locate() is a real text position",
                "get_doc_indices_extra": sorted({int(d) for d in index.get_doc_indices([])
                                                 if int(d) >= index.n_docs}),
                "get_doc_indices_extra_meaning": "ids >= n_docs that SEAL's get_doc_indices([]) "
                                                 "also yields (sentinel row, and row size() whose "
                                                 "locate() is 2**64-1); left out of `documents`",
            },
        },
        "seal_quirks": {
            "get_range_off_by_one": "FMIndex.get_range starts backward search from end_row=size() "
                                    "(sdsl ranges are inclusive, so size()-1 is the last row). For "
                                    "one symbol per index the first step's range then holds one "
                                    "extra row, so get_count is +1 and next/documents may gain a "
                                    "spurious entry, for that first token and n-grams starting "
                                    "with it. Entries affected carry `seal_quirk` with SEAL's and "
                                    "the corrected range and the corrected count/next/documents; "
                                    "the top-level count/next/documents are SEAL's answers as is",
            "quirk_first_tokens": quirk_tokens,
            "empty_prefix_count": "get_count([]) = size()+1 = len_index+2 (range [0, size()+1))",
        },
        "corpus": docs,
        "queries": entries,
    }
    try:
        write_text(args.out, json.dumps(fixture, separators=(",", ":")) + "\n")
    except OSError as exc:
        LOG.error("%s", exc)
        return 2
    LOG.info("wrote %s (%d bytes)", args.out, os.path.getsize(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
