"""The process-wide default journal, fresh run ids, and the JSON check of a step's arguments."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from .._events import check_json, is_json
from .._journal import Journal, default_url, open_journal

_default_journals: dict[str, Journal] = {}
_default_lock = threading.Lock()


def default_journal() -> Journal:
    """The process-wide journal at :func:`engrain.default_url`, opened on first use."""
    url = default_url()
    with _default_lock:
        j = _default_journals.get(url)
        if j is None:
            j = _default_journals[url] = open_journal(url)
        return j


def new_run_id() -> str:
    """A fresh run id that sorts by creation time."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(6).hex()}"


def check_args(type_: str, name: str, args: dict[str, Any]) -> None:
    """Raise :class:`~engrain.NotJSONError` naming the step and argument when ``args`` is not JSON."""
    if not is_json(args):  # the slow walk only to name the culprit
        for k, v in args.items():
            check_json(v, f"{type_} {name!r}", f"argument {k!r}")
        check_json(args, f"{type_} {name!r}", "arguments")
