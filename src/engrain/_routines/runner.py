"""Run routine packages as durable runs, and resume them after a human answers.

:func:`run_routine` executes the steps of a loaded :class:`~engrain._routine.Routine`
inside :func:`engrain.run`: every tool and UDF call is a journaled step (so a
restarted run replays instead of calling again), a ``prompt.user`` step pauses
the run with status ``needs_input``, and :func:`resume_routine` records the
answers and continues from the journal. ``when`` and ``assert`` are evaluated
by the sandboxed expression evaluator; nothing in the routine text is ever
passed to ``eval``.

A run goes on only with the files it started with (:mod:`.pinning`).
"""

from __future__ import annotations

import os
import pathlib
import threading
from collections.abc import Callable
from typing import Any

from .. import _events as ev
from .._durable.context import RunResult, _current, default_journal
from .._durable.execution import run
from .._durable.tools import _spreader
from .._errors import (
    ConflictError,
    EngrainError,
    JSONTooDeepError,
    LeaseHeldError,
    NondeterminismError,
    NotWaitingForInputError,
    RoutineInputError,
    RoutineStepError,
    RunNotFoundError,
)
from .answers import Answers, coerce_answers, parse_answers
from .expr import Budget
from .loader import load_routine
from .model import Routine, Step
from .pinning import ROUTINE_TAG, check_resumable, load_pinned, refuse_changed  # noqa: F401  (ROUTINE_TAG: re-exported)
_PROPAGATE = (NondeterminismError, ConflictError, LeaseHeldError)

_lock = threading.Lock()


def resolve_tools(tools: Any) -> Any:
    """A tool registry from ``None`` (``engrain.tools``), a ``"module:attr"`` string, or a registry/mapping."""
    if tools is None:
        from .._durable.tools import tools as default

        return default
    if isinstance(tools, str):
        import importlib

        mod_name, sep, attr = tools.rpartition(":")
        if not sep or not mod_name or not attr:
            raise RoutineInputError("--tools", tools, "expected 'module:registry' or 'path/to/file.py:registry'")
        try:
            if mod_name.endswith(".py"):
                import importlib.util
                import sys

                file = pathlib.Path(mod_name).resolve()
                key = f"engrain_tools_{file.stem}_{abs(hash(str(file))):x}"
                mod = sys.modules.get(key)
                if mod is None:
                    spec = importlib.util.spec_from_file_location(key, file)
                    if spec is None or spec.loader is None:
                        raise ImportError(f"cannot load {file}")
                    mod = importlib.util.module_from_spec(spec)
                    sys.modules[key] = mod
                    spec.loader.exec_module(mod)  # the operator named this file on purpose
            else:
                mod = importlib.import_module(mod_name)
        except (ImportError, AttributeError, OSError) as e:
            raise RoutineInputError("--tools", tools, f"cannot load the registry: {e}") from None
        if not hasattr(mod, attr):
            # Name the file or module as the operator wrote it, not our private module name.
            raise RoutineInputError("--tools", tools, f"cannot load the registry: {mod_name} has no attribute {attr!r}")
        return getattr(mod, attr)
    return tools


def _schema_error(routine: Routine, key: str, schema: dict[str, Any], value: Any) -> tuple[str, str] | None:
    """``(field path, message)`` of the first schema violation, or ``None``."""
    try:  # iteratively first: the schema validator walks values recursively (a RecursionError, naming nothing)
        ev.check_depth(value, key, "")
    except JSONTooDeepError as e:
        at = e.path.lstrip(".") or "(root)"
        return at if len(at) <= 120 else at[:120] + "…", f"is nested deeper than {e.limit} levels of lists/objects"
    err = routine.validator(key, schema)(value)
    if err is None:
        return None
    return err[0] or "(root)", err[1]


