"""`python -m gr_jax.reproduce --paper P --released DIR`: the shipped release files, the table by hand, a bad
request refused before anything runs, and (slow tier) tiny GLEN, PAG and SEAL-layout releases end to end: the
table's "ours" is the metric of the run file the evaluation wrote, a second run reuses everything, a changed
release file is imported again with the earlier import kept."""

import json
import logging
from pathlib import Path

import pytest

from gr_jax import reproduce as cmd
from gr_jax.data import trec
from gr_jax.evaluation import metrics
from gr_jax.protocols import released
from gr_jax.runtime import gin_utils
from tests.protocols import released_helpers as helpers


def test_shipped_release_files_load_and_name_existing_experiment_files():
    papers = sorted(p.stem for p in (Path(gin_utils.GIN_CONFIGS) / "released").glob("*.json"))
    assert {"glen", "pag", "nci", "seal"} <= set(papers)
    for name in papers:
        rel = released.load_release(name)
        for s in rel.systems.values():
            for f in s["gin"]:
                gin_utils.resolve(f)  # raises for a file that does not exist
            for e in s["evaluate"]:
                for r in e["rows"]:
                    assert r["published"] is None or 0 < r["published"] < 1, (name, r)
                    assert 0 < r["tolerance"] < 0.1


def test_the_table_by_hand():
    rel = released.Release("toy", Path("toy.json"), {"systems": {
        "A": {"evaluate": [{"split": "dev", "num_beams": 10, "rows": [
            {"metric": "Hit@1", "published": 0.5, "tolerance": 0.01, "source": "T1"},
            {"metric": "Hit@10", "published": 0.8, "tolerance": 0.01, "source": "T1"},
            {"metric": "MRR@10", "published": None, "tolerance": 0.01, "source": "none"}]}]},
        "B": {"evaluate": [{"split": "dev", "num_beams": 10, "rows": [
            {"metric": "Hit@1", "published": 0.3, "tolerance": 0.01, "source": "T1"}]}]}}})
    status = {"A": {"status": "ran", "evaluations": [{"metrics": {"Hit@1": 0.505, "Hit@10": 0.78, "MRR@10": 0.6},
                                                      "num_beams": 10, "queries": 100}]},
              "B": {"status": "failed", "stage": "import", "log": "x.log", "last_line": "error: no"}}
    rows = released.table_rows(rel, status)
    assert [(r["system"], r["metric"], r["within"]) for r in rows] == [
        ("A", "Hit@1", True), ("A", "Hit@10", False), ("A", "MRR@10", None), ("B", "Hit@1", None)]
    assert rows[0]["delta"] == pytest.approx(0.005) and rows[1]["delta"] == pytest.approx(-0.02)
    text = released.markdown(rel, rows, status)
    assert "| A | dev | 100 | 10 | Hit@10 (T1) | 0.8000 | 0.7800 | -0.0200 | ±0.0100 | **no** |" in text
    assert "| A | dev | 100 | 10 | MRR@10 (none) | — | 0.6000 | — | ±0.0100 | — |" in text
    assert "B: failed at its import (error: no; log: x.log)" in text


def test_a_missing_release_file_is_named_with_where_to_get_it(tmp_path):
    (tmp_path / "glen").mkdir()
    with pytest.raises(released.ReproduceError, match=r"MODEL = .*glen/model \(GLEN's released phase-2") as e:
        released.reproduce_released("glen", str(tmp_path), str(tmp_path / "out"))
    assert "Released checkpoints" in str(e.value)
    assert not (tmp_path / "out").exists()  # nothing ran
    with pytest.raises(released.ReproduceError, match="papers with released checkpoints"):
        released.reproduce_released("nope", str(tmp_path), str(tmp_path / "o"))
    with pytest.raises(released.ReproduceError, match="--only"):
        released.reproduce_released("glen", str(tmp_path), str(tmp_path / "o"), only=["DSI"])


def _ours_from_the_run(model_dir: Path, split: str, qrels) -> dict:
    run = trec.read_run(model_dir / "runs" / f"{split}.step0.run")
    return metrics.evaluate(run, qrels, ["Hit@1", "Hit@10", "MRR@100"])


