"""BART checkpoints ↔ gr_jax parameters: HF directories (safetensors or `pytorch_model.bin`) both ways, and
fairseq checkpoints (`checkpoint_best.pt`, the format SEAL, MINDER and LTRGR released) one way.

Every key is checked before anything is returned: missing, unexpected and mis-shaped tensors are reported
together (`CheckpointMismatchError`, naming the keys).

**fairseq.** A fairseq checkpoint is a pickle holding the state dict under `model` and the settings as an
`argparse.Namespace` under `args` (older releases) or a config under `cfg` (newer ones: a plain dict, or an
omegaconf `DictConfig`). It is read with `torch.load(weights_only=True)` and an allowlist of exactly the classes
those settings are made of (`FAIRSEQ_ALLOWED`; the omegaconf ones only when omegaconf is installed); any
other class in the file is refused, named, and nothing is executed. Key names are fairseq's (`encoder.layers.
0.self_attn.q_proj.weight`, `decoder.output_projection.weight`, …), which are HF's without the `model.` prefix;
`encoder.version` / `decoder.version` are bookkeeping and skipped.

**Token ids.** fairseq's dictionary (and HF's BART vocabulary, made from it) puts <s> 0, <pad> 1, </s> 2,
<unk> 3. The library pads with 0 and ends sequences with 1 (`data/vocab.py`), so `to_library_ids` permutes the
vocabulary axis of the embedding and the logits bias: library id = (BART id − 1) mod 4 for the first four ids
(<pad> 0, </s> 1, <unk> 2, <s> 3), every other id unchanged; `from_library_ids` is its inverse. The network
computes exactly what it computed before on the permuted ids (tested). The tokenizer written beside an imported
model (`bart_tokenizer`) uses the same ids.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import zipfile
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from gr_jax.runtime.pickle_probe import refusal_text
from gr_jax.backbones import t5_convert
from gr_jax.backbones.bart import BartConfig
from gr_jax.backbones.t5_convert import CheckpointError, CheckpointMismatchError

log = logging.getLogger(__name__)

FAIRSEQ_SKIPPED = ("encoder.version", "decoder.version", "_float_tensor")
_FAIRSEQ_TIED = ("decoder.output_projection.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
_HF_TIED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")
_LIBRARY_FROM_BART = np.array([3, 0, 1, 2])  # BART id b < 4 → library id (b − 1) mod 4


# ----------------------------------------------------------------------------------------------------------
# key map
# ----------------------------------------------------------------------------------------------------------


def _key_map(config: BartConfig) -> Iterator[tuple[str, tuple[str, ...], bool]]:
    """(HF key, path in our tree, transpose) for every parameter."""
    yield "model.shared.weight", ("embedding",), False
    yield "final_logits_bias", ("final_logits_bias",), False
    for stack, n in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        embed = (stack, "embed")
        yield f"model.{stack}.embed_positions.weight", (*embed, "positions"), False
        for p, ours in (("weight", "scale"), ("bias", "bias")):
            yield f"model.{stack}.layernorm_embedding.{p}", (*embed, "layernorm_embedding", ours), False
        attentions = [("self_attn", "self_attention")]
        if stack == "decoder":
            attentions.append(("encoder_attn", "cross_attention"))
        for i in range(n):
            hf = f"model.{stack}.layers.{i}"
            layer = (stack, f"layers_{i}")
            for theirs, ours in attentions:
                for proj, o in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("out_proj", "o")):
                    yield f"{hf}.{theirs}.{proj}.weight", (*layer, ours, o, "kernel"), True
                    yield f"{hf}.{theirs}.{proj}.bias", (*layer, ours, o, "bias"), False
                for p, q in (("weight", "scale"), ("bias", "bias")):
                    yield f"{hf}.{theirs}_layer_norm.{p}", (*layer, f"{ours}_norm", q), False
            for fc in ("fc1", "fc2"):
                yield f"{hf}.{fc}.weight", (*layer, "mlp", fc, "kernel"), True
                yield f"{hf}.{fc}.bias", (*layer, "mlp", fc, "bias"), False
            for p, q in (("weight", "scale"), ("bias", "bias")):
                yield f"{hf}.final_layer_norm.{p}", (*layer, "final_norm", q), False


def _shape(config: BartConfig, path: tuple[str, ...]) -> tuple[int, ...]:
    c, leaf = config, path[-1]
    if path == ("embedding",):
        return (c.vocab_size, c.d_model)
    if path == ("final_logits_bias",):
        return (c.vocab_size,)
    if leaf == "positions":
        return (c.max_position_embeddings + 2, c.d_model)
    if path[-2] in ("fc1", "fc2"):
        ffn = c.encoder_ffn_dim if path[0] == "encoder" else c.decoder_ffn_dim
        shape = (c.d_model, ffn) if path[-2] == "fc1" else (ffn, c.d_model)
        return shape if leaf == "kernel" else (shape[1],)
    return (c.d_model, c.d_model) if leaf == "kernel" else (c.d_model,)


def _set(tree: dict, path: tuple[str, ...], value) -> None:
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


def _get(tree: Mapping, path: tuple[str, ...]):
    for k in path:
        tree = tree[k]
    return tree


# ----------------------------------------------------------------------------------------------------------
# HF
# ----------------------------------------------------------------------------------------------------------


def is_hf_bart_dir(path) -> bool:
    """An HF directory whose config.json says model_type "bart"."""
    try:
        meta = json.loads((Path(path) / t5_convert.HF_CONFIG).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("model_type") == "bart"


def config_from_hf(hf: Mapping[str, Any], source: str = "config.json") -> BartConfig:
    """Our config from an HF BART config.json (the HF ids: pad 1, eos 2, decoder start 2)."""
    if hf.get("model_type", "bart") != "bart":
        raise CheckpointError(f"{source}: model_type {hf.get('model_type')!r}, expected 'bart'")
    for flag, want in (("normalize_before", False), ("add_final_layer_norm", False)):
        if hf.get(flag, want) != want:
            raise CheckpointError(f"{source}: {flag}={hf[flag]} (an mBART-style network), which BART here does "
                                  f"not implement")
    if hf.get("tie_word_embeddings", True) is False:
        raise CheckpointError(f"{source}: tie_word_embeddings is false; BART here ties the output projection to "
                              f"the embedding")
    try:
        return BartConfig(
            vocab_size=int(hf["vocab_size"]), d_model=int(hf["d_model"]), encoder_layers=int(hf["encoder_layers"]),
            decoder_layers=int(hf["decoder_layers"]), encoder_attention_heads=int(hf["encoder_attention_heads"]),
            decoder_attention_heads=int(hf["decoder_attention_heads"]), encoder_ffn_dim=int(hf["encoder_ffn_dim"]),
            decoder_ffn_dim=int(hf["decoder_ffn_dim"]), activation_function=str(hf.get("activation_function", "gelu")),
            max_position_embeddings=int(hf["max_position_embeddings"]),
            scale_embedding=bool(hf.get("scale_embedding", False)), dropout_rate=float(hf.get("dropout", 0.1)),
            attention_dropout=float(hf.get("attention_dropout", 0.0)),
            activation_dropout=float(hf.get("activation_dropout", 0.0)),
            pad_token_id=int(hf.get("pad_token_id", 1)), eos_token_id=int(hf.get("eos_token_id", 2)),
            decoder_start_token_id=int(hf.get("decoder_start_token_id", 2)))
    except KeyError as e:
        raise CheckpointError(f"{source}: no {e.args[0]!r}, which a BART config.json has") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{source}: {e}") from None


def config_to_hf(config: BartConfig) -> dict[str, Any]:
    c = config
    return {"model_type": "bart", "architectures": ["BartForConditionalGeneration"], "vocab_size": c.vocab_size,
            "d_model": c.d_model, "encoder_layers": c.encoder_layers, "decoder_layers": c.decoder_layers,
            "encoder_attention_heads": c.encoder_attention_heads, "decoder_attention_heads": c.decoder_attention_heads,
            "encoder_ffn_dim": c.encoder_ffn_dim, "decoder_ffn_dim": c.decoder_ffn_dim,
            "activation_function": c.activation_function, "max_position_embeddings": c.max_position_embeddings,
            "scale_embedding": c.scale_embedding, "dropout": c.dropout_rate, "attention_dropout": c.attention_dropout,
            "activation_dropout": c.activation_dropout, "pad_token_id": c.pad_token_id,
            "eos_token_id": c.eos_token_id, "decoder_start_token_id": c.decoder_start_token_id,
            "forced_eos_token_id": None, "forced_bos_token_id": None, "tie_word_embeddings": True,
            "init_std": 0.02}


def params_from_hf(tensors: Mapping[str, np.ndarray], config: BartConfig, source: str = "checkpoint") -> dict:
    """HF tensors → our tree; one CheckpointMismatchError listing every problem. A missing `final_logits_bias`
    is zeros (fairseq has none); tied copies of the embedding must equal it."""
    tensors = dict(tensors)
    if "final_logits_bias" not in tensors:
        tensors["final_logits_bias"] = np.zeros((1, config.vocab_size), np.float32)
    params: dict = {}
    missing, mis_shaped, used = [], [], set()
    for key, path, transpose in _key_map(config):
        want = _shape(config, path)
        if key not in tensors:
            missing.append(key)
            continue
        used.add(key)
        value = np.asarray(tensors[key], np.float32)
        if key == "final_logits_bias":
            value = value.reshape(-1) if value.ndim == 2 and value.shape[0] == 1 else value
        theirs = want[::-1] if transpose else want
        if value.shape != theirs:
            mis_shaped.append((key, tuple(value.shape), theirs))
            continue
        _set(params, path, np.ascontiguousarray(value.T if transpose else value))
    shared = tensors.get("model.shared.weight")
    unexpected = [k for k in tensors if k not in used and not (
        k in _HF_TIED and shared is not None and np.array_equal(np.asarray(tensors[k]), np.asarray(shared)))]
    if missing or unexpected or mis_shaped:
        raise CheckpointMismatchError(source, missing, unexpected, mis_shaped, what=type(config).__name__)
    return params


def params_to_hf(params: Mapping, config: BartConfig) -> dict[str, np.ndarray]:
    """Our parameters as an HF state dict (numpy float32; `final_logits_bias` [1, V]; tied aliases left out)."""
    out = {}
    for key, path, transpose in _key_map(config):
        value = np.asarray(_get(params, path), np.float32)
        value = value[None] if key == "final_logits_bias" else value
        out[key] = np.ascontiguousarray(value.T if transpose else value)
    return out


def load_hf(hf_dir: str | os.PathLike) -> tuple[BartConfig, dict]:
    """An HF BART directory → (our config, our params), in BART's own token ids."""
    config = config_from_hf(t5_convert.read_hf_config(hf_dir), str(Path(hf_dir) / t5_convert.HF_CONFIG))
    return config, params_from_hf(t5_convert.read_hf_tensors(hf_dir), config, source=str(hf_dir))


