"""How much of a dataset's queries a decoder-only LM knows by heart: the memorisation measure of the "real text"
routes (docs/results.md). pydoc's queries are docstring summaries of the standard library, which an LM trained on
code may have read verbatim: a route that "retrieves" them may be recalling, not retrieving.

For each judged query of a split (by query id): the LM reads the relevant document's title as a Python comment
and the first half of the summary's words after an opening docstring quote,

    # json.dumps
    \"\"\"Serialize ``obj`` to a JSON

and continues greedily. A query counts as *completed* when the continuation's next `--words` words are the
summary's next words exactly (whitespace-split, compared as written). The same measure on the embedded demo
corpus's queries — invented words the LM cannot have read — is the floor beside it.

    python tools/memorisation.py --lm smollm2_135m --task pydoc --split dev --words 4
Prints a JSON line {task, split, queries, words, completed, rate, floor_rate, examples}; `--out FILE` also writes
it (keep-previous). Exit status 2 on bad arguments or an unreadable LM.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from gr_jax.runtime import cli
from gr_jax.runtime.cli import setup_logging

log = logging.getLogger("memorisation")


def prompts_and_targets(dataset, split: str, words: int, max_queries: int = 0):
    """[(qid, prompt text, the next `words` words)] of the split's judged queries whose summary has at least
    2 · `words` words, by query id."""
    title = dict(zip(dataset.corpus.doc_ids, dataset.corpus.titles or dataset.corpus.doc_ids))
    queries, qrels = dataset.queries[split], dataset.qrels[split]
    text = dict(zip(queries.qids, queries.texts))
    out = []
    for q in sorted(qid for qid in queries.qids if qrels.get(qid)):
        parts = text[q].split()
        if len(parts) < 2 * words:
            continue
        cut = len(parts) // 2
        if len(parts) - cut < words:
            cut = len(parts) - words
        doc = min(d for d, g in qrels[q].items() if g > 0)
        out.append((q, f'# {title.get(doc, doc)}\n"""{" ".join(parts[:cut])}', parts[cut:cut + words]))
        if max_queries and len(out) >= max_queries:
            break
    return out


def completion_rate(lm, items, words: int, batch_size: int = 16) -> tuple[int, list]:
    """(how many items the LM completes exactly, [(qid, prompt, expected, got)] of every item)."""
    from gr_jax.backbones import lm_generate
    from gr_jax.backbones.lm import batches

    rows, hits = [], 0
    for start, end in batches(len(items), batch_size):
        part = items[start:end]
        gen = lm_generate.generate(lm.model, lm.generation_params, [lm.encode(p) for _, p, _ in part],
                                   max_new_tokens=6 * words, stop_ids=[lm.tok.eos_id], greedy=True)
        for (q, p, want), g in zip(part, gen):
            got = lm.tok.decode(g).split()[:words]
            hits += got == want
            rows.append((q, p, " ".join(want), " ".join(got)))
    return hits, rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lm", default="smollm2_135m", help="a named LM, a GGUF file or an HF Llama directory")
    parser.add_argument("--task", default="pydoc")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--words", type=cli.natural, default=4, help="words to complete (≥ 1)")
    parser.add_argument("--max_queries", type=cli.count, default=0, help="the first N queries by id (0: all)")
    parser.add_argument("--floor_task", default="demo", help="a dataset the LM cannot have read ('' : none)")
    parser.add_argument("--out", help="also write the JSON here (keep-previous)")
    args = parser.parse_args(argv)
    setup_logging()
    from gr_jax.backbones.lm import LMContext
    from gr_jax.data import sources
    from gr_jax.runtime.errors import UserError
    from gr_jax.runtime.io_utils import json_text, write_text

    try:
        lm, _ = LMContext.load(args.lm)
        dataset = sources.load_dataset(args.task)
        if args.split not in dataset.queries:
            raise ValueError(f"--split {args.split!r}: the dataset has {sorted(dataset.queries)}")
        items = prompts_and_targets(dataset, args.split, args.words, args.max_queries)
        if not items:
            raise ValueError(f"{args.task} {args.split}: no judged query of ≥ {2 * args.words} words")
        hits, rows = completion_rate(lm, items, args.words)
        result = {"lm": args.lm, "task": args.task, "split": args.split, "queries": len(items),
                  "words": args.words, "completed": hits, "rate": round(hits / len(items), 4),
                  "examples": [{"qid": q, "prompt": p, "expected": w, "got": g} for q, p, w, g in rows
                               if w == g][:10]}
        if args.floor_task:
            floor = sources.load_dataset(args.floor_task)
            split = args.split if args.split in floor.queries else sorted(floor.queries)[0]
            floor_items = prompts_and_targets(floor, split, args.words, len(items))
            floor_hits, _ = completion_rate(lm, floor_items, args.words)
            result.update({"floor_task": args.floor_task, "floor_queries": len(floor_items),
                           "floor_rate": round(floor_hits / max(len(floor_items), 1), 4)})
    except (UserError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = json_text(result)
    if args.out:
        write_text(Path(args.out), text + "\n", keep_previous=True)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
