"""HF / PyTorch T5 checkpoints ↔ gr_jax parameters, and gr_jax's own checkpoint directory format.

Reading needs no torch for `model.safetensors` (sharded or not); `pytorch_model.bin` goes through
`torch.load(weights_only=True)`, never plain pickle. Every key is checked before anything is written:
missing, unexpected and mis-shaped tensors are reported together in one `CheckpointMismatchError`.

A gr_jax T5 checkpoint directory holds `config.json` (our `T5Config`, a format tag and, since format v2, the
checksum of every array) and `params/` (an orbax PyTree checkpoint). Loading checks every array against its
checksum; only a v1 directory (written before checksums existed) is read unchecked, with a note. `save_checkpoint` writes it to a temporary sibling and renames it into place,
so an interrupted or failed conversion leaves nothing at the destination.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import jax
import numpy as np

from gr_jax.runtime.pickle_probe import refusal_text
from gr_jax.runtime.io_utils import FileFormatError, abandoned_reads_quiet, atomic_dir, quiet_orbax_threads, read_json
from gr_jax.runtime.provenance import array_digests, changed_arrays
from gr_jax.backbones.t5 import T5Config, init_params

log = logging.getLogger(__name__)
quiet_orbax_threads()  # orbax worker-thread tracebacks to the debug log (io_utils)

FORMAT_TAG = "gr_jax.t5.v2"  # v2: config.json records the arrays' checksums
_UNCHECKED_TAG = "gr_jax.t5.v1"  # written before checksums existed: read unchecked
HF_CONFIG = "config.json"
HF_SAFETENSORS = "model.safetensors"
HF_SAFETENSORS_INDEX = "model.safetensors.index.json"
HF_TORCH_BIN = "pytorch_model.bin"
HF_TORCH_BIN_INDEX = "pytorch_model.bin.index.json"

# HF keys that alias the shared embedding (tied), or that HF itself ignores on load.
_HF_ALIASES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
_HF_IGNORED = ("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)


class CheckpointError(ValueError):
    """A checkpoint that cannot be read (corrupt file, unknown layout, bad config)."""


class CheckpointMismatchError(CheckpointError):
    """The tensors of a checkpoint do not match the model: lists every missing, unexpected and mis-shaped key."""

    def __init__(self, source: str, missing=(), unexpected=(), mis_shaped=(), what: str = "T5Config"):
        self.missing, self.unexpected, self.mis_shaped = sorted(missing), sorted(unexpected), sorted(mis_shaped)
        counts = [f"{len(v)} {name}" for name, v in (("missing", self.missing), ("unexpected", self.unexpected),
                                                     ("mis-shaped", self.mis_shaped)) if v]
        first = (self.missing or self.unexpected or [k for k, *_ in self.mis_shaped] or ["?"])[0]
        # the first line stands alone (an entry point prints one line): what, where, how many, one example
        lines = [f"checkpoint {source} does not match the {what}: {', '.join(counts)} keys (e.g. {first})"]
        if self.missing:
            lines.append(f"  missing keys ({len(self.missing)}): " + ", ".join(self.missing))
        if self.unexpected:
            lines.append(f"  unexpected keys ({len(self.unexpected)}): " + ", ".join(self.unexpected))
        if self.mis_shaped:
            lines.append(f"  mis-shaped keys ({len(self.mis_shaped)}): "
                         + ", ".join(f"{k} {got} (expected {want})" for k, got, want in self.mis_shaped))
        super().__init__("\n".join(lines))


# ----------------------------------------------------------------------------------------------------------
# The key map
# ----------------------------------------------------------------------------------------------------------


def _key_map(config: T5Config) -> Iterator[tuple[str, tuple[str, ...], bool]]:
    """Yields (HF key, our param path, transpose?) for every tensor of the model."""
    yield "shared.weight", ("embedding",), False
    if not config.tie_word_embeddings:
        yield "lm_head.weight", ("lm_head", "kernel"), True
    ffn = ("wi_0", "wi_1", "wo") if config.is_gated else ("wi", "wo")
    for stack, n_layers in (("encoder", config.num_layers), ("decoder", config.num_decoder_layers)):
        attn0 = "attention" if stack == "encoder" else "self_attention"
        yield (f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
               (stack, "relpos_bias", "rel_embedding"), False)
        yield f"{stack}.final_layer_norm.weight", (stack, "final_norm", "scale"), False
        if stack == "decoder" and config.cross_attention_bias:
            yield _HF_IGNORED[0], ("decoder", "cross_relpos_bias", "rel_embedding"), False
        for i in range(n_layers):
            hf, ours = f"{stack}.block.{i}.layer", (stack, f"layers_{i}")
            sublayers = [(f"{hf}.0.SelfAttention", f"{hf}.0.layer_norm", attn0, f"{attn0}_norm")]
            if stack == "decoder":
                sublayers.append((f"{hf}.1.EncDecAttention", f"{hf}.1.layer_norm", "cross_attention",
                                  "cross_attention_norm"))
            for hf_attn, hf_norm, our_attn, our_norm in sublayers:
                for proj in ("q", "k", "v", "o"):
                    yield f"{hf_attn}.{proj}.weight", (*ours, our_attn, proj, "kernel"), True
                yield f"{hf_norm}.weight", (*ours, our_norm, "scale"), False
            j = 1 if stack == "encoder" else 2
            for proj in ffn:
                yield f"{hf}.{j}.DenseReluDense.{proj}.weight", (*ours, "mlp", proj, "kernel"), True
            yield f"{hf}.{j}.layer_norm.weight", (*ours, "mlp_norm", "scale"), False


def _get(tree: Mapping, path: tuple[str, ...]):
    for p in path:
        tree = tree[p]
    return tree


def _set(tree: dict, path: tuple[str, ...], value) -> None:
    for p in path[:-1]:
        tree = tree.setdefault(p, {})
    tree[path[-1]] = value


def _abstract_params(config: T5Config):
    return jax.eval_shape(lambda: init_params(config))


# ----------------------------------------------------------------------------------------------------------
# HF directory → tensors + config
# ----------------------------------------------------------------------------------------------------------


def config_from_hf(hf_config: Mapping[str, Any], tensors: Mapping[str, Any] | None = None,
                   source: str = "config.json") -> T5Config:
    """Our T5Config from an HF T5 `config.json` (transformers 4.x or 5.x semantics).

    Whether the output head is tied is read from the tensors when given: a separate `lm_head.weight` that
    differs from `shared.weight` means untied, whatever the config says (transformers 5 writes
    `tie_word_embeddings: true` for every T5 and keeps the v1.0/v1.1 difference in `scale_decoder_outputs`).
    """
    model_type = hf_config.get("model_type", "t5")
    if model_type not in ("t5", "mt5"):
        raise CheckpointError(f"{source}: model_type {model_type!r} is not a T5 model")
    try:
        tie_cfg = bool(hf_config.get("tie_word_embeddings", True))
        scale = bool(hf_config.get("scale_decoder_outputs", tie_cfg))
        if tensors is not None and "lm_head.weight" in tensors:
            tied = "shared.weight" in tensors and np.array_equal(np.asarray(tensors["lm_head.weight"]),
                                                                 np.asarray(tensors["shared.weight"]))
        elif tensors is not None:
            tied = True  # no separate head in the file: the head is the shared embedding
        else:
            tied = tie_cfg
        num_layers = int(hf_config["num_layers"])
        return T5Config(
            vocab_size=int(hf_config["vocab_size"]),
            d_model=int(hf_config["d_model"]),
            d_kv=int(hf_config["d_kv"]),
            d_ff=int(hf_config["d_ff"]),
            num_layers=num_layers,
            num_decoder_layers=int(hf_config.get("num_decoder_layers") or num_layers),
            num_heads=int(hf_config["num_heads"]),
            relative_attention_num_buckets=int(hf_config.get("relative_attention_num_buckets", 32)),
            relative_attention_max_distance=int(hf_config.get("relative_attention_max_distance", 128)),
            dropout_rate=float(hf_config.get("dropout_rate", 0.1)),
            layer_norm_epsilon=float(hf_config.get("layer_norm_epsilon", 1e-6)),
            feed_forward_proj=str(hf_config.get("feed_forward_proj", "relu")),
            tie_word_embeddings=tied,
            scale_decoder_outputs=scale,
            pad_token_id=int(hf_config.get("pad_token_id", 0) or 0),
            eos_token_id=int(hf_config.get("eos_token_id", 1) or 1),
            decoder_start_token_id=int(hf_config.get("decoder_start_token_id", 0) or 0),
            cross_attention_bias=bool(hf_config.get("cross_attention_bias", False)),
        )
    except KeyError as e:
        raise CheckpointError(f"{source}: required field {e.args[0]!r} is missing") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{source}: {e}") from None


def config_to_hf(config: T5Config) -> dict[str, Any]:
    """An HF `config.json` dict that transformers 4.x and 5.x both read as this architecture."""
    return {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "vocab_size": config.vocab_size,
        "d_model": config.d_model,
        "d_kv": config.d_kv,
        "d_ff": config.d_ff,
        "num_layers": config.num_layers,
        "num_decoder_layers": config.num_decoder_layers,
        "num_heads": config.num_heads,
        "relative_attention_num_buckets": config.relative_attention_num_buckets,
        "relative_attention_max_distance": config.relative_attention_max_distance,
        "dropout_rate": config.dropout_rate,
        "layer_norm_epsilon": config.layer_norm_epsilon,
        "feed_forward_proj": config.feed_forward_proj,
        "tie_word_embeddings": config.tie_word_embeddings,
        "scale_decoder_outputs": config.scale_decoder_outputs,
        "is_encoder_decoder": True,
        "pad_token_id": config.pad_token_id,
        "eos_token_id": config.eos_token_id,
        "decoder_start_token_id": config.decoder_start_token_id,
        **({"cross_attention_bias": True} if config.cross_attention_bias else {}),
    }


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError, safe_open

    try:
        # framework="flax" reads bfloat16 too (numpy has no native bfloat16).
        with safe_open(str(path), framework="flax") as f:
            return {k: np.asarray(f.get_tensor(k)) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: cannot read safetensors file ({e})") from None


def _read_torch_bin(path: Path) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError:
        raise CheckpointError(f"{path}: reading pytorch_model.bin needs torch (pip install 'gr_jax[torch]'), "
                              f"or convert the directory to model.safetensors") from None
    import pickle

    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{path}: refused: it pickles {refusal_text(path, (), str(e))}, which a state dict of "
                              f"tensors does not need") from None
    except Exception as e:  # torch raises many types for a corrupt or unsafe file
        raise CheckpointError(f"{path}: cannot read PyTorch state dict ({type(e).__name__}: {e})") from None
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{path}: expected a state dict, found {type(state).__name__}")
    return {k: v.detach().float().numpy() if v.dtype == torch.bfloat16 else v.detach().numpy()
            for k, v in state.items()}


def _read_sharded(index_path: Path, reader) -> dict[str, np.ndarray]:
    try:
        weight_map = read_json(index_path)["weight_map"]
    except (OSError, json.JSONDecodeError, KeyError) as e:
        raise CheckpointError(f"{index_path}: not a valid shard index ({e})") from None
    tensors: dict[str, np.ndarray] = {}
    for shard in sorted(set(weight_map.values())):
        tensors.update(reader(index_path.parent / shard))
    return tensors


def read_hf_tensors(hf_dir: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of an HF checkpoint directory, as numpy arrays keyed by HF name."""
    d = Path(hf_dir)
    if (d / HF_SAFETENSORS).exists():
        return _read_safetensors(d / HF_SAFETENSORS)
    if (d / HF_SAFETENSORS_INDEX).exists():
        return _read_sharded(d / HF_SAFETENSORS_INDEX, _read_safetensors)
    if (d / HF_TORCH_BIN).exists():
        return _read_torch_bin(d / HF_TORCH_BIN)
    if (d / HF_TORCH_BIN_INDEX).exists():
        return _read_sharded(d / HF_TORCH_BIN_INDEX, _read_torch_bin)
    raise CheckpointError(f"{d}: no {HF_SAFETENSORS}, {HF_SAFETENSORS_INDEX}, {HF_TORCH_BIN} or "
                          f"{HF_TORCH_BIN_INDEX} found")


