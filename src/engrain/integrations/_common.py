"""What the adapters share: how a framework's tool call and its result become a journaled step,
and which run holds a framework's log."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .._errors import EngrainError
from .._events import is_json

#: The journal's limit on a run id, in characters (``engrain._journal._common.check_run_id``).
MAX_RUN_ID = 200
#: What separates the readable head of a long key from the SHA-256 (hex) of the whole key.
DIGEST_MARK = "#sha256:"
_DIGEST_LEN = 64


def recordable(out: Any) -> Any:
    """A tool result as journaled: itself when JSON, else its ``str()``.

    Returned live as well, so a replay gives the model the same text the first run did.
    """
    return out if is_json(out) else str(out)


def tool_arguments(raw: str) -> Any:
    """The model's argument string as journaled: its JSON value, or the string itself when it is not JSON."""
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return raw


def log_run_id(prefix: str, key: str) -> str:
    """The run id of an adapter's log for ``key`` (a LangGraph thread id, an SDK session id).

    ``prefix + key`` whenever that fits the journal's limit on run ids, exactly as before, so a
    log already in a store keeps its run. The frameworks accept keys of any length, so a longer
    key gets ``prefix``, a readable head of the key, :data:`DIGEST_MARK` and the SHA-256 of the
    whole key: still one run per key, and always :data:`MAX_RUN_ID` characters. The whole key
    is kept in the run's inputs (:func:`is_digest_run_id` says when to read it from there).
    """
    run_id = prefix + key
    if len(run_id) <= MAX_RUN_ID:
        return run_id
    # surrogatepass: the digest must exist for any str; the journal itself names a lone surrogate if there is one.
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    head = key[: MAX_RUN_ID - len(prefix) - len(DIGEST_MARK) - _DIGEST_LEN]
    return f"{prefix}{head}{DIGEST_MARK}{digest}"


def is_digest_run_id(run_id: str) -> bool:
    """Whether ``run_id`` may be a long key's :func:`log_run_id` (its key is then in the run's inputs).

    A short key of that very shape answers True as well; reading its inputs gives it back unchanged.
    """
    tail = run_id[-(_DIGEST_LEN + len(DIGEST_MARK)):]
    return (len(run_id) == MAX_RUN_ID and tail.startswith(DIGEST_MARK)
            and all(c in "0123456789abcdef" for c in tail[len(DIGEST_MARK):]))
