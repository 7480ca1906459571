"""The dynamic-corpora protocol: the command end to end at small scale (BM25, numeric DSI, text DSI, MDGR,
DSI++ replay, SEAL, SEAL++, GenRET), insert == rebuild, the MDGR ranker and docids by hand, published rows, the memory guard."""

import json
import textwrap
from pathlib import Path

import gin
import numpy as np
import pytest

from gr_jax import dynamic as dynamic_cmd
from gr_jax.runtime import gin_utils
from gr_jax.data import demo
from gr_jax.docids.base import DocidTable, FitContext
from gr_jax.docids.embed import TfidfSvdEmbedder
from gr_jax.protocols import dynamic_corpora as dc

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

PROTOCOL = """
load_dataset.demo_docs = 60
run_dynamic.progress = False
run_dynamic.release_programs = False
"""
SMALL = PROTOCOL + """
run_dynamic.max_test_queries_per_part = 8
TRAIN_STEPS = 4
BATCH_SIZE = 16
prepare.vocab_size = 300
train.progress = False
train.log_period = 2
train.checkpoint_period = 100
EvalConfig.batch_size = 32
"""
# The commands of whole methods run D0 and two increments (15 documents each): every step kind, each method's
# insertion twice, in 3 protocol steps instead of the paper's 6.
TWO_PARTS = "run_dynamic.n_parts = 2\n"

GR = {  # a text-docid DSI, MDGR, a numeric-docid DSI with DSI++ (replay, SAM and the generative memory; covers the
    # plain numeric path), SEAL on BART (its authors' network), SEAL on sentence units (Fig. 2), SEAL++ (these two
    # on T5)
    "naive": """
        include 'runs/dynamic.gin'
        include 'experiments/demo/dsi_naive.gin'
        run_dynamic.method = 'gr'
        EvalConfig.compare_bm25 = False
        """,
    "mdgr": """
        include 'experiments/demo/dynamic_mdgr.gin'
        ChunkedPQDocids.k = 8
        TfidfSvdEmbedder.dim = 16
        """,
    "pq_replay": """
        include 'experiments/demo/dynamic_dsi_pp_sam.gin'
        PQDocids.k = 8
        TfidfSvdEmbedder.dim = 16
        Replay.steps = 2
        Replay.batch_size = 8
        """,
    "genret": """
        include 'experiments/demo/dynamic_genret.gin'
        GenretDocids.codes = 8
        genret_objective.iterations = 20
        EvalConfig.num_beams = 4
        """,
    "seal_bart": """
        include 'experiments/demo/dynamic_seal_bart.gin'
        SealSearch.body_length = 3
        SealSearch.title_length = 4
        EvalConfig.num_beams = 4
        """,
    "seal_sentence": """
        include 'experiments/demo/dynamic_seal_sentence.gin'
        SealSearch.query_length = 6
        EvalConfig.num_beams = 4
        """,
    "seal_replay": """
        include 'experiments/demo/dynamic_seal_pp.gin'
        SealSearch.body_length = 3
        SealSearch.title_length = 4
        EvalConfig.num_beams = 4
        Replay.steps = 2
        Replay.batch_size = 8
        """,
}


