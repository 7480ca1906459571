"""Progress of long loops: a bar on a terminal, plain log lines in a file.

`bar(total, desc, ...)` is a tqdm bar when stderr is a terminal. When it is not (a log file, a CI log, a
pipe), a bar's carriage-return frames would pile up into one line of hundreds of kB, so it is instead a
`LogProgress` that logs one line at every tenth of the way (and at the end): "desc: 300/1500 steps (20%),
15.2 steps/s, loss=1.234".
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Optional

log = logging.getLogger("gr_jax.runtime.progress")

LOG_EVERY = 0.1  # the fraction of the total between two lines in a file


class LogProgress:
    """tqdm's `update` / `set_postfix` / `close` (and iteration over `iterable`), writing a log line every
    `LOG_EVERY` of the total."""

    def __init__(self, total: Optional[int], desc: str, unit: str = "it", initial: int = 0, iterable=None):
        self.total, self.desc, self.unit, self.n, self.iterable = total, desc, unit, initial, iterable
        self.postfix: dict = {}
        self._t0, self._n0 = time.time(), initial
        self._every = max(1, int((total or 0) * LOG_EVERY)) if total else None
        self._next = initial + self._every if self._every else None

    def __iter__(self):
        for x in self.iterable:
            yield x
            self.update(1)
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._next is not None and self.n >= self._next and (self.total is None or self.n < self.total):
            self._line()
            while self._next <= self.n:
                self._next += self._every

    def set_postfix(self, postfix=None, **kwargs) -> None:
        self.postfix = {**(postfix or {}), **kwargs}

    def close(self) -> None:
        if self.n > self._n0:
            self._line()
        self._n0 = self.n  # a second close logs nothing

    def _line(self) -> None:
        rate = (self.n - self._n0) / max(time.time() - self._t0, 1e-9)
        where = f"{self.n}/{self.total} {self.unit} ({100 * self.n / self.total:.0f}%)" if self.total else \
            f"{self.n} {self.unit}"
        extra = "".join(f", {k}={v}" for k, v in self.postfix.items())
        log.info("%s: %s, %.1f %s/s%s", self.desc, where, rate, self.unit, extra)


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, postfix=None, **kwargs) -> None:
        pass

    def close(self) -> None:
        pass


def on_terminal() -> bool:
    return sys.stderr.isatty()


def bar(total: Optional[int] = None, desc: str = "", unit: str = "it", initial: int = 0, disable: bool = False,
        iterable=None, **tqdm_kwargs):
    """A progress bar (module docstring); `disable`: nothing at all; `iterable`: iterate over it."""
    if disable:
        return _Silent() if iterable is None else iterable
    if on_terminal():
        from tqdm.auto import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, **tqdm_kwargs)
    if total is None and iterable is not None:
        total = _len(iterable)
    return LogProgress(total, desc, unit, initial, iterable)


def _len(iterable) -> Optional[int]:
    try:
        return len(iterable)
    except TypeError:
        return None