@pytest.mark.slow  # starts the import and evaluation processes
def test_a_tiny_glen_release_end_to_end(tmp_path, capsys, caplog):
    from gr_jax.data import readers

    caplog.set_level(logging.INFO, logger="gr_jax.protocols.released")
    rdir = tmp_path / "release"
    helpers.glen_release(rdir)
    # the command's refusals: exit 2 before anything runs
    assert cmd.main(["--paper", "glen", "--released", str(rdir), "--quick", f"--gin.OUTPUT_DIR='{tmp_path / 'o'}'"]) == 2
    assert "--quick and --rerun do not apply" in capsys.readouterr().err
    assert cmd.main(["--paper", "glen", "--released", str(tmp_path / "none"), f"--gin.OUTPUT_DIR='{tmp_path / 'o'}'"]) == 2
    assert "not a folder" in capsys.readouterr().err
    flags = ["--paper", "glen", "--released", str(rdir), f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'",
             *helpers.GLEN_TINY, "--gin.EvalConfig.num_beams=4"]
    assert cmd.main(flags) == 1  # a random network is far from GLEN's numbers: rows outside the tolerance
    out, err = capsys.readouterr()
    assert "GLEN dev Hit@1: ours" in err and "outside ±0.01" in err
    table = json.loads((tmp_path / "out" / "released_glen.json").read_text())["rows"]
    assert [r["metric"] for r in table] == ["Hit@1", "Hit@10", "MRR@100"]
    assert all(r["beams"] == 4 and r["paper_beams"] == 100 and r["queries"] == 40 for r in table)
    model_dir = tmp_path / "out" / "released" / "GLEN"
    qrels = readers.read_nq320k_nci(rdir / "nq320k").qrels["dev"]
    expect = _ours_from_the_run(model_dir, "dev", qrels)
    for r in table:  # "ours" is the measure of the run file the evaluation wrote
        assert r["ours"] == pytest.approx(expect[r["metric"]], abs=1e-12)
        assert r["delta"] == pytest.approx(r["ours"] - r["published"])
        assert f"| {r['ours']:.4f} |" in out

    # again: everything reused, the same table
    caplog.clear()
    assert cmd.main(flags) == 1
    assert "GLEN: reused" in caplog.text
    assert json.loads((tmp_path / "out" / "released_glen.json").read_text())["rows"] == table

    # a stored evaluation edited while its recipe still matches: its content digest tells, so it is evaluated
    # again (the file named, the edited one kept aside), never printed as ours
    done = model_dir / "released" / "evaluation_0.json"
    held = json.loads(done.read_text())
    held["evaluation"]["metrics"] = {k: 0.999 for k in held["evaluation"]["metrics"]}
    done.write_text(json.dumps(held))
    caplog.clear()
    assert cmd.main(flags) == 1
    assert str(done) in caplog.text and "evaluating again" in caplog.text
    assert json.loads((tmp_path / "out" / "released_glen.json").read_text())["rows"] == table
    assert "0.9990" not in capsys.readouterr().out
    assert [p.name for p in done.parent.glob("evaluation_0.json.prev-*")] == ["evaluation_0.json.prev-1"]

    # a released file changed: imported again, the earlier import kept aside
    text = (rdir / "glen" / "docids.tsv").read_text().splitlines()
    (rdir / "glen" / "docids.tsv").write_text("\n".join(text[:1] + text[2:] + text[1:2]) + "\n")
    caplog.clear()
    assert cmd.main(flags) == 1
    assert "the earlier import is kept as" in caplog.text
    assert list((tmp_path / "out" / "released").glob("GLEN.prev-*"))