def _check_outputs(out: Path, method: str, n_parts: int = 5):
    """The files of a run over 60 demo documents: D0 of 30, then `n_parts` increments of equal size."""
    steps, size = n_parts + 1, 30 // n_parts

    def refuse(constant):  # strict JSON: a bare NaN/Infinity is not JSON (null with a reason instead)
        raise AssertionError(f"dynamic.json holds {constant}")

    result = json.loads((out / "dynamic" / "dynamic.json").read_text(), parse_constant=refuse)
    P = np.array([[np.nan if x is None else x for x in row] for row in result["P"]], float)
    assert "P[o][j], j > o" in result["null_means"] and "idbi[0]" in result["null_means"]
    assert P.shape == (steps, steps)
    assert np.isfinite(P[np.tril_indices(steps)]).all() and np.isnan(P[np.triu_indices(steps, 1)]).all()
    assert ((P[np.tril_indices(steps)] >= 0) & (P[np.tril_indices(steps)] <= 1)).all()
    assert result[f"F_{n_parts}"] == pytest.approx(np.mean(np.maximum(P[0, 0] - P[1:, 0], 0)))
    assert result[f"GA_{n_parts}"] == pytest.approx(np.mean(np.diag(P)[1:]))
    assert result["idbi"][0] is None and all(v is not None and -3 <= v <= 1 for v in result["idbi"][1:])
    assert [s["step"] for s in result["steps"]] == list(range(steps))
    timings = json.loads((out / "dynamic_timing.json").read_text())  # kept apart from the results
    assert [t["step"] for t in timings] == list(range(steps))
    assert all(t["rss_mb"] > 0 and t["search_s"] >= 0 and t["compile_s"] >= 0 for t in timings)
    assert all(t["index_compile_s"] >= 0 for t in timings[1:])
    if method not in ("bm25", "dense"):  # a trained system compiles its search at D0 at least
        # compiled, or read back from the tests' persistent compilation cache
        assert timings[0]["compiled_programs"] + timings[0]["cached_programs"] >= 1 and timings[0]["compile_s"] > 0
    assert not any(k in s for s in result["steps"] for k in ("rss_mb", "search_s", "index_s"))
    assert result["parts"] == [30] + [size] * n_parts
    hits = json.loads((out / "dynamic" / "per_query.json").read_text())["hits"]  # what significance tests read
    assert [len(row) for row in hits] == list(range(1, steps + 1))
    for o, row in enumerate(hits):
        for j, h in enumerate(row):
            assert set(h.values()) <= {0, 1}
            assert np.mean(list(h.values())) == pytest.approx(P[o, j], abs=1e-12)
        assert row[0].keys() == hits[0][0].keys()  # the same Q0 queries at every step
    md = (out / "dynamic" / "dynamic.md").read_text()
    assert f"F_{n_parts}" in md and f"GA_{n_parts}" in md and "IDBI" in md and result["method"] in md
    png = (out / "dynamic" / "dynamic.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    return result


@pytest.mark.slow
def test_command_with_bm25(tmp_path, capsys):
    f = tmp_path / "bm25.gin"
    f.write_text("include 'experiments/demo/dynamic_bm25.gin'\n" + PROTOCOL)
    assert dynamic_cmd.main([f"--gin_file={f}", f"--gin.MODEL_DIR='{tmp_path / 'bm25'}'"]) == 0
    result = _check_outputs(tmp_path / "bm25", "bm25")
    assert result["method"] == "bm25" and result["P"][0][0] > 0.5  # BM25 finds most demo documents
    assert "| bm25 |" in capsys.readouterr().out
    # a re-run gives the same results (other timings): it replaces them quietly, no dynamic.prev-1
    gin.clear_config()
    assert dynamic_cmd.main([f"--gin_file={f}", f"--gin.MODEL_DIR='{tmp_path / 'bm25'}'"]) == 0
    assert sorted(p.name for p in (tmp_path / "bm25").iterdir()) == ["dynamic", "dynamic_timing.json"]
    from tests.conftest import run_tool

    rc, out, err = run_tool("dynamic_report", [tmp_path / "bm25", tmp_path / "bm25", "--out", tmp_path / "report"],
                            capsys)
    assert rc == 0, err
    assert out.count("| bm25 |") == 6  # two runs × three tables
    assert (tmp_path / "report" / "report.png").stat().st_size > 5000

    # beside a published table (Table 4's layout), each run labelled with a published row's name
    ours = json.loads((tmp_path / "bm25" / "dynamic" / "dynamic.json").read_text())
    published = tmp_path / "published.json"
    published.write_text(json.dumps({"table4": {"initial": {"n-gram": [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]},
                                                "new": {"n-gram": [0.9, 0.1, 0.2, 0.3, 0.4, 0.5]}}}))
    rc, out, err = run_tool("dynamic_report", [f"n-gram={tmp_path / 'bm25'}", "--out", tmp_path / "t4",
                                               "--published", published, "--table", "table4"], capsys)
    assert rc == 0, err
    lines = out.splitlines()
    new_at = lines.index("Hit@10 on new documents, ours beside the published rows")
    assert "| n-gram | published | 0.900 | 0.100 | 0.200 | 0.300 | 0.400 | 0.500 |" in lines[new_at:]
    assert "| n-gram | ours | " + " | ".join(f"{x:.3f}" for x in ours["new_P_oo"]) + " |" in lines[new_at:]
    assert (tmp_path / "t4" / "report.png").stat().st_size > 5000
    rc, _, err = run_tool("dynamic_report", [f"url={tmp_path / 'bm25'}", "--out", tmp_path / "t4b",
                                             "--published", published, "--table", "table4"], capsys)
    assert rc == 2 and "url: not a row of table4 (it has n-gram)" in err, err
    assert not (tmp_path / "t4b").exists()


def test_the_papers_split_through_the_protocol(tmp_path):
    """split_protocol='paper': Q1..Q5 hold every judged query of their documents, from both query splits."""
    f = tmp_path / "bm25.gin"
    f.write_text("include 'experiments/demo/dynamic_bm25.gin'\n" + PROTOCOL)
    results = {}
    for protocol in ("dataset", "paper"):
        gin.clear_config()
        gin_utils.parse([str(f)], [f"MODEL_DIR = '{tmp_path / protocol}'", f"run_dynamic.split_protocol = '{protocol}'"])
        results[protocol] = gin_utils.call_configured(dc.run_dynamic)
    data = demo.generate(num_docs=60)
    pooled = {**data.qrels["train"], **data.qrels["test"]}
    paper, ours = results["paper"], results["dataset"]
    assert paper["split_protocol"] == "paper" and ours["split_protocol"] == "dataset"
    assert paper["parts"] == ours["parts"]
    split = dc.make_dynamic_data(data, split_protocol="paper").split
    assert sum(paper["test_queries"]) + len(split.train_queries) == len(pooled)
    assert paper["test_queries"][1:] == [len(q) for q in split.test_queries[1:]]
    assert sum(paper["test_queries"][1:]) > sum(ours["test_queries"][1:])  # the training queries of D1..D5 too
    gin.clear_config()
    gin_utils.parse([str(f)], [f"MODEL_DIR = '{tmp_path / 'bad'}'", "run_dynamic.split_protocol = 'papers'"])
    with pytest.raises(dc.ProtocolError, match="split_protocol must be one of"):
        gin_utils.call_configured(dc.run_dynamic)


def test_dense_system_reencodes_new_documents(tmp_path):
    f = tmp_path / "dense.gin"
    f.write_text("include 'experiments/demo/dynamic_dense.gin'\nTfidfSvdEmbedder.dim = 16\n" + PROTOCOL)
    gin_utils.parse([str(f)], [f"MODEL_DIR = '{tmp_path / 'dense'}'"])
    result = gin_utils.call_configured(dc.run_dynamic)
    _check_outputs(tmp_path / "dense", "dense")
    assert result["steps"][-1]["documents"] == 60
    assert result["method"] == "dense-tfidf_svd"  # the embedder names the system in combined reports


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(GR))
def test_command_with_generative_retrievers(tmp_path, name):
    f = tmp_path / f"{name}.gin"
    extra = ""
    if name == "pq_replay":  # DSI++'s generative memory: two pseudo-queries of every document
        memory = tmp_path / "memory.jsonl"
        corpus = demo.generate(num_docs=60).corpus
        memory.write_text("".join(json.dumps({"doc_id": d, "queries": [t[:40], t[-40:]]}) + "\n"
                                  for d, t in zip(corpus.doc_ids, corpus.texts)))
        extra = f"Replay.memory_file = '{memory}'\n"
    if name == "genret":  # one stage per docid position: TRAIN_STEPS a multiple of 3
        extra = "TRAIN_STEPS = 6\n"
    f.write_text(textwrap.dedent(GR[name]) + SMALL + TWO_PARTS + extra)
    assert dynamic_cmd.main([f"--gin_file={f}", f"--gin.MODEL_DIR='{tmp_path / name}'"]) == 0
    result = _check_outputs(tmp_path / name, name, n_parts=2)
    expect = {"naive": "gr-naive", "mdgr": "gr-mdgr", "pq_replay": "gr-pq++", "seal_bart": "gr-seal",
              "seal_sentence": "gr-seal", "seal_replay": "gr-seal++", "genret": "gr-genret"}[name]
    assert result["method"] == expect
    added = [s.get("docids_added") for s in result["steps"][1:]]
    if name == "mdgr":
        assert added == [0] * 2  # constrained expansion: new chunks only reuse D0 docids
    elif name == "genret":  # the trained model decodes every new document (its codes may repeat D0's)
        assert [s["documents"] for s in result["steps"]] == [30, 45, 60]
    else:
        assert sum(added) > 0
    assert (tmp_path / name / "model" / "checkpoints").is_dir()
    if name == "seal_bart":  # the network is the BART its experiment file names
        assert "bart.get_config.name = 'tiny'" in (tmp_path / name / "model" / "config.gin").read_text()
    if name.startswith("seal"):  # every new document enters the substring index: one identifier text each
        assert added == [15] * 2
    if name in ("seal_bart", "seal_sentence"):  # the index kept its shapes (room reserved for every part): the
        # search compiled at D0 (or was read back from the tests' compilation cache) serves the later steps
        timings = json.loads((tmp_path / name / "dynamic_timing.json").read_text())
        assert [t["compiled"].get("jit(_search_impl)", 0) for t in timings[1:]] == [0, 0], timings
    if name in ("seal_replay", "pq_replay"):
        assert sorted(p.name for p in (tmp_path / name / "model" / "replay").iterdir()) == ["D1", "D2"]
    if name == "pq_replay":  # SAM in the D0 training and in the replay; the memory recorded by its digest
        from gr_jax.runtime.provenance import file_digest

        config = (tmp_path / name / "model" / "config.gin").read_text()
        assert "make_optimizer.sam_rho = 0.05" in config and "Replay.sam_rho = 0.05" in config
        replay = tmp_path / name / "model" / "replay"
        metas = [json.loads(m.read_text()) for m in replay.glob("D*/checkpoints/*/meta/metadata")]
        assert metas and all(m["replay"]["memory_file"] == file_digest(memory) for m in metas), metas[:1]