def save_hf(params: Mapping, config: BartConfig, out_dir: str | os.PathLike, overwrite: bool = False) -> None:
    """An HF directory (config.json + model.safetensors) that transformers loads; atomic."""
    from safetensors.numpy import save_file

    from gr_jax.runtime.io_utils import atomic_dir

    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        (tmp / t5_convert.HF_CONFIG).write_text(json.dumps(config_to_hf(config), indent=2))
        save_file(params_to_hf(params, config), str(tmp / t5_convert.HF_SAFETENSORS), metadata={"format": "pt"})


# ----------------------------------------------------------------------------------------------------------
# fairseq
# ----------------------------------------------------------------------------------------------------------


def _omegaconf_classes() -> list:
    try:
        import omegaconf
        from omegaconf import base, nodes
    except ImportError:
        return []
    import typing

    return [omegaconf.DictConfig, omegaconf.ListConfig, base.ContainerMetadata, base.Metadata, nodes.AnyNode,
            nodes.StringNode, nodes.IntegerNode, nodes.FloatNode, nodes.BooleanNode, nodes.EnumNode, typing.Any]


def fairseq_allowed() -> list:
    """The classes a fairseq checkpoint's settings are made of, the only ones `read_fairseq` unpickles."""
    return [argparse.Namespace, collections.OrderedDict, collections.defaultdict, *_omegaconf_classes()]


