"""The robustness protocol: one condition's diagnostics by hand (a PAG-like system with hand-made runs and
planner tokens), the command end to end for BM25 (tables, plots, shared variations reused, a second run
identical, bad settings refused with exit code 2) and for a small trained PAG (SimulOnly, PAG and plan-swap
runs, TokJaccard)."""

import json

import gin
import pytest

from gr_jax import robustness as entry
from gr_jax.protocols import query_variation as R
from tests.shared import copy_of
from tests.methods.seal.small import train_small


PAG_RUNS = ("pag", "simul_only")  # (end-to-end run, planning-only run) of a system with a planner
PLAIN_RUNS = ("gr", None)


def test_condition_diagnostics_by_hand():
    qrels = {"q1": {"d1": 1}, "q2": {"d9": 1}}
    clean = R.Probe({"simul_only": {"q1": {"d1": 3.0, "d2": 2.0}, "q2": {"d9": 5.0, "d8": 1.0}},
                     "pag": {"q1": {"d1": 9.0}, "q2": {"d8": 2.0, "d9": 1.0}}},
                    tokens={"q1": [4, 5, 6], "q2": [7, 8]})
    varied = R.Probe({"simul_only": {"q1": {"d2": 3.0, "d3": 2.0}, "q2": {"d9": 5.0, "d8": 4.0}},
                      "pag": {"q1": {"d3": 9.0, "d1": 8.0}, "q2": {"d9": 2.0}}},
                     tokens={"q1": [4, 9, 10], "q2": [8, 7]})
    swapped = {"q1": {"d1": 1.0}, "q2": {"d9": 1.0}}
    out = R.condition_diagnostics(PAG_RUNS, clean, varied, swapped, qrels, ["MRR@10"], "MRR@10", 1, k=2, ell=3,
                                  percentile=50, delta=0.05, sweep_percentiles=(50,), sweep_deltas=(0.05,))
    pq = out["per_query"]
    # SimulOnly MRR: clean q1 1, q2 1; varied q1 0 (d1 gone), q2 1. PAG: clean q1 1, q2 1/2; varied q1 1/2, q2 1
    assert pq["cand_overlap"] == {"q1": 0.5, "q2": 1.0}  # {d1,d2}∩{d2,d3}; {d9,d8}∩{d9,d8}
    assert pq["tok_jaccard"] == {"q1": pytest.approx(1 / 5), "q2": 1.0}
    assert pq["delta_planning"] == {"q1": -1.0, "q2": 0.0}  # ΔM_SimulOnly = M(q̃) − M(q)
    assert pq["degradation/pag"] == {"q1": 0.5, "q2": -0.5}  # Δ = M(q) − M(q̃)
    assert pq["seq_gain"] == {"q1": 0.5, "q2": 0.0}  # M_PAG(q̃) − M_SimulOnly(q̃)
    assert pq["plan_swap_drop"] == {"q1": -0.5, "q2": 0.0}  # M_PAG(q̃) − M_PAG(q̃; swapped)
    # τ = p50 of {0.5, 1.0} = 0.75: q1 unstable (0.5) and dropped by 1 → collapsed; q2 stable
    assert out["tau"] == 0.75 and pq["collapsed"] == {"q1": 1.0, "q2": 0.0}
    assert out["metrics"]["pag/MRR@10"] == 0.75 and out["metrics"]["simul_only/MRR@10"] == 0.5
    # without a planner: the overlap of the final ranking and its own end-to-end change
    plain = R.condition_diagnostics(PLAIN_RUNS, R.Probe({"gr": clean.runs["pag"]}), R.Probe({"gr": varied.runs["pag"]}),
                                    None, qrels, ["MRR@10"], "MRR@10", 1, 2, 3, 50, 0.05, (50,), (0.05,))
    assert plain["per_query"]["cand_overlap"] == {"q1": 0.5, "q2": 0.5}
    assert plain["per_query"]["tok_jaccard"] is None and "seq_gain" not in plain["per_query"]
    assert plain["per_query"]["delta_planning"] == {"q1": -0.5, "q2": 0.5}


BM25_ARGS = ["--gin_file=experiments/demo/robustness_bm25.gin", "--gin.run_robustness.max_queries=10",
             "--gin.run_robustness.seeds=[5, 27]", "--gin.run_robustness.generators={}"]


