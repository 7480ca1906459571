"""Shared fixtures. Optional dependencies: a test that needs one skips locally when it is missing, but under
CI (CI=true) a missing dependency is an error, so a broken install cannot hide behind skipped tests."""

from __future__ import annotations

import atexit
import hashlib
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# The suite compiles hundreds of small programs, each run a few times: LLVM's optimisation passes are most of each
# compile and buy nothing at these sizes (2026-11-27, a T5 search oracle test: 56 s -> 38 s on 2 cores), and XLA's
# newer fusion emitters cost more to compile than the loop emitters they replace (2026-11-28, backend compile time
# of four tests: -27% to -55% with `--xla_cpu_use_fusion_emitters=false`). XLA does not reassociate float
# arithmetic at any level (its fast-math flag is off by default); a result may still differ from the default
# level's in the last bit where the backend contracts a multiply-add, so bit-for-bit comparisons are between
# programs of one session, and comparisons with recorded references carry tolerances. The tests and the commands
# they start inherit the flags; a test that sets XLA_FLAGS for host devices appends to them.
# GR_JAX_TEST_FULL_OPT=1 runs the suite at XLA's default optimisation instead.
LOOP_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
FAST_COMPILE = f"--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true {LOOP_EMITTERS}"
FULL_OPT = os.environ.get("GR_JAX_TEST_FULL_OPT", "") in ("1", "true")
if not FULL_OPT and FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()


# A persistent XLA compilation cache that outlives the run: a program compiled by one run (or by a subprocess it
# starts, which inherits the variables) is read back by the next. Its folder is keyed by the JAX and jaxlib versions
# and the XLA flags above, so an upgrade or GR_JAX_TEST_FULL_OPT=1 starts a folder of its own instead of mixing
# programs; JAX's own key (the program, the backend, the compile options) decides each entry within it.
# GR_JAX_TEST_CACHE_DIR sets the root (default: $XDG_CACHE_HOME/gr_jax/xla, else ~/.cache/gr_jax/xla); `off`
# gives a per-run temporary folder, removed at exit (a cold run). JAX_COMPILATION_CACHE_DIR, when set, is used as is.
CACHE_ROOT_VARIABLE = "GR_JAX_TEST_CACHE_DIR"


def compilation_cache_dir(environ=os.environ) -> str | None:
    """The cache folder for this environment, or None for `off`."""
    root = environ.get(CACHE_ROOT_VARIABLE, "").strip()
    if root.lower() == "off":
        return None
    if not root:
        base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "gr_jax", "xla")
    from importlib.metadata import version

    flags = " ".join(sorted(environ.get("XLA_FLAGS", "").split()))
    key = hashlib.sha256(flags.encode()).hexdigest()[:12]
    return os.path.join(root, f"jax{version('jax')}-jaxlib{version('jaxlib')}-xla{key}")


def cache_setting_problem(cache: str, environ=os.environ) -> str | None:
    """Why the compilation cache folder cannot be used (a file in its path, not writable), naming the setting
    that chose it; None when it can. It is made here when missing."""
    setting = f"{CACHE_ROOT_VARIABLE}={environ.get(CACHE_ROOT_VARIABLE)!r}" if environ.get(CACHE_ROOT_VARIABLE, "") \
        else "the default cache folder (set GR_JAX_TEST_CACHE_DIR to another, or to off)"
    try:
        os.makedirs(cache, exist_ok=True)
    except OSError as e:
        return f"{setting}: cannot make the XLA compilation cache folder {cache} ({e.strerror}); point " \
               f"{CACHE_ROOT_VARIABLE} at a writable folder, or set it to off"
    if not os.access(cache, os.W_OK | os.X_OK):
        return f"{setting}: the XLA compilation cache folder {cache} is not writable; point {CACHE_ROOT_VARIABLE} " \
               f"at a writable folder, or set it to off"
    return None


CACHE_PROBLEM = None  # reported by pytest_configure: one line and exit code 2, not a traceback at import
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = compilation_cache_dir()
    if _cache is None:
        _cache = tempfile.mkdtemp(prefix="gr_jax_xla_cache_")
        atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    CACHE_PROBLEM = cache_setting_problem(_cache)
    if CACHE_PROBLEM is None:
        os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")


