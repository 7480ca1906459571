"""Writes a RIPOR parity fixture (tests/fixtures/ripor_parity/<shape>/) from RIPOR's own code.

    # RIPOR's code: github.com/HansiZeng/RIPOR (the fixtures here: commit 03fd0cb)
    python tools/ripor_fixtures.py --ripor_repo RIPOR --out tests/fixtures/ripor_parity/m8_relu
    python tools/ripor_fixtures.py --ripor_repo RIPOR --out tests/fixtures/ripor_parity/m16_gated \\
        --d_model 36 --d_kv 3 --d_ff 48 --encoder_layers 3 --feed_forward gated-gelu --levels 16 --codes 6 --docs 30 \\
        --queries 5 --query_length 20 --short_queries 2 --seed 1 --init_factor 0.2

It builds their `T5ForDocIDGeneration` (t5_pretrainer/modeling/t5_generative_retriever.py) on a tiny random
configuration, runs their `assign_output_embeds` with random centroids (the stand-in for faiss's RQ codebooks),
then records, with their classes:
  * the centroid assignment: the state dict after `assign_output_embeds` (weights.safetensors);
  * their prefix-oriented ranking loss, `T5SeqAQEncoderForLngKnpMarginMSE.forward` (`lng_knp`: MarginMSE of the
    full docid and of its 4- (and 8-) code prefixes), on a batch of queries with positive and negative docids and
    teacher scores, and the per-prefix scores its forward sums (`decoder_last_hidden_state` · `decode(codes)`);
  * the constrained beam search of their `beam_search_for_constrained_prefix` (t5_pretrainer/tasks/generation.py):
    its step logits come from their model (`decoding = True`, the last position of `get_lm_logits`) for every
    prefix of the fixture's docid tree, and its loop is replayed here (their module imports transformers 4.x
    modules that transformers 5 no longer has): raw logits, invalid continuations at −1e9, the top 2·beams of
    beam score + logit, the first `beams` kept, the final scores divided by the hypothesis length M + 1 (HF
    4.x's length penalty 1.0; their run then multiplies by M). Not replayed: their decoder's eos id 1 ends a
    beam that picks code 1 before the last position (HF's `BeamSearchScorer.process`), so their runs drop such
    docids; the replay keeps every docid, as ours does.

Harness shims, no file of theirs edited: `transformers.utils.model_parallel_utils` (gone in transformers 5) as an
empty module; `T5Stack(config, embed_tokens)` (their call) over transformers 5's `T5Stack(config)`; the shared
embedding declared tied for `save_pretrained`; eager attention and `use_cache = False` (transformers 5's cache
would mix their decoder's self- and cross-attention keys: their decoder config says `is_encoder_decoder = False`);
`T5ForDocIDGeneration.from_pretrained` returns the model built here (transformers 5 initialises on the meta
device, where their `__init__`'s `start_token_embed.data = …` fails). Their constructor accepts only T5-base,
-large and -3b decoders (12 layers × 12 heads, 24 × 16, 24 × 32), so the decoder has 12 layers × 12 heads and
`d_model` is small; the start vector file it reads is written here (named t5-base.npy, as it asserts).

Folder: weights.safetensors (their state dict after the assignment), config.json, inputs.npz, outputs.npz,
meta.json. `gr_jax/methods/ripor/parity.py` checks ours against it
(`python tools/check_parity.py --method ripor --fixture tests/fixtures/ripor_parity/m8_relu`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

from gr_jax.runtime import cli
from gr_jax.runtime.provenance import git_commit

FACTORS = {8: {4: 0.5 / 0.75}, 16: {4: 0.5 / 0.875, 8: 0.75 / 0.875}, 32: {4: 0.5, 8: 0.75, 16: 0.875}}  # theirs


def _load_theirs(repo: Path):
    shim = types.ModuleType("transformers.utils.model_parallel_utils")
    shim.assert_device_map = shim.get_device_map = lambda *a, **k: None
    sys.modules.setdefault(shim.__name__, shim)
    sys.path.insert(0, str(repo))
    import t5_pretrainer.modeling.t5_generative_retriever as theirs
    from transformers.models.t5.modeling_t5 import T5Stack

    class StackWithEmbeddings(T5Stack):  # their two-argument call
        def __init__(self, config, embed_tokens=None):
            super().__init__(config)
            if embed_tokens is not None:
                self.embed_tokens = embed_tokens

    theirs.T5Stack = StackWithEmbeddings
    theirs.T5ForDocIDGeneration._tied_weights_keys = {"encoder.embed_tokens.weight": "shared.weight"}
    return theirs


def _docids(rng, n: int, M: int, K: int) -> np.ndarray:
    """n distinct docids of M codes that share prefixes (a tree that branches at several depths)."""
    out: list[tuple] = []
    while len(out) < n:
        if out and rng.random() < 0.6:  # branch off an existing docid at a random depth
            base = list(out[rng.integers(len(out))])
            cut = int(rng.integers(1, M))
            cand = tuple(base[:cut] + rng.integers(0, K, M - cut).tolist())
        else:
            cand = tuple(rng.integers(0, K, M).tolist())
        if cand not in out:
            out.append(cand)
    return np.asarray(out, np.int64)


def _replay_beam_search(step_logits, docids: np.ndarray, K: int, beams: int):
    """Their beam loop (see the module docstring) over `step_logits(prefix tuple) -> [K]` for one query: the
    kept beams' docids and their final scores, best first (the −1e9 ones left out)."""
    M = docids.shape[1]
    valid = {}
    for d in docids.tolist():
        for L in range(M):
            valid.setdefault(tuple(d[:L]), set()).add(d[L])
    hyps = [()] * beams
    scores = np.full(beams, -1e9)
    scores[0] = 0.0
    for L in range(M):
        flat = np.empty(beams * K)
        for b, h in enumerate(hyps):
            mask = np.zeros(K)
            mask[sorted(valid.get(h, ()))] = 1.0
            flat[b * K:(b + 1) * K] = step_logits(h) + (1.0 - mask) * -1e9 + scores[b]
        top = np.argsort(-flat, kind="stable")[:2 * beams][:beams]
        hyps = [hyps[i // K] + (int(i % K),) for i in top]
        scores = flat[top]
    keep = scores > -1e8
    final = scores / (M + 1)  # HF 4.x: sum / length ** 1.0, the length counting the start token
    return [list(h) for h, k in zip(hyps, keep) if k], final[keep], scores[keep]


def _portable(argv) -> list:
    """The command's arguments with the checkout's location written as RIPOR (no machine's path is kept)."""
    out = []
    for i, a in enumerate(argv):
        if i and argv[i - 1] == "--ripor_repo":
            a = "RIPOR"
        elif a.startswith("--ripor_repo="):
            a = "--ripor_repo=RIPOR"
        out.append(a)
    return out


def write_fixture(repo: Path, out: Path, args) -> dict:
    import torch
    from safetensors.numpy import save_file

    theirs = _load_theirs(repo)
    M, K, D = args.levels, args.codes, args.d_model
    if M not in FACTORS:
        raise ValueError(f"--levels {M}: their lng_knp loss is written for 8, 16 or 32 codes")
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        start = Path(tmp) / "t5-base.npy"  # their constructor asserts the name
        np.save(start, rng.normal(0.0, 1.0, (1, 1, D)).astype(np.float32))
        config = theirs.T5forDocIDConfig(
            decoder_vocab_sizes=[K] * M, decoder_start_token_path=str(start), shared_output_input_embeds=False,
            vocab_size=args.vocab, d_model=D, d_kv=args.d_kv, num_heads=12, num_layers=args.encoder_layers,
            num_decoder_layers=12, d_ff=args.d_ff, dropout_rate=0.0, feed_forward_proj=args.feed_forward,
            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
            initializer_factor=args.init_factor)
        config._attn_implementation = "eager"
        config.use_cache = False
        base = theirs.T5ForDocIDGeneration(config)
        with torch.no_grad():  # HF's init sets every norm to ones, where swapping two entries would change nothing
            for name, param in base.named_parameters():
                if "layer_norm" in name:
                    param.copy_(1.0 + 0.1 * torch.randn_like(param))
        config.save_pretrained(Path(tmp) / "model")
        theirs.T5ForDocIDGeneration.from_pretrained = classmethod(lambda cls, path, config=None: base)
        model = theirs.T5SeqAQEncoderForLngKnpMarginMSE.from_pretrained(str(Path(tmp) / "model"),
                                                                        shared_output_input_embeds=False)
    centroids = rng.normal(0.0, 0.3, (M, K, D)).astype(np.float32)
    model.assign_output_embeds(centroids)  # their relevance-based initialisation
    model.eval()

    # queries: token ids ≥ 2, an eos, padded to the longest (their collator's padding="longest")
    B = args.queries
    lengths = rng.integers(3, args.query_length, B)
    lengths[:args.short_queries] = 3
    lengths[-1] = args.query_length  # one query sets the width
    ids = np.zeros((B, args.query_length), np.int64)
    for b, n in enumerate(lengths):
        ids[b, :n - 1] = rng.integers(2, args.vocab, n - 1)
        ids[b, n - 1] = 1
    mask = (ids != 0).astype(np.int64)
    docids = _docids(rng, args.docs, M, K)
    pos_rows = rng.integers(0, len(docids), B)
    neg_rows = (pos_rows + rng.integers(1, len(docids), B)) % len(docids)
    teacher_pos, teacher_neg = rng.normal(5.0, 2.0, B), rng.normal(2.0, 2.0, B)

    def query(codes):  # their collator: decoder inputs [-1, c_0, …, c_{M-2}]
        dec = np.concatenate([np.full((B, 1), -1), codes[:, :-1]], axis=1)
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask),
                "decoder_input_ids": torch.tensor(dec)}

    batch = {"pos_tokenized_query": query(docids[pos_rows]), "neg_tokenized_query": query(docids[neg_rows]),
             "pos_doc_encoding": torch.tensor(docids[pos_rows]), "neg_doc_encoding": torch.tensor(docids[neg_rows]),
             "teacher_pos_scores": torch.tensor(teacher_pos, dtype=torch.float32),
             "teacher_neg_scores": torch.tensor(teacher_neg, dtype=torch.float32)}
    for L, f in FACTORS[M].items():
        batch[f"smtid_{L}_teacher_pos_scores"] = torch.tensor(teacher_pos * f, dtype=torch.float32)
        batch[f"smtid_{L}_teacher_neg_scores"] = torch.tensor(teacher_neg * f, dtype=torch.float32)
    outputs: dict[str, np.ndarray] = {}
    with torch.no_grad():
        losses = model(**batch)
        for name, value in losses.items():
            outputs[f"loss_{name}"] = np.asarray(value.item(), np.float64)
        for side, rows in (("pos", pos_rows), ("neg", neg_rows)):  # the sums their forward takes, per prefix
            h = model.base_model(**query(docids[rows])).decoder_last_hidden_state
            per = (h * model.decode(torch.tensor(docids[rows]))).sum(-1)
            outputs[f"{side}_prefix_scores"] = np.cumsum(per.numpy().astype(np.float64), axis=1)

        model.base_model.config.decoding = True  # their generation reads the per-position logits
        cache: dict = {}

        def step_logits(b: int, prefix: tuple) -> np.ndarray:
            if (b, prefix) not in cache:
                dec = torch.tensor([[-1] + list(prefix)])
                res = model.base_model(input_ids=torch.tensor(ids[b:b + 1]),
                                       attention_mask=torch.tensor(mask[b:b + 1]), decoder_input_ids=dec,
                                       return_dict=True)
                cache[(b, prefix)] = res.logits[-1][0].numpy().astype(np.float64)
            return cache[(b, prefix)]

        beams, finals, sums = [], [], []
        for b in range(B):
            h, final, total = _replay_beam_search(lambda p: step_logits(b, p), docids, K, args.beams)
            beams.append(h)
            finals.append(final)
            sums.append(total)
    n = min(len(x) for x in beams)
    outputs["beam_docids"] = np.asarray([x[:n] for x in beams], np.int64)
    outputs["beam_scores"] = np.asarray([x[:n] for x in finals], np.float64)
    outputs["beam_sums"] = np.asarray([x[:n] for x in sums], np.float64)

    out.mkdir(parents=True, exist_ok=True)
    # the shared embedding stored once; the decoder's `embed_tokens` is transformers 5's own (their decoder gets
    # None and always reads `inputs_embeds`)
    state = {k: v.detach().numpy().copy() for k, v in base.state_dict().items()
             if k not in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")}
    save_file(state, str(out / "weights.safetensors"))
    settings = {**config.to_dict(), "decoder_start_token_path": "t5-base.npy"}  # a temporary file: no path kept
    (out / "config.json").write_text(json.dumps(settings, indent=1, sort_keys=True, default=str) + "\n")
    np.savez(out / "inputs.npz", query_ids=ids, query_mask=mask, docids=docids, pos_rows=pos_rows,
             neg_rows=neg_rows, teacher_pos=teacher_pos, teacher_neg=teacher_neg, centroids=centroids)
    np.savez(out / "outputs.npz", **outputs)
    meta = {"ripor_commit": git_commit(repo), "seed": args.seed, "levels": M, "codes": K, "d_model": D,
            "encoder_layers": args.encoder_layers, "decoder_layers": 12, "heads": 12, "d_kv": args.d_kv,
            "feed_forward": args.feed_forward, "init_factor": args.init_factor, "vocab": args.vocab,
            "docs": len(docids), "queries": B,
            "query_lengths": lengths.tolist(), "beams": args.beams,
            "prefix_factors": {str(L): f for L, f in FACTORS[M].items()},
            "torch": torch.__version__, "transformers": __import__("transformers").__version__,
            "command": "python tools/ripor_fixtures.py " + " ".join(_portable(sys.argv[1:]))}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ripor_repo", required=True, help="a checkout of github.com/HansiZeng/RIPOR")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=cli.natural, default=0)
    parser.add_argument("--d_model", type=cli.count, default=48)
    parser.add_argument("--d_kv", type=cli.count, default=4)
    parser.add_argument("--d_ff", type=cli.count, default=64)
    parser.add_argument("--encoder_layers", type=cli.count, default=2)
    parser.add_argument("--feed_forward", choices=("relu", "gated-gelu"), default="relu")
    # at HF's default 1.0 a random 12-layer decoder is chaotic: float32 rounding alone moves its states by ~1e-2
    # of their size (theirs in float32 against theirs in float64), so no float32 reimplementation could match it
    parser.add_argument("--init_factor", type=cli.positive, default=0.3,
                        help="T5Config.initializer_factor of the random weights (default 0.3)")
    parser.add_argument("--vocab", type=cli.count, default=48)
    parser.add_argument("--levels", type=cli.count, default=8, help="M: 8, 16 or 32 (their lng_knp's lengths)")
    parser.add_argument("--codes", type=cli.count, default=8, help="K")
    parser.add_argument("--docs", type=cli.count, default=24)
    parser.add_argument("--queries", type=cli.count, default=4)
    parser.add_argument("--query_length", type=cli.count, default=9)
    parser.add_argument("--short_queries", type=cli.natural, default=1, help="queries of 3 tokens (long padding)")
    parser.add_argument("--beams", type=cli.count, default=6)
    args = parser.parse_args(argv)
    repo = Path(args.ripor_repo)
    if not (repo / "t5_pretrainer" / "modeling" / "t5_generative_retriever.py").is_file():
        sys.stderr.write(f"{repo}: not a RIPOR checkout (no t5_pretrainer/modeling/t5_generative_retriever.py)\n")
        return 2
    meta = write_fixture(repo, Path(args.out), args)
    sys.stdout.write(json.dumps(meta) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