def check_inputs(routine: Routine, inputs: Any) -> None:
    """Raise :class:`~engrain.RoutineInputError` naming the field if ``inputs`` break the schema."""
    if not isinstance(inputs, dict):
        raise RoutineInputError("inputs", "(root)", f"must be a JSON object, got {type(inputs).__name__}")
    bad = _schema_error(routine, "inputs", routine.inputs, inputs)
    if bad:
        raise RoutineInputError(f"inputs of routine {routine.name!r}", f"inputs.{bad[0]}", bad[1])


def _udf_module(routine: Routine) -> Any:
    """udfs.py of a trusted routine, imported once per loaded package (so once per file version)."""
    mod = routine.udf_module
    if mod is None:
        import importlib.util

        with _lock:
            if routine.udf_module is None:
                name = f"engrain_routine_udfs_{id(routine):x}"
                spec = importlib.util.spec_from_file_location(name, routine.udfs_path)
                assert spec is not None and spec.loader is not None
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)  # trusted routines only: their owner vouched for this code
                routine.udf_module = mod
        mod = routine.udf_module
    return mod


def _sandbox_host(routine: Routine) -> Any:
    """One sandbox host per loaded package (a changed udfs.py makes a new Routine, so a new host)."""
    host = routine.sandbox_host
    if host is None:
        from .._sandbox.udf_host import SandboxUdfHost

        host = routine.sandbox_host = SandboxUdfHost(routine.udfs_path)
    return host