def xla_flags(*flags: str, across_programs: bool = False) -> str:
    """XLA_FLAGS for a subprocess: the session's flags plus `flags` (e.g. a host device count).

    `across_programs=True` leaves out the loop emitters' flag, for a process whose test compares programs of other
    shapes or shardings bit for bit, or within 1e-6 (one device's batch against 8 devices', t5x's train step
    against ours): the loop emitters round such programs differently where XLA's default emitters do not
    (2026-11-28: the 8-device search's scores and t5x's parameters after 3 steps differed with the flag, matched
    without it)."""
    session = os.environ.get("XLA_FLAGS", "")
    if across_programs:
        session = " ".join(f for f in session.split() if f != LOOP_EMITTERS)
    return " ".join([session, *flags]).strip()


# ---------------------------------------------------------------------------------------------------------------
# The two tiers. `python -m pytest` runs the default tier: every test not marked `slow` (hand-worked cases,
# oracles, parity on tiny models, each command's library function at tiny size). `-m slow` runs the slow tier
# (the commands as a user types them, subprocesses, kill -9 and fault injection, several processes, t5x round
# trips, long end-to-end runs); `-m "slow or not slow"` runs both. Naming a test (`path::name`) runs it whatever
# its tier. A default-tier test starts no process and runs no command's main: tests/tiers.py reads that from the
# source (tests/test_repo.py), and the guard below stops one that launches a Python process all the same.
# ---------------------------------------------------------------------------------------------------------------
DEFAULT_TIER = "not slow"


def pytest_configure(config):
    if CACHE_PROBLEM is not None:
        pytest.exit(CACHE_PROBLEM, returncode=2)
    if not config.option.markexpr and not any("::" in str(a) for a in config.args):
        config.option.markexpr = DEFAULT_TIER


