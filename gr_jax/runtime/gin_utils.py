"""gin flags the way t5x takes them: repeated `--gin_file`, `--gin.NAME=VALUE` (rewritten into the binding
`NAME=VALUE`), `--gin_search_paths` (comma-separated).

Where a relative gin path is looked up — `--gin_file` and every `include` inside a file alike — in this
order: the `--gin_search_paths` in the order given, then the project's `gin_configs/`, then the working
directory. An absolute path is used as it is. gin's own extra reader that takes `a/b.gin` for a file in a
Python package `a` is switched off while we parse: any folder named `runs/` or `models/` in the working
directory is such a "package" to Python, and that reader then crashed (or could pick up the wrong file).

What becomes a `GinConfigError` with a message that says what to change, before anything runs:
* an unknown configurable or parameter (with a "did you mean" suggestion);
* a macro that no binding uses (`--gin.TRAIN_STEP=5` for TRAIN_STEPS), with a suggestion;
* macros still `%gin.REQUIRED` after parsing;
* after a command has built everything it configures (`check_bindings_used`, called by the library function
  the command runs), a binding that nothing used — it would otherwise be ignored without a word;
* one setting bound under two of its names with different values (`gin_checks.settle_renamed`: an earlier name
  of a setting is read as the setting, the command line's value over the files').
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import io
import logging
import os
import pkgutil
import re
import sys
import tokenize
import traceback
from pathlib import Path
from typing import Iterable, Optional, Sequence

import gin
import gin.config
from gin import config_parser

from gr_jax.runtime import distributed, gin_checks, host_memory, locks, validation
from gr_jax.runtime.errors import UserError
from gr_jax.runtime.io_utils import FileFormatError, free_space, no_space, read_text
from gr_jax.runtime.gin_checks import MACRO, GinConfigError, call_configured, command  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

GIN_CONFIGS = Path(__file__).resolve().parents[2] / "gin_configs"


# modules never imported for gin: the seqio adapter (it imports TensorFlow and registers seqio tasks, not
# configurables); a subpackage that needs an optional framework guards itself the same way
NOT_FOR_GIN = ("gr_jax.tasks", "gr_jax.t5x")


def register_configurables() -> list[str]:
    """Imports every module of the package (`pkgutil.walk_packages`), so whatever a module registers with
    `@gin.configurable` can be named in a gin file; a gin file may also `import` a module outside the package
    (a method package of one's own). Adding a method edits no list here. Returns the module names."""
    import gr_jax

    names = []
    for name in _modules(gr_jax.__path__, "gr_jax."):
        _import(name)
        names.append(name)
    return names


def _modules(path, prefix: str):
    """The package's modules, depth first; a `NOT_FOR_GIN` package is skipped before anything of it is imported
    (`pkgutil.walk_packages` imports every package it meets to look inside, `gr_jax.t5x` included, which needs
    t5x)."""
    for info in pkgutil.iter_modules(path, prefix):
        if any(info.name == n or info.name.startswith(n + ".") for n in NOT_FOR_GIN):
            continue
        yield info.name
        if info.ispkg:
            yield from _modules(_import(info.name).__path__, info.name + ".")


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ImportError(f"cannot import {name} while registering gin configurables: {e}") from e


def split_flags(argv: Sequence[str]) -> tuple[list[str], list[str], list[str], list[str]]:
    """→ (gin files, bindings, search paths, other args)."""
    files, bindings, paths, rest = [], [], [], []
    it = iter(argv)
    for arg in it:
        m = re.match(r"--gin_file(?:=(.*))?$", arg)
        if m:
            files.append(m.group(1) if m.group(1) is not None else next(it, ""))
            continue
        m = re.match(r"--gin_search_paths(?:=(.*))?$", arg)
        if m:
            paths += [p for p in (m.group(1) if m.group(1) is not None else next(it, "")).split(",") if p]
            continue
        m = re.match(r"--gin\.([\w./]+)=(.*)$", arg, re.S)
        if m:
            bindings.append(f"{m.group(1)} = {m.group(2)}")
            continue
        m = re.match(r"--gin_bindings(?:=(.*))?$", arg)
        if m:
            bindings.append(m.group(1) if m.group(1) is not None else next(it, ""))
            continue
        rest.append(arg)
    return files, bindings, paths, rest


def distributed_flags(args: Sequence[str]) -> tuple[dict, list[str]]:
    """t5x's multi-process flags among `args` (`distributed.FLAGS`: `--multiprocess` (or t5x's
    `--multiprocess_gpu`), `--coordinator_address=H:P`, `--process_count=N`, `--process_index=I`,
    `--initialization_timeout=S`) → (`distributed.initialize`'s arguments, the other args)."""
    found, rest = {}, []
    it = iter(args)
    for arg in it:
        m = re.match(r"--(\w+)(?:=(.*))?$", arg, re.S)
        if not m or m.group(1) not in distributed.FLAGS:
            rest.append(arg)
            continue
        name, value = m.group(1), m.group(2)
        if name in ("multiprocess", "multiprocess_gpu"):
            if value is not None and value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"--{name}={value}: expected true or false")
            found["multiprocess"] = value is None or value.lower() in ("true", "1")
            continue
        value = value if value is not None else next(it, "")
        if name == "coordinator_address":
            if not re.match(r"^[^\s:]+:\d+$", value):
                raise ValueError(f"--coordinator_address={value!r}: expected HOST:PORT")
            found[name] = value
        else:
            if not re.match(r"^\d+$", value):
                raise ValueError(f"--{name}={value!r}: expected a whole number")
            found[name] = int(value)
    return found, rest