def test_replay_pairs_by_hand(tmp_path):
    """DSI++'s continued training data: new documents at 1 − replay_fraction, a seeded sample of old ones at
    replay_fraction — by their text, or by their pseudo-queries when a generative memory is given."""
    data = dc.make_dynamic_data(demo.generate(num_docs=60, seed=5))
    new_rows = data.part_rows[2]
    r = dc.Replay(replay_fraction=0.5, seed=3)
    parts, rates = dc.replay_pairs(data, new_rows, r, 2)
    assert [p.name for p in parts] == ["indexing", "indexing", "retrieval"] and rates == [0.5, 0.25, 0.25]
    assert parts[0].rows.tolist() == new_rows.tolist()
    assert parts[0].texts == [data.full.corpus.texts[int(i)] for i in new_rows]
    old = parts[1].rows
    assert len(set(old.tolist())) == len(new_rows) == 6 and old.max() < 36  # 0.5 / (1 − 0.5) × 6 of D0 ∪ D1
    assert set(parts[2].rows.tolist()) <= set(old.tolist())  # P0 queries of the replayed documents only
    assert dc.replay_pairs(data, new_rows, r, 2)[0][1].rows.tolist() == old.tolist()  # seeded

    memory = tmp_path / "memory.jsonl"
    corpus = data.full.corpus
    memory.write_text("".join(json.dumps({"doc_id": d, "queries": [f"first {d}", f"second {d}"]}) + "\n"
                              for d in sorted(corpus.doc_ids)[::2]))  # every other document has a memory
    with_memory = dc.Replay(replay_fraction=0.5, seed=3, memory_file=str(memory))
    parts, rates = dc.replay_pairs(data, new_rows, with_memory, 2)
    assert [p.name for p in parts] == ["indexing", "memory-new", "memory-old", "retrieval"]
    assert rates == [0.25, 0.25, 0.25, 0.25]
    remembered = {corpus.index_of(d) for d in sorted(corpus.doc_ids)[::2]}
    for p, rows in ((parts[1], new_rows), (parts[2], old)):
        expect = [i for i in sorted(rows.tolist(), key=lambda i: corpus.doc_ids[i]) if i in remembered]
        assert p.rows.tolist() == [i for i in expect for _ in range(2)]
        assert p.texts == [f"{w} {corpus.doc_ids[i]}" for i in expect for w in ("first", "second")]
    assert with_memory.record()["memory_file"] != str(memory) and "sam_rho" not in with_memory.record()
    assert "memory_file" not in r.record()  # replay runs made before the memory existed still resume

    with pytest.raises(ValueError, match="sam_rho"):
        dc.Replay(sam_rho=-0.1)
    with pytest.raises(dc.ProtocolError, match="memory_file: .*missing.jsonl is not a file"):
        dc.Replay(memory_file=str(tmp_path / "missing.jsonl"))


