"""The part of our gin handling that library code calls: the configuration error type, `call_configured`,
`check_bindings_used` (every binding must have been used once a command has built what gin configures), and
one name per setting (`renamed`, `settle_renamed`: the earlier names of a setting keep working, are read as its
one name, and two of them bound to different values are refused). It imports only `gr_jax.runtime.errors`, so library
modules use it without importing the entry-point side (`gin_utils`, which imports every configurable module).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import tokenize
from typing import NamedTuple, Optional, Sequence

import gin
import gin.config

from gr_jax.runtime.errors import UserError

MACRO = "gin.macro"

log = logging.getLogger(__name__)


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


REQUIRED = object()


def macro(name: str, default=REQUIRED):
    """The value the parsed configuration gives the macro `name` (a command's own read of MODEL_DIR,
    TASK_FEATURE_LENGTHS, ...: library functions take such values as parameters); `default` when unset, an
    error naming it when no default is given."""
    try:
        return gin.query_parameter(f"{name}/macro.value")
    except ValueError:
        if default is REQUIRED:
            raise GinConfigError(f"{name} is not set: set it in a gin file or with --gin.{name}=...") from None
        return default


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


# ----------------------------------------------------------------------------------------------------------
# one name per setting
# ----------------------------------------------------------------------------------------------------------

# {a setting's name: its earlier names}: `Configurable.param`, or a MACRO; declared by the module that owns an
# earlier name (`renamed`), so a method's command declares its own
_RENAMED: dict[str, tuple[str, ...]] = {}


def renamed(name: str, *earlier: str) -> None:
    """Declares `earlier` (parameters `fn.param` or macros `NAME`) as earlier names of the setting `name`
    (`EvalConfig.num_beams`): a binding of one of them is read as a binding of `name` (`settle_renamed`). The
    configurable that had the earlier parameter keeps it in its signature, so that gin still parses the files
    that bind it; after `settle_renamed` nothing binds it any more."""
    _RENAMED[name] = tuple(dict.fromkeys((*_RENAMED.get(name, ()), *earlier)))


def renamed_settings() -> dict[str, tuple[str, ...]]:
    return dict(_RENAMED)


class _Bound(NamedTuple):
    name: str  # as declared: 'NUM_BEAMS', 'infer.num_beams'
    key: tuple  # its (scope, selector) in gin's configuration
    param: str
    raw: object  # as bound (a macro reference stays one)
    value: object  # macros replaced by their values
    command_line: bool


def _matches(selector: str, configurable: str) -> bool:
    """A gin selector ('gr_jax.evaluation.retrieval.EvalConfig', 'infer') names `configurable` ('EvalConfig')."""
    return selector == configurable or selector.endswith("." + configurable)


def _macro_value(value, depth: int = 0):
    if isinstance(value, gin.config.ConfigurableReference) and value.configurable.selector == MACRO and depth < 20:
        held = gin.config._CONFIG.get((value.scoped_selector.rsplit("/", 1)[0], MACRO), {})
        return _macro_value(held.get("value"), depth + 1)
    return value


def _command_line_keys(bindings: Sequence[str]) -> set:
    """{(scope, selector, param)} that the command line's bindings set (a macro: (name, MACRO, 'value'))."""
    from gin import config_parser

    keys = set()
    for binding in bindings:
        try:
            for st in config_parser.ConfigParser(binding, gin.config.ParserDelegate(skip_unknown=True)):
                if isinstance(st, config_parser.BindingStatement):
                    keys.add((st.selector, MACRO, "value") if not st.arg_name else
                             (st.scope, st.selector, st.arg_name))
        except (SyntaxError, ValueError, tokenize.TokenError):
            continue  # gin's own parse names it
    return keys