# ----------------------------------------------------------------------------------------------------------
# where gin files come from
# ----------------------------------------------------------------------------------------------------------


def search_prefixes(search_paths: Sequence[str] = ()) -> list[str]:
    return [*search_paths, str(GIN_CONFIGS), os.getcwd()]


def resolve(name: str, search_paths: Sequence[str] = ()) -> Path:
    """The file a relative gin path names (module docstring: search order); warns when another location
    holds a file of the same relative name that this one shadows."""
    if os.path.isabs(name):
        if not os.path.isfile(name):
            raise GinConfigError(f"gin file {name} not found")
        return Path(name)
    hits = [Path(p) / name for p in search_prefixes(search_paths) if (Path(p) / name).is_file()]
    if not hits:
        raise GinConfigError(f"gin file {name!r} not found (searched, in order: "
                             f"{[*search_paths, 'gin_configs/', 'the working directory']})")
    for other in hits[1:]:
        if other.resolve() != hits[0].resolve():
            log.warning("gin file %s: using %s; %s has the same name and is not used (pass --gin_search_paths "
                        "to change the order)", name, hits[0], other)
    return hits[0]


@contextlib.contextmanager
def _include_resolution(search_paths: Sequence[str]):
    """gin resolves `include` against its module-level search list with every registered file reader; we set
    both for the duration of one parse (gin has no public way to remove a reader or reorder the list)."""
    prefixes, readers = gin.config._LOCATION_PREFIXES, gin.config._FILE_READERS
    saved = (list(prefixes), list(readers))
    prefixes[:] = search_prefixes(search_paths)
    readers[:] = [(_GinFile, os.path.isfile)]
    try:
        yield
    finally:
        prefixes[:], readers[:] = saved