class _RoutineRun:
    """The state of one routine run: its scope, tools and UDF callers."""

    def __init__(self, routine: Routine, registry: Any, sandbox: bool, answers: Answers):
        self.routine = routine
        self.registry = registry
        self.sandbox = sandbox
        self.answers = answers
        self.prompted: str | None = None
        #: Time all of this run's when/assert expressions may take together.
        self.budget = Budget()
        self._functions: dict[str, Callable[..., Any]] | None = None

    def udf(self, name: str, args: dict[str, Any]) -> Any:
        ctx = _current.get()
        if self.sandbox:
            host = _sandbox_host(self.routine)
            return ctx.call(name, "udf", args, lambda: host.call(name, args))
        fn = getattr(_udf_module(self.routine), name)
        return ctx.call(name, "udf", args, lambda: fn(**args))

    def functions(self) -> dict[str, Callable[..., Any]]:
        """UDFs callable from expressions; each call is a journaled step like ``udf.call``."""
        if self._functions is None:
            fns: dict[str, Callable[..., Any]] = {}
            for info in self.routine.udfs.values():

                def call(*a: Any, _info: Any = info, **kw: Any) -> Any:
                    if len(a) > len(_info.params):
                        raise TypeError(f"{_info.name}() takes {len(_info.params)} arguments, got {len(a)}")
                    return self.udf(_info.name, {**dict(zip(_info.params, a)), **kw})

                fns[info.name] = call
            self._functions = fns
        return self._functions

    def tool(self, step: Step, args: dict[str, Any]) -> Any:
        name = step.spec["tool"]
        decl = self.routine.tools.get(name) or {}
        if "args" in decl:
            bad = _schema_error(self.routine, f"tools.{name}.args", decl["args"], args)
            if bad:
                raise RoutineStepError(step.id, "SchemaError", f"tool {name!r} args.{bad[0]}: {bad[1]}")
        try:
            if hasattr(self.registry, "get"):
                fn = self.registry.get(name)
            elif hasattr(self.registry, "call") and hasattr(self.registry, "has"):
                fn = _emcore_tool(self.registry, name)  # an em-core ToolRegistry
            else:
                fn = self.registry[name]
        except KeyError as e:
            raise RoutineStepError(step.id, "ToolNotFound", str(e.args[0] if e.args else e)) from None
        if fn is None:
            raise RoutineStepError(step.id, "ToolNotFound", f"no tool named {name!r}")
        meta = getattr(fn, "__engrain_step__", None)
        # A registered @engrain.tool journals itself; call the function it wraps so
        # the routine journals exactly one step, with the routine's tool name.
        inner = getattr(fn, "__wrapped__", fn) if meta else fn
        kind = meta["type"] if meta else "tool"
        result_schema = decl.get("result")
        pos: tuple[Any, ...] = ()
        kw = args
        code = getattr(inner, "__code__", None)
        emcore = not hasattr(self.registry, "get") and hasattr(self.registry, "call") and hasattr(self.registry, "has")
        if not emcore and (code is None or code.co_flags & 0x0C or code.co_posonlyargcount):  # 0x0C: *args, **kwargs
            # The journal records a call by parameter (*args as one list, **kwargs as one mapping): a
            # compiled routine holds that record, so it is spread back as the cache's replay does.
            split = _spreader(inner)
            if split is not None:
                pos, kw = split(args)

        def thunk() -> Any:
            out = inner(*pos, **kw)
            if hasattr(out, "__await__"):
                import asyncio

                out = asyncio.run(_await(out))
            if result_schema is not None:
                bad = _schema_error(self.routine, f"tools.{name}.result", result_schema, out)
                if bad:
                    raise RoutineStepError(step.id, "SchemaError", f"tool {name!r} result.{bad[0]}: {bad[1]}")
            return out

        if meta and "policy" in meta:  # the tool's retries and at-most-once journaling apply here too
            return _current.get().call(name, kind, args, thunk, meta["policy"])
        return _current.get().call(name, kind, args, thunk)

    def ask(self, step: Step, scope: dict[str, Any]) -> Any:
        from . import template as _template

        spec = step.spec
        req = _template.render({"prompt": spec["prompt"], "fields": spec["fields"]}, scope, f"step {step.id!r}")
        ctx = _current.get()
        given = self.answers.for_step(step.id) if ctx.cursor not in ctx.steps else None
        if given is not None:
            # Answers supplied up front: journal the request and its answer together.
            answers = coerce_answers(req["fields"], given, where=f"answers.{step.id}")
            call_id = ctx.cursor
            ctx.cursor += 1
            ctx.append(ev.INPUT_REQUESTED, step.id, {"call_id": call_id, **req}, durable=False)
            ctx.append(ev.INPUT_RECEIVED, step.id, {"call_id": call_id, "answers": answers})
            return answers
        self.prompted = step.id
        return ctx.ask(req["prompt"], req["fields"], name=step.id)

    def __call__(self, task: str, inputs: dict[str, Any], **_: Any) -> Any:
        from . import template as _template

        routine = self.routine
        # em-core reads inputs by bare name ({{ url }}); engrain's own format under inputs.
        scope: dict[str, Any] = {**inputs, "inputs": inputs} if routine.bare_inputs else {"inputs": inputs}
        for step in routine.steps:
            try:
                if step.when_expr is not None and not step.when_expr.evaluate(
                    scope, self.functions() if step.when_expr.calls else None, "when", self.budget
                ):
                    continue
                t = step.type
                # A step's constants are copied: loaded routines are cached and shared, so a tool that appends to a
                # list it was given, or a caller editing an output, must not change what later runs see.
                if t == "tool.call":
                    args = _template.render(step.spec.get("args") or {}, scope, f"step {step.id!r} field 'args'") if step.dynamic else ev.json_copy(step.spec.get("args") or {})
                    result = self.tool(step, args)
                elif t == "udf.call":
                    args = _template.render(step.spec.get("args") or {}, scope, f"step {step.id!r} field 'args'") if step.dynamic else ev.json_copy(step.spec.get("args") or {})
                    result = self.udf(step.spec["function"], args)
                elif t == "assert":
                    result = step.assert_expr.evaluate(scope, self.functions() if step.assert_expr.calls else None, "expr", self.budget)
                    if not result:
                        msg = step.spec.get("message")
                        text = _template.render(msg, scope, f"step {step.id!r} field 'message'") if msg else f"assertion failed: {step.spec['expr']}"
                        raise RoutineStepError(step.id, "AssertionFailed", str(text))
                elif t == "prompt.user":
                    result = self.ask(step, scope)
                else:  # return
                    value = _template.render(step.spec.get("value"), scope, f"step {step.id!r} field 'value'") if step.dynamic else ev.json_copy(step.spec.get("value"))
                    if routine.output is not None:
                        bad = _schema_error(routine, "output", routine.output, value)
                        if bad:
                            raise RoutineStepError(step.id, "SchemaError", f"output.{bad[0]}: {bad[1]}")
                    return value
            except (RoutineStepError, *_PROPAGATE):
                raise
            except Exception as e:
                raise RoutineStepError(step.id, type(e).__name__, str(e)) from e
            scope[step.id] = result
            if step.save_as:
                scope[step.save_as] = result
        raise RoutineStepError(routine.steps[-1].id, "NoReturn", "the routine ended without reaching a return step")