@pytest.mark.slow
def test_bm25_command_writes_tables_and_plots_and_reruns_identically(tmp_path, capsys):
    args = BM25_ARGS + [f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'", f"--gin.VARIATIONS_DIR='{tmp_path / 'var'}'"]
    assert entry.main(args) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "Table 6 shape" in printed and "CandOverlap@100" in printed and "collapse rate" in printed
    out = tmp_path / "out"
    result = json.loads((out / "robustness.json").read_text())
    split = result["splits"]["test"]
    assert split["queries"] == 10 and set(split["variations"]) == {"misspelling", "reordering", "synonym",
                                                                    "paraphrase", "naturality"}
    assert split["variations"]["reordering"]["diagnostics"]["cand_overlap"]["mean"] == 1.0  # a bag of words
    assert (out / "cand_overlap_test.png").read_bytes()[:4] == b"\x89PNG"
    assert not (out / "tok_jaccard_test.png").exists()  # no planner
    assert len(list((tmp_path / "var").glob("test.*.jsonl"))) == 10
    assert len(list((out / "runs").glob("test.*.bm25.run"))) == 11
    before = {p.name: p.read_bytes() for p in (tmp_path / "var").iterdir()}
    gin.clear_config()
    assert entry.main(args) == 0
    assert {p.name: p.read_bytes() for p in (tmp_path / "var").iterdir()} == before
    assert not list(tmp_path.rglob("*.prev-*"))  # the same results: nothing set aside
    gin.clear_config()
    capsys.readouterr()
    assert entry.main(args + ["--gin.run_robustness.variations=['typos']"]) == 2
    err = capsys.readouterr().err
    assert "unknown ['typos']" in err and "Traceback" not in err
    gin.clear_config()
    assert entry.main(args[:-2] + [f"--gin.OUTPUT_DIR='{tmp_path / 'new'}'", "--gin.run_robustness.splits=['tst']",
                                   f"--gin.VARIATIONS_DIR='{tmp_path / 'var'}'"]) == 2
    assert "['tst'] not in the dataset" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # refused before anything was written
    gin.clear_config()
    assert entry.main(args + ["--gin.Misspeller.max_edits=1"]) == 2  # the saved misspellings were made with 2
    err = capsys.readouterr().err
    assert "test.misspelling.5.jsonl: the variation set was built with another settings" in err


@pytest.mark.slow
def test_trained_pag_command(tiny_pag, tmp_path, capsys):
    exp, model_dir = tiny_pag
    args = [f"--gin_file={exp}", "--gin_file=runs/robustness.gin", f"--gin.MODEL_DIR='{model_dir}'",
            f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'",
            "--gin.run_robustness.max_queries=6", "--gin.run_robustness.seeds=[5, 27]",
            "--gin.run_robustness.variations=['misspelling', 'reordering']", "--gin.run_robustness.num_beams=4",
            "--gin.run_robustness.k=10", "--gin.run_robustness.ell=20"]
    assert entry.main(args) == 0, capsys.readouterr().err
    out = tmp_path / "out"
    result = json.loads((out / "robustness.json").read_text())
    assert result["system_runs"] == {"primary": "pag", "planning": "simul_only"}
    d = result["splits"]["test"]["variations"]["reordering"]["diagnostics"]
    assert {"cand_overlap", "tok_jaccard", "seq_gain", "plan_swap_drop", "collapsed"} <= set(d)
    assert 0.0 <= d["tok_jaccard"]["mean"] <= 1.0
    assert (out / "tok_jaccard_test.png").exists() and (out / "cand_overlap_test.png").exists()
    assert len(list((out / "runs").glob("test.*.swapped.run"))) == 4
    gin.clear_config()
    capsys.readouterr()
    assert entry.main(args + ["--gin.PagRetriever.mode='seq_only'"]) == 2
    assert "runs PagRetriever in its mode 'pag'" in capsys.readouterr().err  # the model names itself
    gin.clear_config()
    assert entry.main(args + ["--gin.run_robustness.k=50"]) == 2  # planning set of 12 documents
    assert "k = 50 exceeds PagRetriever.planning_size = 12" in capsys.readouterr().err


def _foreign(text: str) -> str:
    """A constructed stand-in for another language: every word spelt backwards (same intent, other surface)."""
    return " ".join(w[::-1] for w in text.split())


@pytest.mark.slow
def test_cross_lingual_settings_and_alignment(tiny_pag, tmp_path, capsys):
    from gr_jax import align_planner as align_entry
    from gr_jax import cross_lingual as xl_entry
    from gr_jax.runtime import gin_utils
    from gr_jax.data import sources

    exp, model_dir = tiny_pag[0], copy_of(tiny_pag[1], tmp_path / "pag")  # the alignment is written into it
    gin_utils.parse([str(exp)], [f"MODEL_DIR = '{model_dir}'"])
    ds = sources.load_dataset("demo")
    gin.clear_config()

    def write(name, split, fn):
        qs = ds.queries[split]
        (tmp_path / name).write_text("".join(f"{q}\t{fn(t)}\n" for q, t in zip(qs.qids, qs.texts)))
        return str(tmp_path / name)

    de_dev, de_train = write("de.dev.tsv", "dev", _foreign), write("de.train.tsv", "train", _foreign)
    english_dev = write("en.dev.tsv", "dev", lambda t: t)  # a perfect translator
    assert align_entry.main([f"--gin_file={exp}", "--gin_file=runs/align_planner.gin", f"--gin.MODEL_DIR='{model_dir}'",
                             "--gin.ALIGN_LANGUAGE='de'", f"--gin.ALIGN_TRAIN_FILE='{de_train}'",
                             f"--gin.ALIGN_DEV_FILE='{de_dev}'", "--gin.align_planner.epochs=2",
                             "--gin.align_planner.learning_rate=1e-3", "--gin.align_planner.batch_size=8",
                             "--gin.align_planner.ell=20"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    gin.clear_config()
    args = [f"--gin_file={exp}", "--gin_file=runs/cross_lingual.gin", f"--gin.MODEL_DIR='{model_dir}'",
            f"--gin.CROSS_LINGUAL_QUERIES={{'de': '{de_dev}'}}", f"--gin.OUTPUT_DIR='{tmp_path / 'xl'}'",
            "--gin.run_cross_lingual.settings=['naive', 'seq_only', 'translate', 'aligned']",
            "--gin.run_cross_lingual.translator=@FileTranslator()", f"--gin.FileTranslator.files={{'de': '{english_dev}'}}",
            f"--gin.run_cross_lingual.aligned_dirs={{'de': '{model_dir / 'aligned' / 'de'}'}}",
            "--gin.run_cross_lingual.num_beams=4", "--gin.run_cross_lingual.k=10", "--gin.run_cross_lingual.ell=20"]
    assert xl_entry.main(args) == 0, capsys.readouterr().err
    assert "Table 9 shape" in capsys.readouterr().out
    result = json.loads((tmp_path / "xl" / "cross_lingual.json").read_text())
    rows = result["languages"]["de"]["settings"]
    assert set(rows) == {"english", "naive", "seq_only", "translate", "aligned"}
    # the perfect translator gives back the English queries: the same plans and the same effectiveness
    assert rows["translate"]["tok_jaccard"] == 1.0 and rows["translate"]["cand_overlap"] == 1.0
    assert rows["translate"]["metrics"] == rows["english"]["metrics"]
    assert rows["naive"]["tok_jaccard"] < 1.0 and "seq_only/MRR@10" in rows["seq_only"]["metrics"]
    assert 0.0 <= rows["aligned"]["tok_jaccard"] <= 1.0
    assert (tmp_path / "xl" / "cross_lingual.png").read_bytes()[:4] == b"\x89PNG"
    gin.clear_config()
    capsys.readouterr()
    assert xl_entry.main(args[:5] + ["--gin.run_cross_lingual.settings=['translate']"]) == 2
    assert "needs run_cross_lingual.translator" in capsys.readouterr().err
    gin.clear_config()
    assert xl_entry.main(args + ["--gin.run_cross_lingual.k=50"]) == 2
    assert "k = 50 exceeds PagRetriever.planning_size = 12" in capsys.readouterr().err


@pytest.mark.slow
def test_align_planner_killed_mid_run_resumes_to_the_same_files_and_keeps_a_whole_earlier_result(
        tiny_pag, tmp_path):
    """Reliability: `python -m gr_jax.align_planner` killed (-9) as it saves its second epoch's checkpoint, then the
    same command → it resumes from the first epoch's checkpoint (the training loop's) and ends with the files of
    an uninterrupted run, byte for byte; a re-run with other settings trains anew and keeps the earlier
    parameters *with* the report that describes them (aligned/de.prev-1/)."""
    import hashlib
    import os
    import shutil
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from gr_jax.data import sources
    from gr_jax.methods.pag.model_aligned import META_FILE, PARAMS_FILE

    root = Path(__file__).resolve().parents[2]
    exp, trained = tiny_pag
    gin.clear_config()
    qs = {s: sources.load_dataset("demo").queries[s] for s in ("train", "dev")}
    files = {}
    for split, q in qs.items():
        files[split] = tmp_path / f"de.{split}.tsv"
        files[split].write_text("".join(f"{i}\t{_foreign(t)}\n" for i, t in zip(q.qids, q.texts)))

    def command(model_dir, *extra):
        return [sys.executable, "-m", "gr_jax.align_planner", f"--gin_file={exp}", "--gin_file=runs/align_planner.gin",
                f"--gin.MODEL_DIR='{model_dir}'", "--gin.ALIGN_LANGUAGE='de'",
                f"--gin.ALIGN_TRAIN_FILE='{files['train']}'", f"--gin.ALIGN_DEV_FILE='{files['dev']}'",
                "--gin.align_planner.epochs=2", "--gin.align_planner.learning_rate=1e-3",
                "--gin.align_planner.batch_size=8", "--gin.align_planner.ell=20", *extra]

    def copy(name):
        dest = tmp_path / name
        shutil.copytree(trained, dest, ignore=shutil.ignore_patterns("aligned"))
        return dest

    env = {k: v for k, v in os.environ.items() if k != "GR_JAX_FAULT"}
    whole = copy("whole")
    res = subprocess.run(command(whole), cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    killed = copy("killed")
    res = subprocess.run(command(killed), cwd=root, env={**env, "GR_JAX_FAULT": "checkpoint:2:kill"},
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == -signal.SIGKILL, res.stderr[-3000:]
    res = subprocess.run(command(killed), cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed from" in res.stderr and "at step" in res.stderr, res.stderr[-3000:]
    assert (killed / "aligned" / "de" / PARAMS_FILE).read_bytes() == (whole / "aligned" / "de" / PARAMS_FILE).read_bytes()
    got, want = (json.loads((d / "aligned" / "de" / META_FILE).read_text()) for d in (killed, whole))
    assert got.pop("teacher")["step"] == want.pop("teacher")["step"]  # the teacher's model_dir differs
    # the logged mean losses are float32 sums whose last digit XLA's CPU reductions may change between
    # processes (the parameters above are bit-identical): compared to 1e-5 of their size
    for a, b in zip(got.pop("history"), want.pop("history")):
        assert a == pytest.approx(b, rel=1e-5)
    assert got == want
    # no temporaries left: the output and the loop's run directory (its checkpoints) beside it
    assert not [p.name for p in (killed / "aligned").iterdir() if p.name != "de" and not p.name.startswith("de.training-")]

    res = subprocess.run(command(killed, "--gin.align_planner.epochs=1"), cwd=root, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    kept = killed / "aligned" / "de.prev-1"
    assert sorted(p.name for p in kept.iterdir()) == sorted([PARAMS_FILE, META_FILE])
    assert (kept / PARAMS_FILE).read_bytes() == (whole / "aligned" / "de" / PARAMS_FILE).read_bytes()
    meta = json.loads((kept / META_FILE).read_text())
    assert meta["epochs"] == 2 and meta["params_digest"] == hashlib.blake2b((kept / PARAMS_FILE).read_bytes(),
                                                                             digest_size=12).hexdigest()
    assert json.loads((killed / "aligned" / "de" / META_FILE).read_text())["epochs"] == 1


def test_dense_system_is_order_invariant_under_a_bag_of_words_embedder(tmp_path):
    """A TF-IDF + SVD embedder ignores word order: reordered queries retrieve the same top-K with the same
    effectiveness (overlap 1, degradation 0), while misspellings move them."""
    from gr_jax.docids.embed import TfidfSvdEmbedder

    result = R.run_robustness(task="demo", system="dense", output_dir=str(tmp_path / "out"), max_queries=12,
                              seeds=(5,), variations=("reordering", "misspelling"), embedder=TfidfSvdEmbedder(dim=16),
                              k=20, depth=20, progress=False)
    v = result["splits"]["test"]["variations"]
    assert v["reordering"]["diagnostics"]["cand_overlap"]["mean"] == pytest.approx(1.0)
    assert v["reordering"]["diagnostics"]["degradation/dense"]["mean"] == pytest.approx(0.0, abs=1e-12)
    assert v["misspelling"]["diagnostics"]["cand_overlap"]["mean"] < 1.0
    assert result["system_runs"] == {"primary": "dense", "planning": None}




@pytest.mark.slow
def test_trained_seal_command(tmp_path, capsys):
    """The protocol runs on SEAL (substring index, intersective scoring; on BART, its authors' network) like on any
    retriever."""
    exp, _ = train_small(tmp_path, "m", "experiments/demo/seal_bart.gin", 4)
    args = [f"--gin_file={exp}", "--gin_file=runs/robustness.gin", f"--gin.MODEL_DIR='{tmp_path / 'm'}'",
            f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'", "--gin.run_robustness.max_queries=6",
            "--gin.run_robustness.seeds=[5]", "--gin.run_robustness.variations=['misspelling', 'reordering']",
            "--gin.run_robustness.num_beams=4", "--gin.run_robustness.k=10"]
    assert entry.main(args) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "SealRetriever(views=body,title" in printed  # the system names itself in the report
    result = json.loads((tmp_path / "out" / "robustness.json").read_text())
    assert result["system_runs"] == {"primary": "gr", "planning": None}
    split = result["splits"]["test"]
    assert split["queries"] == 6 and set(split["variations"]) == {"misspelling", "reordering"}
    overlap = split["variations"]["reordering"]["diagnostics"]["cand_overlap"]["mean"]
    assert 0.0 <= overlap <= 1.0
    runs = sorted(p.name for p in (tmp_path / "out" / "runs").glob("test.*.gr.run"))
    assert len(runs) == 3  # clean + two variations × one seed
    assert all((tmp_path / "out" / "runs" / r).read_text().strip() for r in runs)  # SEAL ranked something