class _GinFile:
    """gin's file reader (`with reader(path) as f: parse(f)`): the file read as UTF-8, and an error of the
    tokenizer underneath gin's parser (an unclosed bracket or quote at the end of the file, which gin does not
    catch) reported with the file's full path."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        try:
            return io.StringIO(read_text(self.path, "gin file"))
        except FileFormatError as e:
            raise GinConfigError(str(e)) from None

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None or issubclass(exc_type, GinConfigError):  # an included file's error names it
            return False
        if issubclass(exc_type, tokenize.TokenError):
            what, (line, _) = exc.args
            raise GinConfigError(f"gin file {self.path}: {what.lower()} (a bracket or quote opened and never "
                                 f"closed; the file ends at line {line})") from None
        if issubclass(exc_type, (SyntaxError, ValueError, KeyError)):
            raise GinConfigError(f"gin file {self.path}: {_explain(exc)}") from None
        if issubclass(exc_type, OSError):  # an `include` that names no file: say which file includes it
            first = (str(exc).splitlines() or [""])[0]
            raise GinConfigError(f"gin file {self.path}: one of its includes cannot be opened ({first})") from None
        return False


def _bad_binding(bindings: Sequence[str]) -> Optional[str]:
    """The first binding (a `--gin.NAME=VALUE` flag or a binding file line) that gin's parser rejects on its own."""
    for binding in bindings:
        try:
            parser = config_parser.ConfigParser(binding, gin.config.ParserDelegate(skip_unknown=True))
            for _ in parser:
                pass
        except (SyntaxError, ValueError, tokenize.TokenError) as e:
            return f"{binding!r}: {e.args[0] if e.args else e}"
    return None


# ----------------------------------------------------------------------------------------------------------
# suggestions and checks
# ----------------------------------------------------------------------------------------------------------


def _configurable_names() -> list[str]:
    names = set()
    for selector, configurable in gin.config._REGISTRY.items():
        if selector.startswith("gin."):
            continue
        names.add(configurable.name)
        names.add(gin.config._REGISTRY.minimal_selector(selector))
    return sorted(names)


def _parameters(name: str) -> list[str]:
    try:
        configurable = gin.config._REGISTRY.get_match(name)
    except (KeyError, ValueError):
        return []
    if configurable is None:
        return []
    try:
        sig = inspect.signature(configurable.wrapped)
    except (TypeError, ValueError):
        return []
    return [p for p in sig.parameters if p not in ("self", "args", "kwargs")]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _explain(e: Exception) -> str:
    msg = str(e)
    m = re.search(r"No configurable matching '([\w.]+)'", msg)
    if m:
        return f"{msg}{did_you_mean(m.group(1), _configurable_names())}"
    m = re.search(r"Configurable '([\w.]+)' doesn't have a parameter named '(\w+)'", msg)
    if m:
        return f"{msg}{did_you_mean(m.group(2), _parameters(m.group(1)))}"
    return msg


def _library_macro_readers() -> dict[str, list[str]]:
    """{macro: ['train.seed (runs/train.gin)', ...]}: the bindings of the library's own gin files that read a
    macro (`x.y = %MACRO`)."""
    readers: dict[str, list[str]] = {}
    for path in sorted(GIN_CONFIGS.rglob("*.gin")):
        for line in path.read_text(encoding="utf-8").splitlines():
            m = re.match(r"\s*([\w./]+)\s*=\s*%(\w+)\s*$", line)
            if m:
                readers.setdefault(m.group(2), []).append(f"{m.group(1)} ({path.relative_to(GIN_CONFIGS)})")
    return readers


def check_macros(ignore: Iterable[str] = (), bindings: Sequence[str] = ()) -> None:
    """A macro that no binding references does nothing: most often a typo of one that is used. A macro of the
    library's own gin files (SEED of runs/train.gin) goes unused when the user binds the parameter that read it
    (`--gin.train.seed=1` replaces `train.seed = %SEED`): that is what the user asked for, not an error — unless
    the user set the macro too, and one of the two settings would be lost."""
    defined, used = set(), set()
    for (scope, selector), params in gin.config._CONFIG.items():
        if selector == MACRO:
            defined.add(scope)
        for value in params.values():
            gin_checks.macro_references(value, used)
    unused = sorted(defined - used - set(ignore))
    if not unused:
        return
    readers = _library_macro_readers()
    set_by_user = {b.split("=", 1)[0].strip() for b in bindings if "=" in b}
    problems = []
    for m in unused:
        if m in readers and m not in set_by_user:
            log.debug("%s: its reader %s is bound directly instead", m, ", ".join(readers[m]))
            continue
        if m in readers:
            problems.append(f"\n  {m}: read by {', '.join(readers[m])}, but that binding is replaced by yours, so "
                            f"--gin.{m} does nothing; set one of the two")
        else:
            problems.append(f"\n  {m}: nothing uses it{did_you_mean(m, sorted(used))}")
    if problems:
        raise GinConfigError(f"gin macros that no binding uses:{''.join(problems)}\nRemove them or fix the name.")