@pytest.mark.slow
def test_tiny_pag_and_seal_layout_releases_print_their_tables(tmp_path, capsys):
    pag_dir = tmp_path / "pag_release"
    bindings = helpers.pag_release(pag_dir)
    # the shipped release file with its first and its DL 19 evaluation (each evaluation is a process: DL 20 repeats
    # DL 19's path), found first through --gin_search_paths
    spec = json.loads((Path(gin_utils.GIN_CONFIGS) / "released" / "pag.json").read_text())
    spec["systems"]["PAG"]["evaluate"] = spec["systems"]["PAG"]["evaluate"][:2]
    (tmp_path / "search" / "released").mkdir(parents=True)
    (tmp_path / "search" / "released" / "pag.json").write_text(json.dumps(spec))
    assert cmd.main(["--paper", "pag", "--released", str(pag_dir), f"--gin.OUTPUT_DIR='{tmp_path / 'p'}'",
                     *bindings, "--gin.EvalConfig.num_beams=4", f"--gin_search_paths={tmp_path / 'search'}"]) == 1
    rows = json.loads((tmp_path / "p" / "released_pag.json").read_text())["rows"]
    assert [(r["split"], r["metric"]) for r in rows] == [
        ("dev", "MRR@10"), ("dev", "Recall@10"), ("dl19", "nDCG@10"), ("dl19", "Recall@10")]
    assert all(r["ours"] is not None and 0 <= r["ours"] <= 1 for r in rows)
    assert "±0.0200" in capsys.readouterr().out

    seal_dir = tmp_path / "seal_release"
    seal_dir.mkdir()
    bindings = helpers.seal_release(tmp_path, seal_dir)
    assert cmd.main(["--paper", "seal", "--only", "SEAL", "--released", str(seal_dir),
                     f"--gin.OUTPUT_DIR='{tmp_path / 's'}'", *bindings]) == 1
    rows = json.loads((tmp_path / "s" / "released_seal.json").read_text())["rows"]
    assert [r["metric"] for r in rows] == ["Answer@5", "Answer@20", "Answer@100"]
    # answer accuracy of the run file, by hand: q1's answer is in d1's text, q2's in d3's
    run = trec.read_run(tmp_path / "s" / "released" / "SEAL" / "runs" / "test.step0.run")
    gold = {"q1": "d1", "q2": "d3"}
    at5 = sum(gold[q] in trec.ranked(run.get(q, {}))[:5] for q in gold) / 2
    assert rows[0]["ours"] == pytest.approx(at5)


@pytest.mark.slow
def test_a_tiny_nci_release_runs_their_weights(tmp_path):
    """NCI's Lightning checkpoint (the parity fixture's weights, written by NCI's own code) through the command: the
    run file's first document of every query is the one their model, read directly from those weights, ranks first."""
    from gr_jax.data import readers
    from gr_jax.data.pipeline import tokenize
    from gr_jax.data.vocab import load_vocabulary
    from gr_jax.docids.base import FitContext
    from gr_jax.methods.nci import parity as nci_parity
    from gr_jax.methods.nci import released as nci

    rdir = tmp_path / "release"
    bindings = helpers.nci_release(rdir)
    assert cmd.main(["--paper", "nci", "--released", str(rdir), f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'",
                     *bindings]) == 1
    rows = json.loads((tmp_path / "out" / "released_nci.json").read_text())["rows"]
    assert [r["metric"] for r in rows] == ["Hit@1", "Hit@10", "MRR@100"] and all(r["ours"] is not None for r in rows)
    run = trec.read_run(tmp_path / "out" / "released" / "NCI" / "runs" / "dev.step0.run")

    fixture = Path(helpers.__file__).resolve().parents[1] / "fixtures" / "nci_parity" / "v10_d32"
    model, params = nci_parity.fixture_model(*nci_parity._read(fixture)[:3])
    ds = readers.read_nq320k_nci(rdir / "nq320k")
    table = nci.NciDocids(codes=10, positions=5).fit(ds.corpus, FitContext(extras=ds.extras)).assign(ds.corpus)
    vocab = load_vocabulary(str(rdir / "t5-large" / "spiece.model"))
    qs = ds.queries["dev"]
    qids = sorted(q for q in qs.qids if q in ds.qrels["dev"])
    text = dict(zip(qs.qids, qs.texts))
    ranked = model.predict_documents(params, tokenize([text[q] for q in qids], vocab, 24),
                                     table.index(vocab_size=model.config.vocab_size), 4, keys=list(ds.corpus.doc_ids))
    expect = {q: ds.corpus.doc_ids[docs[0][0]] for q, docs in zip(qids, ranked) if docs}
    assert expect and {q: trec.ranked(run[q])[0] for q in expect} == expect
