"""Where a run's starting network comes from: the loaders of INITIAL_CHECKPOINT_PATH.

A loader says which paths it takes (`accepts`), the network config they hold (`config`; cheap where it can be),
the network parameters (`load`: config and parameters, read once), and optionally the vocabulary a run that
continues from such a path must use (`vocabulary`). `loader_for(path)` asks the registered loaders in order of
`priority` (highest first; equal priorities in registration order). The core registers:

  trained run        a MODEL_DIR trained here (its `checkpoints/`): the latest checkpoint's network, the config
                     it recorded, and its vocabulary (VOCABULARY, if set, must be that one);
  decoder-only LM    a named LM (`smollm2_135m`), a GGUF file or an HF Llama directory (`models.llama_io`);
  HF BART directory  config.json with model_type "bart" (`backbones.bart_convert`), ids moved to the library's;
  fairseq BART       a fairseq checkpoint file (`*.pt`: SEAL's, MINDER's, LTRGR's), likewise; both need VOCABULARY
                     (`backbones.bart_tokenizer`);
  HF T5 directory    config.json + safetensors / pytorch_model.bin (`backbones.t5_convert`);
  converted          a gr_jax checkpoint directory (config.json with our format tag + orbax params).

A method registers its own in its folder (`register(InitialLoader(...))` at import; GLEN refuses its phase-1
checkpoints with a message of its own; NCI's loader also gives the head's parameters, `head`) — no shared module
changes. `initial_network(...)` checks the parameters
for NaN/inf and grows a T5's vocabulary for docid tokens.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from gr_jax.backbones import bart_convert, llama_io, seq2seq, t5, t5_convert
from gr_jax.training.trainer import TrainingError, read_checkpoint
from gr_jax.data.vocab import load_vocabulary
from gr_jax.runtime.run_dir import RunDir

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class InitialLoader:
    name: str
    accepts: Callable[[str], bool]
    load: Callable[[str], tuple[Any, dict]]  # → (network config, network parameters)
    config: Optional[Callable[[str], Any]] = None  # the config alone without the tensors (None: `load` is read)
    vocabulary: Optional[Callable[[str, Optional[str]], Optional[str]]] = None  # (path, VOCABULARY) → the one to use
    priority: int = 0
    # (path, the model object) → the docid head's parameters, for a checkpoint that holds them too (NCI's released
    # one: its docid table and adaptor); None: the head starts from its random init
    head: Optional[Callable[[str, Any], dict]] = None


_LOADERS: list[InitialLoader] = []


def register(loader: InitialLoader) -> InitialLoader:
    """Adds a loader (a loader of the same name is replaced: re-importing a module registers nothing twice)."""
    _LOADERS[:] = [x for x in _LOADERS if x.name != loader.name]
    _LOADERS.append(loader)
    return loader


def loaders() -> list[InitialLoader]:
    """The registered loaders in the order they are asked."""
    return sorted(_LOADERS, key=lambda x: -x.priority)  # stable: equal priorities keep registration order


def loader_for(path: str) -> InitialLoader:
    for loader in loaders():
        if loader.accepts(str(path)):
            return loader
    what = "does not exist" if not Path(path).exists() else \
        f"is none of: {', '.join(x.name for x in loaders())}"
    raise ValueError(f"INITIAL_CHECKPOINT_PATH {path} {what}: point it at a trained MODEL_DIR, an HF T5 directory, "
                     f"a converted checkpoint or a decoder-only LM (a method trained in two runs, e.g. GLEN's "
                     f"phase 2, starts from the MODEL_DIR of the first: train that first)")


def initial_network(path: str, loaded: Optional[tuple], vocab_size: int, seed: int = 0) -> dict:
    """The starting network parameters for a model with `vocab_size` token ids: `loaded` (config, params) as
    `prepare` read them, else read now; refused when a parameter holds NaN/inf; a T5's embedding grown for
    docid tokens above the checkpoint's vocabulary."""
    ckpt_config, network = loaded if loaded is not None else loader_for(path).load(path)
    for where, leaf in jax.tree_util.tree_leaves_with_path(network):
        if not np.isfinite(np.asarray(leaf)).all():
            raise TrainingError(f"INITIAL_CHECKPOINT_PATH {path}: parameter {jax.tree_util.keystr(where)} holds "
                                f"NaN/inf values; the checkpoint is damaged — convert it again "
                                f"(tools/convert_checkpoint.py)")
    if vocab_size > ckpt_config.vocab_size:
        if not isinstance(ckpt_config, t5.T5Config):
            raise ValueError(f"INITIAL_CHECKPOINT_PATH {path}: the docids need {vocab_size} token ids, the network "
                             f"has {ckpt_config.vocab_size}; use a docid scheme written in its vocabulary (text "
                             f"docids) or a codebook scheme")
        network, _ = t5_convert.grow_vocab(network, ckpt_config, vocab_size, seed=seed)
    log.info("initialised the network from %s", path)
    return jax.tree_util.tree_map(jnp.asarray, network)


