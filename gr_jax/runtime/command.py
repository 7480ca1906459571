"""The scaffold of a `python -m` command over a gin-configured function (`Command.main`): logging set up,
`gin_utils.run_entry` (flags, gin parsing and checks, the output lock, exit code 2 with one message for a bad
input), then what the command prints on success. The core's commands are a table of these in `gr_jax/commands.py`;
a method's own command is one in `methods/<name>/command.py`. It lives in the runtime, below everything that
defines a command, so a method reaches it without importing the commands' table."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable, Optional

from gr_jax.runtime import distributed, gin_utils
from gr_jax.runtime.cli import setup_logging

# what a command run on a trained system (its experiment file is the training one) adds and allows: the
# training settings it parses but does not use
ON_A_TRAINED_SYSTEM = dict(fixed=("TRAIN_STEPS = 1", "BATCH_SIZE = 1"),
                           allow_unused=("train", "make_optimizer", "EvalConfig"))


@dataclasses.dataclass(frozen=True)
class Command:
    """A `python -m` command over a gin-configured function: `configurable()` imports and returns it (the import
    is deferred so that `--help` and a bad flag cost no library import), `prints(result)` is what goes to stdout
    on success; `root` is the configurable's gin name (its bindings must all be used); `fixed` bindings are
    added before the user's; `multiprocess`: takes t5x's flags for a run over several processes."""

    name: str
    usage: str
    configurable: Callable[[], Callable]
    prints: Callable[[Any], str]
    root: str
    fixed: tuple[str, ...] = ()
    allow_unused: tuple[str, ...] = ()
    multiprocess: bool = False

    def main(self, argv: Optional[list[str]] = None) -> int:
        setup_logging()
        rc, result = gin_utils.run_entry(argv, self.usage, self.configurable, self.fixed, root=self.root,
                                         allow_unused=self.allow_unused, multiprocess=self.multiprocess)
        if rc or result is None or (self.multiprocess and not distributed.is_primary()):
            return rc  # (None: --help)
        sys.stdout.write(self.prints(result))
        return 0


def deferred(module: str, name: str) -> Callable[[], Callable]:
    """`Command.configurable` for a function defined in `module`, imported when the command runs."""

    def get():
        import importlib

        return getattr(importlib.import_module(module), name)

    return get