async def _await(aw: Any) -> Any:
    return await aw


def _emcore_tool(registry: Any, name: str) -> Callable[..., Any]:
    if not registry.has(name):
        raise KeyError(f"Tool not registered: {name}")
    return lambda **args: registry.call(name, args)


def _alias(value: Any, alias: Any, name: str, alias_name: str) -> Any:
    if value is not None and alias is not None:
        raise TypeError(f"run_routine() got both {name}= and its em-core alias {alias_name}=")
    return alias if value is None else value


def prompts_of(routine: Routine) -> dict[str, list[dict[str, Any]]]:
    """The routine's ``prompt.user`` steps: id -> declared fields."""
    return {st.id: list(st.spec.get("fields") or []) for st in routine.steps if st.type == "prompt.user"}


def run_routine(
    path: str | os.PathLike[str] | None = None,
    inputs: dict[str, Any] | None = None,
    tools: Any = None,
    run_id: str | None = None,
    journal: Any = None,
    answers: dict[str, Any] | None = None,
    sandbox: bool | None = None,
    *,
    routine_dir: str | os.PathLike[str] | None = None,
    input_data: dict[str, Any] | None = None,
    tool_registry: Any = None,
    upgrade: bool = False,
) -> RunResult:
    """Run the routine package at ``path`` durably with ``inputs``; return its :class:`~engrain.RunResult`.

    ``tools`` is a :class:`~engrain.ToolRegistry`, a mapping, an em-core
    ``ToolRegistry`` or ``"module:registry"`` (default ``engrain.tools``).
    ``answers`` is ``{field: value}`` for the first prompt the run reaches, or
    ``{step_id: {field: value}}`` for one or more ``prompt.user`` steps, so the
    run does not pause there (see :mod:`engrain._routines.answers`). UDFs of
    untrusted routines (``trusted: false``) or with ``sandbox=True`` run in the
    WASM sandbox. Bad inputs or answers raise :class:`~engrain.RoutineInputError`
    before the run starts; a failing step ends the run with status ``failed``
    (``step_id``, ``error_type``, ``message`` say where and why); a prompt ends
    it with ``needs_input``. em-core's keyword names are accepted as aliases:
    ``routine_dir=``, ``input_data=``, ``tool_registry=``.

    An existing unfinished ``run_id`` is continued only if the package's files
    are the ones it started with (:class:`~engrain.AgentMismatchError`
    otherwise, nothing written); ``upgrade=True`` continues it anyway.
    """
    path = _alias(path, routine_dir, "path", "routine_dir")
    if path is None:
        raise TypeError("run_routine() needs the routine folder (path= or routine_dir=)")
    inputs = _alias(inputs, input_data, "inputs", "input_data")
    tools = _alias(tools, tool_registry, "tools", "tool_registry")
    routine, files = load_pinned(path)
    if run_id is not None:
        journal = journal or default_journal()
        recorded_inputs = check_resumable(journal, run_id, files, inputs, upgrade)
        if inputs is None:
            inputs = recorded_inputs  # a resume without inputs goes on with the run's own
    inputs = {} if inputs is None else inputs
    check_inputs(routine, inputs)
    given = parse_answers(answers, prompts_of(routine))
    registry = resolve_tools(tools)
    use_sandbox = (not routine.trusted) if sandbox is None else bool(sandbox)
    execution = _RoutineRun(routine, registry, use_sandbox, given)
    recorded = {
        "routine": str(routine.path),
        "inputs": inputs,
        "sandbox": use_sandbox,
        "tools": _portable(tools) if isinstance(tools, str) else None,
        "files": files,
    }
    result = run(execution, f"routine {routine.name}", run_id=run_id, inputs=recorded, tags=[ROUTINE_TAG], journal=journal)
    if result.status == "needs_input" and result.prompt is not None:
        result.prompt = {"step": execution.prompted, **result.prompt}
    return result


