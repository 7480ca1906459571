"""Greedy continuation of a prompt with a decoder-only LM (a named pretrained model, a GGUF file or an HF
Llama directory).

    python tools/generate.py --model smollm2_135m --prompt "The capital of France is" --max_new_tokens 8
    python tools/generate.py --model smollm2_135m --chat --prompt "Name three primary colours."
    python tools/generate.py --gguf path/to/model.gguf --prompt "..."

`--chat` wraps the prompt in the model's one-turn chat format (ChatML for SmolLM2-Instruct). Prints the
continuation (without the prompt) on stdout; exit status 2 on an unreadable model or bad arguments.
"""

from __future__ import annotations

import argparse
import logging
import sys

from gr_jax.runtime import cli
from gr_jax.runtime.cli import setup_logging


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", choices=("smollm2_135m",), help="a named pretrained model")
    src.add_argument("--gguf", help="a Llama-family GGUF file (its tokenizer is read from the file)")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--max_new_tokens", type=cli.count, default=32)
    parser.add_argument("--chat", action="store_true", help="wrap the prompt as one user turn of a chat")
    args = parser.parse_args(argv)
    setup_logging()
    if args.max_new_tokens < 1:
        parser.error("--max_new_tokens must be ≥ 1")
    from gr_jax.backbones import llama, llama_io, lm_generate, lm_tokenizer

    try:
        if args.model:
            config, params, tok = llama_io.load_named(args.model)
        else:
            config, params, f = llama_io.load_gguf(args.gguf)
            tok = lm_tokenizer.tokenizer_from_gguf(f)
    except (ValueError, OSError) as e:  # CheckpointError is a ValueError
        logging.error("%s", e)
        return 2
    text = tok.chat(args.prompt) if args.chat else args.prompt
    stops = [tok.eos_id] + ([tok.backend.token_to_id("<|im_end|>")] if args.chat else [])
    out = lm_generate.generate(llama.Llama(config), params, [tok.encode(text)], max_new_tokens=args.max_new_tokens,
                               stop_ids=[s for s in stops if s is not None])
    sys.stdout.write(tok.decode(out[0]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