def _bindings_of(name: str, command_line: set) -> list[_Bound]:
    """Every binding of one name, in any scope (a macro has none)."""
    if "." not in name:
        params = gin.config._CONFIG.get((name, MACRO), {})
        if "value" not in params:
            return []
        return [_Bound(name, (name, MACRO), "value", params["value"], _macro_value(params["value"]),
                       (name, MACRO, "value") in command_line)]
    configurable, param = name.rsplit(".", 1)
    found = []
    for (scope, selector), params in sorted(gin.config._CONFIG.items()):
        if selector != MACRO and param in params and _matches(selector, configurable):
            from_cli = any(s == scope and _matches(sel, configurable) and p == param for s, sel, p in command_line)
            found.append(_Bound(name, (scope, selector), param, params[param], _macro_value(params[param]),
                                from_cli))
    return found


def _label(b: _Bound) -> str:
    scope = b.key[0] if b.key[1] != MACRO else ""
    return f"{scope + '/' if scope else ''}{b.name}"


def settle_renamed(command_line: Sequence[str] = ()) -> set[str]:
    """Reads every binding of a setting's earlier name as a binding of its one name, after parsing and before
    anything runs. Which value counts: the command line's (`command_line`: the `--gin.` bindings) over the gin
    files'; two bindings of the same setting at the same level (both in files, or both on the command line)
    with different values are refused with a message naming both — one of them would otherwise be lost without
    a word. Each earlier name that was bound logs one line naming the setting that replaces it; its binding is
    then dropped and the setting's own name bound. Returns the macros that nothing reads any more because of
    that (an earlier name that is a macro, or one that a dropped binding read), for the unused-macro check."""
    cli = _command_line_keys(command_line)
    released: set[str] = set()
    for name, earlier in sorted(_RENAMED.items()):
        bound = [b for n in (name, *earlier) for b in _bindings_of(n, cli)]
        if not any(b.name != name for b in bound):
            continue
        scopes = sorted({b.key[0] for b in bound if b.key[1] != MACRO} | ({""} if any(
            b.key[1] == MACRO for b in bound) else set()))
        if len(scopes) > 1:
            raise GinConfigError(f"{name} is bound in several scopes under its earlier names "
                                 f"({', '.join(_label(b) for b in bound)}): bind {name} itself in each scope")
        scope = scopes[0]
        level = [b for b in bound if b.command_line] or bound
        values = {repr(b.value) for b in level}
        if len(values) > 1:
            where = "on the command line" if level[0].command_line else "in the gin files"
            raise GinConfigError(
                f"one setting is bound {where} under two names with different values: "
                + ", ".join(f"{_label(b)} = {b.value!r}" for b in level)
                + f". {', '.join(n for n in earlier)} {'is an earlier name' if len(earlier) == 1 else 'are earlier names'}"
                f" of {name}: bind {name} once")
        value = level[0].value
        for b in bound:
            if b.name != name:
                log.info("gin: %s is an earlier name of %s; read as %s = %r", _label(b), name, name, value)
            elif b not in level:
                log.info("gin: the command line's value replaces %s = %r", _label(b), b.value)
        for b in bound:
            if b.name == name:
                continue
            if b.key[1] == MACRO:
                released.add(b.name)
            else:
                refs: set = set()
                macro_references(b.raw, refs)
                released |= refs
                del gin.config._CONFIG[b.key][b.param]
                if not gin.config._CONFIG[b.key]:
                    del gin.config._CONFIG[b.key]
        configurable, param = name.rsplit(".", 1)
        own = [b for b in bound if b.name == name]
        selector = own[0].key[1] if own else configurable
        gin.bind_parameter(f"{scope + '/' if scope else ''}{selector}.{param}", value)
    return released


def macro_references(value, out: set) -> None:
    """The names of the macros a bound value reads (`%NAME`, inside lists and dicts too), added to `out`."""
    if isinstance(value, gin.config.ConfigurableReference):
        if value.configurable.selector == MACRO:
            out.add(value.scoped_selector.rsplit("/", 1)[0])
    elif isinstance(value, dict):
        for v in value.values():
            macro_references(v, out)
    elif isinstance(value, (list, tuple, set)):
        for v in value:
            macro_references(v, out)