# ----------------------------------------------------------------------------------------------------------
# parsing and running
# ----------------------------------------------------------------------------------------------------------


def check_binding_values(bindings: Sequence[str]) -> None:
    """The values of command-line bindings that a parent command hands to its children (`reproduce`), checked
    against their settings' declared ranges and choices now, before any child runs; gin's configuration is
    left empty. A binding that needs the children's gin files (a macro they define) is left to them."""
    if not bindings:
        return
    register_configurables()
    gin.clear_config()
    try:
        for b in bindings:
            try:
                gin.parse_config([b])
            except (ValueError, KeyError, SyntaxError):
                continue  # unknown here (a macro of the children's files): the child parses it with them
        check_bound_values()
    finally:
        gin.clear_config()


def parse(files: Sequence[str], bindings: Sequence[str], search_paths: Sequence[str] = (),
          ignore_unused_macros: Iterable[str] = ()) -> None:
    register_configurables()
    resolved = [str(resolve(f, search_paths)) for f in files]
    with _include_resolution(search_paths):
        bad = _bad_binding(bindings)
        if bad:
            raise GinConfigError(f"bad gin binding (a --gin. flag or --gin_bindings) {bad}; gin strings keep their "
                                 f"quotes: --gin.MODEL_DIR=\"'runs/x'\"")
        try:
            gin.parse_config_files_and_bindings(resolved, bindings, finalize_config=False)
        except (ValueError, KeyError, SyntaxError, OSError, tokenize.TokenError) as e:
            message = _explain(e)
            if isinstance(e, GinConfigError) and message.startswith("gin file "):  # names the file: gin's
                message = message.splitlines()[0]                                 # "In bindings…" is noise
            raise GinConfigError(f"bad gin configuration: {message}") from None
    released = gin_checks.settle_renamed(bindings)  # a setting's earlier names → its one name
    check_macros([*ignore_unused_macros, *released], bindings)
    missing = [m for m in re.findall(r"^(\w+) = %gin.REQUIRED$", gin.config_str(), re.M)]
    if missing:
        examples = " ".join(f"--gin.{m}=..." for m in missing)
        raise GinConfigError(f"required gin macros not set: {missing}; set them in a gin file or on the command "
                             f"line ({examples}; gin strings keep their quotes: --gin.MODEL_DIR=\"'runs/x'\")")
    check_bound_values()
    _resolve_output_paths()
    try:
        gin.finalize()
    except ValueError as e:
        raise GinConfigError(f"bad gin configuration: {e}") from None


# the macros that name where a command writes: recorded in its outputs (final_metrics.json, rank data's record)
# and compared on a re-run, so each is made absolute and normalised once, here
OUTPUT_PATH_MACROS = ("MODEL_DIR", "OUTPUT_DIR", "VARIATIONS_DIR")


def _resolve_output_paths() -> None:
    """MODEL_DIR 'runs/x', './runs/x' and its absolute spelling are one place: bound as the absolute, normalised
    path before anything runs (the same infer spelt two ways otherwise kept a `.prev-1` of identical results, and
    rank data refused its own file as built for "another model_dir")."""
    for name in OUTPUT_PATH_MACROS:
        try:
            value = gin.query_parameter(f"{name}/macro.value")
        except ValueError:
            continue
        if isinstance(value, (str, os.PathLike)) and str(value):
            placed = os.path.abspath(os.path.expanduser(str(value)))
            if placed != str(value):
                gin.bind_parameter(f"{name}/macro.value", placed)


