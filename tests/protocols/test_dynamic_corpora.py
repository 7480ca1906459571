"""The dynamic-corpora protocol: the command end to end at small scale (BM25, numeric DSI, text DSI, MDGR,
DSI++ replay), insert == rebuild, the MDGR ranker and docids by hand, published rows, the memory guard."""

import json
import textwrap
from pathlib import Path

import gin
import numpy as np
import pytest

from gr_jax import dynamic as dynamic_cmd
from gr_jax import gin_utils
from gr_jax.data import demo
from gr_jax.data.readers import Corpus
from gr_jax.decoding import rankers
from gr_jax.docids.base import DocidTable, FitContext, load_scheme_state, save_scheme
from gr_jax.docids.chunked import ChunkedPQDocids
from gr_jax.docids.embed import TfidfSvdEmbedder
from gr_jax.protocols import dynamic_corpora as dc

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

PROTOCOL = """
load_dataset.demo_docs = 60
run_dynamic.progress = False
"""
SMALL = PROTOCOL + """
TRAIN_STEPS = 4
BATCH_SIZE = 16
prepare.vocab_size = 300
train.progress = False
train.log_period = 2
train.checkpoint_period = 100
EvalConfig.batch_size = 32
"""

GR = {  # a text-docid DSI, MDGR, and a numeric-docid DSI with DSI++ replay (covers the plain numeric path)
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
        include 'experiments/demo/dynamic_dsi_pp.gin'
        PQDocids.k = 8
        TfidfSvdEmbedder.dim = 16
        Replay.steps = 2
        Replay.batch_size = 8
        """,
}


def _check_outputs(out: Path, method: str):
    result = json.loads((out / "dynamic" / "dynamic.json").read_text())
    P = np.array(result["P"], float)
    assert P.shape == (6, 6)
    assert np.isfinite(P[np.tril_indices(6)]).all() and np.isnan(P[np.triu_indices(6, 1)]).all()
    assert ((P[np.tril_indices(6)] >= 0) & (P[np.tril_indices(6)] <= 1)).all()
    assert result["F_5"] == pytest.approx(np.mean(np.maximum(P[0, 0] - P[1:, 0], 0)))
    assert result["GA_5"] == pytest.approx(np.mean(np.diag(P)[1:]))
    assert result["idbi"][0] is None and all(v is not None and -3 <= v <= 1 for v in result["idbi"][1:])
    assert [s["step"] for s in result["steps"]] == list(range(6))
    assert all(s["rss_mb"] > 0 and s["search_s"] >= 0 for s in result["steps"])
    assert result["parts"] == [30, 6, 6, 6, 6, 6]
    md = (out / "dynamic" / "dynamic.md").read_text()
    assert "F_5" in md and "GA_5" in md and "IDBI" in md and result["method"] in md
    png = (out / "dynamic" / "dynamic.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    return result


def test_command_with_bm25(tmp_path, capsys):
    f = tmp_path / "bm25.gin"
    f.write_text("include 'experiments/demo/dynamic_bm25.gin'\n" + PROTOCOL)
    assert dynamic_cmd.main([f"--gin_file={f}", f"--gin.MODEL_DIR='{tmp_path / 'bm25'}'"]) == 0
    result = _check_outputs(tmp_path / "bm25", "bm25")
    assert result["method"] == "bm25" and result["P"][0][0] > 0.5  # BM25 finds most demo documents
    assert "| bm25 |" in capsys.readouterr().out
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "tools/dynamic_report.py", str(tmp_path / "bm25"), str(tmp_path / "bm25"),
                          "--out", str(tmp_path / "report")], cwd=root, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("| bm25 |") == 6  # two runs × three tables
    assert (tmp_path / "report" / "report.png").stat().st_size > 5000


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
    f.write_text(textwrap.dedent(GR[name]) + SMALL)
    assert dynamic_cmd.main([f"--gin_file={f}", f"--gin.MODEL_DIR='{tmp_path / name}'"]) == 0
    result = _check_outputs(tmp_path / name, name)
    expect = {"naive": "gr-naive", "mdgr": "gr-mdgr", "pq_replay": "gr-pq++"}[name]
    assert result["method"] == expect
    added = [s.get("docids_added") for s in result["steps"][1:]]
    if name == "mdgr":
        assert added == [0] * 5  # constrained expansion: new chunks only reuse D0 docids
    else:
        assert sum(added) > 0
    assert (tmp_path / name / "model" / "checkpoints").is_dir()


def test_atomic_docids_are_refused(tmp_path):
    f = tmp_path / "atomic.gin"
    f.write_text("include 'runs/dynamic.gin'\ninclude 'experiments/demo/dsi_atomic.gin'\n"
                 "run_dynamic.method = 'gr'\nTRAIN_STEPS = 1\nEvalConfig.compare_bm25 = False\n" + SMALL)
    gin_utils.parse([str(f)], [f"MODEL_DIR = '{tmp_path / 'a'}'"])
    with pytest.raises(dc.ProtocolError, match="atomic docids give every new document a new token"):
        gin_utils.call_configured(dc.run_dynamic)


@pytest.mark.slow
def test_insert_equals_rebuild(tmp_path):
    """Retrieval after inserting D1..D5 one by one equals retrieval over an index built from scratch."""
    from gr_jax.docids.lexical import FieldDocids
    from gr_jax.docids.numeric import PQDocids
    from gr_jax.index.trie import TrieIndex
    from gr_jax.models import t5
    from gr_jax.models.heads import CodebookHead, TextHead
    from gr_jax.models.retriever import GenerativeRetriever
    from gr_jax.vocab import train_sentencepiece
    from gr_jax import compose
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
        runs = [compose.retrieve(model, params, tokens, qids, index, corpus.doc_ids, 10, 32)
                for index in (grown, rebuilt)]
        assert runs[0] == runs[1], scheme.name
        assert any(len(r) == 10 for r in runs[0].values())


def test_mdgr_ranker_by_hand():
    # beams best first; each beam's docid leads to the documents listed (a chunk code shared by documents)
    beams = [[7, 3], [3], [5], [7]]
    got = rankers.mdgr(beams, lam=1.0)
    # doc 7: coverage 2, 1/1 + 1/4 → 3.25; doc 3: coverage 2, 1/1 + 1/2 → 3.5; doc 5: 1 + 1/3 → 1.333
    assert [d for d, _ in got] == [3, 7, 5]
    assert [s for _, s in got] == pytest.approx([3.5, 3.25, 1 + 1 / 3])
    # λ = 0: coverage only; a tie (7 and 3 both cover 2) goes by the document key, descending (trec_eval's order)
    assert rankers.mdgr(beams, lam=0.0) == [(7, 2.0), (3, 2.0), (5, 1.0)]
    keys = {3: "doc-b", 7: "doc-a", 5: "doc-c"}  # with document ids as keys, 3 ("doc-b") now comes first
    assert rankers.mdgr(beams, lam=0.0, keys=keys) == [(3, 2.0), (7, 2.0), (5, 1.0)]
    # λ large: the ranking term decides; 7 (1 + 1/4) > 3 (1 + 1/2)? no: 3 has 1.5 > 7's 1.25
    assert [d for d, _ in rankers.mdgr(beams, lam=100.0)] == [3, 7, 5]
    # a document listed twice under one beam counts once for it
    assert rankers.mdgr([[2, 2]], lam=1.0) == [(2, 2.0)]
    assert rankers.first_occurrence(beams, [-0.1, -0.5, -0.7, -0.9]) == [(7, -0.1), (3, -0.1), (5, -0.7)]
    assert rankers.first_occurrence(beams, [-0.1, -0.5, -0.7, -0.9], keys) == [(3, -0.1), (7, -0.1), (5, -0.7)]
    with pytest.raises(ValueError, match="MDGRRanker.lam must be ≥ 0"):
        rankers.MDGRRanker(lam=-1.0)


def test_rankers_on_device_arrays_match_per_query_lists():
    """The model's rankers take the beams' documents as arrays for a whole batch (invalid slots and beams
    included) and give what the per-query definitions give."""
    rng = np.random.default_rng(4)
    B, N, P = 5, 7, 3
    docs = rng.integers(0, 9, (B, N, P))
    valid = rng.random((B, N, P)) < 0.6
    valid[:, 5:] = False  # fewer valid beams than N
    beam_scores = -np.sort(rng.random((B, N)), axis=1).cumsum(axis=1)
    def first(beams, scores):  # written here from the definitions, sharing no code with rankers.py
        out = {}
        for docs_n, score in zip(beams, scores):
            for x in docs_n:
                out.setdefault(x, score)
        return out

    def formula8(beams, lam):
        out = {}
        for rank, docs_n in enumerate(beams, start=1):
            for x in set(docs_n):
                out[x] = out.get(x, 0.0) + 1.0 + lam / rank
        return out

    for ranker in (rankers.FirstOccurrence(), rankers.MDGRRanker(lam=0.5)):
        q, d, s = ranker(docs, valid, beam_scores)
        assert len(set(zip(q.tolist(), d.tolist()))) == len(q)  # each (query, document) once
        for b in range(B):
            beams = [docs[b, n][valid[b, n]].tolist() for n in range(5)]
            want = (formula8(beams, 0.5) if isinstance(ranker, rankers.MDGRRanker)
                    else first(beams, beam_scores[b, :5].tolist()))
            got = {int(x): float(y) for x, y in zip(d[q == b], s[q == b])}
            assert got == pytest.approx(want), b


class _Words:
    """A word-level 'vocabulary' so chunk windows are easy to check by hand."""

    def __init__(self, texts):
        words = sorted({w for t in texts for w in t.split()})
        self.ids = {w: i + 2 for i, w in enumerate(words)}
        self.words = {i: w for w, i in self.ids.items()}
        self.size = len(words) + 2

    def encode(self, text):
        return [self.ids.get(w, 1) for w in text.split()]

    def decode(self, ids):
        return " ".join(self.words.get(i, "?") for i in ids)


def test_mdgr_docids_chunks_constrained_expansion_and_state(tmp_path):
    ds = demo.generate(num_docs=40, seed=7)
    d0 = Corpus(ds.corpus.doc_ids[:30], ds.corpus.texts[:30])
    vocab = _Words(list(ds.corpus.texts) + ["a b c d e f g"])
    s = ChunkedPQDocids(window=4, stride=2, m=2, k=8, embedder=TfidfSvdEmbedder(dim=8))
    s.bind(vocab)
    assert s.chunks("a b c d e f g") == ["a b c d", "c d e f", "d e f g"]  # the last window reaches the end
    assert s.chunks("a b") == ["a b"]
    s.fit(d0, FitContext(vocab=vocab))
    table0 = s.assign(d0)
    allowed = {tuple(c) for c in s.allowed.tolist()}
    assert {tuple(table0.sequence(i)) for i in range(len(table0))} == allowed  # D0 docids are the D0 set
    assert table0.space.kind == "codebook" and table0.space.length == 2 and table0.sequences.max() < 8
    (pairs,) = s.training_pairs()  # MDGR's chunk objective
    texts, owners, idx = pairs.texts, pairs.rows, pairs.docid_index
    assert pairs.name == "chunk" and len(texts) == len(owners) == len(idx) and (table0.doc_rows[idx] == owners).all()
    new = s.assign(ds.corpus, rows=range(30, 40))
    assert {tuple(new.sequence(i)) for i in range(len(new))} <= allowed  # constrained expansion
    free = ChunkedPQDocids(window=4, stride=2, m=2, k=8, constrain=False, embedder=TfidfSvdEmbedder(dim=8))
    free.fit(d0, FitContext(vocab=vocab))
    np.testing.assert_array_equal(free.assign(d0).sequences, table0.sequences)  # same codes for D0
    single = ChunkedPQDocids(window=4, stride=2, m=2, k=8, multi_docid=False, embedder=TfidfSvdEmbedder(dim=8))
    one = single.fit(d0, FitContext(vocab=vocab)).assign(d0)
    assert len(one) == 30 and sorted(one.doc_rows.tolist()) == list(range(30))
    save_scheme(s, tmp_path / "s")
    back = load_scheme_state(ChunkedPQDocids(embedder=TfidfSvdEmbedder()), tmp_path / "s")
    back.bind(vocab)
    assert back.window == 4 and back.m == 2
    np.testing.assert_array_equal(back.assign(ds.corpus, rows=range(30, 40)).sequences, new.sequences)
    with pytest.raises(ValueError, match="k = 100000 clusters but only"):
        ChunkedPQDocids(window=4, stride=2, k=100000, embedder=TfidfSvdEmbedder(dim=8)).fit(d0, FitContext(vocab=vocab))


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
    from gr_jax.models import t5
    from gr_jax.models.retriever import GenerativeRetriever
    from gr_jax.vocab import DocidTokenSpace
    from gr_jax import compose

    model = GenerativeRetriever(t5.get_config("tiny", vocab_size=64, dropout_rate=0.0))
    params = model.init_params(seed=0)
    tokens = np.random.default_rng(0).integers(3, 64, (3, 8)).astype(np.int32)
    seqs = [[5, 6], [5, 6], [7], [5, 6], [7]]  # two docids, shared by three and two documents
    ids = ["d1", "d0", "n4", "n2", "d3"]
    runs = []
    for order in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 4, 1, 3]):
        table = DocidTable.from_lists([seqs[i] for i in order], list(range(5)), DocidTokenSpace("text", 64))
        runs.append(compose.retrieve(model, params, tokens, ["q0", "q1", "q2"], table.index(vocab_size=64),
                                     [ids[i] for i in order], num_beams=2, batch_size=2))
    assert runs[0] == runs[1] == runs[2]
    for run in runs[0].values():
        assert set(run) == set(ids)
        assert len({run[d] for d in ("d1", "d0", "n2")}) == 1 and run["n4"] == run["d3"]  # a docid's score each
        from gr_jax.data.trec import ranked

        group = [d for d in ranked(run) if d in ("d1", "d0", "n2")]
        assert group == ["n2", "d1", "d0"]  # ties: document id descending, as trec_eval orders them