def pytest_report_header(config):
    tier = {"not slow": "default (the slow tier: -m slow)", "slow": "slow"}.get(config.option.markexpr,
                                                                              repr(config.option.markexpr or "all"))
    return [f"gr_jax tier: {tier}; XLA compilation cache: {os.environ.get('JAX_COMPILATION_CACHE_DIR')}"]


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per core this process may use, at most 4 (each worker holds its own JAX, and often
    TensorFlow and torch: ~2-4 GB)."""
    return max(1, min(len(os.sched_getaffinity(0)), 4))


class TierError(RuntimeError):
    """A default-tier test launched a Python process."""


_running = {"test": None}  # the default-tier test now running (setup, call and teardown), if any


def _is_python(args, executable) -> bool:
    argv0 = executable or (args[0] if isinstance(args, (list, tuple)) and args else str(args).split(" ", 1)[0])
    name = os.path.basename(os.fspath(argv0))
    return os.fspath(argv0) == sys.executable or name.startswith("python")


_popen_init = subprocess.Popen.__init__


def _guarded_popen_init(self, args, *rest, **kwargs):
    executable = kwargs.get("executable") or (rest[1] if len(rest) > 1 else None)
    if _running["test"] and _is_python(args, executable):
        raise TierError(f"{_running['test']} is in the default tier but starts a Python process ({args!r}): mark it "
                        "@pytest.mark.slow, or call the library function in-process (tests/tiers.py)")
    _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _guarded_popen_init


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running["test"] = None if item.get_closest_marker("slow") else item.nodeid
    try:
        yield
    finally:
        _running["test"] = None


@pytest.fixture(autouse=True)
def clean_gin():
    """Every test starts and ends with an empty gin configuration (entry points parse into gin's global state)."""
    import gin

    gin.clear_config()
    yield
    gin.clear_config()


def process_footprint() -> tuple[int, int]:
    """(memory mappings, resident bytes) of this process, from /proc (zeros where there is no /proc)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            maps = sum(1 for _ in f)
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0, 0
    return maps, rss


def _max_map_count() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65530  # Linux's default


# Each compiled program JAX keeps holds its machine code in ~6 memory mappings (2026-11-28: 300 small programs
# kept alive took 433 -> 2300 mappings; dropped, back to 510). Past vm.max_map_count (65,530 by default) mmap fails
# and the process dies inside XLA's compiler: with the limit lowered to 3,000, the 400th kept program stopped with
# "LLVM compilation error: Cannot allocate memory" and a segmentation fault in backend_compile_and_load, the
# crash once seen in a full single-process run. A worker of this suite reached 19,442 mappings within one module
# while keeping programs, ~2,400 after dropping them; one MINDER protocol run alone peaks at ~3,800. So after each
# test the programs are dropped once the process holds more than a third of the mappings allowed, or 4 GiB; below
# that, the next test reuses what the earlier ones compiled (the same tiny T5, the same searches).
MAP_BUDGET = _max_map_count() // 3
RSS_BUDGET = 4 << 30


def release_if_over(map_budget: int = MAP_BUDGET, rss_budget: int = RSS_BUDGET) -> bool:
    """Drops JAX's in-memory compiled programs when this process holds more mappings or resident bytes than the
    budgets allow (what is needed again comes back from the persistent cache); True when it did."""
    maps, rss = process_footprint()
    if maps <= map_budget and rss <= rss_budget:
        return False
    import gc

    import jax

    jax.clear_caches()
    gc.collect()
    return True


@pytest.fixture(autouse=True)
def release_compiled_programs():
    """After every test: `release_if_over` (reading /proc/self/maps costs a few milliseconds)."""
    yield
    release_if_over()


def require(module: str):
    """Imports `module`, or skips (locally) / fails (CI) the calling test."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if IN_CI:
            pytest.fail(f"{module} is required in CI but cannot be imported: {e}")
        pytest.skip(f"{module} not installed")


@pytest.fixture(scope="session")
def hf_t5_dirs(tmp_path_factory):
    """Tiny random HF T5 checkpoints written by transformers' save_pretrained: {"1.0": dir, "1.1": dir}."""
    require("torch")
    require("transformers")
    from gr_jax.backbones import t5_parity

    root = tmp_path_factory.mktemp("hf")
    return {v: t5_parity.write_random_hf_t5(root / f"t5_v{v}", v, seed=3) for v in ("1.0", "1.1")}


REPO = Path(__file__).resolve().parents[1]
_tools: dict = {}


def tool(name: str):
    """A script of tools/ (not a package) imported by path, once per process: tests call its `main(argv)`
    in-process, as the default tier does for every tool (argparse's refusals come back as SystemExit(2))."""
    if name not in _tools:
        spec = importlib.util.spec_from_file_location(f"tools_{name}", REPO / "tools" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _tools[name] = module
    return _tools[name]


def run_tool(name: str, argv, capsys) -> tuple[int, str, str]:
    """`python tools/<name>.py ARGV` in-process → (exit code, stdout, stderr). What the tool logs goes to stderr as
    in its own process (there `setup_logging`'s handler writes it; here pytest's handlers hold the root logger)."""
    import logging

    capsys.readouterr()
    handler = logging.StreamHandler(sys.stderr)  # capsys's stream while this test runs
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        rc = tool(name).main([str(a) for a in argv])
    except SystemExit as e:  # argparse's usage errors
        rc = e.code if isinstance(e.code, int) else 1
    finally:
        logging.getLogger().removeHandler(handler)
    out, err = capsys.readouterr()
    return rc, out, err


def mutation_report(method: str, fixture, capsys, sample: int, seed: int, tolerance=None) -> tuple[int, dict]:
    """`python tools/check_parity.py --method METHOD --fixture FIXTURE --mutate --mutate_sample SAMPLE --seed SEED
    [--tolerance T]` in-process → (exit code, its JSON report)."""
    import json

    argv = ["--method", method, "--fixture", str(fixture), "--mutate", "--mutate_sample", str(sample), "--seed",
            str(seed)] + ([] if tolerance is None else ["--tolerance", str(tolerance)])
    code, out, _ = run_tool("check_parity", argv, capsys)
    return code, json.loads(out.strip().splitlines()[-1])


def sweep(argnames: str, cases, default) -> list:
    """The cases of a parametrized sweep for `pytest.mark.parametrize(argnames, ...)`: those in `default` run in the
    default tier (a few representatives, each value of each argument at least once where it matters), the others
    are marked slow, so CI still runs every case."""
    import itertools

    names = [n.strip() for n in argnames.split(",")]
    cases = list(itertools.product(*cases)) if isinstance(cases, tuple) else list(cases)
    default = [tuple(d) if isinstance(d, (tuple, list)) else (d,) for d in default]
    flat = [tuple(c) if isinstance(c, (tuple, list)) else (c,) for c in cases]
    unknown = [d for d in default if d not in flat]
    assert not unknown, f"default cases {unknown} are not among the cases of {argnames}"
    out = []
    for c in flat:
        values = c if len(names) > 1 else c[:1]
        out.append(pytest.param(*values, marks=() if c in default else pytest.mark.slow))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Tiny systems built once per test run and shared (tests/shared.py): each is read-only for the tests that request
# it (checked when the session ends); a test that writes into one works on `copy_of(...)`.
# ---------------------------------------------------------------------------------------------------------------


def _train_in_process(gin_file: Path, text: str) -> None:
    """Writes `text` to `gin_file` and trains it into `MODEL_DIR = <its folder>/model` through what
    `python -m gr_jax.train` calls (`compose.train` under the parsed configuration), in this process."""
    import gin

    from gr_jax import compose
    from gr_jax.runtime import gin_utils

    gin_file.write_text(text)
    gin.clear_config()
    gin_utils.parse([str(gin_file)], [f"MODEL_DIR = '{gin_file.parent / 'model'}'"])
    gin_utils.call_configured(compose.train)
    gin.clear_config()


@pytest.fixture(scope="session")
def tiny_dsi(tmp_path_factory):
    """The TINY DSI of tests/test_bad_inputs.py (40 demo documents, 2 steps) as `python -m gr_jax.train` leaves
    it, trained in this process through what that command calls (`compose.train`): (its gin file, its MODEL_DIR)."""
    from tests.shared import built_once, check_unchanged

    def build(folder: Path) -> None:
        from tests.test_bad_inputs import TINY

        _train_in_process(folder / "tiny.gin", TINY)

    folder = built_once(tmp_path_factory, "tiny_dsi", build)
    yield folder / "tiny.gin", folder / "model"
    check_unchanged(folder)


@pytest.fixture(scope="session")
def tiny_dsi_process(tmp_path_factory):
    """TINY trained for 4 steps with checkpoints at 2 and 4 (tests/reliability/test_faults.py's TINY_TRAIN) by
    `python -m gr_jax.train` in a process of its own, on one device: what the fault, kill and multi-process tests
    compare their runs with, byte for byte: (its gin file, its MODEL_DIR)."""
    from tests.shared import built_once, check_unchanged

    def build(folder: Path) -> None:
        from tests.reliability.test_faults import TINY_TRAIN

        (folder / "tiny.gin").write_text(TINY_TRAIN)
        env = {k: v for k, v in os.environ.items() if k != "GR_JAX_FAULT"}
        res = subprocess.run([sys.executable, "-m", "gr_jax.train", f"--gin_file={folder / 'tiny.gin'}",
                              f"--gin.MODEL_DIR='{folder / 'model'}'"], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-4000:]

    folder = built_once(tmp_path_factory, "tiny_dsi_process", build)
    yield folder / "tiny.gin", folder / "model"
    check_unchanged(folder)


@pytest.fixture(scope="session")
def tiny_pag(tmp_path_factory):
    """The small PAG of tests/methods/pag/test_run.py (40 demo documents, 6 steps, planning sets of 12, no final
    evaluation), trained through `compose.train` in this process: (its gin file, its MODEL_DIR)."""
    from tests.shared import built_once, check_unchanged

    def build(folder: Path) -> None:
        import textwrap

        from tests.methods.pag.test_run import SHARED

        _train_in_process(folder / "pag.gin", textwrap.dedent(SHARED))

    folder = built_once(tmp_path_factory, "tiny_pag", build)
    yield folder / "pag.gin", folder / "model"
    check_unchanged(folder)


@pytest.fixture(scope="session")
def tiny_lm():
    """tests/backbones/lm_helpers.tiny_lm_context(): a tiny random Llama with a BPE tokenizer trained on 80 demo
    documents and the few-shot prompt, and that dataset. One per worker process (it lives in memory); read-only."""
    from tests.backbones.lm_helpers import tiny_lm_context

    return tiny_lm_context()


@pytest.fixture(scope="session")
def tiny_hf_llama(tmp_path_factory, tiny_lm):
    """tiny_lm's tokenizer beside a tiny random HF Llama directory (d_model 32, 2 heads, 1 KV head): what the LM
    commands load as `--gin.LM=DIR`."""
    from tests.shared import built_once, check_unchanged

    def build(folder: Path) -> None:
        require("torch")
        from gr_jax.backbones import llama_parity

        ctx, _ = tiny_lm
        hf = llama_parity.write_random_hf_llama(folder / "lm", vocab_size=ctx.tok.vocab_size, d_model=32,
                                               num_heads=2, num_kv_heads=1, d_ff=48)
        ctx.tok.backend.save(str(hf / "tokenizer.json"))

    folder = built_once(tmp_path_factory, "tiny_hf_llama", build)
    yield folder / "lm"
    check_unchanged(folder)


def fixture_tool_refuses(name: str, argv: list, message: str, out, capsys, parser_error: bool = False) -> None:
    """A fixture tool (`tools/<name>.py`) refuses `argv` with exit code 2 and `message` on stderr, and writes
    nothing at `out` (a folder that is not the authors' checkout, or sizes their code cannot run)."""
    import pytest

    if parser_error:
        with pytest.raises(SystemExit) as exit_:
            tool(name).main(argv)
        code = exit_.value.code
    else:
        code = tool(name).main(argv)
    assert code == 2 and message in capsys.readouterr().err
    assert not Path(out).exists()