def _bound_value(value, depth: int = 0):
    """A bound value with macro references replaced by the macros' values; `_UNKNOWN` for a configurable's
    result (`@fn()`), which is checked where that configurable's own bindings are."""
    if isinstance(value, gin.config.ConfigurableReference):
        if value.configurable.selector != MACRO or depth > 20:
            return _UNKNOWN
        held = gin.config._CONFIG.get((value.scoped_selector.rsplit("/", 1)[0], MACRO), {})
        return _bound_value(held.get("value", _UNKNOWN), depth + 1)
    if isinstance(value, (list, tuple)):
        items = [_bound_value(v, depth + 1) for v in value]
        return _UNKNOWN if any(v is _UNKNOWN for v in items) else type(value)(items)
    return value


_UNKNOWN = object()


_COMMANDS = ("train", "infer", "run_dynamic")


def check_bound_values() -> None:
    """Every value that the configuration binds to a parameter, checked against the range its signature
    declares (`validation.check_value`: an explicit range, or its type's) before anything runs; the error
    names the binding as a user writes it."""
    # a fixed order, commands' own parameters first (they carry the macros a user sets: TRAIN_STEPS is reported
    # as train.train_steps before make_optimizer.total_steps, which follows it), then by selector
    first = lambda kv: (kv[0][0], kv[0][1].rsplit(".", 1)[-1] not in _COMMANDS, kv[0][1])  # noqa: E731
    for (scope, selector), params in sorted(gin.config._CONFIG.items(), key=first):
        if selector == MACRO:
            continue
        try:
            configurable = gin.config._REGISTRY.get_match(selector)
        except (KeyError, ValueError):
            continue
        if configurable is None:
            continue
        hints = validation.annotations_of(configurable.wrapped)
        for name, value in sorted(params.items()):
            if name not in hints:
                continue
            raw, value = value, _bound_value(value)
            if value is _UNKNOWN:
                continue
            # as a gin file names it: `train`, `make_optimizer`; a short module given at registration kept
            # (`t5.get_config`, `llama.get_config`)
            short = configurable.module and not configurable.module.startswith("gr_jax")
            named = f"{configurable.module}.{configurable.name}" if short else configurable.name
            where = f"{scope + '/' if scope else ''}{named}.{name}"
            if isinstance(raw, gin.config.ConfigurableReference):  # a macro: named as the user set it
                where = f"{raw.scoped_selector.rsplit('/', 1)[0]} ({where})"
            try:
                validation.check_value(where, hints[name], value)
            except ValueError as e:
                raise GinConfigError(f"bad gin binding: {e}") from None


def expected_errors() -> tuple[type[BaseException], ...]:
    """What an entry point reports as one message and exit code 2: bad configuration, bad data or files,
    training that cannot go on. Anything else is a bug and keeps its traceback."""
    return (UserError, ValueError, OSError)


@gin.configurable
def cpu_runtime(synchronous_dispatch: bool = True) -> None:
    """How an entry point runs JAX computations on the CPU, set after parsing and before the first computation.
    Synchronous dispatch by default: each step's temporaries then come from the heap that
    `host_memory.reuse_freed_memory` keeps (the demo's train step 60 → 35 ms, t5_small's 1.29 → 1.07 s, on 2
    cores; `run_entry` holds it around the whole command, so searches and evaluations keep their large
    temporaries too); `cpu_runtime.synchronous_dispatch = False` gives JAX's asynchronous default back."""
    host_memory.cpu_dispatch(synchronous_dispatch)


def output_dirs() -> list[str]:
    """The directory a command writes, which it holds for itself (`locks.output_lock`): OUTPUT_DIR when it is
    bound to a path, otherwise MODEL_DIR."""
    for name in ("OUTPUT_DIR", "MODEL_DIR"):
        try:
            value = gin.query_parameter(f"{name}/macro.value")
        except ValueError:
            continue
        if isinstance(value, (str, os.PathLike)) and str(value):
            return [str(value)]
    return []


