"""The two test tiers' rule, read from the source: a test of the default tier (not marked `slow`) starts no
process and runs no command's `main` (`python -m gr_jax.*`), neither itself nor through what it calls in its own
module, in another test module it imports from, or in the fixtures it requests. `tests/test_repo.py` applies it
to the suite; `conftest.py` also stops a default-tier test that launches a Python process at run time (what a
library function starts on its behalf, which no reading of the tests sees).

Static on purpose: it names the test and the line before anything runs, and costs no test time."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# calls that start a process (dotted names as the module imports them)
PROCESS_MODULES = ("subprocess", "pty")
PROCESS_CALLS = {
    "os.system", "os.popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.posix_spawnp", "os.execv", "os.execve",
    "os.execl", "os.execle", "os.execlp", "os.execlpe", "os.execvp", "os.execvpe", "os.spawnl", "os.spawnle",
    "os.spawnlp", "os.spawnlpe", "os.spawnv", "os.spawnve", "os.spawnvp", "os.spawnvpe",
    "multiprocessing.Process", "multiprocessing.Pool", "asyncio.create_subprocess_exec",
    "asyncio.create_subprocess_shell", "runpy.run_module", "runpy.run_path",
}


def command_modules(root: Path = ROOT) -> set[str]:
    """The gr_jax modules a user runs as `python -m ...`: those with a `main` and an `if __name__ == "__main__"`."""
    found = set()
    for path in (root / "gr_jax").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if "__main__" not in text:
            continue
        tree = ast.parse(text)
        has_main = any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
        guarded = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
        if has_main and guarded:
            found.add(".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__"))
    return found


def _is_slow_mark(node: ast.AST) -> bool:
    """`pytest.mark.slow`, `mark.slow` or a list/tuple holding one (decorators, `pytestmark`)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_is_slow_mark(e) for e in node.elts)
    if isinstance(node, ast.Call):  # pytest.mark.slow(reason=...) is unusual, but still the mark
        node = node.func
    return isinstance(node, ast.Attribute) and node.attr == "slow" and ast.unparse(node.value).endswith("mark")


@dataclasses.dataclass
class _Module:
    name: str  # tests.x.y
    path: Path
    tree: ast.Module
    bindings: dict  # local name -> dotted name it stands for
    functions: dict  # module-level function name -> FunctionDef
    fixtures: set  # names of the module's fixtures
    slow: bool  # module-level pytestmark holds slow


def _load(path: Path, root: Path) -> _Module:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    bindings, functions, fixtures, slow = {}, {}, set(), False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                bindings[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x / from .m import y
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                bindings[a.asname or a.name] = f"{base}.{a.name}" if base else a.name
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = node
            if any("fixture" in ast.unparse(d) for d in node.decorator_list):
                fixtures.add(node.name)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                  for t in node.targets):
            slow = _is_slow_mark(node.value)
    return _Module(name, path, tree, bindings, functions, fixtures, slow)


