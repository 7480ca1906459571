"""`python -m <module> <args>` for the t5x tests, each command in a child forked from one process that has already
imported t5x, seqio and TensorFlow (about 11 s of CPU per start on the CI machine, most of a refusal's cost).

The child is a fresh `python -m` run in every other way: its own working directory, environment, sys.path[0],
argv and exit code; the command module runs as `__main__` (`runpy`), after the fork, so nothing of it (absl flags,
gin bindings, our gin configurables, which t5x command `gr_jax.t5x.models` sees) exists before. JAX's backend
starts in the child, which reads XLA_FLAGS then; the parent never starts one. A command whose XLA_FLAGS differ
from the parent's runs as a plain subprocess (callers keep to that: `run`).

Protocol: one JSON request per line on stdin, one `FORKED <json>` reply line on stdout."""

import atexit
import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

# what t5x's entry points import (not the entry points themselves: they run as __main__ in the child)
PRELOAD = ("tensorflow", "seqio", "t5x.models", "t5x.utils", "t5x.trainer", "t5x.partitioning", "t5x.checkpoints",
           "t5x.config_utils", "t5x.gin_utils", "clu.metrics", "orbax.checkpoint", "jax", "flax")
MARK = "FORKED "


def _child(req: dict) -> int:
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.path[0] = os.getcwd()  # what `python -m` puts first
    sys.argv = ["-m", *req["args"]]
    code = 0
    try:
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:  # as the interpreter does: the message on stderr, exit 1
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 — an uncaught exception: the traceback and exit 1, as `python -m` gives
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()  # what the interpreter runs at exit (locks released, files closed)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def serve() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(req)
            finally:
                os._exit(code)
        deadline = time.monotonic() + req["timeout"]
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                code = "timeout"
                break
            time.sleep(0.05)
        sys.stdout.write(MARK + json.dumps({"returncode": code}) + "\n")
        sys.stdout.flush()


class Forker:
    """The parent process: started on first use with `env` and `cwd`, stopped at exit."""

    def __init__(self, env: dict, cwd: Path):
        self.env, self.cwd, self.proc = dict(env), Path(cwd), None
        atexit.register(self.close)

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.t5x.forked"], cwd=self.cwd, env=self.env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)

    def run(self, module: str, args, cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
        if env.get("XLA_FLAGS", "") != self.env.get("XLA_FLAGS", ""):  # XLA reads them once, at the first backend
            return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True,
                                  text=True, timeout=timeout)
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        with tempfile.TemporaryDirectory(prefix="forked_") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            req = {"module": module, "args": list(args), "cwd": str(Path(cwd).absolute()), "env": dict(env),
                   "stdout": str(out), "stderr": str(err), "timeout": timeout}
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            while True:
                line = self.proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"the forking process ended (exit {self.proc.wait()}) running {module} {args}")
                if line.startswith(MARK):
                    code = json.loads(line[len(MARK):])["returncode"]
                    break
            if code == "timeout":
                raise subprocess.TimeoutExpired([module, *args], timeout)
            return subprocess.CompletedProcess([sys.executable, "-m", module, *args], code,
                                               out.read_text(errors="replace"), err.read_text(errors="replace"))


if __name__ == "__main__":
    serve()