def _portable(spec: str) -> str:
    """A ``file.py:attr`` tools spec with an absolute path, so a resume from elsewhere finds it."""
    mod, _, attr = spec.rpartition(":")
    return f"{pathlib.Path(mod).resolve()}:{attr}" if mod.endswith(".py") else spec


def resume_routine(
    run_id: str,
    answers: dict[str, Any],
    tools: Any = None,
    journal: Any = None,
    sandbox: bool | None = None,
    *,
    upgrade: bool = False,
) -> RunResult:
    """Answer the prompt a ``needs_input`` routine run waits for, and continue it from the journal.

    ``answers`` is ``{field: value}`` for the prompt the run waits at, or
    ``{step_id: {field: value}}`` naming that step (and, optionally, later
    prompts, which are then answered without pausing). The routine folder and
    inputs come from the run's ``run.started`` event; trust never does: UDFs run
    in the sandbox when the routine is untrusted, when ``sandbox=True``, or when
    the run was started sandboxed (the journal can only tighten this), and
    ``tools`` is the caller's (a run started with a ``--tools`` spec must be
    resumed with one: no module named in the journal is imported). Answers are
    validated against the prompt's fields (:class:`~engrain.RoutineInputError`
    naming the step and field). Files changed since the run started (or a run
    older than the digests that tell) raise :class:`~engrain.AgentMismatchError`
    and record no answer; ``upgrade=True`` lets the current files continue it.
    """
    from .._durable.context import steps_of
    from .._durable.human import answer

    j = journal or default_journal()
    events = j.read(run_id)
    if not events:
        raise RunNotFoundError(run_id)
    started = events[0].data
    rec = started.get("inputs") or {}
    tags = started.get("tags") or []
    is_routine = isinstance(tags, list) and ROUTINE_TAG in tags and ev.CLIENT_TAG not in tags
    if not is_routine or not isinstance(rec, dict) or not isinstance(rec.get("routine"), str):
        raise EngrainError(f"run {run_id!r} is not a routine run (task {started.get('task')!r})")
    waiting = [s for s in steps_of(events).values() if s.state == "waiting"]
    if not waiting:
        raise NotWaitingForInputError(run_id)
    step = waiting[-1]
    if tools is None and rec.get("tools"):
        raise RoutineInputError(
            f"resume {run_id}", "tools",
            f"the run was started with --tools {rec['tools']}; pass the same registry to resume it "
            "(engrain loads no code named in the journal)",
        )
    fields = step.args.get("fields") or []
    root = pathlib.Path(rec["routine"])
    routine, files = load_pinned(root)
    if not upgrade:  # before the answer is recorded: it answers the prompt the old files showed
        refuse_changed(run_id, rec, files)
    given = parse_answers(answers, prompts_of(routine))
    if given.by_step and step.name not in given.by_step:
        raise RoutineInputError(
            "answers", "(root)", f"the run waits at step {step.name!r}, but the answers name {', '.join(sorted(given.by_step))}"
        )
    now = given.by_step.pop(step.name) if given.by_step else (given.current or {})
    answer(run_id, coerce_answers(fields, now, where=f"answers to step {step.name!r}"), journal=j)
    return run_routine(
        root,
        rec.get("inputs") or {},
        tools=tools,
        run_id=run_id,
        journal=j,
        answers=given.by_step or None,
        # Only the caller may switch the sandbox off; a recorded True merely keeps it on.
        sandbox=sandbox if sandbox is not None else (True if rec.get("sandbox") is True else None),
        upgrade=upgrade,
    )
