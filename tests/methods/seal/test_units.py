"""000 Fig. 2's fixed-position units (SealDocids.units): the units of a text by hand, the identifier text that
holds them, a document ranked by its best unit (an oracle from teacher forcing over every unit, not from the
index or the search), and training targets drawn by overlap with the query."""

import numpy as np
import pytest

from gr_jax.data.readers import Corpus
from gr_jax.docids.base import FitContext
from gr_jax.methods.seal.docids import SealDocids, text_units
from gr_jax.methods.seal.model import SealRetriever, SealSearch, mark
from gr_jax.methods.seal.training import SealPairs, split_views
from gr_jax.backbones import t5

WORDS = "alpha beta gamma delta eps zeta eta theta".split()


class Words:
    """Words and the full stop as ids 2.. (0 pad, 1 end)."""

    size = 3 + len(WORDS)

    def encode(self, text):
        return [2 + (WORDS + ["."]).index(w) for w in text.replace(".", " .").split()]


DOT = 2 + len(WORDS)
CORPUS = Corpus(["d0", "d1", "d2"], ["alpha beta. gamma.", "delta. alpha eps. zeta eta theta.", "beta beta."],
                titles=["eta", "theta", "zeta"])


def test_units_of_a_text_by_hand():
    text = "Overview. It is old! Is it? History.\nIt was built. Then.\n\nDetails."
    assert text_units(text, "sentence") == ["Overview.", "It is old!", "Is it?", "History.", "It was built.",
                                            "Then.", "Details."]
    # a blank line separates paragraphs; a text without line breaks has runs of sentences_per_paragraph
    assert text_units(text, "paragraph") == ["Overview. It is old! Is it? History.\nIt was built. Then.", "Details."]
    assert text_units("one\ntwo. three.\n", "paragraph") == ["one", "two. three."]  # no blank line: lines
    flat = "a. b. c. d. e."
    assert text_units(flat, "paragraph", 2) == ["a. b.", "c. d.", "e."]
    assert text_units("no full stop", "sentence") == ["no full stop"]


def _scheme(units="sentence", max_unit_tokens=24):
    return SealDocids(units=units, max_unit_tokens=max_unit_tokens).fit(CORPUS, FitContext(vocab=Words()))


def test_identifier_text_holds_the_units_in_the_pseudo_query_slots():
    scheme = _scheme(max_unit_tokens=2)
    m = scheme.markers
    table = scheme.assign(CORPUS)
    a, b, g, d, e, z, et, th = range(2, 10)
    assert table.sequence(1) == [m.doc_start, th, m.title_end, d, DOT, a, e, DOT, z, et, th, DOT,
                                 m.query_start, d, DOT, m.title_end, m.query_start, a, e, m.title_end,
                                 m.query_start, z, et, m.title_end]  # each unit cut to its first 2 tokens
    assert split_views(table.sequence(1), m)[2] == [[d, DOT], [a, e], [z, et]]
    # only the units that start within the indexed body: 4 tokens hold "delta ." and "alpha eps ."
    short = SealDocids(units="sentence", max_text_tokens=4).fit(CORPUS, FitContext(vocab=Words()))
    assert split_views(short.assign(CORPUS).sequence(1), m)[2] == [[d, DOT], [a, e, DOT]]
    with pytest.raises(ValueError, match="units and pseudo_queries_file both fill"):
        SealDocids(units="sentence", pseudo_queries_file="train")
    with pytest.raises(ValueError, match="SealDocids.units must be one of"):
        SealDocids(units="word")


def test_a_document_ranks_by_its_best_unit():
    scheme = _scheme()
    m = scheme.markers
    table = scheme.assign(CORPUS)
    config = t5.get_config("tiny", vocab_size=scheme.space().end)
    model = SealRetriever(config, search=SealSearch(views=("query",), query_length=5, query_keys=0,
                                                     document_score="best_key", max_hits=5))
    model.use_docids(table)
    params = model.init_params(2)
    queries = np.array([[2, 3, 1, 0], [7, 1, 0, 0]], np.int32)
    units = {r: split_views(table.sequence(r), m)[2] for r in range(3)}
    distinct = {tuple(u) for us in units.values() for u in us}
    ranked = model.ranked(params, queries, table.index(), num_beams=len(distinct) + 2)
    for b in range(2):
        want = {}
        for r, us in units.items():  # oracle: teacher-forced log P(unit, end | query marked for the view)
            for u in us:
                target = np.zeros((1, 6), np.int32)
                target[0, : len(u) + 1] = u + [m.title_end]
                s = float(model.score(params, mark(queries[b:b + 1], m.view_query), target)[0])
                want[r] = max(want.get(r, -np.inf), s)
        got = {r: v for r, v, _ in ranked[b]}
        assert set(got) == set(want)
        for r in want:  # float32 sums of ≤ 4 log-probabilities: 1e-5 relative
            assert abs(got[r] - want[r]) <= 1e-5 * max(1.0, abs(want[r])), (b, r)
        order = [r for r, _, _ in ranked[b]]
        assert order == sorted(order, key=lambda r: (-got[r], r))


def test_unit_targets_drawn_by_overlap_with_the_query():
    scheme = _scheme()
    m = scheme.markers
    identifier = scheme.assign(CORPUS).sequence(1)
    query = [2, 6]  # "alpha eps": the second sentence holds both words, the others none
    pairs = SealPairs(title_samples=0, span_samples=0, query_samples=8, query_sampling="overlap", temperature=0.05)
    got = pairs.supervised("q", query, identifier, 1, m, seed=0)
    assert [t for _, v, t in got] == [[2, 6, DOT, m.title_end]] * 8 and {v for _, v, _ in got} == {m.view_query}
    first = SealPairs(title_samples=0, span_samples=0, query_samples=2).supervised("q", query, identifier, 1, m, 0)
    assert [t for _, _, t in first] == [[5, DOT, m.title_end], [2, 6, DOT, m.title_end]]  # MINDER's: in order


def test_schemes_saved_before_spelled_markers_still_match():
    """marker_ids and spelled were added after SEAL schemes were saved: at their defaults they are not part of
    what a saved state was built from, so a MODEL_DIR trained before them is not refused."""
    from gr_jax.docids.base import scheme_params
    from gr_jax.methods.seal.docids import SealDocids

    params = scheme_params(SealDocids())
    assert "marker_ids" not in params and "spelled" not in params
    assert scheme_params(SealDocids(marker_ids="spelled"))["marker_ids"] == "spelled"