FAIRSEQ_ALLOWED = ("argparse.Namespace", "collections.OrderedDict", "collections.defaultdict",
                   "omegaconf DictConfig/ListConfig and their nodes (when omegaconf is installed)")


def _load_fairseq_state(path: Path, mmap: bool = False) -> Mapping:
    """The checkpoint's top-level dict through `torch.load(weights_only=True)` and the settings' allowlist; a
    refused global is named from the pickle itself (`runtime/pickle_probe.py`)."""
    import pickle

    try:
        import torch
    except ImportError:
        raise CheckpointError(f"{path}: reading a fairseq checkpoint needs torch (pip install 'gr_jax[torch]')") \
            from None
    if not path.is_file():
        raise CheckpointError(f"{path}: no such fairseq checkpoint file")
    try:
        with torch.serialization.safe_globals(fairseq_allowed()):
            # memory-mapping needs torch's zip format; a legacy checkpoint is read whole
            state = torch.load(str(path), map_location="cpu", weights_only=True,
                               mmap=mmap and zipfile.is_zipfile(path))
    except pickle.UnpicklingError as e:
        text = str(e)
        hint = "; install omegaconf to read a checkpoint whose cfg is an omegaconf DictConfig" \
            if "omegaconf" in text else ""
        what = refusal_text(path, fairseq_allowed(), text)
        raise CheckpointError(f"{path}: refused: it pickles {what}, which a fairseq checkpoint's settings do not "
                              f"need (allowed: {', '.join(FAIRSEQ_ALLOWED)}){hint}") from None
    except Exception as e:  # torch raises many types for a corrupt file
        raise CheckpointError(f"{path}: cannot read as a fairseq checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(state, Mapping) or not isinstance(state.get("model"), Mapping):
        raise CheckpointError(f"{path}: not a fairseq checkpoint (no 'model' state dict)")
    return state


def fairseq_embedding_rows(path: str | os.PathLike) -> int:
    """The rows of a fairseq checkpoint's token embedding (its dictionary's size), read without loading the
    tensors (memory-mapped)."""
    path = Path(path)
    weight = _load_fairseq_state(path, mmap=True)["model"].get("encoder.embed_tokens.weight")
    if weight is None or len(getattr(weight, "shape", ())) != 2:
        raise CheckpointError(f"{path}: no encoder.embed_tokens.weight [V, D] in its model state dict")
    return int(weight.shape[0])


def read_fairseq(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(state dict as numpy float32, settings as a plain dict) of a fairseq checkpoint file."""
    import torch

    path = Path(path)
    state = _load_fairseq_state(path)
    tensors = {}
    for k, v in state["model"].items():
        if not hasattr(v, "detach"):
            raise CheckpointError(f"{path}: model entry {k!r} is a {type(v).__name__}, not a tensor")
        tensors[k] = v.detach().to(torch.float32).numpy()
    return tensors, _settings(state, path)


def _settings(state: Mapping, path: Path) -> dict[str, Any]:
    """The model's settings: `cfg["model"]` (a dict or DictConfig) or `vars(args)`."""
    cfg = state.get("cfg")
    if cfg is not None:
        try:
            from omegaconf import OmegaConf

            if OmegaConf.is_config(cfg):
                cfg = OmegaConf.to_container(cfg, resolve=True)
        except ImportError:
            pass
        model = cfg.get("model") if isinstance(cfg, Mapping) else None
        if isinstance(model, argparse.Namespace):
            return vars(model)
        if isinstance(model, Mapping):
            return dict(model)
    args = state.get("args")
    if isinstance(args, argparse.Namespace):
        return vars(args)
    raise CheckpointError(f"{path}: no model settings (neither cfg['model'] nor args)")


def fairseq_to_hf_keys(tensors: Mapping[str, np.ndarray], source: str) -> dict[str, np.ndarray]:
    """fairseq key names → HF's: `model.` + the key; the tied copies (embed_tokens, output_projection) must equal
    the encoder's embedding, which becomes `model.shared.weight`; bookkeeping keys skipped."""
    if "encoder.embed_tokens.weight" not in tensors:
        raise CheckpointMismatchError(source, ["encoder.embed_tokens.weight"], [], [], what="BartConfig")
    shared = np.asarray(tensors["encoder.embed_tokens.weight"])
    out, untied = {"model.shared.weight": shared}, []
    for k, v in tensors.items():
        if k in FAIRSEQ_SKIPPED:
            continue
        if k in _FAIRSEQ_TIED:
            if np.shape(v) != shared.shape or not np.array_equal(np.asarray(v), shared):
                untied.append(k)
            continue
        out[f"model.{k}"] = v
    if untied:
        raise CheckpointError(f"{source}: {', '.join(untied)} differ from encoder.embed_tokens.weight; BART here "
                              f"shares one embedding (fairseq's --share-all-embeddings)")
    return out


def config_from_fairseq(settings: Mapping[str, Any], tensors: Mapping[str, np.ndarray], source: str) -> BartConfig:
    """Our config from fairseq's model settings; sizes the tensors fix are read from them."""
    def get(*names, default=None):
        for n in names:
            if settings.get(n) is not None:
                return settings[n]
        if default is None:
            raise CheckpointError(f"{source}: the settings have no {names[0]!r}")
        return default

    for flag in ("encoder_normalize_before", "decoder_normalize_before"):
        if settings.get(flag):
            raise CheckpointError(f"{source}: {flag} is set (a pre-LN network such as mBART), which BART here does "
                                  f"not implement")
    if settings.get("layernorm_embedding") is False:
        raise CheckpointError(f"{source}: layernorm_embedding is off; BART here always has it")
    vocab, d_model = np.shape(tensors["encoder.embed_tokens.weight"])
    positions = np.shape(tensors.get("encoder.embed_positions.weight", np.zeros((1026, 1))))[0]

    def layers(stack):
        return len({k.split(".")[2] for k in tensors if k.startswith(f"{stack}.layers.")})

    try:
        return BartConfig(
            vocab_size=int(vocab), d_model=int(d_model), encoder_layers=layers("encoder"),
            decoder_layers=layers("decoder"), encoder_attention_heads=int(get("encoder_attention_heads")),
            decoder_attention_heads=int(get("decoder_attention_heads")),
            encoder_ffn_dim=int(np.shape(tensors["encoder.layers.0.fc1.weight"])[0]),
            decoder_ffn_dim=int(np.shape(tensors["decoder.layers.0.fc1.weight"])[0]),
            activation_function=str(get("activation_fn", default="gelu")),
            max_position_embeddings=int(positions) - 2, scale_embedding=not get("no_scale_embedding", default=True),
            dropout_rate=float(get("dropout", default=0.1)),
            attention_dropout=float(get("attention_dropout", default=0.0)),
            activation_dropout=float(get("activation_dropout", default=0.0)),
            pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)
    except KeyError as e:
        raise CheckpointMismatchError(source, [e.args[0]], [], [], what="BartConfig") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{source}: {e}") from None


def load_fairseq(path: str | os.PathLike) -> tuple[BartConfig, dict]:
    """A fairseq BART checkpoint file → (our config, our params), in fairseq's token ids."""
    tensors, settings = read_fairseq(path)
    config = config_from_fairseq(settings, tensors, str(path))
    return config, params_from_hf(fairseq_to_hf_keys(tensors, str(path)), config, source=str(path))


def hf_to_fairseq_keys(hf_tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HF key names → fairseq's (for tests and export): the inverse of `fairseq_to_hf_keys`, with fairseq's tied
    copies written out as fairseq stores them. fairseq's BART has no logits bias: a non-zero one is refused."""
    bias = np.asarray(hf_tensors.get("final_logits_bias", 0.0))
    if np.any(bias != 0):
        raise CheckpointError("final_logits_bias is not zero, and a fairseq BART has no logits bias")
    shared = hf_tensors["model.shared.weight"]
    out = {k[len("model."):]: v for k, v in hf_tensors.items() if k.startswith("model.") and k != "model.shared.weight"}
    for k in _FAIRSEQ_TIED:
        out[k] = shared
    out["encoder.version"] = np.array([3.0], np.float32)
    out["decoder.version"] = np.array([3.0], np.float32)
    return out


# ----------------------------------------------------------------------------------------------------------
# token ids
# ----------------------------------------------------------------------------------------------------------


def library_id_order(vocab_size: int) -> np.ndarray:
    """perm[b] = the library id of BART id b."""
    perm = np.arange(vocab_size)
    perm[:4] = _LIBRARY_FROM_BART
    return perm


def _moved(params: Mapping, config: BartConfig, old_to_new: np.ndarray) -> tuple[BartConfig, dict]:
    """The embedding's and the logits bias's rows moved from id i to id old_to_new[i], the special ids renumbered."""
    new_to_old = np.argsort(old_to_new)
    out = dict(params)
    for name in ("embedding", "final_logits_bias"):
        out[name] = np.asarray(params[name])[new_to_old]
    ids = {name: int(old_to_new[getattr(config, name)])
           for name in ("pad_token_id", "eos_token_id", "decoder_start_token_id")}
    return config.replace(**ids), out


def to_library_ids(params: Mapping, config: BartConfig) -> tuple[BartConfig, dict]:
    """Parameters and config over the library's ids (<pad> 0, </s> 1, <unk> 2, <s> 3)."""
    return _moved(params, config, library_id_order(config.vocab_size))


def from_library_ids(params: Mapping, config: BartConfig) -> tuple[BartConfig, dict]:
    """The inverse of `to_library_ids` (export to HF / fairseq ids)."""
    return _moved(params, config, np.argsort(library_id_order(config.vocab_size)))