@pytest.mark.slow
def test_atomic_docids_are_refused(tmp_path):
    f = tmp_path / "atomic.gin"
    f.write_text("include 'runs/dynamic.gin'\ninclude 'experiments/demo/dsi_atomic.gin'\n"
                 "run_dynamic.method = 'gr'\nTRAIN_STEPS = 1\nEvalConfig.compare_bm25 = False\n" + SMALL)
    gin_utils.parse([str(f)], [f"MODEL_DIR = '{tmp_path / 'a'}'"])
    with pytest.raises(dc.ProtocolError, match="docid scheme .atomic. gives every new document a new token"):
        gin_utils.call_configured(dc.run_dynamic)


@pytest.mark.slow
def test_insert_equals_rebuild(tmp_path):
    """Retrieval after inserting D1..D5 one by one equals retrieval over an index built from scratch."""
    from gr_jax.docids.lexical import FieldDocids
    from gr_jax.docids.numeric import PQDocids
    from gr_jax.index.trie import TrieIndex
    from gr_jax.backbones import t5
    from gr_jax.retriever.heads import CodebookHead, TextHead
    from gr_jax.retriever.model import GenerativeRetriever
    from gr_jax.data.vocab import train_sentencepiece
    from gr_jax.evaluation import retrieval
    from gr_jax.data.pipeline import tokenize

    data = dc.make_dynamic_data(demo.generate(num_docs=60, seed=5))
    corpus = data.full.corpus
    vocab = train_sentencepiece(list(corpus.texts) + list(corpus.titles), tmp_path / "v.model", vocab_size=300)
    qids = [q for part in data.split.test_queries for q in part]
    tokens = tokenize([data.test_texts[q] for q in qids], vocab, 32, what="q")
    emb = TfidfSvdEmbedder(dim=16).fit([corpus.texts[r] for r in data.part_rows[0]])
    for scheme, head in ((FieldDocids("title"), TextHead()), (PQDocids(4, 8), CodebookHead(length=4, codes=8))):
        d0 = data.d0.corpus
        scheme.fit(d0, FitContext(embeddings=emb.embed(d0.texts), vocab=vocab))
        tables = [scheme.assign(corpus, rows=r, embeddings=emb.embed([corpus.texts[i] for i in r]))
                  for r in data.part_rows]
        config = t5.get_config("tiny", vocab_size=vocab.size)
        model = GenerativeRetriever(config, head)
        params = model.init_params(seed=1)
        grown = tables[0].index(vocab_size=config.vocab_size) if head.kind == "text" else tables[0].index()
        for t in tables[1:]:
            t.insert_into(grown)
        all_table = DocidTable.concatenate(tables)
        rebuilt = all_table.index(vocab_size=config.vocab_size) if head.kind == "text" else all_table.index()
        assert isinstance(rebuilt, TrieIndex)
        runs = [retrieval.retrieve(model, params, tokens, qids, index, corpus.doc_ids, 10, 32)
                for index in (grown, rebuilt)]
        assert runs[0] == runs[1], scheme.name
        assert any(len(r) == 10 for r in runs[0].values())


