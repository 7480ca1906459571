"""The part of our gin handling that library code calls: the configuration error type, `call_configured`,
and `check_bindings_used` (every binding must have been used once a command has built what gin configures).
It imports only `gr_jax.errors`, so library modules use it without importing the entry-point side
(`gin_utils`, which imports every configurable module).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Optional, Sequence

import gin
import gin.config

from gr_jax.errors import UserError

MACRO = "gin.macro"


class GinConfigError(UserError, ValueError):
    pass


def call_configured(fn, macro_hint: str = "--gin.NAME=VALUE"):
    """Calls a gin-configured function; a missing REQUIRED parameter becomes a clear GinConfigError."""
    try:
        return fn()
    except RuntimeError as e:
        if "Required bindings" in str(e) or "REQUIRED" in str(e):
            raise GinConfigError(f"{e}\nSet the missing values in a gin file or on the command line, e.g. "
                                 f"{macro_hint}") from None
        raise


def entry_configurable(fn=None, *, not_under: Optional[str] = None):
    """`gin.configurable` under the bare name (selector `train`, not `gr_jax.compose.train`). t5x's entry points
    register their own `train` / `infer` in `__main__` before they parse; gin prefers a selector that matches
    exactly, so `train.x` in our gin files stays ours when `python -m t5x.train` parses them (gr_jax/t5x/).
    `not_under`: a module run as `__main__` (`python -m <it>`) that looks its own configurable of this name up by
    the bare name (`t5x.infer` queries `infer.shard_id`): there ours is not registered at all, and no gin file of
    ours binds it (the t5x adapter's files bind `train.*` only)."""
    if fn is None:
        return lambda f: entry_configurable(f, not_under=not_under)
    if not_under is not None and getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name",
                                         None) == not_under:
        return fn
    module = fn.__module__
    fn.__module__ = None  # gin takes the selector's module from here: none gives the bare name
    try:
        wrapped = gin.configurable(fn)
    finally:
        fn.__module__ = module
    wrapped.__module__ = module
    return wrapped


def _minimal(selector: str) -> str:
    try:
        return gin.config._REGISTRY.minimal_selector(selector)
    except (KeyError, ValueError):
        return selector


_ACTIVE: dict = {"root": None, "allow": ()}


def _references(value, out: set, uncalled_only: bool = False) -> None:
    """Selectors of the configurables a bound value references (`@fn()` and `@fn`; or `@fn` alone)."""
    if isinstance(value, gin.config.ConfigurableReference):
        if not (uncalled_only and value.evaluate) and value.configurable.selector != MACRO:
            out.add(value.configurable.selector)
    elif isinstance(value, dict):
        for v in value.values():
            _references(v, out, uncalled_only)
    elif isinstance(value, (list, tuple, set)):
        for v in value:
            _references(v, out, uncalled_only)


def _closure(selectors: set) -> set:
    """The configurables reachable from `selectors` through the references in their bindings."""
    todo, seen = list(selectors), set(selectors)
    while todo:
        sel = todo.pop()
        found: set = set()
        for (scope, selector), params in gin.config._CONFIG.items():
            if selector == sel:
                for value in params.values():
                    _references(value, found)
        todo += [f for f in found - seen]
        seen |= found
    return seen


@contextlib.contextmanager
def command(root: str | None, allow: Sequence[str] = ()):
    """Marks the command being run from the command line (`gin_utils.run_entry`) for `check_bindings_used`."""
    _ACTIVE.update(root=root, allow=tuple(allow))
    try:
        yield
    finally:
        _ACTIVE.update(root=None, allow=())


def check_bindings_used(roots: str | Sequence[str], allow: Sequence[str] = ()) -> None:
    """Called by library code once everything gin configures for a command has been built, before the long
    work (`roots`: the commands this point belongs to: "train", "infer", "run_dynamic"). When one of them is
    the command being run from the command line (`run_entry`), every binding must have been used by now,
    except those `allow` or the command allows ("configurable" or "configurable.param"). Library calls from
    Python are not checked."""
    if _ACTIVE["root"] is None or _ACTIVE["root"] not in ([roots] if isinstance(roots, str) else roots):
        return
    allow = set(allow) | set(_ACTIVE["allow"])
    operative = {key: set(params) for key, params in gin.config._OPERATIVE_CONFIG.items()}
    passed: set = set()  # configurables handed over uncalled (`@fn`, not `@fn()`): their bindings apply when
    for params in gin.config._OPERATIVE_CONFIG.values():  # the receiver calls them, e.g. in the train step
        for value in params.values():
            _references(value, passed, uncalled_only=True)
    passed = _closure(passed)  # and what their own bindings reference (`@PagRetriever` → `@PagObjective()`)
    # an allowed configurable (not built yet) also covers what its bindings reference
    later = _closure({sel for (_, sel) in gin.config._CONFIG if _minimal(sel) in allow})
    unused = []
    for (scope, selector), params in gin.config._CONFIG.items():
        if selector == MACRO or selector in passed or selector in later:
            continue
        name = _minimal(selector)
        for param in params:
            if param in operative.get((scope, selector), ()) or name in allow or f"{name}.{param}" in allow:
                continue
            unused.append(f"{scope + '/' if scope else ''}{name}.{param}")
    if unused:
        raise GinConfigError(
            "gin bindings that this run never used (they would be ignored):\n  " + "\n  ".join(sorted(unused))
            + "\nRemove them, or bind the parameter of what this run calls (a caller may pass that value "
              "itself; see the run's config.gin for what was used).")
