"""Who started a run, so that only the same program resumes it.

``run.started`` records the agent's **name** (``agent``) and a **fingerprint**
of its code (``agent_code``). The name says which program: ``agent_name=`` if
given, else ``module:qualname``, where a script (module ``__main__``) is named
by its absolute file path (as run, symlinks not followed), since every
script's function ``agent`` would otherwise be ``__main__:agent``. The fingerprint says which version of it: a
digest of the agent function's bytecode and constants, of the functions of its
own module it calls by global name, and of the engrain tools they reach by name
or closure (each tool's name, type, at-most-once policy and code). It ignores comments, blank lines,
where the code sits in its file and the path it was deployed to, so a restart
of the same code matches; any change of that code (or of the Python version,
whose bytecode differs) is a new version. engrain's own runners (routines, the
cache, ``eg.Agent``, named ``llm-agent:<name>``) record no fingerprint: the run
names what they execute, and their code is engrain's.

:func:`refusal` is the one rule every resumer applies (``engrain.run`` with an
existing run id, ``recover``, workers, the server): a run created by an API
client is never executed; another name is another program; another
fingerprint is another version, resumed only when the caller opts in with
``upgrade=True`` (a deploy whose new code replays the old runs, with the
changed steps behind ``engrain.patched``). Runs recorded before fingerprints
(no ``agent_code``) are matched by name, as they were then.
"""

from __future__ import annotations

import functools
import os
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

from .._events import CLIENT_TAG

#: Longest agent name a run records.
AGENT_NAME_LIMIT = 200
#: Most functions (the agent and its module's helpers) one fingerprint walks.
_MAX_FUNCTIONS = 64
_SCRIPT_MODULES = ("__main__", "__mp_main__")

_fingerprints: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _target(agent: Any) -> Any:
    """The function whose code runs when ``agent`` is called (partials and bound methods unwrapped)."""
    fn = agent
    while isinstance(fn, functools.partial):
        fn = fn.func
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    if not isinstance(getattr(fn, "__qualname__", None), str):
        fn = type(fn)
        fn = getattr(fn, "__call__", fn)  # a callable object runs its class's __call__
    return fn


def agent_name(agent: Callable[..., Any]) -> str:
    """The name a run of ``agent`` records when no ``agent_name`` is given: ``module:qualname``.

    A function of a script (module ``__main__``) is named by the script's
    absolute path instead (as run: symlinks are not followed), e.g.
    ``/srv/jobs/pay.py:agent``, so two scripts'
    ``agent`` functions are two agents (a module run with ``python -m`` by its
    import name, as when it is imported). Code with no script file (``python -c``,
    a REPL, a notebook, whose kernel names each cell's code after a temporary
    file) keeps ``__main__``: its code fingerprint tells such programs apart. A ``functools.partial`` is named after
    its function, a callable object after its class.
    """
    fn: Any = agent
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not isinstance(getattr(fn, "__qualname__", None), str):
        fn = type(fn)
    module = getattr(fn, "__module__", None) or "?"
    if module in _SCRIPT_MODULES:
        # `python -m pkg.mod` runs a module under its import name; `python path/to/script.py` has only its path.
        spec = getattr(sys.modules.get(module), "__spec__", None)
        module = getattr(spec, "name", None) or _script_path(module) or module
    name = f"{module}:{fn.__qualname__}"
    # Keep the end of a long path: it tells programs apart, and the qualname must stay whole.
    return name if len(name) <= AGENT_NAME_LIMIT else "..." + name[-(AGENT_NAME_LIMIT - 3):]


def _script_path(module: str) -> str | None:
    # The running script's file, not the function's code file: a notebook kernel compiles each
    # cell under a temporary file of its own (a new one after a restart) in a __main__ with no file.
    path = getattr(sys.modules.get(module), "__file__", None)
    if not isinstance(path, str) or not path or path.startswith("<"):  # python -c, <stdin>, a REPL or notebook
        return None
    # The path it was run as, not its symlinks' target: a release layout (current -> releases/v7)
    # runs the same program as current/pay.py after every deploy.
    return os.path.abspath(path)


def fingerprint(agent: Callable[..., Any]) -> str | None:
    """The fingerprint of ``agent``'s code and tools (16 hex digits), computed once per function.

    ``None`` for engrain's own runners (a routine run, a cache hit, an ``eg.Agent``):
    what they execute is named by the run (the routine, the agent's name), and their
    code is engrain's, so an engrain upgrade must not strand their runs.
    """
    fn = _target(agent)
    module = getattr(fn, "__module__", None) or ""
    if module == "engrain" or module.startswith("engrain."):
        return None
    try:
        hit = _fingerprints.get(fn)
    except TypeError:  # not weak-referenceable (a builtin): nothing of ours to fingerprint but its name
        from hashlib import blake2b

        return blake2b(repr(fn).encode(), digest_size=8).hexdigest()
    if hit is None:
        hit = _compute(fn)
        try:
            _fingerprints[fn] = hit
        except TypeError:
            pass
    return hit


