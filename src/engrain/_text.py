"""Plain text from docstrings, for the help that people (CLI) and models (MCP) read.

Imports nothing of engrain, so every surface may use it.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:class|func|meth|data|attr|mod|exc|obj):`(~?)([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain_doc(text: str | None) -> str | None:
    """``text`` without reST markup: ``x`` becomes 'x' and :class:`~engrain.RunResult` becomes RunResult."""
    if not text:
        return text
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    return _LITERAL.sub(r"'\1'", text)
