"""Tiny releases in the authors' layouts, written by the tests (random networks, the demo corpus): what
`python -m gr_jax.reproduce --paper P --released DIR` reads (gin_configs/released/<P>.json names the files)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

DOCS = 40


def demo(folder: Path):
    """(the demo dataset of DOCS documents, a sentencepiece vocabulary at folder/t5-base/spiece.model)."""
    from gr_jax.data.sources import load_dataset
    from gr_jax.data.vocab import train_sentencepiece

    ds = load_dataset("demo", demo_docs=DOCS)
    (folder / "t5-base").mkdir(parents=True, exist_ok=True)
    vocab = train_sentencepiece(list(ds.corpus.texts), folder / "t5-base" / "spiece.model", 300)
    return ds, vocab


def write_nq320k_nci(folder: Path, ds, semantic=None) -> Path:
    """The dataset in NCI's NQ320k layout (NQ_doc_content.tsv, nq_{train,dev}_doc_newid.tsv); `semantic`: docid →
    its semantic id (default: the document's row in base 10, three digits)."""
    d = folder / "nq320k"
    d.mkdir(parents=True, exist_ok=True)
    corpus = ds.corpus
    semantic = semantic or {doc: (r // 100 % 10, r // 10 % 10, r % 10) for r, doc in enumerate(corpus.doc_ids)}
    (d / "NQ_doc_content.tsv").write_text("".join(f"{i}\t\t\t{t}\t\t\ten\n" for i, t in zip(corpus.doc_ids,
                                                                                          corpus.texts)))
    for split, name in (("train", "nq_train_doc_newid.tsv"), ("dev", "nq_dev_doc_newid.tsv")):
        qs = ds.queries[split]
        lines = []
        for q, text in zip(qs.qids, qs.texts):
            for doc in sorted(ds.qrels[split].get(q, {})):
                lines.append(f"{text}\t{q}\t{doc}\t{'-'.join(map(str, semantic[doc]))}\n")
        (d / name).write_text("".join(lines))
    return d


def glen_release(folder: Path) -> None:
    """folder/{glen/model (HF T5), glen/docids.tsv, t5-base/spiece.model, nq320k/}: GLEN's layout."""
    from gr_jax.backbones import t5, t5_convert
    from gr_jax.data.pipeline import tokenize
    from gr_jax.methods.glen.docids import write_docid_tsv
    from gr_jax.methods.glen.model import GlenRetriever

    ds, vocab = demo(folder)
    config = t5.get_config("tiny").replace(vocab_size=vocab.size)
    model = GlenRetriever(config, docid_length=3)
    params = model.init_params(3)
    t5_convert.save_hf(params["network"], config, folder / "glen" / "model")
    tokens, logits = model.decode_docids(params, tokenize(ds.corpus.texts, vocab, 156))
    write_docid_tsv(folder / "glen" / "docids.tsv", ds.corpus.doc_ids, tokens, logits, ds.corpus.texts,
                    vocab.id_to_piece)
    write_nq320k_nci(folder, ds)


GLEN_TINY = ["--gin.TASK_FEATURE_LENGTHS={'inputs': 24, 'targets': 3, 'documents': 156}"]


def pag_release(folder: Path, levels: int = 3, k: int = 8) -> list[str]:
    """folder/{pag/model, pag/aq_smtid/docid_to_tokenids.json, pag/top_bow/docid_to_tokenids.json, msmarco/,
    t5-base/spiece.model}: PAG's layout. → the bindings that size the experiment to it."""
    from gr_jax.backbones import t5, t5_convert
    from gr_jax.methods.pag import model as pag

    ds, vocab = demo(folder)
    corpus = ds.corpus
    config = t5.get_config("tiny").replace(vocab_size=vocab.size + levels * k)
    params = pag.PagRetriever(config).init_params(5)
    t5_convert.save_hf(params["network"], config, folder / "pag" / "model")
    rng = np.random.default_rng(0)
    codes = rng.integers(0, k, (len(corpus), levels))
    for sub, table in (("aq_smtid", {d: [int(vocab.size + k * i + c) for i, c in enumerate(row)]
                                     for d, row in zip(corpus.doc_ids, codes)}),
                       ("top_bow", {d: rng.choice(np.arange(3, vocab.size), 5, replace=False).tolist()
                                    for d in corpus.doc_ids})):
        (folder / "pag" / sub).mkdir(parents=True)
        (folder / "pag" / sub / "docid_to_tokenids.json").write_text(json.dumps(table))
    d = folder / "msmarco"
    (d / "dev_queries").mkdir(parents=True)
    (d / "collection.tsv").write_text("".join(f"{i}\t{t}\n" for i, t in zip(corpus.doc_ids, corpus.texts)))
    qs, qrels = ds.queries["dev"], ds.qrels["dev"]
    queries = "".join(f"{q}\t{t}\n" for q, t in zip(qs.qids, qs.texts))
    (d / "dev_queries" / "raw.tsv").write_text(queries)
    (d / "dev_qrels.tsv").write_text("".join(f"{q} 0 {doc} {g}\n" for q, docs in qrels.items()
                                             for doc, g in docs.items()))
    for year in (2019, 2020):  # TREC DL: graded (2 and 3 count for the binary measures)
        sub = d / f"TREC_DL_{year}"
        (sub / f"queries_{year}").mkdir(parents=True)
        (sub / f"queries_{year}" / "raw.tsv").write_text(queries)
        (sub / "qrels.tsv").write_text("".join(f"{q} 0 {doc} {2 + (year == 2020)}\n" for q, docs in qrels.items()
                                               for doc in docs))
    return [f"--gin.PagDocids.levels={levels}", f"--gin.PagDocids.k={k}", f"--gin.PagDocids.base={vocab.size}",
            "--gin.PagDocids.set_size=5", "--gin.PagRetriever.planning_size=12",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 24, 'targets': 3}"]


def seal_release(tmp_path: Path, folder: Path) -> list[str]:
    """folder/{SEAL.NQ/(checkpoint_best.pt, dict.txt, encoder.json, vocab.bpe), nq/(corpus.tsv, queries, qrels,
    answers)}: SEAL's layout (a tiny random fairseq BART, tests/methods/seal/test_released.py). → the bindings that
    size the experiment to it."""
    import shutil

    from tests.methods.seal.test_released import _data, _release

    ckpt, _ = _release(tmp_path)
    shutil.move(str(ckpt), str(folder / "SEAL.NQ"))
    data = _data(tmp_path)
    (data / "answers.test.tsv").write_text('q1\t["the mat"]\nq2\t["a string", "json"]\n')
    shutil.move(str(data), str(folder / "nq"))
    return ["--gin.TASK_FEATURE_LENGTHS={'inputs': 24, 'targets': 8}", "--gin.EvalConfig.num_beams=3",
            "--gin.SealSearch.top_k_unigrams=50", "--gin.EvalConfig.batch_size=2",
            "--gin.SealSearch.document_score='best_key'"]


def nci_release(folder: Path) -> list[str]:
    """folder/{nci/NCI_NQ.ckpt (a Lightning checkpoint of the NCI parity fixture's weights, written by NCI's own
    code), t5-large/spiece.model (64 pieces, the fixture's text vocabulary), nq320k/}: NCI's layout. → the bindings
    that size the experiment to the fixture's model."""
    import argparse

    import torch
    from safetensors.numpy import load_file

    from gr_jax.data.sources import load_dataset
    from gr_jax.data.vocab import train_sentencepiece

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "nci_parity" / "v10_d32"
    ds = load_dataset("demo", demo_docs=DOCS)
    (folder / "t5-large").mkdir(parents=True)
    train_sentencepiece(list(ds.corpus.texts), folder / "t5-large" / "spiece.model", 64)
    state = {f"model.{k}": torch.tensor(v) for k, v in load_file(str(fixture / "weights.safetensors")).items()}
    (folder / "nci").mkdir()
    torch.save({"state_dict": state, "epoch": 3, "hyper_parameters": argparse.Namespace(kary=10, max_output_length=5)},
               str(folder / "nci" / "NCI_NQ.ckpt"))
    write_nq320k_nci(folder, ds)
    return ["--gin.NciDocids.codes=10", "--gin.NciDocids.positions=5", "--gin.NciFlatHead.codes=10",
            "--gin.NciFlatHead.positions=5", "--gin.TASK_FEATURE_LENGTHS={'inputs': 24, 'targets': 5}",
            "--gin.EvalConfig.num_beams=4"]