def bound_settings() -> dict[str, str]:
    """Every value the parsed configuration binds, as text: {'TRAIN_STEPS': '4', 'train.log_period': '1', ...}
    (macros by name, parameters as `[scope/]selector.param`)."""
    out = {}
    for (scope, selector), params in gin.config._CONFIG.items():
        for name, value in params.items():
            key = scope if selector == MACRO else f"{scope + '/' if scope else ''}{selector}.{name}"
            out[key] = repr(value)
    return out


def run_entry(argv, usage: str, get_fn, extra_bindings: Sequence[str] = (), root: str | None = None,
              allow_unused: Sequence[str] = (), multiprocess: bool = False):
    """The body of a `python -m gr_jax.<command>` entry point: split the flags, parse gin, call the configured
    function `get_fn()` returns (named `root` for `check_bindings_used`). Returns (exit code, result); a
    usage, configuration, data or file error → (2, None) with one message on stderr; `--help` prints `usage`
    → (0, None). A command that runs over several processes (`multiprocess`: `runtime/distributed.py`) takes
    t5x's flags for them; process i > 0 holds its own lock file beside process 0's. A process of such a run that fails exits at once (with the same
    message): JAX's shutdown would otherwise wait minutes for the processes it can no longer reach."""
    try:
        rc, result = _run_entry(argv, usage, get_fn, extra_bindings, root, allow_unused, multiprocess)
    except BaseException:
        if not distributed.several():
            raise
        traceback.print_exc()
        rc = 1
    if rc and distributed.several():
        sys.stderr.write(f"note: process {distributed.process_index()} of {distributed.process_count()} stopped; "
                         f"the other processes of this run stop too. Start all of them again with the same "
                         f"command: training resumes from the last checkpoint\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(rc)
    return rc, result


def _run_entry(argv, usage: str, get_fn, extra_bindings: Sequence[str], root: Optional[str],
               allow_unused: Sequence[str], multiprocess: bool):
    files, bindings, paths, rest = split_flags(sys.argv[1:] if argv is None else argv)
    if rest and rest[0] in ("-h", "--help"):
        sys.stdout.write(usage.strip() + "\n")
        return 0, None
    try:
        processes, rest = distributed_flags(rest)
    except ValueError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2, None
    if rest or not files:
        sys.stderr.write((f"unknown arguments: {rest}\n" if rest else "") + usage + "\n")
        return 2, None
    if processes and not multiprocess:
        sys.stderr.write(f"error: gr_jax {root or 'this command'} runs in one process; the multi-process flags "
                         f"(--{', --'.join(sorted(processes))}) are for gr_jax.train and gr_jax.infer\n")
        return 2, None
    extra_macros = [b.split("=", 1)[0].strip() for b in extra_bindings]
    try:
        with command(root, allow_unused):
            parse(files, [*extra_bindings, *bindings], paths, ignore_unused_macros=extra_macros)
            cpu_runtime()  # read when JAX makes its CPU client: before `initialize` asks for the devices
            distributed.initialize(**processes)
            distributed.agree(bound_settings())  # every process the same settings, or none runs
            index = distributed.process_index() if processes.get("multiprocess") else 0
            with contextlib.ExitStack() as held:
                for path in output_dirs():
                    held.enter_context(locks.output_lock(path, f"gr_jax {root or 'command'}",
                                                         f".{index}" if index else ""))
                held.enter_context(host_memory.reuse_freed_memory())  # the heap stays for the next call
                return 0, call_configured(get_fn())
    except Exception as e:
        if not isinstance(e, expected_errors()) and not no_space(e):
            raise
        log.debug("the error's traceback", exc_info=True)
        if no_space(e) and "no space left" not in str(e).lower():
            e = OSError(f"no space left on the device ({free_space((output_dirs() or ['.'])[0])} free where this command "
                        f"writes, {', '.join(output_dirs()) or 'its output'}); free some space and run it again")
        # gin appends "In call to configurable ..." lines naming its wrapper: noise for the user
        message = "\n".join(line for line in str(e).splitlines() if not line.startswith("  In call to configurable"))
        sys.stderr.write(f"error: {message}\n")
        return 2, None

