"""SEAL against its authors' code (`methods/seal/parity.py`): our document scoring on the keys and unigram
scores SEAL's `aggregate_evidence` was given, our substring index on the n-grams SEAL's FM-index answered
(tests/fixtures/seal_parity/<shape>, written by SEAL's own code). The checks fail for the right reasons: a count off by
one or two keys' scores swapped move the scores past the tolerance."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gr_jax.methods.seal import parity
from gr_jax.methods.seal.ranker import weight

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "seal_parity"
SHAPES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
FIXTURE = FIXTURES / "d300_v204"
# float64 sums of a few dozen terms of magnitude up to ~300: 1e-9 of the magnitude is far above their rounding
# (~1e-14 measured) and far below what one key's weight moves (≥ 1e-3 of a document's score)
TOLERANCE = 1e-9


@pytest.fixture(scope="module")
def scoring():
    return json.loads((FIXTURE / "scoring.json").read_text())


def test_scores_and_order_are_seals(scoring):
    """SEAL's NQ settings here; every variant in the slow tier (the tool's test)."""
    result = {"index": parity.check_index(json.loads((FIXTURE / "fm_index.json").read_text())),
              "scoring": parity.check_scoring(scoring, variants=("nq_defaults",))}
    assert parity.within(result, TOLERANCE), result
    defaults = result["scoring"]["nq_defaults"]
    assert defaults["queries"] == 50 and defaults["documents_compared"] > 5000
    assert defaults["seal_only_documents"] <= 5  # documents only a boundary-crossing key made candidates


def _first_query_diff(fixture, variant="nq_defaults", q: int = 0) -> float:
    q = fixture["queries"][q]
    theirs = {int(d): s for d, s in q["outputs"][variant]["ranking"] if s > 0}
    ours = dict(parity.rank_like_seal(fixture, q, variant))
    return max(abs(ours.get(d, 0.0) - s) / s for d, s in theirs.items())


def _heaviest(fixture) -> int:
    """The first query's key of the largest weight."""
    q, n = fixture["queries"][0], fixture["corpus"]["n_tokens"]
    return max(range(len(q["ngrams"])), key=lambda k: weight(q["ngrams"][k][1], q["seal_counts"][k], n))


def test_a_count_off_by_one_is_caught(scoring):
    assert _first_query_diff(scoring) <= TOLERANCE
    bad = copy.deepcopy(scoring)
    q = bad["queries"][0]
    q["seal_counts"][_heaviest(bad)] += 1  # the key that weighs most occurs once more in SEAL's index
    assert _first_query_diff(bad) > 1e3 * TOLERANCE


def test_swapped_key_scores_are_caught(scoring):
    bad = copy.deepcopy(scoring)
    q = bad["queries"][0]
    i = _heaviest(bad)
    j = min(range(len(q["ngrams"])), key=lambda k: q["ngrams"][k][1])  # the least likely key
    (a, sa), (b, sb) = q["ngrams"][i], q["ngrams"][j]
    q["ngrams"][i], q["ngrams"][j] = [a, sb], [b, sa]
    assert _first_query_diff(bad) > 1e3 * TOLERANCE


@pytest.mark.slow  # starts a process
@pytest.mark.parametrize("shape", SHAPES)
def test_check_parity_tool(shape):
    for method in ("seal", "minder"):
        out = subprocess.run([sys.executable, "tools/check_parity.py", "--method", method, "--fixture",
                              str(FIXTURES / shape),
                              "--tolerance", str(TOLERANCE)], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[3], timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout.strip().splitlines()[-1])["within_tolerance"] is True


@pytest.mark.slow  # the default tier checks SEAL's scoring, of which MINDER's is SEAL's plus the boost
def test_minders_scoring_with_its_pseudo_query_boost():
    """MINDER's keys.py (SEAL's scoring plus its +14 on keys that start with the pseudo-query view's token, capped
    at -1; keys passed with repeats): scores within tolerance on SEAL's NQ settings, in MINDER's order, and the
    boost matters (without it the scores move)."""
    minder = json.loads((FIXTURE / "minder_scoring.json").read_text())
    result = parity.check_scoring(minder, variants=("nq_defaults",))["nq_defaults"]
    assert result["max_rel_diff_score"] <= TOLERANCE and result["queries_in_seal_order"] == result["queries"] == 50
    unboosted = copy.deepcopy(minder)
    unboosted["query_start"] = None  # the same keys read without MINDER's boost
    moved = max(_first_query_diff(unboosted, q=k) for k in range(5))
    assert moved > 1e3 * TOLERANCE