def test_summaries_from_published_rows():
    """The command's summarize() on a P matrix holding the published rows reproduces the published F_5/GA_5."""
    tables = json.loads((FIXTURES / "dynamic_corpora_tables.json").read_text())
    t1, t2 = tables["table1_P_o0_and_F5"], tables["table2_P_oo_and_GA5"]
    n = 0
    for method in t1:
        for dataset in t1[method]:
            if method not in t2 or dataset not in t2[method]:
                continue
            P = np.full((6, 6), np.nan)
            P[:, 0] = t1[method][dataset]["hit10_D0_to_D5"]
            P[np.diag_indices(6)] = t2[method][dataset]["hit10_D0_to_D5"]
            P[0, 0] = t1[method][dataset]["hit10_D0_to_D5"][0]
            got = dc.summarize(P)
            assert got["F_5"] == pytest.approx(t1[method][dataset]["summary"], abs=1e-3), (method, dataset)
            assert got["GA_5"] == pytest.approx(t2[method][dataset]["summary"], abs=1e-3), (method, dataset)
            n += 1
    assert n >= 20


def test_memory_guard_stops_a_step_with_a_message(tmp_path):
    guard = dc.MemoryGuard(limit=dc.rss_bytes() + (10 << 20))
    guard.check("small step", 1 << 20)
    with pytest.raises(dc.ProtocolError, match=r"step 3.*needs about 100 MiB.*raise run_dynamic.memory_limit_mb"):
        guard.check("step 3", 100 << 20)
    f = tmp_path / "bm25.gin"
    f.write_text("include 'experiments/demo/dynamic_bm25.gin'\n" + PROTOCOL)
    gin_utils.parse([str(f)], [f"MODEL_DIR = '{tmp_path / 'm'}'", "run_dynamic.memory_limit_mb = 1"])
    with pytest.raises(dc.ProtocolError, match="step 1"):
        gin_utils.call_configured(dc.run_dynamic)
    assert not (tmp_path / "m" / "dynamic").exists()  # nothing half-written


