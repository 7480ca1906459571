"""Repository contracts: the README's test command is what CI runs; core modules import without torch/TF."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands():
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    return [line.strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_readme_has_two_setup_commands_and_ci_runs_the_test_one():
    commands = _readme_commands()
    assert len(commands) == 2, commands
    test_cmd = commands[1]
    assert "pytest" in test_cmd
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_cmd in [line.strip() for line in ci], "'.ci/run' must run exactly the README's test command"


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
skip = {'gr_jax.data.tasks'}  # the seqio adapter, imported only when seqio is installed
names = [m.name for m in pkgutil.walk_packages(gr_jax.__path__, 'gr_jax.') if m.name not in skip]
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
