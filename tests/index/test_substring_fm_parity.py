"""Parity of the substring index with independent FM-indexes on a real text: the repository's own README.md and
WORKSPACE.md, one document per paragraph, one token per word or punctuation mark (ids in order of first
appearance). For a few thousand n-grams — every distinct 1-gram, a seeded sample of the distinct 2..6-grams,
the n-grams that span two consecutive paragraphs and random n-grams that occur nowhere — the corpus frequency
F(n) and the set of occurrences (document row, start within the document) from the device (one jitted batch)
and the host count must equal the FM-index's.

The reference, queried with the same token ids: `fm-index` (PyPI, Rust; `MultiFMIndex` over one string per
document): token id t is the character chr(0x100 + t) (clear of the control characters, below the surrogates), so
a document is a string of its tokens and a character offset is a token offset; documents are indexed separately,
as here. SEAL's own FM-index is compared in tests/index/test_substring_seal.py, from answers its compiled module
gave (tests/fixtures/seal_parity/<shape>/fm_index.json).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("README.md", "WORKSPACE.md")
MAX_N = 6
SAMPLE_PER_LENGTH = 500  # distinct n-grams of each length 2..6 (all the 1-grams are taken)
ABSENT = 300


def _corpus():
    """Paragraphs of the repository's own prose as token-id documents; the vocabulary in order of appearance."""
    vocab: dict[str, int] = {}
    documents = []
    for name in SOURCES:
        for paragraph in re.split(r"\n\s*\n", (ROOT / name).read_text(encoding="utf-8")):
            words = re.findall(r"\w+|[^\w\s]", paragraph)
            if words:
                documents.append([vocab.setdefault(w, len(vocab)) for w in words])
    return documents, len(vocab)


def _queries(documents, vocab_size):
    rng = np.random.default_rng(0)
    by_length = [sorted({tuple(d[s:s + n]) for d in documents for s in range(len(d) - n + 1)})
                 for n in range(1, MAX_N + 1)]
    grams = list(by_length[0])
    for found in by_length[1:]:
        take = rng.choice(len(found), size=min(SAMPLE_PER_LENGTH, len(found)), replace=False)
        grams += [found[i] for i in sorted(take)]
    # across a paragraph boundary: in the concatenated text, in no single document (unless by chance elsewhere)
    for a, b in itertools.pairwise(documents):
        for k in range(1, min(3, len(a)) + 1):
            for m in range(1, min(MAX_N - k, len(b)) + 1):
                grams.append(tuple(a[-k:] + b[:m]))
    occurring = {g for found in by_length for g in found}
    absent = set()
    while len(absent) < ABSENT:
        g = tuple(rng.integers(0, vocab_size, size=rng.integers(2, MAX_N + 1)).tolist())
        if g not in occurring:
            absent.add(g)
    return list(dict.fromkeys(grams + sorted(absent)))


@pytest.fixture(scope="module")
def corpus():
    documents, vocab_size = _corpus()
    assert len(documents) >= 20 and vocab_size >= 500, (len(documents), vocab_size)  # a real text, not a toy
    assert vocab_size < 0xD800 - 0x100  # the character mapping of the fm-index reference stays below surrogates
    rows = [1000 + 3 * k for k in range(len(documents))]
    return documents, vocab_size, rows, _queries(documents, vocab_size)


@pytest.fixture(scope="module")
def substring_answers(corpus):
    """F(n) and occurrence sets of every query from the device (one jitted batch) and the host count; the index
    is built in two inserts, so that a state spans two segments."""
    import jax
    import jax.numpy as jnp

    from gr_jax.index.substring import SubstringIndex

    documents, vocab_size, rows, grams = corpus
    # the last documents, under a third of the tokens, as a second segment (not merged: smaller than half)
    total, tail, split = sum(map(len, documents)), 0, len(documents)
    while split > 1 and 3 * (tail + len(documents[split - 1])) < total:
        split -= 1
        tail += len(documents[split])
    index = SubstringIndex.build(documents[:split], vocab_size, rows=rows[:split])
    index.insert(documents[split:], rows=rows[split:])
    assert len(index.segments) == 2
    host = [index.count(g) for g in grams]
    max_occurrences = 1 << max(max(host), 1).bit_length()  # every occurrence of every segment comes back

    # the n-grams longest first, so that the states still walking at depth d are a prefix of the batch; depth 0
    # is the root's children, picked per n-gram
    order = sorted(range(len(grams)), key=lambda i: -len(grams[i]))
    live = [sum(len(g) > d for g in grams) for d in range(MAX_N)]
    tokens = np.zeros((len(grams), MAX_N), np.int32)
    for i, k in enumerate(order):
        tokens[i, :len(grams[k])] = grams[k]

    tree_map = jax.tree_util.tree_map

    @jax.jit
    def walk(dev, tokens):
        _, nxt, _, _ = dev.children(0, dev.root(()))
        state = tree_map(lambda x: x[tokens[:, 0]], nxt)
        for d in range(1, MAX_N):
            walking, picked = live[d], tokens[: live[d], d, None]
            _, nxt, _, _ = dev.children(d, tree_map(lambda x, k=walking: x[:k], state))
            child = tree_map(lambda x, t=picked: jnp.take_along_axis(x, t, -1)[:, 0], nxt)
            state = tree_map(lambda s, c, k=walking: s.at[:k].set(c), state, child)
        return dev.counts(state), dev.occurrences(state, max_occurrences)

    walked, (r, p, ok) = jax.device_get(walk(index.device(MAX_N), jnp.asarray(tokens)))
    counts, occurrences = [0] * len(grams), [set()] * len(grams)
    for i, k in enumerate(order):
        counts[k] = int(walked[i])
        occurrences[k] = set(zip(r[i][ok[i]].tolist(), p[i][ok[i]].tolist()))
    return host, counts, occurrences


def _fm_index_answers(documents, rows, grams):
    fm_index = require("fm_index")

    def to_text(ids):
        return "".join(chr(0x100 + t) for t in ids)

    fm = fm_index.MultiFMIndex([to_text(d) for d in documents])
    counts, occurrences = [], []
    for g in grams:
        pattern = to_text(g)
        counts.append(fm.count_all(pattern))
        occurrences.append({(rows[k], s) for k, starts in fm.locate(pattern).items() for s in starts})
    return counts, occurrences


def test_counts_and_occurrences_match_an_fm_index(corpus, substring_answers):
    reference = "fm-index"
    documents, vocab_size, rows, grams = corpus
    want_counts, want_occurrences = _fm_index_answers(documents, rows, grams)
    host, counts, occurrences = substring_answers
    assert len(grams) >= 3000 and sum(c == 0 for c in want_counts) >= ABSENT and max(want_counts) > 100
    assert [len(o) for o in want_occurrences] == want_counts  # the reference agrees with itself
    bad = [(g, want_counts[i], host[i], counts[i]) for i, g in enumerate(grams)
           if not want_counts[i] == host[i] == counts[i]]
    assert not bad, f"{len(bad)} of {len(grams)} n-grams: (n-gram, {reference}, host, device) {bad[:5]}"
    bad = [(g, sorted(want_occurrences[i] ^ occurrences[i])[:4]) for i, g in enumerate(grams)
           if want_occurrences[i] != occurrences[i]]
    assert not bad, f"{len(bad)} of {len(grams)} n-grams: (n-gram, occurrences in only one) {bad[:5]}"
