"""Shared fixtures: every backend-parametrized test runs on SQLite and on a real PostgreSQL server.

PostgreSQL comes from ``$ENGRAIN_TEST_PG_URL`` (``scripts/postgres.sh`` starts one
and prints it). Each test gets its own schema, so tests never see each other's rows.
A missing server fails the tests rather than skipping them: a skipped backend
would look like a passing one.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pytest

PG_URL = os.environ.get("ENGRAIN_TEST_PG_URL", "postgresql://engrain:engrain@127.0.0.1:5432/engrain_test")
BACKENDS = ["sqlite", "postgres"]


def _patient_browser_assertions() -> None:
    """Give every Playwright ``expect`` 30 s, not its 5 s default.

    On a loaded 2-core CI machine drawing a page of a 5,000-event run took over 5 s,
    which failed the whole run; the assertions still fail at once on a wrong value,
    only a slow right one waits longer.
    """
    try:
        from playwright.sync_api import expect
    except ImportError:  # the UI tests then fail on their own import, naming the package
        return
    expect.set_options(timeout=30_000)


_patient_browser_assertions()


def pg_schema_url(schema: str) -> str:
    """A URL on the test server whose search_path is ``schema`` (created if missing)."""
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as c:
        c.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options={quote(f'-csearch_path={schema}', safe='')}"


def drop_pg_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL store URL in a fresh schema of its own (dropped afterwards), for PostgreSQL-only tests."""
    schema = "t_" + uuid.uuid4().hex[:12]
    yield pg_schema_url(schema)
    drop_pg_schema(schema)


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """A fresh, empty store URL on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'engrain.db'}"
        return
    schema = "t_" + uuid.uuid4().hex[:12]
    yield pg_schema_url(schema)
    drop_pg_schema(schema)


@pytest.fixture
def journal(store_url: str):
    """An open journal on each backend."""
    import engrain

    j = engrain.open(store_url)
    yield j
    j.close()


@pytest.fixture
def scripted_openai(monkeypatch):
    """A scripted model (a local stub speaking the OpenAI wire format), reached by ``openai:`` agents through
    ``OPENAI_BASE_URL``, as a server's agents reach theirs."""
    from engrain._agent.scripted import ScriptedModel

    m = ScriptedModel().start()
    monkeypatch.setenv("OPENAI_BASE_URL", m.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", "scripted")
    yield m
    m.stop()


@pytest.fixture(scope="session")
def embedder():
    """The real local embedder (MiniLM int8 ONNX), loaded once for the whole session."""
    from engrain._memory.embed import default_embedder

    e = default_embedder()
    e.embed(["warm up"])
    return e


@pytest.fixture(params=["libyaml", "pure"])
def yaml_parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Read routine files with PyYAML's C parser, then with its pure-Python one: users get either."""
    import yaml

    from engrain._routines import yamlfile

    if request.param == "libyaml":
        if not getattr(yaml, "__with_libyaml__", False):
            pytest.fail("this PyYAML has no libyaml: install a wheel built with it to test the C parser")
        c_loader = yamlfile._loader()  # engrain's JSON-only loader on the C parser (checked above it exists)
        assert issubclass(c_loader, yaml.CSafeLoader)
        monkeypatch.setattr(yamlfile, "_loader", lambda: c_loader)
    else:
        monkeypatch.setattr(yamlfile, "_loader", yamlfile.pure_loader)
    return request.param


@pytest.fixture(autouse=True)
def _isolated_default_store(tmp_path, monkeypatch):
    """Point the default store at a temp dir so no test writes ./.engrain."""
    monkeypatch.setenv("ENGRAIN_URL", f"sqlite:///{tmp_path / 'default' / 'engrain.db'}")
    monkeypatch.setenv("ENGRAIN_HOME", str(tmp_path / "default"))
