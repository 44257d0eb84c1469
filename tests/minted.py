"""Ids as the fake services in the agent-cache tests mint them: random hex, as a real service's are.

A token is drawn again until it holds a letter and a digit. An all-digit draw (0.4% of 12-hex
tokens) reads as a number, and the cache rightly treats a changed number as meaningful, which
would turn a test's expected hit into a miss once in a few hundred runs.
"""

from __future__ import annotations

import uuid


def token(n: int) -> str:
    """``n`` random hex characters holding at least one letter and one digit."""
    while True:
        t = uuid.uuid4().hex[:n]
        if not t.isdigit() and not t.isalpha():
            return t
