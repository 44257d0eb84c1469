"""Typed errors of engrain.

Every error engrain raises on purpose derives from :class:`EngrainError`, so a
caller can catch the family with one ``except``. Each message names the thing
that was wrong (file, field, step, tool, argument) so it can be fixed without a
debugger.
"""

from __future__ import annotations


class EngrainError(Exception):
    """Base class of every error raised by engrain on purpose."""


class ConfigError(EngrainError):
    """A store URL, option or setting is invalid."""


class UnknownStatusError(EngrainError, ValueError):
    """A run status filter is not one of the known statuses; the message lists the valid ones."""

    def __init__(self, value: object, valid: tuple[str, ...] | list[str]):
        self.value = value
        self.valid = list(valid)
        super().__init__(f"unknown run status {value!r}; valid statuses: {', '.join(self.valid)} ('completed' means ok)")


class StorageError(EngrainError):
    """The store could not be written or read: disk full, I/O error, lost database connection.

    Not the run's failure: nothing is recorded as failed, and the run resumes
    once the store works again. ``store`` names the file or database, ``cause``
    is the driver's error.
    """

    #: What the message advises when the caller gives no ``advice`` (the journal's case).
    RUN_ADVICE = "the run is not marked failed; resume it once the store works again"

    def __init__(self, store: str, cause: BaseException | str, advice: str | None = None):
        self.store = store
        self.cause = cause
        super().__init__(f"store {store}: {cause} ({advice or self.RUN_ADVICE})")


class StoreCorruptError(EngrainError):
    """The store file is not a readable engrain database (damaged, truncated or another kind of file)."""

    def __init__(self, path: str, cause: BaseException | str):
        self.path = path
        self.cause = cause
        super().__init__(
            f"store {path} is corrupt or not an engrain database ({cause}); restore it from a backup, "
            "or move it aside to start a new store (sqlite3 DB '.recover' may salvage its rows)"
        )


class RunIdError(ConfigError, ValueError):
    """A run id engrain cannot store: not a string, empty, over 200 characters, a lone surrogate or a NUL.

    A ``ValueError`` too, as before this class: callers that caught that keep working.
    """


class TextNotStorableError(EngrainError, ValueError):
    """A text engrain would store (an event's name, a run's task or tags, a lease owner) holds a character no
    store keeps as given: NUL (PostgreSQL's driver cuts text there) or a lone surrogate. A ``ValueError`` too."""


class StoreURLError(ConfigError, ValueError):
    """A store URL engrain does not read: an unknown scheme, a malformed URL or an unknown query parameter.

    The message lists the forms engrain accepts. A ``ValueError`` too: it is bad input.
    """


class StoreUnreachableError(ConfigError):
    """A PostgreSQL store's server could not be reached when the store was opened: refused, no such host,
    timed out, or the login was refused. The message names the store (password masked) and the driver's
    reason. A :class:`ConfigError`, as before this class; the CLI exits 1 for it (what the command runs on
    failed), not 2 (bad input). A store that drops later is a :class:`StorageError`."""


class StoreVersionError(ConfigError):
    """The store was written by a newer engrain (its schema version is higher than this one knows)."""

    def __init__(self, store: str, found: int, known: int):
        self.store = store
        self.found = found
        self.known = known
        super().__init__(
            f"store {store} has schema version {found}, but this engrain knows versions up to {known}; "
            "upgrade engrain to open it (opening it with an older version could damage it)"
        )


class StoreNotFoundError(ConfigError):
    """A read-only command was pointed at a store that does not exist (often a typo in the URL)."""

    def __init__(self, store: str, hint: str | None = None):
        self.store = store
        hint = hint or (
            "check the URL (sqlite:///relative/path.db is relative to the current directory, "
            "sqlite:////absolute/path.db is absolute)"
        )
        super().__init__(f"no store at {store}; {hint}, or run something first to create it")


class ConflictError(EngrainError):
    """Another writer appended to the same run first (optimistic concurrency).

    ``expected_seq`` is the sequence number this writer meant to write next;
    ``actual_seq`` is the run's real next sequence number when known.
    """

    def __init__(self, run_id: str, expected_seq: int, actual_seq: int | None = None):
        self.run_id = run_id
        self.expected_seq = expected_seq
        self.actual_seq = actual_seq
        got = "unknown" if actual_seq is None else str(actual_seq)
        super().__init__(
            f"run {run_id!r}: expected to append at seq {expected_seq}, but the journal is at {got} "
            "(another writer appended to this run)"
        )