def _write_jsonl_dataset(ds, out: Path, seed=None) -> None:
    """The demo dataset in the `jsonl` layout; with a seed, every file's rows (and every query's judgements)
    in a shuffled order."""
    r = np.random.default_rng(seed)
    perm = (lambda n: r.permutation(n)) if seed is not None else (lambda n: np.arange(n))
    out.mkdir(parents=True)
    c = ds.corpus
    with open(out / "corpus.jsonl", "w") as f:
        for i in perm(len(c)):
            f.write(json.dumps({"id": c.doc_ids[i], "text": c.texts[i], "title": c.titles[i], "url": c.urls[i]}) + "\n")
    for split, queries in ds.queries.items():
        with open(out / f"queries.{split}.jsonl", "w") as f:
            for i in perm(len(queries)):
                f.write(json.dumps({"id": queries.qids[i], "text": queries.texts[i]}) + "\n")
        lines = [f"{q} 0 {d} {g}\n" for q, judged in ds.qrels[split].items() for d, g in judged.items()]
        (out / f"qrels.{split}.tsv").write_text("".join(lines[i] for i in perm(len(lines))))


PERMUTED_SYSTEMS = {
    "bm25": "include 'experiments/demo/dynamic_bm25.gin'\n" + PROTOCOL,
    # one keyword per document: many documents share a docid, so ties between D0 and new documents are common
    "keywords": """
        include 'runs/dynamic.gin'
        include 'experiments/demo/dsi_keywords.gin'
        run_dynamic.method = 'gr'
        EvalConfig.compare_bm25 = False
        KeywordDocids.n = 1
        KeywordDocids.split_collisions = False
        """ + SMALL,
    "mdgr": GR["mdgr"] + SMALL,
}