# ----------------------------------------------------------------------------------------------------------
# the core's loaders
# ----------------------------------------------------------------------------------------------------------


def is_trained_run(path) -> bool:
    return RunDir(path).checkpoints.is_dir()


def trained_run(path) -> tuple[ocp.CheckpointManager, int, dict]:
    """(checkpoint manager, latest step, its recorded provenance) of a MODEL_DIR trained here."""
    ckpt_dir = RunDir(path).checkpoints.absolute()
    manager = ocp.CheckpointManager(ckpt_dir, options=ocp.CheckpointManagerOptions(create=False))
    step = manager.latest_step()
    if step is None:
        raise ValueError(f"INITIAL_CHECKPOINT_PATH {path}: a MODEL_DIR without any checkpoint; train it first")
    try:
        meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:  # orbax/tensorstore raise many types for unreadable files
        raise TrainingError(f"INITIAL_CHECKPOINT_PATH {ckpt_dir / str(step)}: cannot read its metadata "
                            f"({type(e).__name__})") from None
    return manager, step, meta


def _run_config(path) -> seq2seq.Config:
    return seq2seq.config_from_dict(trained_run(path)[2]["config"])


def _run_network(path) -> tuple[seq2seq.Config, dict]:
    manager, step, meta = trained_run(path)
    state = read_checkpoint(manager, step, f"INITIAL_CHECKPOINT_PATH {RunDir(path).checkpoint(step)}")["state"]
    return seq2seq.config_from_dict(meta["config"]), state["params"]["network"]


def _run_vocabulary(path, vocabulary: Optional[str]) -> str:
    """A run continued from a trained MODEL_DIR uses that run's vocabulary: VOCABULARY if it is the same one,
    else the MODEL_DIR's own SentencePiece model."""
    _, step, meta = trained_run(path)
    chosen = vocabulary or str(RunDir(path).vocabulary / "spiece.model")
    if not Path(chosen).exists():
        raise ValueError(f"INITIAL_CHECKPOINT_PATH {path}: no {Path(chosen).relative_to(path)} there and no "
                         f"VOCABULARY given; set --gin.VOCABULARY to the vocabulary that run was trained with")
    if load_vocabulary(chosen).fingerprint != meta.get("vocabulary"):
        raise ValueError(f"VOCABULARY {chosen} is not the vocabulary INITIAL_CHECKPOINT_PATH {path} was trained "
                         f"with (its checkpoint {step} records another); leave VOCABULARY unset to use that run's")
    return chosen


def _lm(path) -> tuple[Any, dict]:
    config, params, _, _ = llama_io.load_lm(path)
    return config, params


def _is_converted(path) -> bool:
    return Path(path).is_dir() and not t5_convert.is_hf_dir(path) and not bart_convert.is_hf_bart_dir(path)


def _is_fairseq_file(path) -> bool:
    return Path(path).is_file() and Path(path).suffix == ".pt"


def _bart(read) -> Callable[[str], tuple[Any, dict]]:
    def load(path):
        config, params = read(path)
        return bart_convert.to_library_ids(params, config)  # the library's pad/eos ids (bart_convert)

    return load


def _bart_vocabulary(path, vocabulary: Optional[str]) -> str:
    if not vocabulary:
        src = path if Path(path).is_dir() else Path(path).parent
        raise ValueError(f"INITIAL_CHECKPOINT_PATH {path} is a BART checkpoint: set VOCABULARY to its tokenizer in "
                         f"the library's ids, written once by `python -m gr_jax.backbones.bart_tokenizer {src} "
                         f"<dir>` (it reads vocab.json + merges.txt, or encoder.json + vocab.bpe + dict.txt)")
    return vocabulary


register(InitialLoader("trained run", is_trained_run, _run_network, config=_run_config,
                       vocabulary=_run_vocabulary, priority=30))
register(InitialLoader("decoder-only LM", llama_io.is_lm_spec, _lm, priority=20))
register(InitialLoader("HF BART directory", bart_convert.is_hf_bart_dir, _bart(bart_convert.load_hf),
                       vocabulary=_bart_vocabulary, priority=15))
register(InitialLoader("fairseq BART checkpoint", _is_fairseq_file, _bart(bart_convert.load_fairseq),
                       vocabulary=_bart_vocabulary, priority=15))
register(InitialLoader("HF T5 directory", t5_convert.is_hf_dir, t5_convert.load_hf, priority=10))
register(InitialLoader("converted checkpoint", _is_converted, t5_convert.load_checkpoint,
                       config=t5_convert.load_checkpoint_config, priority=0))
