"""Writes a backbone parity fixture (tests/fixtures/<arch>_parity/<shape>/): a tiny random HF model of transformers'
own T5, BART or Llama, every size a flag.

    python tools/backbone_fixtures.py --arch t5 --out tests/fixtures/t5_parity/v10_relu_d32
    python tools/backbone_fixtures.py --arch t5 --out tests/fixtures/t5_parity/v11_gated_l3 --t5_version 1.1 \\
        --d_model 24 --d_kv 6 --heads 4 --d_ff 40 --layers 3 --decoder_layers 2 --seed 1
    python tools/backbone_fixtures.py --arch bart --out tests/fixtures/bart_parity/d32_l2
    python tools/backbone_fixtures.py --arch bart --out tests/fixtures/bart_parity/d24_l3 --d_model 24 --layers 3 \\
        --decoder_layers 1 --heads 6 --decoder_heads 3 --d_ff 40 --decoder_d_ff 56 --seed 1
    python tools/backbone_fixtures.py --arch llama --out tests/fixtures/llama_parity/kv2_untied
    python tools/backbone_fixtures.py --arch llama --out tests/fixtures/llama_parity/kv4_tied_l3 --kv_heads 4 \\
        --tied --layers 3 --d_model 48 --d_ff 80 --seed 1

The writers are the parity modules' (`t5_parity.write_random_hf_t5`, `bart_parity.write_random_hf_bart`,
`llama_parity.write_random_hf_llama`). Then every tensor whose entries the initialisation leaves all equal (the
norms' ones, the biases' zeros) gets noise of `--spread`: there a swap of two entries (`check_parity --mutate`)
would change nothing. meta.json records the sizes, the seed, the versions and the command. The reference is
transformers itself, run by `python tools/check_parity.py --arch A --hf_dir FOLDER [--mutate]`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from gr_jax.runtime import cli
from gr_jax.runtime.io_utils import atomic_dir

DEFAULTS = {
    "t5": dict(vocab=64, d_model=32, d_kv=8, heads=4, d_ff=64, layers=2),
    "bart": dict(vocab=96, d_model=32, heads=4, decoder_heads=2, d_ff=64, decoder_d_ff=48, layers=2),
    "llama": dict(vocab=64, d_model=32, heads=4, kv_heads=2, d_ff=48, layers=2),
}


def write_fixture(arch: str, out: Path, seed: int = 0, spread: float = 0.1, **sizes) -> dict:
    import torch
    import transformers

    from gr_jax.backbones import bart_parity, llama_parity, t5_parity

    z = {**DEFAULTS[arch], **{k: v for k, v in sizes.items() if v not in (None, False)}}
    with atomic_dir(out) as tmp:
        if arch == "t5":
            t5_parity.write_random_hf_t5(tmp, z.get("t5_version", "1.0"), seed=seed, vocab_size=z["vocab"],
                                         d_model=z["d_model"], num_layers=z["layers"], num_heads=z["heads"],
                                         d_kv=z["d_kv"], d_ff=z["d_ff"], num_decoder_layers=z.get("decoder_layers"))
            model = t5_parity.load_torch_t5(tmp)
        elif arch == "bart":
            bart_parity.write_random_hf_bart(
                tmp, seed=seed, vocab_size=z["vocab"], d_model=z["d_model"], encoder_layers=z["layers"],
                decoder_layers=z.get("decoder_layers") or z["layers"], encoder_heads=z["heads"],
                decoder_heads=z["decoder_heads"], encoder_ffn=z["d_ff"], decoder_ffn=z["decoder_d_ff"])
            model = bart_parity.load_torch_bart(tmp)
        else:
            llama_parity.write_random_hf_llama(tmp, seed=seed, vocab_size=z["vocab"], d_model=z["d_model"],
                                               num_layers=z["layers"], num_heads=z["heads"],
                                               num_kv_heads=z["kv_heads"], d_ff=z["d_ff"],
                                               tie_word_embeddings=bool(z.get("tied")))
            model = llama_parity.load_torch_llama(tmp)
        generator = torch.Generator().manual_seed(seed + 7)
        spread_names = []
        with torch.no_grad():
            for name, p in model.named_parameters():
                if spread and bool((p == p.reshape(-1)[0]).all()):
                    p.add_(spread * torch.randn(p.shape, generator=generator))
                    spread_names.append(name)
        model.save_pretrained(str(tmp))
        meta = {"arch": arch, "seed": seed, "spread": spread, "sizes": z, "spread_tensors": len(spread_names),
                "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
                "command": " ".join(["python tools/backbone_fixtures.py", f"--arch {arch}", f"--out {out}"]
                                    + [f"--{k} {v}" for k, v in sorted(z.items())
                                       if DEFAULTS[arch].get(k) != v and k not in ("tied",)]
                                    + (["--tied"] if z.get("tied") else [])
                                    + ([f"--seed {seed}"] if seed else [])
                                    + ([f"--spread {spread}"] if spread != 0.1 else []))}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=tuple(DEFAULTS), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=cli.natural, default=0)
    parser.add_argument("--spread", type=cli.nonnegative, default=0.1,
                        help="noise added to every tensor the initialisation leaves constant (0: none)")
    for name in ("vocab", "d_model", "d_kv", "heads", "decoder_heads", "kv_heads", "d_ff", "decoder_d_ff", "layers",
                 "decoder_layers"):
        parser.add_argument(f"--{name}", type=cli.count, default=None, help="default: the arch's (module DEFAULTS)")
    parser.add_argument("--t5_version", choices=("1.0", "1.1"), default=None,
                        help="t5: 1.0 (ReLU, tied head) or 1.1 (gated GELU, separate head)")
    parser.add_argument("--tied", action="store_true", help="llama: tie the head to the embedding")
    args = parser.parse_args(argv)
    cli.setup_logging()
    sizes = {k: v for k, v in vars(args).items() if k not in ("arch", "out", "seed", "spread")}
    if args.t5_version and args.arch != "t5" or args.tied and args.arch != "llama":
        parser.error("--t5_version goes with --arch t5, --tied with --arch llama")
    read = {"t5": {"vocab", "d_model", "d_kv", "heads", "d_ff", "layers", "decoder_layers"},
            "bart": {"vocab", "d_model", "heads", "decoder_heads", "d_ff", "decoder_d_ff", "layers", "decoder_layers"},
            "llama": {"vocab", "d_model", "heads", "kv_heads", "d_ff", "layers"}}[args.arch]
    unread = [f"--{k}" for k in ("vocab", "d_model", "d_kv", "heads", "decoder_heads", "kv_heads", "d_ff",
                                 "decoder_d_ff", "layers", "decoder_layers") if getattr(args, k) is not None
              and k not in read]
    if unread:
        parser.error(f"{', '.join(unread)}: --arch {args.arch} has no such size")
    try:
        meta = write_fixture(args.arch, Path(args.out), seed=args.seed, spread=args.spread, **sizes)
    except (ValueError, OSError) as e:
        logging.error("%s", e)
        return 2
    logging.info("wrote %s (%s)", args.out, meta["command"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
