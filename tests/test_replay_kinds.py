"""A replayed step's arguments are compared as JSON values, kinds included (issue 23, #1).

Python says ``True == 1 == 1.0``; a tool given ``True`` is still not the call
that recorded ``1``. The journal keeps the kinds apart (its text holds
``true``, ``1`` and ``1.0``, each decoding to its own type), so a call replayed
with another kind ends the run with a ``NondeterminismError`` naming both, on
the fast path (every argument positional) and the slow one, and a faithful
replay, values that came through JSON from an HTTP API included, is never
flagged. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import engrain as eg
from engrain._durable.steps import StepRecord, same_args, steps_of, steps_of_rows

_tools = eg.ToolRegistry()
_state: dict = {}


@eg.tool(registry=_tools)
def charge(amount) -> str:
    _state["calls"].append(amount)
    return f"charged {amount!r}"


@eg.tool(registry=_tools)
def charge_all(amounts: list, meta: dict) -> int:
    _state["calls"].append(amounts)
    return len(amounts)


@eg.udf
def scaled(x):
    return [x, x]


def payer(task: str) -> object:
    v = _state["value"]
    calls = {"positional": lambda: charge(v), "keyword": lambda: charge(amount=v),
             "nested": lambda: charge_all([1, v], {"v": v}), "udf": lambda: scaled(v)}
    done = calls[task]()
    if _state["crash"]:
        raise KeyboardInterrupt
    return done


PAIRS = [(1, True), (True, 1), (0, False), (False, 0), (1, 1.0), (1.0, 1), (0.0, False), ("1", 1)]


def _crash_then_resume(journal, task, run_id, recorded, replayed):
    _state.update(value=recorded, crash=True, calls=[])
    with pytest.raises(KeyboardInterrupt):
        eg.run(payer, task, run_id=run_id, journal=journal)
    _state.update(value=replayed, crash=False, calls=[])
    return eg.run(payer, task, run_id=run_id, journal=journal)


@pytest.mark.parametrize("task", ["positional", "keyword", "nested", "udf"])
@pytest.mark.parametrize(("recorded", "replayed"), PAIRS, ids=[f"{a!r}-then-{b!r}" for a, b in PAIRS])
def test_a_replayed_argument_of_another_kind_is_another_call(journal, task, recorded, replayed):
    res = _crash_then_resume(journal, task, "r", recorded, replayed)
    assert res.status == "failed" and res.error_type == "NondeterminismError", res
    assert _state["calls"] == []  # the recorded result was not handed over, and nothing ran
    was, now = res.error.split("recorded ", 1)[1].split(" but the agent called ")
    assert repr(recorded) in was and repr(replayed) in now
    assert journal.get_run("r").status == "failed"


SAME = [1, 1.0, True, False, 0, 0.0, None, "1", -2.5, 10**15, 1e300]


@pytest.mark.parametrize("task", ["positional", "keyword", "nested", "udf"])
@pytest.mark.parametrize("value", SAME, ids=repr)
def test_the_same_value_of_the_same_kind_replays(journal, task, value):
    res = _crash_then_resume(journal, task, "same", value, value)
    assert res.status == "ok" and res.replayed == 1 and res.executed == 0 and _state["calls"] == [], res


def test_the_journal_keeps_each_kind_on_both_decoders(journal):
    """What a replay compares with is what was recorded: ``1.0`` stays a float, ``True`` a bool."""
    _state.update(value=None, crash=True, calls=[])
    args = [1, 1.0, True, 0, 0.0, False]

    def agent(task: str) -> None:
        charge_all(args, {"f": 1.0, "i": 1, "b": True})
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        eg.run(agent, "t", run_id="kinds", journal=journal)
    fast = steps_of_rows("kinds", journal.read_raw("kinds"))[0].args
    slow = steps_of(journal.read("kinds"))[0].args
    for got in (fast, slow):
        assert [type(v) for v in got["amounts"]] == [int, float, bool, int, float, bool]
        assert [type(v) for v in got["meta"].values()] == [float, int, bool]
        assert got == {"amounts": args, "meta": {"f": 1.0, "i": 1, "b": True}}


class _Api(BaseHTTPRequestHandler):
    """A JSON API whose body the test sets: numbers as another program wrote them."""

    body = b"{}"

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


@pytest.fixture
def api_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/bill"
    server.shutdown()
    server.server_close()


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@eg.tool(registry=_tools)
def fetch_bill(url: str) -> dict:
    return _get(url)


@pytest.mark.parametrize("body", [b'{"amount": 1.0, "paid": true}', b'{"amount": 1, "paid": false}',
                                  b'{"amount": 1e0, "paid": true}'])
def test_arguments_from_a_json_api_through_a_step_replay_whatever_the_api_says_next(journal, api_url, body):
    """The API's answer is a step's result: the replay gets the recorded kinds back, whatever the API now says."""

    def agent(task: str) -> list:
        bill = fetch_bill(api_url)
        out = [charge(bill["amount"]), charge(amount=bill["paid"]), charge_all([bill["amount"]], bill)]
        if _state["crash"]:
            raise KeyboardInterrupt
        return out

    _Api.body = body
    _state.update(crash=True, calls=[])
    with pytest.raises(KeyboardInterrupt):
        eg.run(agent, "pay", run_id="api", journal=journal)
    first = list(_state["calls"])
    _Api.body = b'{"amount": 1, "paid": 1}' if b"1.0" in body or b"1e0" in body else b'{"amount": 1.0, "paid": 0}'
    _state.update(crash=False, calls=[])
    res = eg.run(agent, "pay", run_id="api", journal=journal)
    assert res.status == "ok" and res.replayed == 4 and res.executed == 0 and _state["calls"] == [], res
    assert [type(v) for v in first[:2]] == [type(v) for v in json.loads(body).values()]


def test_arguments_read_from_an_api_outside_any_step_are_compared_by_kind(journal, api_url):
    """Read outside the journal, the API's ``1`` then ``1.0`` are two calls: the journal recorded which one ran."""

    def agent(task: str) -> str:
        out = charge(_get(api_url)["amount"])
        if _state["crash"]:
            raise KeyboardInterrupt
        return out

    for first, then, ok in ((b'{"amount": 1}', b'{"amount": 1.0}', False), (b'{"amount": 1.0}', b'{"amount": 1}', False),
                            (b'{"amount": 1.0}', b'{"amount": 1.00}', True), (b'{"amount": 1}', b'{"amount": 1}', True)):
        run_id = f"out-{first!r}-{then!r}"
        _Api.body, _state["crash"], _state["calls"] = first, True, []
        with pytest.raises(KeyboardInterrupt):
            eg.run(agent, "pay", run_id=run_id, journal=journal)
        _Api.body, _state["crash"], _state["calls"] = then, False, []
        res = eg.run(agent, "pay", run_id=run_id, journal=journal)
        assert (res.status == "ok") is ok and _state["calls"] == [], (first, then, res)
        if not ok:
            assert res.error_type == "NondeterminismError" and "charge(amount=1)" in res.error
            assert "charge(amount=1.0)" in res.error


def test_the_comparisons_themselves():
    from engrain._durable.steps import same_json, same_kinds

    assert same_json({"a": [1, {"b": 1.0}]}, {"a": [1, {"b": 1.0}]})
    assert not same_json({"a": [1, {"b": 1.0}]}, {"a": [1, {"b": 1}]})
    assert not same_json([True], [1]) and not same_json({"a": 1}, {"a": 1, "b": 2}) and not same_json([1], [1, 1])
    assert same_json({"a": 1, "b": 2}, {"b": 2, "a": 1})  # key order is no part of a JSON object
    assert not same_json([1, 2], (1, 2))  # a tuple is never what the journal holds
    assert same_kinds((1, "x", [1.0]), (1, "x", [1.0])) and not same_kinds((1, "x", [1.0]), (1, "x", [1]))
    assert not same_kinds((1,), (True,)) and not same_kinds((1.0,), (1,))
    rec = StepRecord(0, "charge", args={"amount": 1})
    assert same_args(rec, {"amount": 1}) and not same_args(rec, {"amount": True}) and not same_args(rec, {"amount": 1.0})