class RunNotFoundError(EngrainError, KeyError):
    """No run with that id is in the journal."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        super().__init__(run_id)

    def __str__(self) -> str:
        return f"no run with id {self.run_id!r} in the journal"


class NotJournaledError(EngrainError):
    """A wrapped client's attribute that sends a request the journal does not record was called inside a run.

    Its request would be sent (and paid) again on every resume, and its result could differ from the
    one the run went on with, so it is refused instead of passed through. ``attribute`` names it
    (``"openai.chat.completions.with_raw_response.create"``), ``instead`` what to call instead.
    """

    def __init__(self, attribute: str, instead: str):
        self.attribute = attribute
        self.instead = instead
        super().__init__(f"engrain.wrap: {attribute} is not journaled, so inside a run its request would be sent "
                         f"again on every resume (paid again, and maybe answered differently); {instead}")


class NotDurableError(EngrainError):
    """Inside an engrain run, a framework called a model past the adapter's journaling wrapper.

    The call was paid and not journaled, so a resumed run would pay it again; the message names
    the setting that routed it around the wrapper and how to make it durable.
    """


class RunFinishedError(EngrainError):
    """Answers or events were given to a run that has ended (``ok``, ``failed`` or ``cancelled``); ``status`` says how.

    A finished run is never resumed, so an answer to a question it left pending, or any
    event appended after its ``run.completed``/``run.failed``/``run.cancelled``, would only
    make it look alive again. ``kind`` is the event kind the journal refused (``None`` for
    answers); the journal raises this from ``append`` and writes nothing.
    """

    #: The refused event's kind; a class default so that subclasses built without it still have it.
    kind: str | None = None

    def __init__(self, run_id: str, status: str, kind: str | None = None):
        self.run_id = run_id
        self.status = status
        self.kind = kind
        if kind is not None:
            ending = _ENDINGS.get(status, status)
            super().__init__(f"run {run_id!r} has ended {status} ({ending}): a finished run takes no more events,"
                             f" so {kind} was refused (fork the run, or start a new one, to go on)")
            return
        # "not waiting for input" as before this class: callers match that text.
        super().__init__(f"run {run_id!r} is not waiting for input: it has ended {status}, and a finished run"
                         " takes no answers and is never resumed")


class NotWaitingForInputError(EngrainError):
    """Answers were given to a run that is still going but asks for nothing (or was answered already).

    Unlike :class:`RunFinishedError` the run is alive: it may ask later, so the
    caller can wait and answer then. Over HTTP this is 409 ``NotWaitingForInput``.
    """

    def __init__(self, run_id: str):
        self.run_id = run_id
        super().__init__(f"run {run_id!r} is not waiting for input")


#: The event kind behind each finished status, for messages (the base layer's errors import no events).
_ENDINGS = {"ok": "run.completed", "failed": "run.failed", "cancelled": "run.cancelled"}


class NondeterminismError(EngrainError):
    """A replayed run called a different step than the journal recorded at that position."""

    def __init__(self, run_id: str, call_id: int, recorded: str, called: str):
        self.run_id = run_id
        self.call_id = call_id
        self.recorded = recorded
        self.called = called
        super().__init__(
            f"run {run_id!r}, step {call_id}: the journal recorded {recorded!r} but the agent "
            f"called {called!r}; the agent's code or its inputs changed since the run was recorded"
        )


class AgentMismatchError(EngrainError):
    """A run was given to code that did not start it: another program, another version of it, or an API client's run.

    ``reason`` says which (see :func:`engrain.run`'s ``upgrade``); the run is left untouched.
    """

    def __init__(self, run_id: str, reason: str):
        self.run_id = run_id
        self.reason = reason
        super().__init__(f"run {run_id!r} {reason}")


class NotJSONError(EngrainError, TypeError):
    """A step argument or result is not a JSON value (None, bool, int, float, str, list, dict)."""

    def __init__(self, where: str, path: str, value: object, reason: str | None = None):
        self.where = where
        self.path = path
        self.value_type = type(value).__name__
        super().__init__(
            f"{where}: {path} {reason}" if reason else
            f"{where}: {path} is a {self.value_type}, which is not JSON; "
            "use None, bool, int, float, str, list or dict with str keys"
        )


class JSONTooDeepError(NotJSONError):
    """A JSON value is nested deeper than engrain accepts (``engrain._events.MAX_DEPTH`` levels).

    Deep nesting is refused where data comes in, because every later reader
    (replay, the API's encoder, the UI) walks it recursively.
    """

    def __init__(self, where: str, path: str, limit: int):
        self.where = where
        self.path = path
        self.limit = limit
        self.value_type = "nesting"
        shown = path if len(path) <= 120 else path[:120] + "…"
        EngrainError.__init__(self, f"{where}: {shown} is nested deeper than {limit} levels of lists/objects")


class StepFailedError(EngrainError):
    """Replay of a step whose recorded failure cannot be re-raised as its original type."""

    def __init__(self, name: str, error_type: str, message: str):
        self.name = name
        self.error_type = error_type
        self.message = message
        super().__init__(f"step {name!r} failed with {error_type}: {message}")


class RetriesExhaustedError(StepFailedError):
    """A step with ``retries`` failed on every attempt; ``attempts`` holds each attempt's error."""

    def __init__(self, name: str, attempts: list[str]):
        self.attempts = list(attempts)
        self.name = name
        self.error_type = "RetriesExhaustedError"
        listed = "; ".join(f"attempt {i}: {a}" for i, a in enumerate(self.attempts, 1))
        self.message = f"failed after {len(self.attempts)} attempts ({listed})"
        EngrainError.__init__(self, f"step {name!r} {self.message}")


class RunFailedError(EngrainError):
    """The run was recorded as failed; it is not run again."""

    def __init__(self, run_id: str, error: object):
        self.run_id = run_id
        self.error = error
        super().__init__(f"run {run_id!r} failed: {error}")


class LeaseHeldError(EngrainError):
    """Another worker holds the lease of this run."""

    def __init__(self, run_id: str, owner: str | None):
        self.run_id = run_id
        self.owner = owner
        super().__init__(f"run {run_id!r} is leased by {owner!r}")


class LeaseLostError(LeaseHeldError):
    """This executor's lease was taken over (its epoch is stale), so its append was refused.

    Another executor resumed the run (this one was presumed dead, or its lease
    expired); the run goes on there, and nothing of this append was written.
    """

    def __init__(self, run_id: str, owner: str | None, epoch: int | None):
        self.run_id = run_id
        self.owner = owner
        self.epoch = epoch
        # ``owner`` is the lease's holder now: None once the executor that took over released it (it paused
        # the run at a question, or finished it), which says nothing of who took it.
        held = (
            f"taken over by {owner!r}; the run continues with the new holder" if owner
            else "another executor took the run over and has since released the lease"
        )
        Exception.__init__(
            self, f"run {run_id!r}: lease epoch {epoch} is no longer current ({held}); this executor's append was refused"
        )


class SandboxError(EngrainError):
    """A sandboxed WASM tool failed: it trapped, exited non-zero or wrote no JSON."""

    def __init__(self, tool: str, message: str):
        self.tool = tool
        super().__init__(f"sandboxed tool {tool!r}: {message}")


class SandboxLimitError(SandboxError):
    """A sandboxed tool hit a limit (``fuel``, ``memory``, ``wall_clock`` or ``output``)."""

    def __init__(self, tool: str, limit: str, value: object):
        self.limit = limit
        self.value = value
        Exception.__init__(self, f"sandboxed tool {tool!r} exceeded its {limit} limit ({value})")
        self.tool = tool


class CacheError(EngrainError, ValueError):
    """The behavior cache was misused: an engine not finalized, a missing agent or context, a bad Check.

    A ``ValueError`` too, as muscle-mem raises for the same mistakes, so code written for it catches these.
    """


class EmbeddingError(EngrainError):
    """An embedder could not load its model or embed a text."""


class MemoryInputError(EngrainError, ValueError):
    """Bad input to skill memory (``remember``, ``recall``, ``consolidate``); names the argument."""


class SynthesisError(EngrainError):
    """The LLM provider failed or answered with something that is not an article.

    The message names the synthesizer, the endpoint and what went wrong (HTTP
    status and the provider's own message, timeout, unreadable body), never the
    API key. Consolidation reports it in ``errors`` and keeps the records.
    """


class RoutineError(EngrainError):
    """A routine package is invalid; ``issues`` lists every problem (file, step id, field, message)."""

    def __init__(self, path: str, issues: list):
        self.path = path
        self.issues = list(issues)
        lines = "\n".join(f"  {i}" for i in self.issues)
        super().__init__(f"routine {path!r} has {len(self.issues)} problem(s):\n{lines}")


class TraceError(RoutineError):
    """A trace given to the compiler is malformed; names the trace, the event index and the field.

    ``field`` is a path such as ``events[3].data.call_id``.
    """

    def __init__(self, source: str, field: str, message: str):
        self.path = self.source = source
        self.field = field
        self.issues = []
        EngrainError.__init__(self, f"trace {source}: {field}: {message}")


class RoutineInputError(EngrainError, ValueError):
    """Inputs, answers or an output do not match the routine's schema; names the file and field."""

    def __init__(self, where: str, field: str, message: str):
        self.where = where
        self.field = field
        super().__init__(f"{where}: {field}: {message}")


class RoutineStepError(StepFailedError):
    """A routine step failed (tool error, failed assert, schema mismatch); the run is recorded as failed."""

    def __init__(self, step_id: str, error_type: str, message: str):
        self.step_id = step_id
        super().__init__(step_id, error_type, message)


class UnknownInputError(EngrainError, LookupError):
    """A compiled UDF was called with arguments it has no recorded result for."""

    def __init__(self, function: str, args: object):
        self.function = function
        self.args_seen = args
        super().__init__(
            f"udfs.py: {function}() has no recorded result for arguments {args!r}; "
            "it only replays the calls seen in the trace (write the real function to generalize)"
        )


class RemoteError(EngrainError):
    """An engrain server answered a :class:`~engrain.Client` request with an error.

    ``status`` is the HTTP status, ``error`` the server's error type (e.g.
    ``"ValidationError"``) and ``detail`` its message. Errors that have a local
    counterpart are also instances of it (a 404 for a run is a
    :class:`RunNotFoundError`, a 409 append is a :class:`ConflictError`).
    """

    def __init__(self, status: int, error: str, detail: object):
        self.status = status
        self.error = error
        self.detail = detail
        Exception.__init__(self, f"HTTP {status} {error}: {detail}")

    def __str__(self) -> str:
        return f"HTTP {self.status} {self.error}: {self.detail}"


class ServerUnreachableError(EngrainError, ConnectionError):
    """A :class:`~engrain.Client` could not reach its server (refused, unknown host, timed out).

    ``url`` is the server's base URL and ``reason`` what the connection ran into;
    the message says what to check.
    """

    def __init__(self, url: str, reason: str):
        self.url, self.reason = url, reason
        super().__init__(f"cannot reach the engrain server at {url}: {reason}. Check that `engrain serve` is "
                         "running there (and its host and port), and that base_url names it")


class TemplateError(EngrainError, ValueError):
    """A ``{{ path }}`` template is malformed or names a variable, key or index that is missing.

    ``template`` is the placeholder text, ``reason`` what is wrong, ``where`` the
    step and field it came from (e.g. ``"step 'fetch' field 'args.url'"``) when known.
    """

    def __init__(self, template: str, reason: str, where: str | None = None):
        self.template = template
        self.reason = reason
        self.where = where
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}template {template!r}: {reason}")


class ExpressionError(EngrainError, ValueError):
    """A ``when``/``assert`` expression is refused by the sandboxed evaluator or fails while evaluated.

    ``expression`` is the source text, ``reason`` why it was refused or failed, and
    ``where`` the step and field it came from when known.
    """

    def __init__(self, expression: str, reason: str, where: str | None = None):
        self.expression = expression
        self.reason = reason
        self.where = where
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}expression {expression!r}: {reason}")
