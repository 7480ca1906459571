"""Docid statistics of a scheme on a corpus: collision rate, docid length distribution and the effective
vocabulary size (distinct tokens used, as in Table 5 of 000_dynamic_corpora.txt).

    python tools/docid_stats.py --scheme url --corpus demo
    python tools/docid_stats.py --scheme pq --corpus demo --docs 5000
    python tools/docid_stats.py --scheme ngram --corpus demo        # multi-docids: + identifying share
    python tools/docid_stats.py --scheme keywords --corpus nq320k_nci --data_dir data/nq320k --vocab spiece.model
    python tools/docid_stats.py --scheme title --corpus demo --familiarity_lm smollm2_135m   # + semantic familiarity

Semantic familiarity (000_dynamic_corpora.txt Eq. 6): S = E_z[log P_LM(z)] over the scheme's docids written as
text — text docids decoded with the vocabulary, numeric ones as their codes joined by '-' (e.g. "17-3-250-8"),
atomic ones as the number — each scored by a pretrained decoder-only LM after its start-of-text token
(`<|endoftext|>` where the vocabulary has it, else BOS). Reported as the mean log-probability per docid and per
LM token, over up to --familiarity_docids docids chosen by a hash of the docid text (not by corpus order).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from gr_jax.runtime import cli
from gr_jax.runtime.cli import setup_logging
from gr_jax.data import sources
from gr_jax.docids.atomic import AtomicDocids, NaiveDocids
from gr_jax.docids.base import FitContext
from gr_jax.docids.embed import TfidfSvdEmbedder
from gr_jax.docids.lexical import FieldDocids, KeywordDocids
from gr_jax.docids.ngram import NgramDocids, multi_docid_stats
from gr_jax.docids.numeric import PQDocids, RQDocids, SemanticDocids
from gr_jax.docids.pseudo_query import PseudoQueryDocids, queries_by_document
from gr_jax.data.vocab import EOS_ID, PAD_ID, load_vocabulary, train_sentencepiece

SCHEMES = {
    "atomic": AtomicDocids, "naive": NaiveDocids, "title": lambda: FieldDocids("title"),
    "url": lambda: FieldDocids("url"), "keywords": KeywordDocids, "semantic": lambda: SemanticDocids(10, 100, 2),
    "pq": lambda: PQDocids(4, 256), "rq": lambda: RQDocids(4, 256), "ngram": NgramDocids,
    "pseudo_query": PseudoQueryDocids,
}


def stats(scheme_name: str, dataset, vocab, familiarity_lm=None, familiarity_docids: int = 500) -> dict:
    corpus = dataset.corpus
    scheme = SCHEMES[scheme_name]()
    emb, queries = None, None
    if scheme.needs_embeddings:
        emb = TfidfSvdEmbedder(dim=64).fit(corpus.texts).embed(corpus.texts)
    if scheme.uses_training_queries:
        queries = queries_by_document(dataset, "train")
    table = scheme.fit(corpus, FitContext(vocab=vocab, embeddings=emb, queries=queries)).assign(corpus, embeddings=emb)
    out = table.stats()
    if len(table) > len(set(table.doc_rows.tolist())):  # several docids per document
        out.update(multi_docid_stats(table))
    lengths, counts = np.unique(table.lengths, return_counts=True)
    out["length_histogram"] = {int(l): int(c) for l, c in zip(lengths, counts)}
    out["scheme"] = scheme_name
    if familiarity_lm:
        out["familiarity"] = familiarity(docid_texts(table, vocab), familiarity_lm, familiarity_docids)
    return out


def docid_texts(table, vocab) -> list[str]:
    """Each docid of the table as text (see the module docstring)."""
    out = []
    for i in range(len(table)):
        seq = [t for t in table.sequence(i) if table.space.kind == "codebook" or t not in (EOS_ID, PAD_ID)]
        if table.space.kind == "codebook":  # the sequences hold the codes themselves
            out.append("-".join(str(int(t)) for t in seq))
        elif all(t < vocab.size for t in seq):  # text; characters the vocabulary lacks (⁇) are left out
            out.append(" ".join(vocab.decode(seq).replace("\u2047", " ").split()))
        else:  # ids grown above the text vocabulary (atomic)
            out.append("-".join(str(int(table.space.code(t))) for t in seq))
    return out


def familiarity(texts: list[str], lm_name: str, max_docids: int = 500) -> dict:
    """S (mean log P_LM per docid) and the mean per LM token, over a hash-chosen sample of the docid texts."""
    import hashlib

    from gr_jax.backbones import llama, llama_io, lm_generate

    config, params, tok, _ = llama_io.load_lm(lm_name)
    unique = sorted(set(t for t in texts if t))
    key = lambda t: hashlib.blake2b(t.encode("utf-8"), digest_size=8).digest()  # noqa: E731
    sample = sorted(unique, key=key)[:max_docids]
    start = tok.backend.token_to_id("<|endoftext|>")
    context = [start if start is not None else config.bos_token_id]
    seqs = [tok.encode(t) for t in sample]
    logp = lm_generate.sequence_log_probs(llama.Llama(config), params, seqs, context)
    n_tokens = np.array([len(s) for s in seqs], np.float64)
    return {"lm": lm_name, "docids_scored": len(sample), "S_per_docid": float(logp.mean()),
            "S_per_token": float(logp.sum() / n_tokens.sum()), "mean_lm_tokens": float(n_tokens.mean()),
            "examples": sample[:3]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scheme", required=True, choices=sorted(SCHEMES))
    parser.add_argument("--corpus", default="demo", choices=sources.NAMES)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--docs", type=cli.count, default=2000, help="demo corpus size")
    parser.add_argument("--vocab", default=None, help="SentencePiece model (default: trained on the corpus)")
    parser.add_argument("--familiarity_lm", default=None,
                        help="also report semantic familiarity S under this LM (smollm2_135m, a GGUF file or an "
                             "HF Llama directory)")
    parser.add_argument("--familiarity_docids", type=cli.count, default=500)
    args = parser.parse_args(argv)
    setup_logging()
    try:
        dataset = sources.load_dataset(args.corpus, args.data_dir, demo_docs=args.docs)
        if args.vocab:
            vocab = load_vocabulary(args.vocab)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                vocab = train_sentencepiece(list(dataset.corpus.texts), Path(tmp) / "sp.model", 1000)
        result = stats(args.scheme, dataset, vocab, args.familiarity_lm, args.familiarity_docids)
    except (ValueError, OSError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    sys.stdout.write(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
