"""Writes an NCI parity fixture (tests/fixtures/nci_parity/<shape>/) from NCI's own code; every size is a flag.

    git clone https://github.com/solidsea98/Neural-Corpus-Indexer-NCI NCI && \\
        python tools/nci_fixtures.py --nci_repo NCI --out tests/fixtures/nci_parity/v10_d32
    python tools/nci_fixtures.py --nci_repo NCI --out tests/fixtures/nci_parity/v7_d24_padded --codes 7 \\
        --d_model 24 --d_kv 6 --encoder_layers 3 --decoder_layers 2 --batch 4 --short_docids 2 --code_length 5 \\
        --query_length 9 --seed 1

(`--short_docids`: rows whose docid is two codes and the end token, padded after it; transformers 3.4's T5 has no
gated feed-forward, so every shape is ReLU; `--norm_spread`: noise added to every tensor their init leaves constant,
the norms' ones and the attention biases' zeros, where a swap of two entries (`check_parity --mutate`) would change
nothing.)

It runs the T5 with the PAWA decoder that NCI vendors (NCI_model/transformers/modeling_t5.py, transformers 3.4.0
modified), built as NCI_model/main_models.py builds it for train.sh (decode_embedding 2, adaptor_efficient,
Rdrop 0.15, tied docid table), on a tiny random configuration: the training forward over [queries; augmented
queries] with dropout off (their logits under the training mask, the cross-entropy, their "Contrast" term and the
loss), the evaluation forward (logits under the evaluation mask) and their prefix-tree `generate` (beams, length
penalty 0.8). Adaptation, because the vendored package's `__init__` imports every model of transformers 3.4 (and
needs sacremoses and an old protobuf): its modules are loaded as a package of their own without running that
`__init__` (with `__version__` set, which file_utils imports), with USE_TF=0 / USE_FLAX=0; no file of theirs is
edited. The decoder batch is never exactly 2 rows (modeling_t5.py:709 embeds only row 0 then).

Folder: weights.safetensors (their state dict), config.json (their T5Config's fields), inputs.npz, outputs.npz,
meta.json. `methods/nci/parity.py` checks ours against it
(`python tools/check_parity.py --method nci --fixture tests/fixtures/nci_parity/v10_d32`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import types
from pathlib import Path

import numpy as np

from gr_jax.runtime import cli
from gr_jax.runtime.provenance import git_commit

# the default shape (tests/fixtures/nci_parity/v10_d32): d_model, codes V, docid codes L, batch B, vocabulary,
# adaptor layers; every size is a flag
D, V, L, B, VOCAB, ADAPTOR_LAYERS = 32, 10, 4, 3, 64, 2


def _load_vendored(repo: Path):
    os.environ["USE_TF"], os.environ["USE_FLAX"], os.environ["USE_TORCH"] = "0", "0", "1"
    pkg = types.ModuleType("nci_vendored_transformers")
    pkg.__path__ = [str(repo / "NCI_model" / "transformers")]
    pkg.__version__ = "3.4.0"
    sys.modules[pkg.__name__] = pkg
    config = importlib.import_module(f"{pkg.__name__}.configuration_t5")
    model = importlib.import_module(f"{pkg.__name__}.modeling_t5")
    return config.T5Config, model.T5ForConditionalGeneration


DEFAULTS = dict(d_model=D, codes=V, code_length=L, batch=B, vocab=VOCAB, adaptor_layers=ADAPTOR_LAYERS,
                encoder_layers=2, decoder_layers=2, d_ff=64, heads=4, d_kv=8, short_docids=1, query_length=7,
                norm_spread=0.1)


class _Node:  # their TreeBuilder's node (main_models.py)
    def __init__(self, token):
        self.token_id, self.children = token, {}


def write_fixture(repo: Path, out: Path, seed: int = 0, commit: str | None = None, sizes=None) -> dict:
    import torch
    from safetensors.numpy import save_file

    z = sizes if sizes is not None else argparse.Namespace(**DEFAULTS)
    D, V, L, B, VOCAB, ADAPTOR_LAYERS = z.d_model, z.codes, z.code_length, z.batch, z.vocab, z.adaptor_layers
    T = L + 1  # max_output_length: L codes + the end token
    VD = V * T + 2
    if B < 3 or B == 2 or z.short_docids > B - 1 or z.query_length < 4:
        raise ValueError("--batch ≥ 3 (their decoder embeds only row 0 of a 2-row batch), --short_docids < --batch, "
                         "--query_length ≥ 4")
    T5Config, T5 = _load_vendored(repo)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    settings = dict(vocab_size=VOCAB, num_layers=z.encoder_layers, num_decoder_layers=z.decoder_layers, d_ff=z.d_ff,
                    d_model=D, num_heads=z.heads, d_kv=z.d_kv,
                    decoder_start_token_id=0, output_past=True, dropout_rate=0.1, decode_embedding=2,
                    hierarchic_decode=0, decode_vocab_size=VD, output_vocab_size=V, tie_word_embeddings=0,
                    tie_decode_embedding=1, contrastive=0, Rdrop=0.15, Rdrop_only_decoder=0, Rdrop_loss="KL",
                    adaptor_decode=1, adaptor_efficient=1, adaptor_layer_num=ADAPTOR_LAYERS,
                    embedding_distillation=0.0, weight_distillation=0.0, input_dropout=1, denoising=0,
                    multiple_decoder=0, decoder_num=1, train_batch_size=B, eval_batch_size=B, max_output_length=T)
    model = T5(T5Config(**settings))
    with torch.no_grad():  # their init leaves the cross-attention bias and the adaptor's memory at small values
        for name, p in model.named_parameters():
            if "relative_attention_bias" in name:
                p.normal_(0.0, 1.0)
            elif z.norm_spread and p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                # norms at ones, biases at zeros: a swap of two entries of a constant tensor changes nothing
                p.add_(z.norm_spread * torch.randn_like(p))
    # docids of L − 1 codes and one of two (then the end token, padding), shorter than T − 1 as NQ320k's are: their
    # generate (max_length = T) scores the end token of every docid only then
    codes = rng.integers(0, V, (B, L - 1))
    labels = np.zeros((B, T), np.int64)
    labels[:, :L - 1] = codes + 2 + np.arange(L - 1) * V
    labels[:, L - 1] = 1
    for row in range(2, 2 + z.short_docids):  # docids of two codes: the end token, then padding
        labels[row, 2] = 1
        labels[row, 3:] = 0
    Q = z.query_length
    src = rng.integers(2, VOCAB, (B, Q))
    src[:, -1] = 1
    aug = rng.integers(2, VOCAB, (B, Q))
    aug[:, -1] = 1
    src[1, Q - 2:] = [1, 0]  # one padded query
    lm = np.where(labels == 0, -100, labels)

    def no_dropout(m):
        for mod in m.modules():
            if isinstance(mod, torch.nn.Dropout):
                mod.p = 0.0
            if isinstance(getattr(mod, "dropout", None), float):  # MultiheadAttention's, and T5Attention's
                mod.dropout = 0.0  # attention-weight dropout (a rate, not a module)

    no_dropout(model)
    model.train()  # the training mask and the Rdrop loss; no dropout
    both = torch.tensor(np.concatenate([src, aug]))
    with torch.no_grad():
        train = model(input_ids=both, attention_mask=both.ne(0), labels=torch.tensor(np.concatenate([lm, lm])),
                      decoder_attention_mask=torch.tensor(np.concatenate([labels != 0] * 2).astype(np.int64)),
                      return_dict=True)
    model.eval()
    s = torch.tensor(src)
    with torch.no_grad():
        ev = model(input_ids=s, attention_mask=s.ne(0), labels=torch.tensor(lm), return_dict=True)
        root = _Node(0)
        for row in labels.tolist():
            node = root
            for tok in row:
                if tok == 0:
                    break
                node = node.children.setdefault(tok, _Node(tok))
        seqs, scores = model.generate(s, attention_mask=s.ne(0), use_cache=False, max_length=T, num_beams=B,
                                      length_penalty=0.8, num_return_sequences=B, early_stopping=False,
                                      decode_embedding=2, decode_vocab_size=VD, decode_tree=root, output_scores=True)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in state.items()}, str(out / "weights.safetensors"))
    (out / "config.json").write_text(json.dumps(settings, indent=1) + "\n")
    np.savez(out / "inputs.npz", queries=src, augmented=aug, labels=labels)
    np.savez(out / "outputs.npz", train_logits=train.logits.numpy(), train_loss=np.float64(train.loss),
             train_ce=np.float64(train.orig_loss), train_contrast=np.float64(train.dist_loss),
             eval_logits=ev.logits.numpy(), beams=seqs.numpy().reshape(B, B, -1),
             beam_scores=np.asarray(scores, np.float64).reshape(B, B))
    meta = {"codes": V, "positions": T, "adaptor_layers": ADAPTOR_LAYERS, "batch": B, "seed": seed,
            "sizes": vars(z), "command": "python tools/nci_fixtures.py --nci_repo NCI " + " ".join(
                f"--{k} {v}" for k, v in sorted(vars(z).items()) if DEFAULTS.get(k) != v),
            "nci_commit": commit or git_commit(repo), "torch": torch.__version__,
            "adapted": "NCI_model/transformers loaded as a package without running its __init__ (which imports every "
                       "model of transformers 3.4 and needs sacremoses); USE_TF=0, USE_FLAX=0; no file edited",
            "settings": "train.sh's: decode_embedding 2, adaptor_efficient, tie_decode_embedding, Rdrop 0.15 "
                        "(Contrast); dropout off (p = 0, train mode for the training mask); relative position "
                        "biases drawn N(0, 1) so that they matter; generate: beams 3, length penalty 0.8, no cache"}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nci_repo", required=True, help="a working tree of solidsea98/Neural-Corpus-Indexer-NCI")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=cli.natural, default=0)
    parser.add_argument("--commit", help="the commit of --nci_repo when it is not a git working tree (an export)")
    for name, default in DEFAULTS.items():
        kind = cli.nonnegative if name == "norm_spread" else cli.natural if name == "short_docids" else cli.count
        parser.add_argument(f"--{name}", type=kind, default=default)
    args = parser.parse_args(argv)
    repo = Path(args.nci_repo)
    if not (repo / "NCI_model" / "transformers" / "modeling_t5.py").is_file():
        sys.stderr.write(f"error: {repo}: no NCI_model/transformers/modeling_t5.py; give a working tree of "
                         f"github.com/solidsea98/Neural-Corpus-Indexer-NCI\n")
        return 2
    sizes = argparse.Namespace(**{k: getattr(args, k) for k in DEFAULTS})
    try:
        meta = write_fixture(repo, Path(args.out), args.seed, args.commit, sizes)
    except ValueError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    sys.stdout.write(json.dumps(meta) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
