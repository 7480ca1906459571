"""The vocabulary a run uses, and the one it trains and keeps in its MODEL_DIR.

`run_vocabulary`: VOCABULARY when given (a SentencePiece model, an HF tokenizer directory, a decoder-only LM's
own tokenizer: a named LM, a GGUF file, an HF Llama directory; or 'all-MiniLM-L6-v2', its WordPiece); else the SentencePiece model this MODEL_DIR trained
earlier — checked against what it was trained on —; else (training only) a new one trained on the corpus and the
training queries, written as one atomic folder MODEL_DIR/vocabulary/ (`spiece.model` + `provenance.json`: the
digest of the texts, vocab_size, the digest of the model file).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional, Sequence

from gr_jax.runtime import locks
from gr_jax.data.readers import Dataset, fingerprint
from gr_jax.runtime.io_utils import atomic_dir, read_json
from gr_jax.backbones import bert, llama_io
from gr_jax.data.vocab import load_vocabulary, train_sentencepiece
from gr_jax.runtime.run_dir import RunDir

log = logging.getLogger(__name__)



def resolve(spec: str):
    """The vocabulary VOCABULARY names: an LM's tokenizer (name, GGUF file, HF Llama dir) or a SentencePiece /
    HF tokenizer file."""
    if llama_io.is_lm_spec(spec):
        return llama_io.lm_vocabulary(spec)
    if spec == bert.MINILM:  # the sentence encoder's WordPiece vocabulary (a MiniLM-encoder T5)
        return load_vocabulary(bert.sentence_encoder_path(spec))
    return load_vocabulary(spec)


def training_texts(dataset: Dataset, train_split: str) -> list[Sequence[str]]:
    """What a vocabulary trained here learns from: the corpus and the training queries."""
    texts = [dataset.corpus.texts]
    if train_split in dataset.queries:
        texts.append(dataset.queries[train_split].texts)
    return texts


def run_vocabulary(vocabulary: Optional[str], model_dir: Path, dataset: Dataset, train_split: str,
                   vocab_size: int, may_train: bool = True):
    """The run's vocabulary (module docstring): given, kept in MODEL_DIR (checked), or trained now."""
    if vocabulary:
        return resolve(vocabulary)
    vdir = RunDir(model_dir).vocabulary  # {spiece.model, provenance.json}: a vocabulary trained here
    texts = training_texts(dataset, train_split)
    built_from = {"texts": fingerprint(*texts), "vocab_size": int(vocab_size)}
    if vdir.exists():
        return _kept(vdir, built_from)
    if not may_train:
        raise ValueError(f"{model_dir}: no vocabulary ({vdir} is missing and VOCABULARY is not set); point "
                         f"MODEL_DIR at a trained model or set --gin.VOCABULARY")
    log.info("no VOCABULARY given: training a %d-piece SentencePiece model on the corpus → %s", vocab_size, vdir)
    with atomic_dir(vdir) as tmp:
        vocab = train_sentencepiece([t for part in texts for t in part], tmp / "spiece.model", vocab_size)
        (tmp / "provenance.json").write_text(json.dumps({**built_from, "spiece": vocab.fingerprint}, indent=1))
    locks.provisional(vdir)  # removed if the run is refused before it is accepted
    return load_vocabulary(vdir / "spiece.model")


def _kept(vdir: Path, built_from: dict):
    """The SentencePiece model a MODEL_DIR trained earlier, refused when its file or what it was trained on
    differs from this run's."""
    try:
        saved = read_json(vdir / "provenance.json")
    except (OSError, ValueError):
        raise ValueError(f"{vdir}: no readable provenance.json (what the vocabulary was trained on); delete "
                         f"{vdir} to train it again, or use a new MODEL_DIR") from None
    vocab = load_vocabulary(vdir / "spiece.model")
    if saved.get("spiece") != vocab.fingerprint:
        raise ValueError(f"{vdir / 'spiece.model'}: not the file its provenance.json describes (changed after "
                         f"it was trained); delete {vdir} to train it again, or use a new MODEL_DIR")
    differs = [k for k, v in built_from.items() if saved.get(k) != v]
    if differs:
        what = " and ".join("texts (corpus + training queries)" if k == "texts" else k for k in differs)
        raise ValueError(f"{vdir}: the SentencePiece model there was trained on other {what} than this run's; use "
                         f"the data and settings it was trained with (MODEL_DIR/config.gin), delete {vdir} to "
                         f"train a new one, or use a new MODEL_DIR")
    return vocab