def _dotted(node: ast.AST, bindings: dict) -> str | None:
    """`a.b.c` with `a` replaced by what the module bound it to; None for anything else (a call's result...)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([bindings.get(node.id, node.id), *reversed(parts)])


class _Checker:
    def __init__(self, root: Path):
        self.root = root
        self.commands = command_modules(root)
        self.modules: dict[str, _Module] = {}

    def module(self, name: str) -> _Module | None:
        if name not in self.modules:
            rel = Path(*name.split("."))
            for path in (self.root / rel.with_suffix(".py"), self.root / rel / "__init__.py"):
                if path.is_file():
                    self.modules[name] = _load(path, self.root)
                    break
            else:
                self.modules[name] = None
        return self.modules[name]

    def conftests(self, module: _Module) -> list[_Module]:
        """The conftest modules whose fixtures a test module sees: its folder's and every folder above, to tests/."""
        found, folder = [], module.path.parent
        while folder != self.root:
            if (folder / "conftest.py").is_file():
                found.append(self.module(".".join(folder.relative_to(self.root).parts) + ".conftest"))
            folder = folder.parent
        return found

    def forbidden(self, dotted: str) -> str | None:
        """What a call of `dotted` does that the default tier may not, or None."""
        head, _, last = dotted.rpartition(".")
        if dotted in PROCESS_CALLS or dotted.split(".")[0] in PROCESS_MODULES:
            return f"starts a process ({dotted})"
        if last == "main" and head in self.commands:
            return f"runs the command `python -m {head}` ({dotted})"
        if dotted in {f"{c}.main" for c in self.commands}:
            return f"runs the command `python -m {head}`"
        if last == "main" and any(head.startswith(c + ".") for c in self.commands):  # a Command object's main
            return f"runs a command's main ({dotted})"
        if head == "gr_jax.commands" and last in ("run", "eval_main", "reproduce_main"):  # the scaffold itself
            return f"runs a command ({dotted})"
        return None

    def reach(self, module: _Module, fn: ast.FunctionDef, seen: set, passed: dict | None = None) -> list[str]:
        """What `fn` does that is forbidden — itself, through the functions of the test modules it calls and the
        fixtures it requests — as 'path:line: what' strings. `passed` binds `fn`'s parameters to what a caller
        passed (a command module handed to a helper that calls its `main`)."""
        passed = passed or {}
        key = (module.name, fn.name, fn.lineno, tuple(sorted(passed.items())))
        if key in seen:
            return []
        seen.add(key)
        bindings = {**module.bindings, **passed}
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        found = []
        for arg in params + [a.arg for a in fn.args.kwonlyargs]:  # fixtures requested by name
            for owner in [module, *self.conftests(module)]:
                if owner is not None and arg in owner.fixtures:
                    found += self.reach(owner, owner.functions[arg], seen)
                    break
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            dotted = _dotted(node.func, bindings)
            if dotted is None:
                continue
            what = self.forbidden(dotted)
            if what:
                found.append(f"{module.path.relative_to(self.root)}:{node.lineno}: {what}")
                continue
            owner, fname = module, dotted
            if dotted not in module.functions and dotted.startswith("tests."):
                owner_name, _, fname = dotted.rpartition(".")
                owner = self.module(owner_name)
            if owner is None or fname not in owner.functions:
                continue
            callee = owner.functions[fname]
            names = [a.arg for a in callee.args.posonlyargs + callee.args.args]
            given = list(zip(names, node.args)) + [(k.arg, k.value) for k in node.keywords if k.arg]
            handed = {}
            for name, value in given:
                d = _dotted(value, bindings)
                if d is not None and d in self.commands:
                    handed[name] = d
            found += self.reach(owner, callee, seen, handed)
        return found


def _parametrized_commands(fn: ast.FunctionDef, module: _Module, commands: set) -> dict:
    """The test's parameters that `pytest.mark.parametrize` sets to a command module, e.g. `("entry", [train])`."""
    bound = {}
    for deco in fn.decorator_list:
        if not (isinstance(deco, ast.Call) and ast.unparse(deco.func).endswith("parametrize") and len(deco.args) >= 2):
            continue
        if not isinstance(deco.args[0], ast.Constant) or not isinstance(deco.args[1], (ast.List, ast.Tuple)):
            continue
        names = [n.strip() for n in str(deco.args[0].value).split(",")]
        for case in deco.args[1].elts:
            if isinstance(case, ast.Call) and ast.unparse(case.func).endswith("param"):  # pytest.param(..., marks=)
                values = case.args
            else:
                values = case.elts if isinstance(case, ast.Tuple) and len(names) > 1 else [case]
            for name, value in zip(names, values):
                d = _dotted(value, module.bindings)
                if d in commands:
                    bound[name] = d
    return bound


def violations(root: Path = ROOT) -> list[str]:
    """Every default-tier test (not marked slow) that starts a process or runs a command's main, with where."""
    checker = _Checker(root)
    out = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        module = checker.module(".".join(path.relative_to(root).with_suffix("").parts))
        if module is None or module.slow:
            continue
        tests = [(None, n) for n in module.tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]
        for cls in (n for n in module.tree.body if isinstance(n, ast.ClassDef) and n.name.startswith("Test")):
            if not any(_is_slow_mark(d) for d in cls.decorator_list):
                tests += [(cls, n) for n in cls.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]
        for cls, fn in tests:
            if any(_is_slow_mark(d) for d in fn.decorator_list):
                continue
            where = checker.reach(module, fn, set(), _parametrized_commands(fn, module, checker.commands))
            if where:
                test = f"{path.relative_to(root)}::{cls.name + '::' if cls else ''}{fn.name}"
                out.append(f"{test} is in the default tier but {where[0]}"
                           + (f" (and {len(where) - 1} more)" if len(where) > 1 else ""))
    return out