@pytest.mark.slow
@pytest.mark.parametrize("system", sorted(PERMUTED_SYSTEMS))
def test_permuting_corpus_queries_and_qrels_changes_no_number(tmp_path, system):
    """Shuffling the rows of the corpus, of the query files and of the qrels (hence the order of the documents
    inside D0..D5 too) leaves the P matrix, F_n, GA_n and IDBI unchanged."""
    ds = demo.generate(num_docs=60, seed=0)
    results = []
    for name, seed in (("ordered", None), ("shuffled", 1)):
        _write_jsonl_dataset(ds, tmp_path / f"data_{name}", seed)
        f = tmp_path / f"{system}.gin"
        f.write_text(textwrap.dedent(PERMUTED_SYSTEMS[system]).replace("load_dataset.demo_docs = 60\n", ""))
        gin.clear_config()
        gin_utils.parse([str(f)], [f"MODEL_DIR = '{tmp_path / name}'", "MIXTURE_OR_TASK_NAME = 'jsonl'",
                                   f"DATA_DIR = '{tmp_path / f'data_{name}'}'"])
        results.append(gin_utils.call_configured(dc.run_dynamic))
    a, b = results
    assert np.array_equal(np.array(a["P"]), np.array(b["P"]), equal_nan=True)
    assert a["idbi"] == b["idbi"]
    assert {k: a[k] for k in a if k[:2] in ("F_", "GA")} == {k: b[k] for k in b if k[:2] in ("F_", "GA")}
    assert a["parts"] == b["parts"] == [30, 6, 6, 6, 6, 6]


def test_retrieve_breaks_ties_by_document_id_not_by_row(tmp_path):
    """Documents that share a docid get the docid's score; their order comes from the document ids (trec_eval's:
    descending), so a corpus that lists new documents first or last gives the same run."""
    from gr_jax.docids.base import DocidTable
    from gr_jax.backbones import t5
    from gr_jax.retriever.model import GenerativeRetriever
    from gr_jax.data.vocab import DocidTokenSpace
    from gr_jax.evaluation import retrieval

    model = GenerativeRetriever(t5.get_config("tiny", vocab_size=64, dropout_rate=0.0))
    params = model.init_params(seed=0)
    tokens = np.random.default_rng(0).integers(3, 64, (3, 8)).astype(np.int32)
    seqs = [[5, 6], [5, 6], [7], [5, 6], [7]]  # two docids, shared by three and two documents
    ids = ["d1", "d0", "n4", "n2", "d3"]
    runs = []
    for order in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 4, 1, 3]):
        table = DocidTable.from_lists([seqs[i] for i in order], list(range(5)), DocidTokenSpace("text", 64))
        runs.append(retrieval.retrieve(model, params, tokens, ["q0", "q1", "q2"], table.index(vocab_size=64),
                                     [ids[i] for i in order], num_beams=2, batch_size=2))
    assert runs[0] == runs[1] == runs[2]
    for run in runs[0].values():
        assert set(run) == set(ids)
        assert len({run[d] for d in ("d1", "d0", "n2")}) == 1 and run["n4"] == run["d3"]  # a docid's score each
        from gr_jax.data.trec import ranked

        group = [d for d in ranked(run) if d in ("d1", "d0", "n2")]
        assert group == ["n2", "d1", "d0"]  # ties: document id descending, as trec_eval orders them


