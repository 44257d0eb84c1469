"""eg.Client says which server it could not reach and what to check, as one engrain error."""

from __future__ import annotations

import pytest

import engrain as eg


def test_an_unreachable_server_is_one_engrain_error_naming_the_url():
    c = eg.Client("http://127.0.0.1:1")  # nothing listens on port 1
    for call in (c.runs, c.health, lambda: list(c.stream("r")), lambda: list(c.chat("a", "hi", session="s"))):
        with pytest.raises(eg.ServerUnreachableError) as e:
            call()
        err = e.value
        assert isinstance(err, eg.EngrainError) and isinstance(err, ConnectionError)
        assert err.url == "http://127.0.0.1:1" and "refused" in err.reason.lower()
        assert str(err).startswith("cannot reach the engrain server at http://127.0.0.1:1: ")
        assert "engrain serve" in str(err)


def test_a_base_url_without_a_scheme_is_refused_at_once():
    with pytest.raises(eg.ConfigError, match="http://HOST:PORT"):
        eg.Client("127.0.0.1:8765")
