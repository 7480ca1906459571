"""PAG through the composition: a small PAG trained by `train` (set + sequential prefix objectives), evaluated in
its three modes by `infer`; PAG's released artefacts (HF model directory, the two docid_to_tokenids.json files,
raw.tsv queries) imported and evaluated, equal to the model built directly from the same files; a changed
docid file refused by name."""

import json

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import tool


TRAIN = """
include 'runs/train.gin'
include 'models/t5_tiny.gin'
MIXTURE_OR_TASK_NAME = 'demo'
load_dataset.demo_docs = 40
BATCH_SIZE = 8
TASK_FEATURE_LENGTHS = {'inputs': 24, 'targets': 3}
TRAIN_STEPS = 6
prepare.vocab_size = 300
prepare.docid_scheme = @PagDocids()
PagDocids.levels = 3
PagDocids.k = 8
PagDocids.set_size = 6
prepare.embedder = @TfidfSvdEmbedder()
TfidfSvdEmbedder.dim = 8
prepare.model_fn = @PagRetriever
prepare.score_mode = 'raw'
PagRetriever.planning_size = 10
PagRetriever.objective = @PagObjective()
prepare.objectives_config = @PagObjectives()
t5.get_config.dropout_rate = 0.0
make_optimizer.learning_rate = 3e-3
train.optimizer = @make_optimizer()
train.progress = False
train.checkpoint_period = 6
EvalConfig.num_beams = 4
train.eval_config = @EvalConfig()
"""


# the PAG the session trains once (tests/conftest.py `tiny_pag`): TRAIN with planning sets of 12 and no final
# evaluation (later bindings win in gin); tests/protocols/test_query_variation.py reads it too
SHARED = TRAIN + """
PagRetriever.planning_size = 12
train.final_eval = False
"""