@pytest.mark.slow
def test_ltrgr_starts_from_the_minder_trained_on_d0(tmp_path, capsys):
    """LTRGR in the protocol: the MINDER of dynamic_minder.gin trained on D0, then LTRGR from its checkpoint with
    rank data made at the start by that model over D0's training queries; new documents enter the index
    untrained. The commands run as users run them, each in its own process (two protocol runs in the test
    process, after the rest of the suite, once crashed inside XLA's compiler; alone they pass)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]

    def dynamic(gin_file, model_dir):
        return subprocess.run([sys.executable, "-m", "gr_jax.dynamic", f"--gin_file={gin_file}",
                               f"--gin.MODEL_DIR='{model_dir}'"], cwd=root, capture_output=True, text=True,
                              timeout=900)

    short = """
        SealSearch.body_length = 3
        SealSearch.title_length = 4
        SealSearch.query_length = 6
        EvalConfig.num_beams = 4
        """
    minder = tmp_path / "minder.gin"
    minder.write_text("include 'experiments/demo/dynamic_minder.gin'\n" + textwrap.dedent(short) + SMALL + TWO_PARTS)
    res = dynamic(minder, tmp_path / "minder")
    assert res.returncode == 0, res.stderr[-3000:]
    ltrgr = tmp_path / "ltrgr.gin"
    ltrgr.write_text("include 'experiments/demo/dynamic_ltrgr.gin'\n" + textwrap.dedent(short) + SMALL + TWO_PARTS
                     + f"""
INITIAL_CHECKPOINT_PATH = '{tmp_path / 'minder' / 'model'}'
LtrgrPairs.max_queries = 12
LtrgrPairs.num_beams = 4
LTRGR_MARGIN = 1e6
TRAIN_STEPS = 2
BATCH_SIZE = 4
""")
    res = dynamic(ltrgr, tmp_path / "ltrgr")
    assert res.returncode == 0, res.stderr[-3000:]
    result = _check_outputs(tmp_path / "ltrgr", "ltrgr", n_parts=2)
    assert [s.get("docids_added") for s in result["steps"][1:]] == [15] * 2
    logged = [json.loads(line) for line in
              (tmp_path / "ltrgr" / "model" / "train_metrics.jsonl").read_text().splitlines()]
    assert "rank_loss" in logged[-1]  # LTRGR's loss trained it
    ltrgr.write_text(ltrgr.read_text().replace(f"INITIAL_CHECKPOINT_PATH = '{tmp_path / 'minder' / 'model'}'",
                                               "INITIAL_CHECKPOINT_PATH = None"))
    capsys.readouterr()  # refused before anything runs: the command's main in this process
    assert dynamic_cmd.main([f"--gin_file={ltrgr}", f"--gin.MODEL_DIR='{tmp_path / 'none'}'"]) == 2
    err = capsys.readouterr().err
    assert "LTRGR starts from a trained MINDER: set INITIAL_CHECKPOINT_PATH" in err and "Traceback" not in err, err


@pytest.mark.slow
def test_memory_stays_flat_over_the_steps(tmp_path):
    """Resident memory grew with every step (SEAL's 120-document demo run: 1.5 → 3.1 GB over five steps; here,
    a title-docid DSI on 30 documents: +12.7% from step 1 to step 5) while the index stayed small: the programs
    compiled for each step's index shapes were all kept. Now each step's are dropped after it (measured: flat to
    0.1 MB); 5% leaves room for the allocator, a third of what the growth was."""
    f = tmp_path / "dsi.gin"
    f.write_text("include 'experiments/demo/dynamic_dsi_title.gin'\n" + PROTOCOL + """
run_dynamic.release_programs = True
load_dataset.demo_docs = 30
run_dynamic.max_test_queries_per_part = 4
run_dynamic.n_parts = 5
TRAIN_STEPS = 2
BATCH_SIZE = 8
prepare.vocab_size = 200
train.progress = False
train.log_period = 1
EvalConfig.batch_size = 8
EvalConfig.num_beams = 3
""")
    assert dynamic_cmd.main([f"--gin_file={f}", f"--gin.MODEL_DIR='{tmp_path / 'm'}'"]) == 0
    timings = json.loads((tmp_path / "m" / "dynamic_timing.json").read_text())
    rss = [t["rss_mb"] for t in timings]
    assert len(rss) == 6, rss
    assert rss[5] <= 1.05 * rss[1], rss