def test_the_device_scorer_against_seals_code(scoring):
    """`DeviceScorer` (SealSearch.scorer 'device') on the keys and unigram scores SEAL's `aggregate_evidence` was
    given: SEAL's scores within float32 rounding, SEAL's order on all 50 queries, the same documents as the host
    scorer (the two SEAL ranks that only a boundary-crossing key reaches)."""
    # float32 sums of a few dozen terms up to ~300: ~1e-7 relative measured; a key's weight moves a score ≥ 1e-3
    device = parity.check_scoring(scoring, rel=1e-5, variants=("nq_defaults",), device=True)["nq_defaults"]
    host = parity.check_scoring(scoring, variants=("nq_defaults",))["nq_defaults"]
    assert device["max_rel_diff_score"] <= 1e-5 and device["queries_in_seal_order"] == device["queries"] == 50
    for figure in ("documents_compared", "seal_only_documents", "our_only_documents"):
        assert device[figure] == host[figure], figure


def test_two_shapes_are_stored():
    shapes = set()
    for shape in SHAPES:
        fm = json.loads((FIXTURES / shape / "fm_index.json").read_text())
        scoring = json.loads((FIXTURES / shape / "scoring.json").read_text())
        assert (FIXTURES / shape / "minder_scoring.json").is_file()
        shapes.add((len(fm["corpus"]), scoring["corpus"]["vocab_size"]))
    assert len(shapes) == len(SHAPES) >= 2


def test_minders_repeated_key_counts_its_last_weighing_score():
    """MINDER's keys.py passes repeated keys and stores a key's weight only when it is not zero: a repeat whose
    score weighs nothing leaves the earlier score in force (the case d120_v96's query 26 holds)."""
    minder = json.loads((FIXTURES / "d120_v96" / "minder_scoring.json").read_text())
    q = minder["queries"][26]
    scores = [s for g, s in q["ngrams"] if g == [2, 4, 6, 3]]
    assert len(scores) == 2 and scores[0] > scores[1]
    n = int(minder["corpus"]["n_tokens"])
    count = q["seal_counts"][[g for g, _ in q["ngrams"]].index([2, 4, 6, 3])]
    assert weight(scores[0], count, n) > 0 == weight(scores[1], count, n)
    result = parity.check_scoring({**minder, "queries": [q]}, variants=("nq_defaults",))["nq_defaults"]
    assert result["max_rel_diff_score"] <= TOLERANCE and result["queries_in_seal_order"] == 1


def test_mutations_of_each_kind_are_caught():
    names = ["fm_index.docs[0]", "scoring.queries[5].ngram_scores", "scoring.queries[3].unigram_scores",
             "minder_scoring.queries[22].ngram_scores", "minder_scoring.queries[1].unigram_scores"]
    assert parity.mutations(FIXTURE, names=names) == {n: True for n in names}


def test_a_check_too_loose_to_see_a_mutation_exits_1(capsys):
    from tests.conftest import mutation_report

    code, report = mutation_report("seal", FIXTURES / "d120_v96", capsys, 30, 4, tolerance=1e9)
    # a tolerance of 1e9 still sees a changed count or order; a moved score alone is missed
    assert code == 1 and report["missed"] and report["mutations"] == 30


@pytest.mark.slow  # a seeded sample of 100 mutations a shape (~10 s); every one: docs/results.md
@pytest.mark.parametrize("shape", SHAPES)
def test_a_sample_of_mutations_is_caught(shape, capsys):
    from tests.conftest import mutation_report

    code, report = mutation_report("seal", FIXTURES / shape, capsys, 100, 78)
    assert code == 0 and report["missed"] == [] and report["mutations"] == 100, report