@pytest.mark.slow
def test_pag_trains_and_evaluates_in_every_mode(tiny_pag, tmp_path, capsys):
    from gr_jax import infer as infer_cmd
    from tests.shared import copy_of

    exp, model_dir = tiny_pag[0], copy_of(tiny_pag[1], tmp_path / "m")  # infer writes runs into it
    lines = [json.loads(x) for x in (model_dir / "train_metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["step"] == 6
    assert all(np.isfinite(x["set_loss"]) and np.isfinite(x["seq_loss"]) for x in lines)
    metrics = {}
    for mode in ("pag", "seq_only", "simul_only", "pag_unguided"):
        gin.clear_config()
        assert infer_cmd.main([f"--gin_file={exp}", "--gin_file=runs/eval.gin", f"--gin.MODEL_DIR='{tmp_path / 'm'}'",
                               "--gin.NUM_BEAMS=4", f"--gin.PagRetriever.mode='{mode}'"]) == 0, capsys.readouterr().err
        out = json.loads(capsys.readouterr().out)
        assert out["model"].startswith(f"PagRetriever(mode={mode!r}")
        metrics[mode] = out["metrics"]
    assert all(0.0 <= v <= 1.0 for m in metrics.values() for v in m.values())
    # the run of each mode was kept: three earlier results next to the last one
    assert len(list((tmp_path / "m" / "runs").glob("dev.step6.run.prev-*"))) == 3


def _msmarco_layout(tmp_path, corpus, queries, qrels):
    d = tmp_path / "data"
    (d / "dev_queries").mkdir(parents=True)
    (d / "collection.tsv").write_text("".join(f"{i}\t{t}\n" for i, t in zip(corpus.doc_ids, corpus.texts)))
    (d / "dev_queries" / "raw.tsv").write_text("".join(f"{q}\t{t}\n" for q, t in zip(queries.qids, queries.texts)))
    (d / "dev_qrels.tsv").write_text("".join(f"{q} 0 {doc} {g}\n" for q, docs in qrels.items()
                                             for doc, g in docs.items()))
    return d


@pytest.mark.slow
def test_released_pag_artefacts_import_and_evaluate(tmp_path, capsys):
    """PAG's artefacts made here from a random tiny model: imported by gr_jax/import_checkpoint.py and evaluated
    by `gr_jax.infer` (raw.tsv queries, both JSON docid files); the run equals the one of a PagRetriever built
    directly from the HF directory and the JSON files; a docid file changed after the import is refused."""
    from gr_jax import infer as infer_cmd
    from gr_jax.data.pipeline import tokenize
    from gr_jax.data.sources import load_dataset
    from gr_jax.methods.pag import docids as pag_docids
    from gr_jax.backbones import t5, t5_convert
    from gr_jax.methods.pag import model as pag
    from gr_jax.data.vocab import train_sentencepiece

    gin.clear_config()
    ds = load_dataset("demo", demo_docs=40)
    corpus = ds.corpus
    vocab = train_sentencepiece(list(corpus.texts), tmp_path / "spiece.model", 300)
    M, K = 3, 8
    config = t5.get_config("tiny").replace(vocab_size=vocab.size + M * K)
    model = pag.PagRetriever(config)
    params = model.init_params(5)
    t5_convert.save_hf(params["network"], config, tmp_path / "released")
    rng = np.random.default_rng(0)
    codes = rng.integers(0, K, (len(corpus), M))
    (tmp_path / "smt.json").write_text(json.dumps(
        {d: [int(vocab.size + K * i + c) for i, c in enumerate(row)] for d, row in zip(corpus.doc_ids, codes)}))
    (tmp_path / "lex.json").write_text(json.dumps(
        {d: rng.choice(np.arange(3, vocab.size), 5, replace=False).tolist() for d in corpus.doc_ids}))
    data = _msmarco_layout(tmp_path, corpus, ds.queries["dev"], ds.qrels["dev"])

    exp = tmp_path / "released.gin"
    exp.write_text("include 'experiments/msmarco/pag.gin'\nPagDocids.levels = 3\nPagDocids.k = 8\n"
                   f"PagDocids.base = {vocab.size}\nPagRetriever.planning_size = 12\n"
                   "load_dataset.query_files = {'dev': ['dev_queries/raw.tsv', 'dev_qrels.tsv']}\n"
                   "TASK_FEATURE_LENGTHS = {'inputs': 24, 'targets': 3}\n")
    common = [f"--gin_file={exp}", f"--gin.INITIAL_CHECKPOINT_PATH='{tmp_path / 'released'}'",
              f"--gin.DATA_DIR='{data}'", f"--gin.VOCABULARY='{tmp_path / 'spiece.model'}'",
              f"--gin.SEQUENTIAL_DOCIDS='{tmp_path / 'smt.json'}'",
              f"--gin.SET_DOCIDS='{tmp_path / 'lex.json'}'", f"--gin.MODEL_DIR='{tmp_path / 'm'}'"]
    gin.clear_config()
    assert tool("import_checkpoint").main(common) == 0, capsys.readouterr().err
    gin.clear_config()
    assert infer_cmd.main([*common, "--gin_file=runs/eval.gin", "--gin.NUM_BEAMS=4"]) == 0, capsys.readouterr().err
    run_lines = (tmp_path / "m" / "runs" / "dev.step0.run").read_text().splitlines()

    # the same system built directly: HF directory through the PAG loader, the JSON files through table_from_files
    cfg, net = pag.load_pag_hf(tmp_path / "released")
    direct = pag.PagRetriever(cfg, planning_size=12, query_padding="batch_longest")
    table = pag_docids.table_from_files(tmp_path / "smt.json", tmp_path / "lex.json", corpus.doc_ids, levels=M, k=K,
                                        base=vocab.size)
    direct.use_docids(table)
    index = table.index(vocab_size=cfg.vocab_size)
    qs = ds.queries["dev"]
    qids = sorted(q for q in qs.qids if q in ds.qrels["dev"])
    text_of = dict(zip(qs.qids, qs.texts))
    tokens = tokenize([text_of[q] for q in qids], vocab, 24)
    p = {"network": jax.tree_util.tree_map(jnp.asarray, net), "head": {}}
    expect = []
    for start in range(0, len(qids), 16):  # the batch size of the gin (their sequential stage's)
        ranked = direct.predict_documents(p, tokens[start:start + 16], index, 4, keys=list(corpus.doc_ids))
        for qid, docs in zip(qids[start:start + 16], ranked):
            expect += [(qid, corpus.doc_ids[d]) for d, _ in docs]
    got = [(x.split()[0], x.split()[2]) for x in run_lines]
    assert got == expect and got

    # their set docid file changed after the import: refused, naming the file
    lex = json.loads((tmp_path / "lex.json").read_text())
    first = corpus.doc_ids[0]
    lex[first] = lex[first][::-1]
    (tmp_path / "lex.json").write_text(json.dumps(lex))
    gin.clear_config()
    capsys.readouterr()
    assert infer_cmd.main([*common, "--gin_file=runs/eval.gin"]) == 2
    err = capsys.readouterr().err
    assert "PagDocids.set_docid_file" in err and "changed since this MODEL_DIR" in err
