"""The non-generative retrievers on a dataset's query splits, for the tables where a GR route is compared with them:
BM25, the pretrained all-MiniLM-L6-v2 as a dense retriever (frozen), and DPR (that encoder fine-tuned on the train
split's queries, `methods/dpr`: in-batch negatives, its default settings).

    python tools/baselines.py --task pydoc --splits dev test --out_dir runs/pydoc_baselines

Writes OUT_DIR/runs/<split>.<system>.run, OUT_DIR/baselines.json and .md (keep-previous) and prints the table
(Hit@1, Hit@10, MRR@10; seconds to build each system). DPR's training is kept in OUT_DIR/dpr/ (a second run
restores it). Exit status 2 on bad arguments or data.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gr_jax.runtime import cli
from gr_jax.runtime.cli import setup_logging

SYSTEMS = ("bm25", "minilm", "dpr")
METRICS = ("Hit@1", "Hit@10", "MRR@10")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="pydoc")
    parser.add_argument("--splits", nargs="+", default=["dev", "test"])
    parser.add_argument("--systems", type=cli.name_list(SYSTEMS), default=list(SYSTEMS),
                        help=f"comma list of {', '.join(SYSTEMS)}")
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--k", type=cli.natural, default=10)
    args = parser.parse_args(argv)
    setup_logging()
    from gr_jax.baselines.bm25 import BM25
    from gr_jax.baselines.dense import DenseIndex
    from gr_jax.data import sources
    from gr_jax.data.trec import write_run
    from gr_jax.docids.embed import MiniLMEmbedder
    from gr_jax.evaluation.metrics import evaluate
    from gr_jax.evaluation.report import markdown_table
    from gr_jax.methods.dpr.model import DprEmbedder
    from gr_jax.runtime.errors import UserError
    from gr_jax.runtime.io_utils import json_text, write_text
    from gr_jax.runtime.run_dir import RunDir

    out = Path(args.out_dir)
    try:
        dataset = sources.load_dataset(args.task)
        missing = [s for s in args.splits if s not in dataset.queries]
        if missing:
            raise ValueError(f"--splits {missing}: the dataset has {sorted(dataset.queries)}")
        corpus = dataset.corpus
        results: dict = {"task": args.task, "documents": len(corpus), "splits": {}, "seconds": {}}
        for system in args.systems:
            t = time.time()
            if system == "bm25":
                index = BM25.build(list(corpus.doc_ids), list(corpus.texts))
                search = lambda qids, texts: index.search(qids, texts, k=args.k)  # noqa: E731
            else:
                emb = MiniLMEmbedder() if system == "minilm" else DprEmbedder(progress=False)
                if system == "dpr":
                    emb.train(dataset, "train", out)
                dense = DenseIndex.build(emb, corpus, fit=system == "minilm")
                search = lambda qids, texts, dense=dense: dense.search(texts, qids, k=args.k)  # noqa: E731
            results["seconds"][system] = round(time.time() - t, 1)
            for split in args.splits:
                queries, qrels = dataset.queries[split], dataset.qrels[split]
                qids = sorted(q for q in queries.qids if q in qrels)
                text = dict(zip(queries.qids, queries.texts))
                run = search(qids, [text[q] for q in qids])
                write_run(RunDir(out).run_file(f"{split}.{system}.run"), run)
                metrics = evaluate(run, {q: qrels[q] for q in qids}, list(METRICS), 1, missing_as_zero=True)
                results["splits"].setdefault(split, {"queries": len(qids), "systems": {}})["systems"][system] = metrics
    except (UserError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    lines = []
    for split, part in results["splits"].items():
        rows = [[s, *[f"{m[k]:.3f}" for k in METRICS], f"{results['seconds'][s]:.0f}"] for s, m in part["systems"].items()]
        lines.append(f"{args.task} {split} ({part['queries']} queries, {len(corpus)} documents)\n\n"
                     + markdown_table(["system", *METRICS, "build s"], rows))
    text = "\n\n".join(lines)
    write_text(out / "baselines.json", json_text({k: v for k, v in results.items() if k != "seconds"}, indent=1),
               keep_previous=True)
    write_text(out / "baselines.md", text + "\n", keep_previous=True)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
