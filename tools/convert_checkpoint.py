"""Converts an HF / PyTorch T5 directory into a gr_jax checkpoint (orbax params + config.json).

    python tools/convert_checkpoint.py --hf_dir path/to/hf_t5 --out path/to/gr_jax_ckpt

Every tensor is checked before anything is written; on error nothing is left at --out.
With --to_hf, converts the other way: a gr_jax checkpoint directory → an HF directory.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from gr_jax.runtime.cli import setup_logging
from gr_jax.backbones import t5_convert


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf_dir", required=True, help="HF T5 directory (config.json + model.safetensors "
                        "or pytorch_model.bin); with --to_hf, the HF directory to write")
    parser.add_argument("--out", required=True, help="gr_jax checkpoint directory to write; with --to_hf, "
                        "the gr_jax checkpoint to read")
    parser.add_argument("--to_hf", action="store_true", help="export a gr_jax checkpoint to an HF directory")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty destination")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        if args.to_hf:
            config, params = t5_convert.load_checkpoint(args.out)
            t5_convert.save_hf(params, config, args.hf_dir, overwrite=args.overwrite)
            result = {"hf_dir": args.hf_dir, "from": args.out}
        else:
            config = t5_convert.convert_hf_to_checkpoint(args.hf_dir, args.out, overwrite=args.overwrite)
            result = {"out": args.out, "from": args.hf_dir, "t5_config": json.loads(config.to_json())}
    except (ValueError, OSError) as e:  # CheckpointError is a ValueError; OSError: unwritable --out
        logging.error("%s", e)
        return 2
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