def hf_tensor_names(hf_dir: str | os.PathLike) -> set[str]:
    """The tensor names of an HF checkpoint directory; safetensors and shard indexes are read for their headers
    only (no tensor is loaded)."""
    from safetensors import SafetensorError, safe_open

    d = Path(hf_dir)
    if (d / HF_SAFETENSORS).exists():
        try:
            with safe_open(str(d / HF_SAFETENSORS), framework="numpy") as f:
                return set(f.keys())
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{d / HF_SAFETENSORS}: cannot read safetensors file ({e})") from None
    for index in (HF_SAFETENSORS_INDEX, HF_TORCH_BIN_INDEX):
        if (d / index).exists():
            try:
                return set(read_json(d / index)["weight_map"])
            except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(f"{d / index}: not a valid shard index ({e})") from None
    return set(read_hf_tensors(d))


def is_hf_dir(path) -> bool:
    """An HF T5 directory: a config.json without our format tag and not another architecture's (BART's is
    `bart_convert.is_hf_bart_dir`; the weights beside it are read later)."""
    try:
        meta = read_json(Path(path) / HF_CONFIG)
    except (OSError, ValueError):
        return False
    return (isinstance(meta, dict) and meta.get("format") not in (FORMAT_TAG, _UNCHECKED_TAG)
            and meta.get("model_type") != "bart")


