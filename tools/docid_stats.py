"""Docid statistics of a scheme on a corpus: collision rate, docid length distribution and the effective
vocabulary size (distinct tokens used, as in Table 5 of 000_dynamic_corpora.txt).

    python tools/docid_stats.py --scheme url --corpus demo
    python tools/docid_stats.py --scheme pq --corpus demo --docs 5000
    python tools/docid_stats.py --scheme ngram --corpus demo        # multi-docids: + identifying share
    python tools/docid_stats.py --scheme keywords --corpus nq320k_nci --data_dir data/nq320k --vocab spiece.model
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from gr_jax.cli import setup_logging
from gr_jax.data import sources
from gr_jax.docids.atomic import AtomicDocids, NaiveDocids
from gr_jax.docids.base import FitContext
from gr_jax.docids.embed import TfidfSvdEmbedder
from gr_jax.docids.lexical import FieldDocids, KeywordDocids
from gr_jax.docids.ngram import NgramDocids, multi_docid_stats
from gr_jax.docids.numeric import PQDocids, RQDocids, SemanticDocids
from gr_jax.docids.pseudo_query import PseudoQueryDocids, queries_by_document
from gr_jax.vocab import load_vocabulary, train_sentencepiece

SCHEMES = {
    "atomic": AtomicDocids, "naive": NaiveDocids, "title": lambda: FieldDocids("title"),
    "url": lambda: FieldDocids("url"), "keywords": KeywordDocids, "semantic": lambda: SemanticDocids(10, 100, 2),
    "pq": lambda: PQDocids(4, 256), "rq": lambda: RQDocids(4, 256), "ngram": NgramDocids,
    "pseudo_query": PseudoQueryDocids,
}


def stats(scheme_name: str, dataset, vocab) -> dict:
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
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scheme", required=True, choices=sorted(SCHEMES))
    parser.add_argument("--corpus", default="demo", choices=sources.NAMES)
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--docs", type=int, default=2000, help="demo corpus size")
    parser.add_argument("--vocab", default=None, help="SentencePiece model (default: trained on the corpus)")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        dataset = sources.load_dataset(args.corpus, args.data_dir, demo_docs=args.docs)
        if args.vocab:
            vocab = load_vocabulary(args.vocab)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                vocab = train_sentencepiece(list(dataset.corpus.texts), Path(tmp) / "sp.model", 1000)
        result = stats(args.scheme, dataset, vocab)
    except (ValueError, OSError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    sys.stdout.write(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
