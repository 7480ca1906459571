"""`RunDir`: the layout of a run directory (MODEL_DIR), the one place its file and folder names are spelled.

    MODEL_DIR/
      config.gin                the run's gin configuration (written once the run is accepted, or with results)
      vocabulary/               the run's vocabulary and its provenance (`training/vocabulary.py`)
      docid_scheme/             the fitted docid scheme and what it was built from (`docids/base.py`)
      vectors/                  a pretrained encoder's document vectors, reused by every command
                                (`docids/vector_cache.py`)
      docids/                   docids decoded by the model, per step (GLEN, GenRET)
      checkpoints/<step>/       orbax checkpoints with per-array checksums (`training/trainer.py`)
      damaged_checkpoints/      checkpoints that failed their checks, set aside (never deleted)
      train_metrics.jsonl       one line per log step (<loop>_metrics.jsonl for another loop)
      eval_metrics.jsonl        periodic evaluation
      tensorboard/<loop>/       the same scalars for TensorBoard, when it is installed
      final_metrics.json        the final evaluation's summary
      imported.json             what `compose.import_checkpoint` imported
      runs/<split>.step<N>.run  TREC runs (and `.metrics.json` beside one with metrics)
      robustness/ cross_lingual/ aligned/<language>/   the outputs of the commands run on a trained system
      model/                    a protocol's trained system in its output directory (itself a RunDir)

A `RunDir` is a value: it names places and creates nothing. Tests hold the rest of the library to it
(`tests/test_repo.py::test_the_run_directory_layout_is_spelled_only_in_run_dir`).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class RunDir:
    root: Path

    def __init__(self, root: str | os.PathLike | "RunDir"):
        object.__setattr__(self, "root", root.root if isinstance(root, RunDir) else Path(root))

    def __fspath__(self) -> str:
        return os.fspath(self.root)

    def __str__(self) -> str:
        return str(self.root)

    # configuration and prepared state
    @property
    def config(self) -> Path:
        return self.root / "config.gin"

    @property
    def vocabulary(self) -> Path:
        return self.root / "vocabulary"

    @property
    def docid_scheme(self) -> Path:
        return self.root / "docid_scheme"

    @property
    def vectors(self) -> Path:
        """Document vectors of a cached embedder (`docids/vector_cache.py`)."""
        return self.root / "vectors"

    @property
    def docids(self) -> Path:
        """The docids a model decoded (GLEN, GenRET: one file per step, `DocidScheme.write_decoded`)."""
        return self.root / "docids"

    # checkpoints
    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / str(int(step))

    @property
    def damaged_checkpoints(self) -> Path:
        return self.root / "damaged_checkpoints"

    # metrics and runs
    def metrics_log(self, name: str) -> Path:
        """One JSON line per logged step of a loop named `name` ('train', 'eval', or a method's own loop)."""
        return self.root / f"{name}_metrics.jsonl"

    @property
    def train_metrics(self) -> Path:
        return self.metrics_log("train")

    @property
    def eval_metrics(self) -> Path:
        return self.metrics_log("eval")

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def final_metrics(self) -> Path:
        return self.root / "final_metrics.json"

    @property
    def imported(self) -> Path:
        return self.root / "imported.json"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def run(self, split: str, step: int) -> Path:
        """The TREC run of `split` searched with the checkpoint of `step`."""
        return self.runs / f"{split}.step{int(step)}.run"

    def run_file(self, name: str) -> Path:
        """Another file of runs/ (a command's own run names: `test.fewshot_n3.run`, `dev.qrels`)."""
        return self.runs / name

    # what commands on a trained system write there by default (OUTPUT_DIR moves each)
    @property
    def robustness(self) -> Path:
        return self.root / "robustness"

    @property
    def cross_lingual(self) -> Path:
        return self.root / "cross_lingual"

    def aligned(self, language: str) -> Path:
        """PAG's planner aligned to `language` (`python -m gr_jax.align_planner`)."""
        return self.root / "aligned" / language

    @property
    def compilation_cache(self) -> Path:
        """XLA's compiled programs kept between the steps of a protocol (`compile_clock.use_compilation_cache`)."""
        return self.root / "xla_cache"

    # a protocol's trained system
    @property
    def model(self) -> "RunDir":
        return RunDir(self.root / "model")

    # what the run recorded
    def recorded(self, *settings: str) -> dict:
        """The values the run's config.gin binds to `settings` ('train.task', 'train.feature_lengths', ...), macros
        resolved (`train.task = %MIXTURE_OR_TASK_NAME` gives the macro's value); a setting it does not bind, or
        binds to something other than a value, is left out. Read with gin's parser alone: nothing is configured.
        A config.gin that cannot be read or parsed is an error naming it."""
        import tokenize

        import gin.config
        from gin import config_parser

        from gr_jax.runtime.io_utils import read_text

        text = read_text(self.config, "the run's recorded configuration")
        macros, bound = {}, {}
        try:
            for st in config_parser.ConfigParser(text, gin.config.ParserDelegate(skip_unknown=True)):
                if isinstance(st, config_parser.BindingStatement):
                    if st.arg_name:
                        bound[f"{st.selector.rsplit('.', 1)[-1]}.{st.arg_name}"] = st.value
                    else:
                        macros[st.selector] = st.value
        except (SyntaxError, ValueError, tokenize.TokenError) as e:
            raise ValueError(f"{self.config}: cannot parse the run's recorded configuration ({e})") from None
        out = {}
        for name in settings:
            value, seen = bound.get(name, _MISSING), 0
            while isinstance(value, gin.config.ConfigurableReference) and seen < 20:
                name_of = value.scoped_selector.rsplit("/", 1)[0]
                value = macros.get(name_of, _MISSING) if value.configurable.selector == "gin.macro" else _MISSING
                seen += 1
            if value is not _MISSING and not isinstance(value, gin.config.ConfigurableReference):
                out[name] = value
        return out


_MISSING = object()
