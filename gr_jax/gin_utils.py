"""gin flags the way t5x takes them: repeated `--gin_file`, `--gin.NAME=VALUE` (rewritten into the binding
`NAME=VALUE`), `--gin_search_paths` (comma-separated; the repository's gin_configs/ and the working directory
are always searched). Unknown configurables and missing REQUIRED macros become `GinConfigError`s that say
what to set."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Sequence

import gin

log = logging.getLogger(__name__)

GIN_CONFIGS = Path(__file__).resolve().parent.parent / "gin_configs"


class GinConfigError(ValueError):
    pass


class _QuietIncludeSearch(logging.Filter):
    """gin logs every search path an `include` misses at ERROR level; a real miss still raises."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Path not found")


def register_configurables() -> None:
    """Import every module whose functions and classes gin files may name."""
    from gr_jax.data import sources  # noqa: F401
    from gr_jax.docids import atomic, chunked, embed, lexical, ngram, numeric, pseudo_query  # noqa: F401
    from gr_jax.baselines import dense  # noqa: F401
    from gr_jax.models import heads, retriever, t5  # noqa: F401
    from gr_jax.protocols import dynamic_corpora  # noqa: F401
    from gr_jax.training import partitioning, trainer  # noqa: F401

    if not gin.config._REGISTRY.get("t5.get_config"):
        gin.external_configurable(t5.get_config, module="t5")


def split_flags(argv: Sequence[str]) -> tuple[list[str], list[str], list[str], list[str]]:
    """→ (gin files, bindings, search paths, other args)."""
    files, bindings, paths, rest = [], [], [], []
    it = iter(argv)
    for arg in it:
        m = re.match(r"--gin_file(?:=(.*))?$", arg)
        if m:
            files.append(m.group(1) if m.group(1) is not None else next(it))
            continue
        m = re.match(r"--gin_search_paths(?:=(.*))?$", arg)
        if m:
            paths += [p for p in (m.group(1) if m.group(1) is not None else next(it)).split(",") if p]
            continue
        m = re.match(r"--gin\.([\w./]+)=(.*)$", arg, re.S)
        if m:
            bindings.append(f"{m.group(1)} = {m.group(2)}")
            continue
        m = re.match(r"--gin_bindings(?:=(.*))?$", arg)
        if m:
            bindings.append(m.group(1) if m.group(1) is not None else next(it))
            continue
        rest.append(arg)
    return files, bindings, paths, rest


def parse(files: Sequence[str], bindings: Sequence[str], search_paths: Sequence[str] = ()) -> None:
    register_configurables()
    for p in [str(GIN_CONFIGS), *search_paths, os.getcwd()]:
        gin.add_config_file_search_path(p)
    resolved = []
    for f in files:
        candidates = [Path(f)] + [Path(p) / f for p in [*search_paths, str(GIN_CONFIGS)]]
        hit = next((c for c in candidates if c.is_file()), None)
        if hit is None:
            raise GinConfigError(f"gin file {f!r} not found (searched the working directory, "
                                 f"{[*search_paths, 'gin_configs/']})")
        resolved.append(str(hit))
    quiet = _QuietIncludeSearch()
    logging.getLogger().addFilter(quiet)
    try:
        gin.parse_config_files_and_bindings(resolved, bindings, finalize_config=False)
    except (ValueError, KeyError, SyntaxError, IOError) as e:
        raise GinConfigError(f"bad gin configuration: {e}") from None
    finally:
        logging.getLogger().removeFilter(quiet)
    missing = [m for m in re.findall(r"^(\w+) = %gin.REQUIRED$", gin.config_str(), re.M)]
    if missing:
        examples = " ".join(f"--gin.{m}=..." for m in missing)
        raise GinConfigError(f"required gin macros not set: {missing}; set them in a gin file or on the command "
                             f"line ({examples}; gin strings keep their quotes: --gin.MODEL_DIR=\"'runs/x'\")")
    try:
        gin.finalize()
    except ValueError as e:
        raise GinConfigError(f"bad gin configuration: {e}") from None


def call_configured(fn, macro_hint: str = "--gin.NAME=VALUE"):
    """Calls a gin-configured function; a missing REQUIRED parameter becomes a clear GinConfigError."""
    try:
        return fn()
    except RuntimeError as e:
        if "Required bindings" in str(e) or "REQUIRED" in str(e):
            raise GinConfigError(f"{e}\nSet the missing values in a gin file or on the command line, e.g. "
                                 f"{macro_hint}") from None
        raise


def run_entry(argv, usage: str, get_fn, extra_bindings: Sequence[str] = ()):
    """The body of a `python -m gr_jax.<command>` entry point: split the flags, parse gin, call the configured
    function `get_fn()` returns. Returns (exit code, result); usage or a configuration error → (2, None) with
    the message on stderr."""
    import sys

    files, bindings, paths, rest = split_flags(sys.argv[1:] if argv is None else argv)
    if rest or not files:
        sys.stderr.write((f"unknown arguments: {rest}\n" if rest else "") + usage + "\n")
        return 2, None
    try:
        parse(files, [*extra_bindings, *bindings], paths)
        return 0, call_configured(get_fn())
    except (GinConfigError, ValueError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2, None
