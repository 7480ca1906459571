"""Few-Shot GR: the docid bank (dedup policies, add/remove, order independence, resume), the writer's length
limits, and retrieval checked against an oracle that scores every bank docid with the full forward pass (no
cache, no shared prefix, no beam search). A tiny random Llama with a small byte-level BPE tokenizer trained
on the demo corpus (lm_helpers.tiny_lm_context) stands in for the pretrained LM
(tests/backbones/test_smollm2.py uses the real one)."""

import json

import numpy as np
import pytest

from gr_jax.runtime.provenance import records_text

import jax
import jax.numpy as jnp

from gr_jax.data import batches, demo
from gr_jax.methods.fewshot import model as fewshot
from gr_jax.methods.fewshot import command as fewshot_gr
from gr_jax.backbones.lm import clean_text


@pytest.fixture
def lm(tiny_lm):
    """The session's tiny LM and its demo dataset (tests/conftest.py), read-only."""
    return tiny_lm


def test_bank_dedup_policies_by_hand():
    bank = fewshot.DocidBank()
    # added in the order b, a, c: ownership must not depend on it
    bank.add(["b", "a", "c"], [[[1, 2], [4]], [[1, 2], [3]], [[], [5], [5]]], str,
             [["qb"], ["qa"], ["qc"]])
    pairs, rep = bank.resolve("first")
    assert pairs == [("a", [1, 2]), ("a", [3]), ("b", [4]), ("c", [5])]
    assert (rep["generated"], rep["empty"], rep["repeated_within_document"], rep["shared"]) == (7, 1, 1, 1)
    pairs, rep = bank.resolve("drop")
    assert pairs == [("a", [3]), ("b", [4]), ("c", [5])] and rep["documents_without_docid"] == []
    first_only, rep = bank.resolve("first", per_document=1)  # k = 0 of each document
    assert first_only == [("a", [1, 2])] and rep["documents_without_docid"] == ["b", "c"]
    other = fewshot.DocidBank()
    other.add(["c", "a", "b"], [[[], [5], [5]], [[1, 2], [3]], [[1, 2], [4]]], str, [["qc"], ["qa"], ["qb"]])
    assert other.resolve("first") == bank.resolve("first")
    # removing the owner hands the shared docid to the next document id; adding a present document is refused
    assert bank.remove(["a"]) == 2
    assert bank.resolve("first")[0] == [("b", [1, 2]), ("b", [4]), ("c", [5])]
    with pytest.raises(ValueError, match="already in the docid bank"):
        bank.add(["b"], [[[9]]], str, [["q"]])
    with pytest.raises(ValueError, match="dedup policy"):
        bank.resolve("keep_all")


def test_bank_index_and_files(tmp_path):
    bank = fewshot.DocidBank(built_from={"lm": "x"})
    bank.add(["d1", "d2"], [[[5, 6], [7]], [[5, 8]]], str, [["q1", "q1b"], ["q2"]])
    index, rep = bank.index({"d1": 0, "d2": 1}, vocab_size=10, end_id=9)
    assert rep["docids"] == 3
    np.testing.assert_array_equal(index.lookup([[5, 6, 9], [7, 9], [5, 8, 9]]) >= 0, [True, True, True])
    assert index.lookup([[5, 9]])[0] < 0  # a prefix of a docid is not a docid
    with pytest.raises(ValueError, match="not in the corpus"):
        bank.index({"d1": 0}, vocab_size=10, end_id=9)
    path = tmp_path / "bank.jsonl"
    bank.save(path)
    again = fewshot.DocidBank.load(path)
    assert again.records == bank.records and again.built_from == {"lm": "x"}
    path.write_text(path.read_text().splitlines()[0] + "\n{\"doc_id\": \"d1\"}\n")
    with pytest.raises(ValueError, match="bank.jsonl: its rows are not the ones it was written with"):
        fewshot.DocidBank.load(path)


@pytest.mark.slow
def test_writer_respects_lengths_and_is_deterministic(lm):
    ctx, d = lm
    texts = list(d.corpus.texts[:3])
    for inputs in ("document", "pseudo_queries"):
        w = fewshot.DocidWriter(num_docids=4, min_tokens=3, max_tokens=6, inputs=inputs, batch_size=2)
        docids, sources = w.write(ctx, texts)
        assert len(docids) == 3 and all(len(x) == 4 for x in docids)
        stops = set(ctx.line_stops)
        for per_doc in docids:
            for tokens in per_doc:
                assert 3 <= len(tokens) <= 6 and not stops & set(tokens)
        assert w.write(ctx, texts) == (docids, sources)
        if inputs == "pseudo_queries":
            assert all(len(s) == 4 and all(isinstance(q, str) and q for q in s) for s in sources)


