"""How well a residual quantiser fitted on D0 codes documents it never saw: the bound on RIPOR's GA_n.

    python tools/rq_generalisation.py --out docs/rq_generalisation.md [--windows] [--dataset pydoc]

Before training, RIPOR ranks by dense retrieval over the RQ reconstructions of the document vectors
(methods/ripor). In the dynamic protocol (000's split, `protocols/dynamic_corpora.make_dynamic_data`) the quantiser
is fitted on D0's vectors only, and a later document is coded by it. This tool measures, for each M × K, exact
dense retrieval (all-MiniLM-L6-v2 query vectors against the reconstructions of every document's vector) by
Hit@10 on the test queries of D0's documents and on those of D1..D5's, and the mean reconstruction error
‖x − x̂‖ of both groups of documents; the first row is the exact vectors. `--windows`: the quantiser is fitted on
D0's documents plus windows of 48 words (stride 24) of D0's texts — more vectors than D0 holds, from D0 only.
Ties at the 10th score are broken by corpus row of the D0, D1, … order (scores of distinct documents rarely tie).
Writes a markdown table to --out (through the keep-previous path) and prints it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from gr_jax.runtime import cli


def windows_of(texts, width: int = 48, stride: int = 24) -> list:
    out = []
    for t in texts:
        words = t.split()
        for s in range(0, max(1, len(words) - width // 3), stride):
            out.append(" ".join(words[s:s + width]))
    return out


def hit_at_10(query_vectors, recon, relevant_rows) -> float:
    scores = query_vectors @ recon.T
    top = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    return float(np.mean([bool(set(top[i].tolist()) & rows) for i, rows in enumerate(relevant_rows)]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="pydoc")
    parser.add_argument("--out", required=True)
    parser.add_argument("--windows", action="store_true")
    parser.add_argument("--settings", default="8x256,8x64,16x64,16x32,16x16",
                        help="comma-separated MxK quantisers")
    parser.add_argument("--seed", type=cli.natural, default=0)
    args = parser.parse_args(argv)
    cli.setup_logging()
    try:
        settings = [tuple(int(v) for v in s.split("x")) for s in args.settings.split(",")]
    except ValueError:
        parser.error(f"--settings {args.settings!r}: MxK pairs such as 8x256,16x32")
    from gr_jax.backbones.bert import MiniLMJaxEmbedder
    from gr_jax.data.sources import load_dataset
    from gr_jax.docids.quantize import ResidualQuantizer
    from gr_jax.evaluation.report import markdown_table
    from gr_jax.protocols.dynamic_corpora import make_dynamic_data
    from gr_jax.runtime.io_utils import write_text

    dd = make_dynamic_data(load_dataset(args.dataset), seed=args.seed, split_protocol="paper")
    corpus = dd.full.corpus
    n0 = len(dd.split.parts[0])
    row = {d: i for i, d in enumerate(corpus.doc_ids)}
    embedder = MiniLMJaxEmbedder()
    docs = np.asarray(embedder.embed(list(corpus.texts)), np.float32)
    groups = {"D0": dd.split.test_queries[0], "D1..D5": [q for part in dd.split.test_queries[1:] for q in part]}
    queries = {g: np.asarray(embedder.embed_queries([dd.test_texts[q] for q in qs]), np.float32)
               for g, qs in groups.items()}
    relevant = {g: [{row[d] for d, grade in dd.test_qrels[q].items() if grade >= 1 and d in row} for q in qs]
                for g, qs in groups.items()}
    fit_on = docs[:n0]
    if args.windows:
        fit_on = np.concatenate([fit_on, np.asarray(embedder.embed(windows_of(corpus.texts[:n0])), np.float32)])
    rows = [["exact vectors", "—", f"{hit_at_10(queries['D0'], docs, relevant['D0']):.3f}",
             f"{hit_at_10(queries['D1..D5'], docs, relevant['D1..D5']):.3f}", "0", "0"]]
    for M, K in settings:
        rq = ResidualQuantizer(M, K, seed=args.seed).fit(fit_on)
        recon = rq.decode(rq.encode(docs))
        err = np.linalg.norm(docs - recon, axis=1)
        h0, hn = hit_at_10(queries["D0"], recon, relevant["D0"]), hit_at_10(queries["D1..D5"], recon,
                                                                            relevant["D1..D5"])
        rows.append([f"RQ {M} × {K}", str(len(fit_on)), f"{h0:.3f}", f"{hn:.3f}", f"{err[:n0].mean():.3f}",
                     f"{err[n0:].mean():.3f}"])
    table = markdown_table(["document vectors", "quantiser fitted on", "Hit@10, D0's queries",
                            "Hit@10, D1..D5's queries", "‖x − x̂‖, D0", "‖x − x̂‖, D1..D5"], rows)
    text = (f"# RQ generalisation ({args.dataset}, 000's split, seed {args.seed}"
            f"{', D0 windows added' if args.windows else ''})\n\n{table}\n")
    write_text(Path(args.out), text, keep_previous=True)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
