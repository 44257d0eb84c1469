"""A hostile outside tester's fourth round on the CLI and the agent engine's surfaces.

* An option naming an id, a file or a module given as an empty string is a usage error (exit 2,
  naming the option): ``engrain fork RUN --run-id ''`` and ``engrain enqueue --run-id ''`` made
  a fresh id, ``engrain run --input ''`` read the package's own input.json, ``validate --tools ''``
  used engrain.tools and ``serve --routines ''`` served ./routines, all as if the option were left out.
* A PostgreSQL store that cannot be connected to is a failure (exit 1) naming the store without
  its password, not bad input (it was 2, as a malformed URL is and stays).
* ``x: int = None`` on an agent tool took "an integer, default null": a model sending that null
  was refused. It now takes null as ``Optional[int]`` does and the tool gets None.
* ``eg.wrap`` streams: a loop that stops at the stream's last event (``message_stop``,
  ``response.completed``, the chunk with ``finish_reason``) left its step unjournaled, so the
  call was paid again on resume; a replayed stream had no ``response.status_code`` and an async
  one no ``aclose()``.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Optional

import pydantic
import pytest

import engrain as eg
from engrain._agent.scripted import ScriptedModel, say, tool_call
from engrain._agent.toolspec import from_function
from engrain._durable.context import steps_of

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")
PACKAGE = str(ROOT / "tests" / "fixtures" / "csv_report" / "routine")


def _cli(*args: str, cwd: pathlib.Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ENGRAIN_URL"}
    try:
        return subprocess.run([ENGRAIN, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                              env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:  # `serve` taking the empty option for "not given" serves on
        pytest.fail(f"engrain {' '.join(args)} did not exit: it took the empty option for the default")


@pytest.fixture
def place(tmp_path) -> pathlib.Path:
    j = eg.open(f"sqlite:///{tmp_path / 'store.db'}")
    assert eg.run(lambda t: t.upper(), "done task", run_id="done", journal=j).status == "ok"
    j.close()
    return tmp_path


def _run_ids(place: pathlib.Path) -> list[str]:
    j = eg.open(f"sqlite:///{place / 'store.db'}", create=False)
    try:
        return sorted(r.run_id for r in j.runs())
    finally:
        j.close()


URL = ["--url", "sqlite:///store.db"]

# -- empty ids, files and modules are usage errors -------------------------------------------------

EMPTY = [
    (["fork", "done", "--at-step", "0", "--run-id", "", *URL], "--run-id"),
    (["enqueue", "agent", "task", "--run-id", "", *URL], "--run-id"),
    (["run", PACKAGE, "--run-id", "", *URL], "--run-id"),  # the fast path (no typer)
    (["run", PACKAGE, "--input", "", *URL], "--input"),
    (["run", PACKAGE, "--answers", "", *URL], "--answers"),
    (["validate", PACKAGE, "--tools", ""], "--tools"),
    (["serve", "--routines", "", "--port", "0", *URL], "--routines"),
    (["serve", "--tools-dir", "", "--port", "0", *URL], "--tools-dir"),
    (["mcp", "--routines", "", *URL], "--routines"),
]


@pytest.mark.parametrize(("args", "flag"), EMPTY, ids=[f"{a[0]} {flag}" for a, flag in EMPTY])
def test_an_empty_option_is_a_usage_error_naming_it(place, args, flag):
    r = _cli(*args, cwd=place)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    [line] = r.stderr.splitlines()
    assert line.startswith(f"error: {flag} must not be empty (leave it out for "), line
    assert _run_ids(place) == ["done"]  # no run made with a fresh id, none started


@pytest.mark.parametrize("args", [["fork", "done", "--at-step", "0"], ["run", PACKAGE]], ids=["fork", "run"])
def test_an_empty_run_id_under_json_says_so_on_stdout(place, args):
    r = _cli(*args, "--run-id", "", "--json", *URL, cwd=place)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert json.loads(r.stdout) == {"error": "UsageError", "detail": "--run-id must not be empty (leave it out for a fresh id)"}
    assert _run_ids(place) == ["done"]


def test_a_given_run_id_still_forks_and_enqueues(place):
    assert _cli("fork", "done", "--at-step", "0", "--run-id", "forked", *URL, cwd=place).stdout.strip() == "forked"
    assert _cli("enqueue", "agent", "task", "--run-id", "queued", *URL, cwd=place).stdout.strip() == "queued"
    assert _run_ids(place) == ["done", "forked", "queued"]


# -- an unreachable PostgreSQL server is a failure, a malformed URL bad input ----------------------

UNREACHABLE = [
    "postgresql://eve:hunter2@127.0.0.1:1/engrain",  # nothing listens on port 1
    "postgresql://eve:hunter2@/engrain?host=/nonexistent-engrain-socket-dir",  # no local socket there
]


@pytest.mark.parametrize("url", UNREACHABLE, ids=["tcp", "socket"])
@pytest.mark.parametrize("args", [["runs"], ["memory", "stats"], ["run", PACKAGE]], ids=["runs", "memory", "run"])
def test_an_unreachable_store_is_a_failure_naming_it(tmp_path, url, args):
    r = _cli(*args, "--url", url, cwd=tmp_path)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    [line] = r.stderr.splitlines()
    assert line.startswith("error: cannot connect to PostgreSQL at postgresql://eve:***@"), line
    assert "hunter2" not in r.stderr + r.stdout
    r = _cli(*args, "--url", url, "--json", cwd=tmp_path)
    assert r.returncode == 1 and "hunter2" not in r.stdout
    assert json.loads(r.stdout)["detail"] == line.removeprefix("error: ")


@pytest.mark.parametrize("url", UNREACHABLE, ids=["tcp", "socket"])
def test_an_unreachable_store_is_its_own_error_type(url):
    with pytest.raises(eg.StoreUnreachableError, match=r"postgresql://eve:\*\*\*@") as e:
        eg.open(url)
    assert isinstance(e.value, eg.ConfigError) and "hunter2" not in str(e.value)


@pytest.mark.parametrize("url", [
    "postgresql://eve:hunter2@127.0.0.1:notaport/engrain",
    "postgresql://eve:hunter2@127.0.0.1:99999/engrain",
    "postgresql://eve:hunter2@127.0.0.1:1/engrain?sslmode=bogus",
    "postgresql://eve:hunter2@127.0.0.1:1/engrain?nosuchparam=1",
    "postgresql://eve:hunter2@127.0.0.1:1/engrain?connect_timeout=abc",  # was a raw psycopg traceback
    "mysql://eve:hunter2@127.0.0.1:1/engrain",
    "postgresql//eve:hunter2@127.0.0.1:1/engrain",  # a typo: the message showed the password
    "eve:hunter2@127.0.0.1/engrain",
])
def test_a_malformed_store_url_is_a_store_url_error_without_its_password(url):
    with pytest.raises(eg.StoreURLError) as e:
        eg.open(url)
    assert "hunter2" not in str(e.value)


def test_a_local_socket_url_reaches_libpq_whole():
    """``postgresql:///db`` (no host: libpq's local socket) lost its empty authority and was refused as malformed."""
    from engrain._journal import parse_url

    assert parse_url("postgresql:///engrain?host=/nonexistent-dir&durability=normal")[1] == (
        "postgresql:///engrain?host=/nonexistent-dir")
    with pytest.raises(eg.StoreUnreachableError):
        eg.open("postgresql:///engrain?host=/nonexistent-engrain-socket-dir")


