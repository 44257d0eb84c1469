"""What the adapters share: how a framework's tool call and its result become a journaled step."""

from __future__ import annotations

import json
from typing import Any

from .._events import is_json


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