def _read_json_object(path: Path, missing_hint: str) -> dict[str, Any]:
    try:
        obj = read_json(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not found ({missing_hint})") from None
    except FileFormatError as e:
        raise CheckpointError(f"{path}: invalid JSON ({str(e).split(f'{path}: ', 1)[-1]})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return obj


def read_hf_config(hf_dir: str | os.PathLike) -> dict[str, Any]:
    return _read_json_object(Path(hf_dir) / HF_CONFIG, "an HF model directory has config.json")


# ----------------------------------------------------------------------------------------------------------
# tensors ↔ params
# ----------------------------------------------------------------------------------------------------------


def params_from_hf(tensors: Mapping[str, np.ndarray], config: T5Config, source: str = "checkpoint",
                   dtype=np.float32) -> dict:
    """Maps HF tensors onto our parameter tree; raises one CheckpointMismatchError listing every problem."""
    abstract = _abstract_params(config)
    params: dict = {}
    missing, mis_shaped, used = [], [], set()
    for hf_key, path, transpose in _key_map(config):
        want = tuple(_get(abstract, path).shape)
        if hf_key not in tensors:
            missing.append(hf_key)
            continue
        used.add(hf_key)
        value = np.asarray(tensors[hf_key])
        hf_want = want[::-1] if transpose else want
        if value.shape != hf_want:
            mis_shaped.append((hf_key, tuple(value.shape), hf_want))
            continue
        _set(params, path, (value.T if transpose else value).astype(dtype))
    unexpected = []
    for k in tensors:
        if k in used or k in _HF_IGNORED:  # (transformers ≥ 4 drop it; read with `cross_attention_bias`)
            continue
        if k in _HF_ALIASES or (k == "lm_head.weight" and config.tie_word_embeddings):
            if "shared.weight" in tensors and np.array_equal(np.asarray(tensors[k]),
                                                             np.asarray(tensors["shared.weight"])):
                continue  # a stored copy of the tied embedding
        unexpected.append(k)
    if missing or unexpected or mis_shaped:
        raise CheckpointMismatchError(source, missing, unexpected, mis_shaped, what=type(config).__name__)
    return params


def params_to_hf(params: Mapping, config: T5Config) -> dict[str, np.ndarray]:
    """Our parameters as an HF state dict (numpy, float32), without tied aliases."""
    out = {}
    for hf_key, path, transpose in _key_map(config):
        value = np.asarray(_get(params, path), dtype=np.float32)
        out[hf_key] = np.ascontiguousarray(value.T if transpose else value)
    return out


def load_hf(hf_dir: str | os.PathLike) -> tuple[T5Config, dict]:
    """Reads an HF T5 directory into (our config, our params)."""
    hf_config = read_hf_config(hf_dir)
    tensors = read_hf_tensors(hf_dir)
    config = config_from_hf(hf_config, tensors, source=str(Path(hf_dir) / HF_CONFIG))
    return config, params_from_hf(tensors, config, source=str(hf_dir))


def save_hf(params: Mapping, config: T5Config, out_dir: str | os.PathLike, overwrite: bool = False) -> None:
    """Writes an HF directory (config.json + model.safetensors) that transformers loads; atomic."""
    from safetensors.numpy import save_file

    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        (tmp / HF_CONFIG).write_text(json.dumps(config_to_hf(config), indent=2))
        save_file(params_to_hf(params, config), str(tmp / HF_SAFETENSORS), metadata={"format": "pt"})


# ----------------------------------------------------------------------------------------------------------
# gr_jax checkpoint directory
# ----------------------------------------------------------------------------------------------------------


def save_checkpoint(params: Mapping, config: T5Config, out_dir: str | os.PathLike, overwrite: bool = False,
                    extra_metadata: Mapping[str, Any] | None = None) -> Path:
    """Writes `out_dir/config.json` and `out_dir/params` (orbax); atomic: all or nothing."""
    import orbax.checkpoint as ocp

    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        params = jax.tree_util.tree_map(np.asarray, params)
        meta = {"format": FORMAT_TAG, "t5_config": json.loads(config.to_json()), "checksums": array_digests(params)}
        if extra_metadata:
            meta["metadata"] = dict(extra_metadata)
        (tmp / "config.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
        with ocp.StandardCheckpointer() as ckptr:
            ckptr.save(tmp.resolve() / "params", params)
            ckptr.wait_until_finished()
    return Path(out_dir)


def load_checkpoint_config(ckpt_dir: str | os.PathLike) -> T5Config:
    return _checkpoint_meta(ckpt_dir)[0]


def _checkpoint_meta(ckpt_dir) -> tuple[T5Config, dict]:
    """(the config, config.json's whole record) of a gr_jax checkpoint directory, its format tag checked."""
    path = Path(ckpt_dir) / "config.json"
    meta = _read_json_object(path, f"is {ckpt_dir} a gr_jax checkpoint?")
    if meta.get("format") not in (FORMAT_TAG, _UNCHECKED_TAG):
        raise CheckpointError(f"{path}: format tag {meta.get('format')!r}, expected {FORMAT_TAG!r}")
    try:
        return T5Config.from_dict(meta["t5_config"]), meta
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: bad t5_config ({e})") from None


def load_checkpoint(ckpt_dir: str | os.PathLike) -> tuple[T5Config, dict]:
    """Reads a directory written by `save_checkpoint`; checks every array against the config."""
    import orbax.checkpoint as ocp

    config, meta = _checkpoint_meta(ckpt_dir)
    recorded = _recorded_checksums(meta, Path(ckpt_dir) / "config.json")
    abstract = _abstract_params(config)
    target = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), abstract)
    params_dir = (Path(ckpt_dir) / "params").resolve()
    if not params_dir.is_dir():
        raise CheckpointError(f"{params_dir}: missing (the orbax parameter checkpoint)")
    if not (params_dir / "_METADATA").is_file():
        raise CheckpointError(f"{params_dir}: _METADATA is missing (orbax's record of the arrays): the checkpoint "
                              f"is incomplete; convert it again")
    try:
        with abandoned_reads_quiet(), ocp.StandardCheckpointer() as ckptr:
            stored = getattr(ckptr.metadata(params_dir).item_metadata, "tree", None)
            if stored is None:
                raise CheckpointError(f"{params_dir}/_METADATA: unreadable (orbax's record of the arrays): the "
                                      f"checkpoint is damaged; convert it again")
            _check_tree_shapes(stored, target, source=str(params_dir))
            params = ckptr.restore(params_dir, target)
    except CheckpointError:
        raise
    except Exception as e:  # orbax/tensorstore raise many types for corrupt data
        raise CheckpointError(f"{params_dir}: cannot restore parameters for this config "
                              f"({type(e).__name__}: {str(e)[:500]})") from None
    if recorded is None:
        log.info("%s: format %s, written before checksums were recorded: its arrays are read unchecked", ckpt_dir,
                 _UNCHECKED_TAG)
    else:
        changed = changed_arrays(array_digests(params), recorded)
        if changed:
            raise CheckpointError(f"{params_dir}: damaged, {len(changed)} array(s) differ from the checksums in "
                                  f"{Path(ckpt_dir) / 'config.json'} (first: {changed[0]}); convert it again")
    return config, params


def _recorded_checksums(meta: dict, path: Path):
    """config.json's checksums (`meta`, read from `path`); None for a v1 directory (before checksums). A v2
    directory without a readable record is damaged: refused, never read unchecked."""
    if meta.get("format") == _UNCHECKED_TAG:
        return None
    checksums = meta.get("checksums")
    if not isinstance(checksums, dict) or not checksums or not all(isinstance(v, str) for v in checksums.values()):
        raise CheckpointError(f"{path}: format {FORMAT_TAG} without a readable 'checksums' record: the checkpoint is "
                              f"damaged; convert it again")
    return checksums


def _check_tree_shapes(stored, expected, source: str) -> None:
    """Orbax restores whatever shape was stored, so compare the stored metadata with the config first."""
    def flat(tree):
        return {"/".join(str(getattr(k, "key", k)) for k in path): tuple(leaf.shape)
                for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}

    have, want = flat(stored), flat(expected)
    mis_shaped = [(k, have[k], want[k]) for k in sorted(set(have) & set(want)) if have[k] != want[k]]
    if set(have) != set(want) or mis_shaped:
        raise CheckpointMismatchError(source, set(want) - set(have), set(have) - set(want), mis_shaped)


def convert_hf_to_checkpoint(hf_dir: str | os.PathLike, out_dir: str | os.PathLike,
                             overwrite: bool = False) -> T5Config:
    """HF directory → gr_jax checkpoint directory. Validates everything before writing anything."""
    config, params = load_hf(hf_dir)
    save_checkpoint(params, config, out_dir, overwrite=overwrite, extra_metadata={"converted_from": str(hf_dir)})
    n = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    log.info("converted %s → %s (%d parameters)", hf_dir, out_dir, n)
    return config


def grow_vocab(params: Mapping, config: T5Config, new_vocab_size: int, seed: int = 0,
               pad_to_multiple: int = 1) -> tuple[dict, T5Config]:
    """Grows the embedding (and an untied lm_head) to `new_vocab_size` rows, rounded up to a multiple of
    `pad_to_multiple`. Old rows are unchanged; new rows ~ N(mean of old rows, std of old rows) drawn from
    `seed`, so a resumed or re-run experiment gets the same matrix."""
    new_size = -(-int(new_vocab_size) // pad_to_multiple) * pad_to_multiple
    old = config.vocab_size
    if new_size < old:
        raise ValueError(f"grow_vocab: new size {new_size} is smaller than the current {old}")
    if new_size == old:
        return dict(params), config
    n_new = new_size - old
    key_emb, key_head = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), old * 1_000_003 + new_size))

    def new_rows(table_VxD: np.ndarray, key) -> np.ndarray:
        mean = table_VxD.mean(axis=0)
        std = table_VxD.std(axis=0) + 1e-6
        noise = np.asarray(jax.random.normal(key, (n_new, table_VxD.shape[1]), np.float32))
        return (mean + std * noise).astype(table_VxD.dtype)

    out = jax.tree_util.tree_map(lambda x: x, dict(params))
    emb = np.asarray(params["embedding"])
    out["embedding"] = np.concatenate([emb, new_rows(emb, key_emb)], axis=0)
    if not config.tie_word_embeddings:
        head_DxV = np.asarray(params["lm_head"]["kernel"])
        out["lm_head"] = {"kernel": np.concatenate([head_DxV, new_rows(head_DxV.T, key_head).T], axis=1)}
    log.info("grew vocabulary %d → %d rows (seed %d)", old, new_size, seed)
    return out, config.replace(vocab_size=new_size)