@pytest.mark.slow
def test_pseudo_query_docids_are_each_querys_own_greedy_continuation(lm):
    """The paper's mode writes a docid from each pseudo-query greedily, its prompts batched by length: every
    docid must be the greedy continuation of its own query's prompt, found here by full forward passes (no
    cache, no batch, no shared prefix)."""
    ctx, d = lm
    texts = list(d.corpus.texts[:3])
    w = fewshot.DocidWriter(num_docids=3, min_tokens=2, max_tokens=5, inputs="pseudo_queries", batch_size=2)
    docids, sources = w.write(ctx, texts)
    lengths = {len(w._docid_prompt_tokens(ctx, q)) for qs in sources for q in qs}
    assert len(lengths) > 1  # prompts of several lengths: the batches are not in document order
    prefix, stops = ctx.encode(w.prompt.prefix()), set(ctx.line_stops)
    # one compiled forward pass: each sequence padded on the right to a multiple of 64 (a causal LM: what follows a
    # position does not change its logits), so the oracle compiles once or twice, not once a length
    forward = jax.jit(lambda p, x: ctx.model.apply({"params": p}, x))

    def last_logits(seq):
        x = np.zeros((1, -(-len(seq) // 64) * 64), np.int32)
        x[0, :len(seq)] = seq
        return np.array(forward(ctx.params, jnp.asarray(x))[0, len(seq) - 1])

    for per_doc, queries in zip(docids, sources):
        for tokens, query in zip(per_doc, queries):
            # the prompt of the paper's Fig. 1 as the module docstring spells it, each piece tokenized on its own
            seq = (prefix + ctx.encode("Query: ") + ctx.encode(clean_text(query)) + ctx.encode("\n")
                   + ctx.encode("Identifier:"))
            want = []
            for step in range(w.max_tokens):
                logits = last_logits(seq)
                if step < w.min_tokens:
                    logits[sorted(stops)] = -np.inf
                tok = int(np.argmax(logits))
                if tok in stops:
                    break
                want.append(tok)
                seq.append(tok)
            assert list(tokens) == want, query


def _oracle_scores(ctx, retriever, query_text, docids):
    """log p(docid tokens, newline | few-shot prefix, query slot, ':') by a full forward pass of each sequence,
    all of them in one batch padded on the right to a multiple of 64 (a causal LM: padding after a position does
    not change its logits; few shapes, so the forward pass compiles once or twice, not once a sequence)."""
    prefix = ctx.encode(retriever.prompt.prefix())
    row = retriever.query_tokens([query_text])[0]
    prompt = prefix + [int(t) for t in row if t >= 0] + [retriever.start_token]
    seqs = [prompt + list(tokens) + [ctx.newline_id] for tokens in docids]
    length = -(-max(map(len, seqs)) // 64) * 64
    batch = np.zeros((len(seqs), length), np.int32)
    for i, seq in enumerate(seqs):
        batch[i, :len(seq)] = seq
    logits = np.asarray(_forward(ctx.model)(ctx.params, jnp.asarray(batch)), np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    return np.array([sum(logp[i, len(prompt) - 1 + j, t] for j, t in enumerate(seq[len(prompt):]))
                     for i, seq in enumerate(seqs)])


_FORWARD: dict = {}


def _forward(model):
    """The model's forward pass, jitted once per model object."""
    if id(model) not in _FORWARD:
        _FORWARD[id(model)] = (model, jax.jit(lambda params, tokens: model.apply({"params": params}, tokens)))
    return _FORWARD[id(model)][1]


def test_retrieval_equals_exhaustive_oracle(lm):
    ctx, d = lm
    bank = fewshot.DocidBank()
    rng = np.random.default_rng(0)
    docs = [f"doc{i}" for i in range(5)]
    # docids sharing prefixes, of different lengths, two per document
    gen = [[list(rng.integers(20, 60, size=rng.integers(1, 4))) + [int(i)] for _ in range(2)] for i in range(5)]
    gen[1][0] = gen[0][0][:-1] + [77]  # a sibling of doc0's first docid
    bank.add(docs, gen, str, [["s"]] * 5)
    index, rep = bank.index({x: i for i, x in enumerate(docs)}, ctx.model.config.vocab_size, ctx.newline_id)
    retriever = fewshot.FewShotRetriever(ctx)
    queries = list(d.queries["test"].texts[:3])
    q, rows, scores = retriever.rank(retriever.params, retriever.query_tokens(queries), index, num_beams=16)
    pairs, _ = bank.resolve()
    for b, text in enumerate(queries):
        oracle = _oracle_scores(ctx, retriever, text, [t for _, t in pairs])
        best = {}
        for (doc, _), s in zip(pairs, oracle):
            best[doc] = max(best.get(doc, -np.inf), s)
        got = {docs[int(r)]: float(s) for qq, r, s in zip(q, rows, scores) if qq == b}
        assert set(got) == set(best)  # beams ≥ docids: every document is found
        for doc, s in best.items():  # scores relative to their size (sums of ~6 log-probabilities in float32)
            assert got[doc] == pytest.approx(s, rel=1e-4, abs=1e-4)


def test_build_bank_resumes_and_ignores_corpus_order(lm, tmp_path):
    from gr_jax.data.readers import Corpus

    ctx, d = lm
    ids, texts = list(d.corpus.doc_ids[:6]), list(d.corpus.texts[:6])
    w = fewshot.DocidWriter(num_docids=2, min_tokens=2, max_tokens=4, inputs="document", batch_size=2)
    built = {"lm": "tiny", "writer": w.settings(), "demonstrations": (("q", "d"),)}  # tuples: JSON gives lists
    whole = tmp_path / "whole.jsonl"
    fewshot_gr.build_bank(ctx, Corpus(ids, texts), w, whole, built, progress=False)
    perm = [3, 0, 5, 1, 4, 2]
    shuffled = tmp_path / "shuffled.jsonl"
    fewshot_gr.build_bank(ctx, Corpus([ids[i] for i in perm], [texts[i] for i in perm]), w, shuffled, built,
                          progress=False)
    assert fewshot.DocidBank.load(shuffled).resolve() == fewshot.DocidBank.load(whole).resolve()
    # interrupted after two of three batches: the resumed file equals the uninterrupted one
    lines = whole.read_text().splitlines()
    part = tmp_path / "part.jsonl"
    # what a run stopped after two batches leaves: the file as it saved it then (whole, with its row digest)
    head = {k: v for k, v in json.loads(lines[0]).items() if k not in ("rows", "rows_digest")}
    part.write_text(records_text(head, [json.loads(line) for line in lines[1:1 + 2 * 2 * 2]]))
    fewshot_gr.build_bank(ctx, Corpus(ids, texts), w, part, built, progress=False)

    def without_timing(text: str) -> list:  # the header's generation seconds are a timing, not a result
        head, *rows = text.splitlines()
        head = json.loads(head)
        head["stats"].pop("generation_seconds")
        return [head, *rows]

    assert without_timing(part.read_text()) == without_timing(whole.read_text())
    with pytest.raises(ValueError, match="whole.jsonl: the docid bank was built with another writer"):
        fewshot_gr.build_bank(ctx, Corpus(ids, texts), w, whole, {**built, "writer": {"num_docids": 3}},
                              progress=False)


def test_restrict_keeps_queries_about_kept_documents():
    d = demo.generate(num_docs=40, seed=2)
    sub = batches.restrict(d, 10)
    keep = set(sorted(d.corpus.doc_ids)[:10])
    assert set(sub.corpus.doc_ids) == keep
    for split, qrels in sub.qrels.items():
        assert all(set(rel) <= keep for rel in qrels.values())
        assert set(sub.queries[split].qids) == set(qrels)
        assert len(qrels) == sum(1 for rel in d.qrels[split].values() if set(rel) <= keep)
    assert batches.restrict(d, 0) is d


def test_writer_settings_errors():
    with pytest.raises(ValueError, match="'pseudo_queries', 'document' or 'title'"):
        fewshot.DocidWriter(inputs="titles")
    with pytest.raises(ValueError, match="num_docids = 1"):
        fewshot.DocidWriter(inputs="title")  # a title is one docid
    with pytest.raises(ValueError, match="min_tokens"):
        fewshot.DocidWriter(min_tokens=5, max_tokens=3)
    assert json.dumps(fewshot.DocidWriter().settings())  # recorded in the bank header: JSON-serialisable


def test_docid_texts_of_each_kind():
    import importlib.util
    from pathlib import Path

    from gr_jax.docids.base import DocidTable
    from gr_jax.data.vocab import DocidTokenSpace

    spec = importlib.util.spec_from_file_location(
        "docid_stats", Path(__file__).resolve().parents[3] / "tools" / "docid_stats.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)

    class Vocab:  # ids 3.. spell letters
        size = 30

        def decode(self, ids):
            return "".join(chr(ord("a") + i - 3) for i in ids)

    code = DocidTable.from_lists([[4, 0, 17], [2, 2, 2]], [0, 1], DocidTokenSpace.codebook(3, 20))
    assert tool.docid_texts(code, Vocab()) == ["4-0-17", "2-2-2"]
    text = DocidTable.from_lists([[3, 4, 5], [7, 8]], [0, 1], DocidTokenSpace("text", 30))
    assert tool.docid_texts(text, Vocab()) == ["abc", "ef"]
    atomic = DocidTable.from_lists([[30 + 12], [30 + 5]], [0, 1], DocidTokenSpace.above_text(30, 40))
    assert tool.docid_texts(atomic, Vocab()) == ["12", "5"]


@pytest.mark.slow
@pytest.mark.torch
def test_fewshot_command_runs_reuses_its_bank_and_refuses_another(tiny_hf_llama, tmp_path, capsys):
    """python -m gr_jax.fewshot on a tiny random HF Llama directory (with the tokenizer trained above)."""
    import gin

    from gr_jax import fewshot as entry

    hf = tiny_hf_llama
    args = ["--gin_file=experiments/demo/fewshot_smollm2.gin", f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
            f"--gin.LM='{hf}'", "--gin.run_fewshot.max_documents=6", "--gin.DocidWriter.num_docids=2",
            "--gin.DocidWriter.max_tokens=4", "--gin.DocidWriter.inputs='document'",
            "--gin.run_fewshot.bank_sizes=[1, 2]", "--gin.run_fewshot.num_beams=3"]
    assert entry.main(args) == 0
    out = capsys.readouterr().out
    assert "Few-Shot GR, n = 1" in out and "Few-Shot GR, n = 2" in out and "BM25" in out
    result = json.loads((tmp_path / "run" / "fewshot.json").read_text())
    assert set(result["bank_sizes"]) == {"1", "2"} and result["documents"] == 6
    from gr_jax.data.trec import read_qrels

    qrels = read_qrels(tmp_path / "run" / "runs" / "test.qrels")  # the evaluated queries, for other systems
    assert len(qrels) == result["queries"] and all(qrels.values())
    bank_file = tmp_path / "run" / "docid_bank.jsonl"
    first = bank_file.read_text()
    assert len(first.splitlines()) == 1 + 6 * 2
    gin.clear_config()
    assert entry.main(args) == 0  # the bank is reused, not written again: same file, same table
    assert bank_file.read_text() == first
    assert json.loads((tmp_path / "run" / "fewshot.json").read_text())["bank_sizes"] == result["bank_sizes"]
    gin.clear_config()
    capsys.readouterr()
    assert entry.main(args + ["--gin.DocidWriter.temperature=0.5"]) == 2
    err = capsys.readouterr().err
    assert "docid_bank.jsonl: the docid bank was built with another writer" in err and "Traceback" not in err
    gin.clear_config()
    # another batch size: other batches, other seeds, so other samples (`data.batches`)
    assert entry.main(args + ["--gin.DocidWriter.batch_size=4"]) == 2
    assert "docid_bank.jsonl: the docid bank was built with another writer" in capsys.readouterr().err
    assert bank_file.read_text() == first
    gin.clear_config()
    assert entry.main(args + ["--gin.run_fewshot.bank_sizes=[1, 5]"]) == 2
    assert "bank_sizes must lie in 1..DocidWriter.num_docids (2)" in capsys.readouterr().err


def test_title_docids_and_training_demonstrations(lm):
    """Few-Shot GR with titles as docids: nothing is generated (a document's docid is its title, tokenized as the
    prompt's docids are), and the demonstrations are training queries with their titles, chosen by a hash of the
    query ids — the same whatever the order of the query file."""
    import dataclasses as dc

    from gr_jax.data.readers import Dataset, QuerySet

    ctx, data = lm
    writer = fewshot.DocidWriter(inputs="title", num_docids=1)
    titles = list(data.corpus.titles[:3])
    docids, sources = writer.write(ctx, list(data.corpus.texts[:3]), titles=titles)
    assert docids == [[ctx.encode(" " + t)] for t in titles] and sources == [[t] for t in titles]
    with pytest.raises(ValueError, match="title"):
        writer.write(ctx, list(data.corpus.texts[:2]), titles=["a", ""])
    demos = fewshot.train_demonstrations(data, 3)
    title_of = dict(zip(data.corpus.doc_ids, data.corpus.titles))
    text_of = dict(zip(data.queries["train"].qids, data.queries["train"].texts))
    for q, t in demos:
        assert t in set(title_of.values()) and q in {" ".join(x.split()) for x in text_of.values()}
    # another order of the same queries: the same demonstrations
    qs = data.queries["train"]
    rev = QuerySet(list(reversed(qs.qids)), list(reversed(qs.texts)))
    shuffled = Dataset(data.corpus, {**data.queries, "train": rev}, data.qrels, extras=data.extras)
    assert fewshot.train_demonstrations(shuffled, 3) == demos
    assert fewshot.train_demonstrations(data, 0) == ()
    with pytest.raises(ValueError, match="judged queries"):
        fewshot.train_demonstrations(data, 10 ** 6)
    prompt = dc.replace(fewshot.FewShotPrompt(), demonstrations=demos)
    assert all(f"Identifier: {t}\n" in prompt.prefix() for _, t in demos)
