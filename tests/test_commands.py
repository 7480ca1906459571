"""Each command's library function at tiny size, in-process (the default tier's share of the entry points): what
`python -m gr_jax.<command>` calls after parsing its flags — `gin_utils.parse` of the same files and bindings,
then `gin_utils.call_configured` — on a few demo documents. The commands themselves, with their flags, exit codes
and output locks, run in the slow tier (tests/test_bad_inputs.py, tests/reliability/, tests/protocols/, ...).

In the slow tier only, as each needs a trained system of a kind no other default-tier test compiles:
`gr_jax.cross_lingual` (a trained PAG; below, marked slow), `gr_jax.align_planner` (it trains the aligned planner:
tests/protocols/test_query_variation.py), `gr_jax.methods.seal.rank_data` (a trained MINDER:
tests/methods/seal/test_training_ltrgr.py) and `gr_jax.t5x.checkpoints` (a t5x run: tests/t5x/test_adapter.py); the default
tier tests their parts (the alignment loss, the LTRGR loss, the t5x model in-process). `gr_jax.eval`,
`gr_jax.dynamic`, `gr_jax.reproduce` and `gr_jax.t5x.pretrained` have their functions tested in
tests/evaluation/, tests/protocols/ and tests/t5x/."""

from __future__ import annotations

import json

import gin
import pytest

from gr_jax import compose
from gr_jax.runtime import gin_utils
from tests.shared import copy_of


def _call(files, bindings, fn):
    gin.clear_config()
    gin_utils.parse([str(f) for f in files], bindings)
    try:
        return gin_utils.call_configured(fn)
    finally:
        gin.clear_config()


