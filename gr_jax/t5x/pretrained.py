"""A pretrained T5 in t5x's checkpoint format → our converted checkpoint, which INITIAL_CHECKPOINT_PATH starts a run
from (`python -m gr_jax.train` or `python -m t5x.train` with a gr_jax model):

    python -m gr_jax.t5x.pretrained --checkpoint t5_1_1_small/checkpoint_1000000 --out runs/t5_1_1_small

The public T5.1.1 / T5.1.0 / mT5 checkpoints of t5x (t5x's `examples/t5` network: `token_embedder`, `encoder` /
`decoder` with `layers_<i>`, `relpos_bias`, `logits_dense` unless the head is the embedding) in either of t5x's
layouts (msgpack + tensorstore, or orbax). The network's shape is read from the tensors: vocabulary, widths, layers,
heads (from the relative-position table), gated-GELU or ReLU feed-forward, a separate or shared output head; what
the tensors do not hold is T5's (relative attention max distance 128, LayerNorm epsilon 1e-6) or given here
(`--dropout_rate`). Every tensor is placed through our HF T5 mapping (`models.convert.params_from_hf`), which
refuses a checkpoint with a missing, extra or mis-shaped tensor. Exit 2 with a message on bad input.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Mapping

import numpy as np

from gr_jax.runtime.cli import setup_logging
from gr_jax.runtime.errors import UserError
from gr_jax.backbones import t5_convert
from gr_jax.t5x.checkpoints import read_t5x_params


class PretrainedError(UserError, ValueError):
    pass


def _layers(stack: Mapping, where: str) -> int:
    n = sum(1 for k in stack if re.fullmatch(r"layers_\d+", k))
    if n == 0 or any(f"layers_{i}" not in stack for i in range(n)):
        raise PretrainedError(f"{where}: not t5x's T5 layout (layers_0 .. layers_<n-1>), has {sorted(stack)}")
    return n


# per layer: (t5x block, HF sub-layer index, HF block name, t5x layer norm before it)
_ENCODER = (("attention", 0, ".SelfAttention", "pre_attention_layer_norm"), ("mlp", 1, "", "pre_mlp_layer_norm"))
_DECODER = (("self_attention", 0, ".SelfAttention", "pre_self_attention_layer_norm"),
            ("encoder_decoder_attention", 1, ".EncDecAttention", "pre_cross_attention_layer_norm"),
            ("mlp", 2, "", "pre_mlp_layer_norm"))


def hf_from_t5x(target: Mapping, max_distance: int = 128, dropout_rate: float = 0.1) -> tuple[dict, dict]:
    """(HF T5 config, HF T5 tensors) of t5x's T5 parameter tree (`target`). t5x's kernels are [in, out] and HF's
    weights [out, in]; the relative-position tables are [heads, buckets] in t5x and [buckets, heads] in HF."""
    try:
        enc, dec = target["encoder"], target["decoder"]
        emb = np.asarray(target["token_embedder"]["embedding"])
        rel = np.asarray(enc["relpos_bias"]["rel_embedding"])
        n_enc, n_dec = _layers(enc, "encoder"), _layers(dec, "decoder")
        heads, buckets = rel.shape
        q = np.asarray(enc["layers_0"]["attention"]["query"]["kernel"])
        gated = "wi_0" in enc["layers_0"]["mlp"]
        d_ff = np.asarray(enc["layers_0"]["mlp"]["wi_0" if gated else "wi"]["kernel"]).shape[1]
    except (KeyError, TypeError) as e:
        raise PretrainedError(f"not a t5x T5 checkpoint: no {e} in its parameters") from None
    if q.shape[1] % heads:
        raise PretrainedError(f"query width {q.shape[1]} is not a multiple of the {heads} heads")
    config = {"model_type": "t5", "vocab_size": int(emb.shape[0]), "d_model": int(emb.shape[1]),
              "d_kv": int(q.shape[1] // heads), "d_ff": int(d_ff), "num_layers": n_enc, "num_decoder_layers": n_dec,
              "num_heads": int(heads), "relative_attention_num_buckets": int(buckets),
              "relative_attention_max_distance": int(max_distance), "dropout_rate": float(dropout_rate),
              "layer_norm_epsilon": 1e-6, "feed_forward_proj": "gated-gelu" if gated else "relu",
              "tie_word_embeddings": "logits_dense" not in dec}
    t: dict[str, np.ndarray] = {"shared.weight": emb}

    def kernel(x):
        return np.asarray(x["kernel"]).T

    def attention(prefix: str, block: Mapping) -> None:
        for ours, theirs in (("q", "query"), ("k", "key"), ("v", "value"), ("o", "out")):
            t[f"{prefix}.{ours}.weight"] = kernel(block[theirs])

    def mlp(prefix: str, block: Mapping) -> None:
        for name in (("wi_0", "wi_1", "wo") if gated else ("wi", "wo")):
            t[f"{prefix}.DenseReluDense.{name}.weight"] = kernel(block[name])

    try:
        for name, stack, n, parts in (("encoder", enc, n_enc, _ENCODER), ("decoder", dec, n_dec, _DECODER)):
            for i in range(n):
                layer, p = stack[f"layers_{i}"], f"{name}.block.{i}.layer"
                for block, index, hf_block, norm in parts:
                    (mlp if block == "mlp" else attention)(f"{p}.{index}{hf_block}", layer[block])
                    t[f"{p}.{index}.layer_norm.weight"] = np.asarray(layer[norm]["scale"])
        t["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = rel.T
        t["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = np.asarray(
            dec["relpos_bias"]["rel_embedding"]).T
        t["encoder.final_layer_norm.weight"] = np.asarray(enc["encoder_norm"]["scale"])
        t["decoder.final_layer_norm.weight"] = np.asarray(dec["decoder_norm"]["scale"])
        if "logits_dense" in dec:
            t["lm_head.weight"] = kernel(dec["logits_dense"])
    except (KeyError, TypeError) as e:
        raise PretrainedError(f"not a t5x T5 checkpoint: no {e} in its parameters") from None
    return config, t


def convert_t5x_t5(checkpoint: str, out: str, max_distance: int = 128, dropout_rate: float = 0.1) -> dict:
    """Module docstring. Returns what was written."""
    path = Path(checkpoint)
    if not path.is_dir():
        raise PretrainedError(f"{path}: not a directory (pass a t5x checkpoint_<N> folder)")
    config_hf, tensors = hf_from_t5x(read_t5x_params(path), max_distance, dropout_rate)
    config = t5_convert.config_from_hf(config_hf, tensors, source=str(path))
    try:
        params = t5_convert.params_from_hf(tensors, config, source=str(path))
    except t5_convert.CheckpointError as e:
        raise PretrainedError(str(e)) from None
    t5_convert.save_checkpoint(params, config, out, extra_metadata={"converted_from": str(path), "format": "t5x"})
    return {"checkpoint": str(out), "from": str(path), "config": json.loads(config.to_json())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a t5x checkpoint_<N> folder of a T5")
    parser.add_argument("--out", required=True, help="the converted checkpoint folder to write (must not exist)")
    parser.add_argument("--dropout_rate", type=float, default=0.1, help="recorded in the config (default 0.1)")
    parser.add_argument("--relative_attention_max_distance", type=int, default=128)
    args = parser.parse_args(argv)
    setup_logging()
    try:
        out = convert_t5x_t5(args.checkpoint, args.out, args.relative_attention_max_distance, args.dropout_rate)
    except (UserError, t5_convert.CheckpointError, FileExistsError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