@pytest.mark.parametrize("url", [
    "postgresql://eve:hunter2@127.0.0.1:notaport/engrain",
    "postgresql://eve:hunter2@127.0.0.1:99999/engrain",
    "postgresql://eve:hunter2@127.0.0.1:1/engrain?sslmode=bogus",
    "postgresql://eve:hunter2@127.0.0.1:1/engrain?nosuchparam=1",
    "postgresql://eve:hunter2@127.0.0.1:1/engrain?connect_timeout=abc",
    "mysql://eve:hunter2@127.0.0.1:1/engrain",
])
def test_a_malformed_store_url_stays_bad_input(tmp_path, url):
    r = _cli("runs", "--url", url, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(r.stderr.splitlines()) == 1 and "hunter2" not in r.stderr


# -- `x: int = None` takes null ---------------------------------------------------------------------


class Filter(pydantic.BaseModel):
    field: str


def _tool(order_id: int, limit: int = None, note: str = None, where: Filter = None, opt: Optional[int] = None,
          tag: str = "a") -> dict:
    """Look up orders."""
    return {"order_id": order_id, "limit": limit, "note": note, "where": where and where.field, "opt": opt}


def test_a_none_default_takes_null_like_optional():
    t = from_function(_tool)
    props = t.parameters["properties"]
    assert props["limit"] == props["opt"] == {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}
    assert props["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
    assert {"type": "null"} in props["where"]["anyOf"]
    assert props["tag"] == {"type": "string", "default": "a"}  # other defaults are as they were
    args = t.check('{"order_id": 1, "limit": null, "note": null, "where": null, "opt": null}')
    assert t.invoke(args) == {"order_id": 1, "limit": None, "note": None, "where": None, "opt": None}
    assert t.invoke(t.check('{"order_id": 1, "limit": 5, "where": {"field": "x"}}'))["where"] == "x"
    for bad in ('{"order_id": 1, "limit": "5"}', '{"order_id": 1, "tag": null}', '{"order_id": null}'):
        with pytest.raises(ValueError, match="argument"):
            t.check(bad)

    def flat_tool(order_id: int, limit: int = None) -> int:  # a flat schema: checked in plain Python first
        return limit

    flat = from_function(flat_tool)
    assert flat.check('{"order_id": 1, "limit": null}') == {"order_id": 1, "limit": None}
    assert flat.quick and flat.quick({"order_id": 1, "limit": None}) and not flat.quick({"order_id": 1, "limit": "x"})


def test_an_agent_tool_called_with_null_for_a_none_default_runs(tmp_path):
    got = []

    def orders(customer: str, limit: int = None) -> str:
        """List a customer's orders."""
        got.append(limit)
        return f"{customer}: 2 orders"

    model = ScriptedModel().start()
    journal = eg.open(f"sqlite:///{tmp_path / 'engrain.db'}")
    try:
        model.script = [tool_call("orders", customer="ann", limit=None), say("Ann has 2 orders.")]
        agent = eg.Agent("helper", "openai:scripted", "Help.", [orders], base_url=model.openai_url, journal=journal)
        res = agent.run("orders of ann")
        assert res.output == "Ann has 2 orders." and got == [None]
        sent = [m for m in model.requests[1][1]["messages"] if m["role"] == "tool"]
        assert [m["content"] for m in sent] == ["ann: 2 orders"]  # a result, not "error: bad arguments"
    finally:
        journal.close()
        model.stop()


def test_the_definition_digests_the_schema_earlier_runs_were_recorded_with():
    """A run records its agent's definition, and a resume must give the same: the null a None default now
    takes is left out of it, so runs started before (their calls fit both schemas) still resume."""
    import hashlib

    def orders(customer: str, limit: int = None) -> str:
        """List a customer's orders."""
        return customer

    agent = eg.Agent("helper", "openai:scripted", "Help.", [orders], base_url="http://127.0.0.1:1/v1")
    recorded = {"type": "object", "properties": {"customer": {"type": "string"}, "limit": {"type": "integer", "default": None}},
                "required": ["customer"], "additionalProperties": False}
    text = json.dumps({"model": agent.model, "instructions": agent.instructions, "tools": [["orders", recorded]]},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert agent.definition() == hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
    assert agent.tools["orders"].parameters["properties"]["limit"]["anyOf"][1] == {"type": "null"}  # what the model sees


# -- eg.wrap streams --------------------------------------------------------------------------------

MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture
def model():
    m = ScriptedModel().start()
    m.script = lambda api, body: say("hello there")
    yield m
    m.stop()


def _clients(model: ScriptedModel, is_async: bool = False):
    import anthropic
    import openai

    if is_async:
        return (eg.wrap(openai.AsyncOpenAI(base_url=model.openai_url, api_key="scripted")),
                eg.wrap(anthropic.AsyncAnthropic(base_url=model.url, api_key="scripted")))
    return (eg.wrap(openai.OpenAI(base_url=model.openai_url, api_key="scripted")),
            eg.wrap(anthropic.Anthropic(base_url=model.url, api_key="scripted")))


def _crash_then_resume(agent, journal, model) -> tuple[list, list, int]:
    """The agent's outputs on its first run (which dies at its end) and on the resume, and the calls the resume made."""
    seen: list = []
    crash = [True]

    def run(task: str):
        seen.append(agent())
        if crash[0]:
            crash[0] = False
            raise KeyboardInterrupt  # the process dies here: the run stays resumable
        return "ok"

    with pytest.raises(KeyboardInterrupt):
        eg.run(run, "t", run_id="r", journal=journal)
    first = model.calls
    res = eg.run(run, "t", run_id="r", journal=journal)
    assert res.status == "ok", res.error
    return seen[0], seen[1], model.calls - first


@pytest.fixture
def journal(tmp_path):
    j = eg.open(f"sqlite:///{tmp_path / 'engrain.db'}")
    yield j
    j.close()


def test_a_loop_stopping_at_the_last_event_is_journaled(model, journal):
    oc, ac = _clients(model)

    def agent() -> list:
        out = []
        with ac.messages.create(model="m", max_tokens=10, messages=MSGS, stream=True) as s:
            for e in s:
                if e.type == "message_stop":
                    out.append(e.type)
                    break
        with oc.responses.create(model="m", input="hi", stream=True) as s:
            for e in s:
                if e.type == "response.completed":
                    out.append(e.response.output_text)
                    break
        s = oc.chat.completions.create(model="m", messages=MSGS, stream=True, stream_options={"include_usage": True})
        text = ""
        for c in s:
            text += c.choices[0].delta.content or ""
            if c.choices[0].finish_reason:
                break
        s.close()
        out.append(text)
        with oc.chat.completions.stream(model="m", messages=MSGS) as s:
            out += [e.content for e in s if e.type == "content.done"][:1]
        with ac.messages.stream(model="m", max_tokens=10, messages=MSGS) as s:
            for e in s:
                if e.type == "message_stop":
                    out.append(e.message.content[0].text)
                    break
        return out

    live, replayed, paid = _crash_then_resume(agent, journal, model)
    assert paid == 0  # nothing sent again on resume
    assert live == replayed == ["message_stop", "hello there", "hello there", "hello there", "hello there"]
    steps = list(steps_of(journal.read("r")).values())
    assert [s.state for s in steps] == ["completed"] * 5
    # the events after the last one (the usage chunk) are recorded too
    chat = steps[2].result["events"]
    assert chat[-1]["usage"] is not None and chat[-2]["choices"][0]["finish_reason"] == "stop"


def test_a_stream_left_before_its_last_event_is_called_again(model, journal):
    oc, _ = _clients(model)

    def agent() -> str:
        with oc.chat.completions.create(model="m", messages=MSGS, stream=True) as s:
            return next(iter(s)).object

    live, replayed, paid = _crash_then_resume(agent, journal, model)
    assert live == replayed == "chat.completion.chunk" and paid == 1


def test_what_code_reads_from_a_stream_is_there_on_replay(model, journal):
    oc, ac = _clients(model)

    def agent() -> list:
        out = []
        s = oc.chat.completions.create(model="m", messages=MSGS, stream=True)
        out.append([s.response.status_code, "".join(c.choices[0].delta.content or "" for c in s)])
        s.close()
        with ac.messages.create(model="m", max_tokens=10, messages=MSGS, stream=True) as s:
            out.append([s.response.status_code, [e.type for e in s][-1]])
        with ac.messages.stream(model="m", max_tokens=10, messages=MSGS) as s:
            out.append(["".join(s.text_stream), s.get_final_message().stop_reason])
        with oc.responses.stream(model="m", input="hi") as s:
            out.append(s.get_final_response().output_text)
        return out

    live, replayed, paid = _crash_then_resume(agent, journal, model)
    assert paid == 0
    assert live == replayed == [[200, "hello there"], [200, "message_stop"], ["hello there", "end_turn"], "hello there"]


def test_what_code_reads_from_an_async_stream_is_there_on_replay(model, journal):
    oc, ac = _clients(model, is_async=True)

    async def main() -> list:
        out = []
        s = await oc.chat.completions.create(model="m", messages=MSGS, stream=True)
        out.append([s.response.status_code, "".join([c.choices[0].delta.content or "" async for c in s])])
        await s.aclose()
        s = await oc.chat.completions.create(model="m", messages=MSGS, stream=True)
        async with s:
            async for c in s:
                if c.choices[0].finish_reason:
                    out.append(c.choices[0].finish_reason)
                    break
        async with ac.messages.stream(model="m", max_tokens=10, messages=MSGS) as ms:
            out.append("".join([t async for t in ms.text_stream]))
        s = await ac.messages.create(model="m", max_tokens=10, messages=MSGS, stream=True)
        async for e in s:
            if e.type == "message_stop":
                break
        await s.close()
        out.append(e.type)
        return out

    live, replayed, paid = _crash_then_resume(lambda: asyncio.run(main()), journal, model)
    assert paid == 0
    assert live == replayed == [[200, "hello there"], "stop", "hello there", "message_stop"]