def test_train(tiny_dsi):
    """`gr_jax.train`: the session's TINY DSI was trained by `compose.train` (tests/conftest.py `tiny_dsi`);
    here, what that left in MODEL_DIR."""
    _, model = tiny_dsi
    assert sorted(p.name for p in (model / "checkpoints").iterdir()) == ["2"]
    steps = [json.loads(line)["step"] for line in (model / "train_metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    final = json.loads((model / "final_metrics.json").read_text())
    assert final["steps"] == 2 and final["queries"] > 0
    assert all(0.0 <= v <= 1.0 for v in final["metrics"].values())
    run = (model / "runs" / "test.step2.run").read_text().splitlines()
    assert run and len({line.split()[0] for line in run}) == final["queries"]
    assert (model / "config.gin").is_file() and (model / "vocabulary").is_dir() and (model / "docid_scheme").is_dir()


def test_infer(tiny_dsi, tmp_path):
    """`gr_jax.infer` with runs/eval.gin on the dev split of a copy of the TINY DSI: a run and its metrics."""
    exp, shared = tiny_dsi
    model = copy_of(shared, tmp_path / "m")
    out = _call([exp, "runs/eval.gin"], [f"MODEL_DIR = '{model}'", "EvalConfig.num_beams = 3"], compose.infer)
    assert out["step"] == 2 and (model / "runs" / "dev.step2.run").is_file()
    assert all(0.0 <= v <= 1.0 for v in out["metrics"].values())


def test_infer_searches_with_the_experiments_beams(tiny_dsi, tmp_path):
    """`gr_jax.infer --gin_file=runs/infer.gin --gin_file=<experiment with EvalConfig.num_beams = 100>` searches
    with 100 beams (runs/infer.gin used to bind NUM_BEAMS = 10 over the experiment's value without a word); the
    same setting bound on the command line under two names with different values is refused, naming both."""
    exp, shared = tiny_dsi
    model = copy_of(shared, tmp_path / "m")
    wide = tmp_path / "wide.gin"
    wide.write_text(f"include '{exp}'\nEvalConfig.num_beams = 100\n")
    out = _call(["runs/infer.gin", wide], [f"MODEL_DIR = '{model}'"], compose.infer)
    assert out["num_beams"] == 100
    per_query: dict[str, int] = {}
    for line in (model / "runs" / "dev.step2.run").read_text().splitlines():
        per_query[line.split()[0]] = per_query.get(line.split()[0], 0) + 1
    assert max(per_query.values()) > 10  # more documents than 10 beams (or TINY's 3) can return
    with pytest.raises(gin_utils.GinConfigError) as e:
        _call(["runs/infer.gin", wide], [f"MODEL_DIR = '{model}'", "NUM_BEAMS = 20", "EvalConfig.num_beams = 30"],
              compose.infer)
    assert "NUM_BEAMS = 20" in str(e.value) and "EvalConfig.num_beams = 30" in str(e.value)


def test_robustness(tmp_path):
    """`gr_jax.robustness` with BM25: one variation and one seed of 8 test queries."""
    from gr_jax.protocols import query_variation

    out = _call(["experiments/demo/robustness_bm25.gin"],
                [f"OUTPUT_DIR = '{tmp_path / 'out'}'", f"VARIATIONS_DIR = '{tmp_path / 'var'}'",
                 "run_robustness.max_queries = 8", "run_robustness.seeds = [5]",
                 "run_robustness.variations = ['reordering']", "run_robustness.generators = {}"],
                query_variation.run_robustness)
    assert out is not None
    result = json.loads((tmp_path / "out" / "robustness.json").read_text())
    assert set(result["splits"]["test"]["variations"]) == {"reordering"}


def test_pseudo_queries(tiny_hf_llama, tmp_path):
    """`gr_jax.pseudo_queries` with a tiny random HF Llama as the LM: one query for each of 3 documents."""
    from gr_jax.protocols import lm_pseudo_queries

    out = _call(["experiments/demo/pseudo_queries_smollm2.gin"],
                [f"MODEL_DIR = '{tmp_path / 'run'}'", f"LM = '{tiny_hf_llama}'",
                 "write_pseudo_queries.max_documents = 3", "write_pseudo_queries.num_queries = 1",
                 "PseudoQueryGenerator.max_query_tokens = 3"], lm_pseudo_queries.write_pseudo_queries)
    assert out["documents"] == 3 and out["queries"] == 3


def test_fewshot(tiny_hf_llama, tmp_path):
    """`gr_jax.fewshot`: a bank of one docid for each of 4 documents, then retrieval at bank size 1."""
    from gr_jax.methods.fewshot import command

    out = _call(["experiments/demo/fewshot_smollm2.gin"],
                [f"MODEL_DIR = '{tmp_path / 'run'}'", f"LM = '{tiny_hf_llama}'", "run_fewshot.max_documents = 4",
                 "DocidWriter.num_docids = 1", "DocidWriter.min_tokens = 1", "DocidWriter.max_tokens = 3",
                 "DocidWriter.inputs = 'document'", "run_fewshot.bank_sizes = [1]", "EvalConfig.num_beams = 2",
                 "run_fewshot.compare_bm25 = False"], command.run_fewshot)
    assert out is not None
    result = json.loads((tmp_path / "run" / "fewshot.json").read_text())
    assert set(result["bank_sizes"]) == {"1"} and result["documents"] == 4


@pytest.mark.slow
def test_cross_lingual(tiny_pag, tmp_path):
    """`gr_jax.cross_lingual` in its naive setting on the session's small PAG, with queries whose words are
    reversed. (`gr_jax.align_planner`, which trains the aligned setting's planner, and the other settings run in
    the slow tier: tests/protocols/test_query_variation.py.)"""
    from gr_jax.data import sources
    from gr_jax.protocols import language_shift

    exp, model = tiny_pag
    qs = sources.load_dataset("demo").queries["dev"]
    dev = tmp_path / "de.dev.tsv"
    dev.write_text("".join(f"{q}\t{' '.join(w[::-1] for w in t.split())}\n" for q, t in zip(qs.qids, qs.texts)))
    out = _call([exp, "runs/cross_lingual.gin"],
                [f"MODEL_DIR = '{model}'", f"CROSS_LINGUAL_QUERIES = {{'de': '{dev}'}}",
                 f"OUTPUT_DIR = '{tmp_path / 'xl'}'", "run_cross_lingual.settings = ['naive']",
                 "EvalConfig.num_beams = 4", "run_cross_lingual.k = 10", "run_cross_lingual.ell = 20",
                 "run_cross_lingual.max_queries = 12"], language_shift.run_cross_lingual)
    assert out is not None
    rows = json.loads((tmp_path / "xl" / "cross_lingual.json").read_text())["languages"]["de"]["settings"]
    assert {"english", "naive"} <= set(rows) and 0.0 <= rows["naive"]["tok_jaccard"] <= 1.0
