"""A released SEAL / MINDER / LTRGR checkpoint → a MODEL_DIR that `python -m gr_jax.infer` evaluates.

    python -m gr_jax.methods.seal.import_released --checkpoint_dir=CKPT --model_dir=M \\
        --gin_file=experiments/released/seal_nq.gin --gin.DATA_DIR="'D'"

CKPT is the directory the authors' release unpacks to: a fairseq checkpoint (checkpoint_best.pt, or the one *.pt
there; an HF BART directory converted from it works too) and its tokenizer (fairseq's dict.txt with GPT-2's
encoder.json and vocab.bpe, or HF's vocab.json and merges.txt). The tokenizer is written to M/vocabulary in the
library's ids (`backbones/bart_tokenizer`), the network is read through its INITIAL_CHECKPOINT_PATH loader
(`backbones/bart_convert`: fairseq keys, the unpickling allowlist), and `compose.import_checkpoint` builds the
substring index over the corpus of DATA_DIR with that tokenizer and writes M/checkpoints/0. Nothing is trained.
Prints one JSON line, with the `gr_jax.infer` command that evaluates the import; exit 2 with a message on bad
input, and nothing of the import is left in M.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from gr_jax.methods.api import Command, RunDir, UserError, bart_convert, bart_tokenizer, gin_checks, import_checkpoint

USAGE = __doc__


def checkpoint_file(checkpoint_dir: Path) -> Path:
    """The network of a release directory: checkpoint_best.pt, the one *.pt, or the directory as an HF BART."""
    if bart_convert.is_hf_bart_dir(checkpoint_dir):
        return checkpoint_dir
    best = checkpoint_dir / "checkpoint_best.pt"
    if best.is_file():
        return best
    found = sorted(checkpoint_dir.glob("*.pt"))
    if len(found) != 1:
        raise UserError(f"{checkpoint_dir}: {'no' if not found else len(found)} fairseq checkpoint files (*.pt) and no "
                        f"checkpoint_best.pt; point --checkpoint_dir at the directory of one released checkpoint")
    return found[0]


def _imported(checkpoint_dir: Path, model_dir: Path, network: Path, args_line: str):
    def run():
        vocab_dir = RunDir(model_dir).vocabulary
        if vocab_dir.exists():
            raise UserError(f"{vocab_dir}: exists; import into a new MODEL_DIR")
        rows = None if network.is_dir() else bart_convert.fairseq_embedding_rows(network)
        bart_tokenizer.write_library_tokenizer(checkpoint_dir, vocab_dir, embedding_rows=rows)
        try:
            out = import_checkpoint(model_dir=str(model_dir), initial_checkpoint_path=str(network),
                                    feature_lengths=gin_checks.macro("TASK_FEATURE_LENGTHS"),
                                    task=gin_checks.macro("MIXTURE_OR_TASK_NAME"))
        except BaseException:
            shutil.rmtree(vocab_dir, ignore_errors=True)
            raise
        out["vocabulary"] = str(vocab_dir)
        out["evaluate"] = (f"python -m gr_jax.infer --gin_file=runs/infer.gin {args_line} --gin.MODEL_DIR=\"'{model_dir}'\" "
                           f"--gin.INITIAL_CHECKPOINT_PATH=\"'{network}'\" --gin.VOCABULARY=\"'{vocab_dir}'\" "
                           f"--gin.infer.evaluate=True")
        return out

    return run


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--checkpoint_dir")
    parser.add_argument("--model_dir")
    ours, rest = parser.parse_known_args(argv)
    if not any(a in ("-h", "--help") for a in rest) and not (ours.checkpoint_dir and ours.model_dir):
        sys.stderr.write("error: --checkpoint_dir and --model_dir are required\n" + USAGE)
        return 2
    checkpoint_dir = Path(ours.checkpoint_dir or ".")
    model_dir = Path(ours.model_dir or ".")
    try:
        network = checkpoint_file(checkpoint_dir) if ours.checkpoint_dir else checkpoint_dir
        if ours.checkpoint_dir and bart_tokenizer.layout(checkpoint_dir) is None:
            raise UserError(f"{checkpoint_dir}: no tokenizer beside the checkpoint (dict.txt + encoder.json + "
                            f"vocab.bpe, or vocab.json + merges.txt); copy BART's files there")
    except UserError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    vocab_dir = RunDir(model_dir).vocabulary
    gin_args = " ".join(a for a in rest if a.startswith("--gin"))
    command = Command(
        "import_released", USAGE, lambda: _imported(checkpoint_dir, model_dir, network, gin_args),
        lambda out: json.dumps(out) + "\n", root="infer",
        fixed=(f"MODEL_DIR = '{model_dir}'", f"INITIAL_CHECKPOINT_PATH = '{network}'", f"VOCABULARY = '{vocab_dir}'",
               "TRAIN_STEPS = 1", "BATCH_SIZE = 1"),
        allow_unused=("train", "make_optimizer", "EvalConfig"))
    return command.main(rest)


if __name__ == "__main__":
    sys.exit(main())