def _compute(fn: Any) -> str:
    from hashlib import blake2b  # lazily: hashlib (OpenSSL) costs ~20 ms of start-up

    h = blake2b(digest_size=8)
    module = getattr(fn, "__module__", None)
    tools: dict[str, Any] = {}
    seen: set[int] = {id(fn)}
    todo = [fn]
    walked = 0
    while todo and walked < _MAX_FUNCTIONS:
        f = todo.pop(0)
        walked += 1
        code = getattr(f, "__code__", None)
        if code is None:
            h.update(f"<{getattr(f, '__qualname__', type(f).__qualname__)}>".encode())
            continue
        _hash_code(h, code)
        for value in _referenced(f, code):
            step = getattr(value, "__engrain_step__", None)
            if isinstance(step, dict):
                tools[str(step.get("name"))] = value
            elif isinstance(value, types.FunctionType) and value.__module__ == module and id(value) not in seen:
                seen.add(id(value))
                todo.append(value)
    for name in sorted(tools):
        tool = tools[name]
        step = tool.__engrain_step__
        policy = step.get("policy")
        h.update(f"tool {name} {step.get('type')} {getattr(policy, 'at_most_once', False)}\0".encode())
        code = getattr(getattr(tool, "__wrapped__", tool), "__code__", None)
        if code is not None:
            _hash_code(h, code)
    return h.hexdigest()


def _names(code: types.CodeType) -> list[str]:
    """Global names ``code`` and the code nested in it (comprehensions, lambdas, inner functions) use."""
    out = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out += _names(c)
    return out


def _referenced(f: Any, code: types.CodeType) -> list[Any]:
    """The objects ``f`` reaches by name: its globals, then the tools in its closure's cells.

    Of a closure only tools count: its other cells hold per-call values (callbacks,
    clients) that say nothing about which program this is.
    """
    out = []
    g = getattr(f, "__globals__", None) or {}
    for name in dict.fromkeys(_names(code)):
        if name in g:
            out.append(g[name])
    for cell in getattr(f, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # a cell not filled yet
            continue
        if isinstance(getattr(value, "__engrain_step__", None), dict):
            out.append(value)
    return out


def _hash_code(h: Any, code: types.CodeType) -> None:
    # Not the file name, line numbers or qualname: moving the same code keeps its fingerprint.
    h.update(code.co_code)
    h.update(f"{code.co_argcount} {code.co_kwonlyargcount}\0".encode())
    h.update("\0".join((*code.co_names, "|", *code.co_varnames, "|", *code.co_freevars)).encode())
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _hash_code(h, c)
        else:
            h.update(_const_text(c).encode())
        h.update(b"\1")


def _const_text(c: Any) -> str:
    """A constant's text, the same in every process (a frozenset's order depends on the string hash seed)."""
    if isinstance(c, frozenset):
        return "frozenset(" + ",".join(sorted(_const_text(x) for x in c)) + ")"
    if isinstance(c, tuple):
        return "(" + ",".join(_const_text(x) for x in c) + ")"
    return repr(c)


def is_client_run(started: dict[str, Any]) -> bool:
    """True when ``run.started`` data says an HTTP API client created the run (the server tags it)."""
    tags = started.get("tags")
    return isinstance(tags, list) and CLIENT_TAG in tags


CLIENT_RUN = ("was created by an HTTP API client: its events are client data, never executed"
              " or replayed by an agent, recover() or a worker")


def refusal(started: dict[str, Any], name: str | None, code: str | None, *, upgrade: bool = False,
            finished: bool = False) -> str | None:
    """Why code named ``name`` with fingerprint ``code`` may not resume the run ``started`` began; ``None`` if it may.

    ``name``/``code`` ``None``: not checked (a run recorded without a name, resumed by
    ``recover(unnamed=...)``). ``finished``: the run only reports its recorded outcome,
    so another version of the same agent may read it.
    """
    if is_client_run(started):
        return CLIENT_RUN
    recorded = started.get("agent")
    if not isinstance(recorded, str) or not recorded:
        return None  # recorded before agent names were: resumed only by explicit choice (run_id=, unnamed=)
    if name is not None and recorded != name:
        return f"was started by agent {recorded!r}, not {name!r}{legacy_hint(recorded)}"
    rec_code = started.get("agent_code")
    if finished or upgrade or code is None or not isinstance(rec_code, str) or rec_code == code:
        return None
    return (f"was started by another version of agent {recorded!r} (code {rec_code}, this code {code}):"
            " resume it with upgrade=True once this code replays it (old branches behind engrain.patched)")


def legacy_hint(recorded: str) -> str:
    """For a name every script shared before scripts were named by path: how to resume such a run."""
    if recorded.split(":", 1)[0] in _SCRIPT_MODULES:
        return (f" (recorded before scripts were named by their path: if this script started it, resume it"
                f" with recover({{{recorded!r}: agent}}) or run(..., agent_name={recorded!r}))")
    return ""
