"""The agent's behavior cache on tools whose results change between runs, against a scripted model.

Volatile results (generated ids, write stamps) let a replay go on; meaningful
ones (amounts, recipients, statuses) end it. Empty replies never become an
answer; tool-less answers are cached only with ``answers_ttl``; every run's
savings are recorded.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import uuid

import pytest

import engrain as eg
from engrain._agent.loop import EmptyReplyError
from minted import token

from engrain._agent.scripted import Reply, ScriptedModel, say, tool_call, tool_calls
from engrain._agent.volatile import Replayer, result_check


@pytest.fixture
def model():
    m = ScriptedModel().start()
    yield m
    m.stop()


def _agent(model, journal, tools, provider="openai", **kw) -> eg.Agent:
    url = model.openai_url if provider == "openai" else model.url
    return eg.Agent("mailer", f"{provider}:scripted", "Send mail.", list(tools), base_url=url, journal=journal,
                    cache=True, **kw)


def _now() -> str:
    """The time of the call, as a service stamps what it writes (a stamp far from its call is not one)."""
    return dt.datetime.now(dt.timezone.utc).isoformat()


class Mailbox:
    """A fake mail service whose writes return what a real one does: a fresh id and the send time."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.status = "paid"
        self.amount = 120.0

    def send_email(self, to: str, subject: str) -> dict:
        """Send an email."""
        item = {"id": f"msg_{token(12)}", "to": to, "subject": subject, "sent_at": _now()}
        self.sent.append(item)
        return item

    def add_label(self, message_id: str, label: str) -> str:
        """Label a sent email."""
        assert any(m["id"] == message_id for m in self.sent), f"no message {message_id}"
        return f"labelled {message_id} {label}"

    def invoice(self, customer: str) -> dict:
        """The customer's open invoice."""
        return {"customer": customer, "amount": self.amount, "status": self.status, "checked_at": _now()}


def test_generated_ids_and_write_stamps_the_model_never_read_again_do_not_end_a_replay(model, journal):
    box = Mailbox()
    model.script = [tool_call("send_email", to="ann@example.com", subject="Hello"), say("Sent your email to Ann.")]
    a = _agent(model, journal, [box.send_email])
    assert a.run("email Ann hello").output == "Sent your email to Ann." and model.calls == 2
    events: list[dict] = []
    res = a.run("email Ann hello", on_event=events.append)
    assert res.output == "Sent your email to Ann." and model.calls == 2  # the fresh id and time did not matter
    assert len(box.sent) == 2 and box.sent[0]["id"] != box.sent[1]["id"]
    assert not any("diverged" in e for e in events if e["type"] == "cache")


def test_a_minted_id_the_model_copied_is_carried_into_the_later_calls(model, journal):
    box = Mailbox()

    def script(api, body):
        tools = [m for m in body["messages"] if m["role"] == "tool"]
        if not tools:
            return tool_call("send_email", to="bob@example.com", subject="Invoice")
        if len(tools) == 1:
            return tool_call("add_label", message_id=json.loads(tools[0]["content"])["id"], label="billing")
        return say(f"Sent and labelled: {tools[1]['content']}.")

    model.script = script
    a = _agent(model, journal, [box.send_email, box.add_label])
    first = a.run("send Bob the invoice and label it")
    assert model.calls == 3 and box.sent[0]["id"] in first.output
    again = a.run("send Bob the invoice and label it")
    assert model.calls == 3  # replayed whole: the label call got the id this run minted
    assert again.output == f"Sent and labelled: labelled {box.sent[1]['id']} billing."
    assert box.sent[0]["id"] not in again.output


@pytest.mark.parametrize("change", ["amount", "status", "recipient"])
def test_a_meaningful_difference_ends_the_replay(model, journal, change):
    box = Mailbox()
    to = {"v": "ann@example.com"}

    def lookup_contact(name: str) -> dict:
        """Find a contact."""
        return {"name": name, "email": to["v"], "created_at": _now()}

    model.script = [tool_calls(("invoice", {"customer": "Ann"}), ("lookup_contact", {"name": "Ann"})),
                    say("Ann owes 120.0 and is reachable.")]
    a = _agent(model, journal, [box.invoice, lookup_contact])
    a.run("what does Ann owe?")
    assert model.calls == 2
    assert a.run("what does Ann owe?").output == "Ann owes 120.0 and is reachable." and model.calls == 2
    if change == "amount":
        box.amount = 95.5
    elif change == "status":
        box.status = "refunded"
    else:
        to["v"] = "ann@elsewhere.org"
    model.script.append(say("Something changed."))
    events: list[dict] = []
    assert a.run("what does Ann owe?", on_event=events.append).output == "Something changed."
    assert model.calls == 3 and {"type": "cache", "diverged": 0} in events


def test_a_stamp_the_answer_used_and_a_bare_time_end_the_replay(model, journal):
    box = Mailbox()

    def current_time() -> str:
        """The current time."""
        return _now()

    model.script = lambda api, body: (
        tool_call("send_email", to="cy@example.com", subject="Hi")
        if not any(m["role"] == "tool" for m in body["messages"])
        else say(f"Sent at {json.loads(body['messages'][-1]['content'])['sent_at']}."))
    a = _agent(model, journal, [box.send_email])
    a.run("email Cy")
    again = a.run("email Cy")
    assert model.calls == 3  # the answer quoted the stamp: the model writes the new one
    assert again.output == f"Sent at {box.sent[1]['sent_at']}."
    b = eg.Agent("clock", "openai:scripted", "", [current_time], base_url=model.openai_url, journal=journal,
                 cache=True)
    model.script = lambda api, body: (tool_call("current_time") if not any(
        m["role"] == "tool" for m in body["messages"]) else say("The shop is open."))
    b.run("is the shop open?")
    b.run("is the shop open?")
    assert model.calls == 6  # a time the tool was asked for is never volatile by default


def test_a_tool_says_how_its_result_compares(model, journal):
    seq = itertools.count()

    @eg.tool(volatile=["trace"])
    def status(job: str) -> dict:
        """A job's status."""
        return {"job": job, "state": "done", "trace": next(seq)}

    @eg.tool(same_result=lambda old, new: old["state"] == new["state"])
    def status2(job: str) -> dict:
        """A job's status, again."""
        return {"job": job, "state": "done", "polled": next(seq)}

    @eg.tool(volatile=())
    def created(job: str) -> dict:
        """When a job was created (compared whole)."""
        return {"job": job, "created_at": _now()}

    def plain(job: str) -> dict:
        """A plain function with a counter."""
        return {"job": job, "n": next(seq)}

    for fn, kw in [(status, {}), (status2, {}), (plain, {"volatile": {"plain": ["n"]}}),
                   (plain, {"same_result": {"plain": lambda old, new: old["job"] == new["job"]}})]:
        name = fn.__name__
        model.script = [tool_call(name, job="j1"), say("Done.")]
        model.requests.clear()
        a = eg.Agent(f"a{uuid.uuid4().hex[:6]}", "openai:scripted", "", [fn], base_url=model.openai_url,
                     journal=journal, cache=True, **kw)
        a.run("is j1 done?")
        a.run("is j1 done?")
        assert model.calls == 2, name
    model.script = [tool_call("created", job="j1"), say("Done."), say("Done.")]
    model.requests.clear()
    a = eg.Agent("exact", "openai:scripted", "", [created], base_url=model.openai_url, journal=journal, cache=True)
    a.run("when was j1 created?")
    a.run("when was j1 created?")
    assert model.calls == 3  # volatile=() compares everything, even a write stamp
    with pytest.raises(eg.ConfigError, match="not one of its tools"):
        eg.Agent("x", "openai:m", "", [plain], volatile={"nope": ["n"]})
    with pytest.raises(eg.ConfigError, match="volatile= or same_result="):
        result_check("t", ["a"], lambda a, b: True)


def test_the_default_comparison_on_text_results():
    then = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1)
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    turns = [{"reply": {"text": "", "tool_calls": [{"id": "1", "name": "t", "arguments": "{}"}],
                        "ts": then.isoformat()},
              "results": [f"Email sent.\ntimestamp: {then:%Y-%m-%d %H:%M:%S}\nid: msg_a1b2c3d4e5f6"]},
             {"reply": {"text": "Done.", "tool_calls": []}, "results": []}]
    r = Replayer(turns, "send it")
    assert r.matches(0, ["t"], [f"Email sent.\ntimestamp: {now}\nid: msg_f6e5d4c3b2a1"], {})
    for changed in [f"Email bounced.\ntimestamp: {now}\nid: msg_f6e5d4c3b2a1",
                    f"Email sent.\ndue: {now}\nid: msg_f6e5d4c3b2a1",  # a date that is not a stamp
                    f"Email sent.\ntimestamp: {now}\nid: msg_77",  # another id shape
                    f"Email sent.\ntimestamp: {now}",
                    "Email sent.\ntimestamp: 2026-01-02 03:04:05\nid: msg_f6e5d4c3b2a1"]:  # not the call's time
        assert not Replayer(turns, "send it").matches(0, ["t"], [changed], {}), changed
    # nesting past MAX_DEPTH compares whole; a result too deep for json is compared as text
    deep_old, deep_new = {"id": "msg_a1b2c3d4e5f6"}, {"id": "msg_f6e5d4c3b2a1"}
    for _ in range(100):
        deep_old, deep_new = {"x": deep_old}, {"x": deep_new}
    deep = [{**turns[0], "results": [json.dumps(deep_old)]}, turns[1]]
    assert not Replayer(deep, "t").matches(0, ["t"], [json.dumps(deep_new)], {})
    nested = [{**turns[0], "results": ["[" * 100_000 + "]" * 100_000]}, turns[1]]
    assert not Replayer(nested, "t").matches(0, ["t"], ["[" * 99_999 + "]" * 99_999], {})
    # a value the task named is never volatile
    assert not Replayer(turns, "resend msg_a1b2c3d4e5f6").matches(
        0, ["t"], [f"Email sent.\ntimestamp: {now}\nid: msg_f6e5d4c3b2a1"], {})


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_server_that_ignores_stream_is_read_whole(journal, provider):
    with ScriptedModel([tool_call("add", a=2, b=3), say("The sum is 5.")], ignore_stream=True) as m:
        def add(a: int, b: int) -> int:
            """Add."""
            return a + b

        events: list[dict] = []
        a = eg.Agent("adder", f"{provider}:scripted", "", [add], base_url=m.openai_url if provider == "openai"
                     else m.url, journal=journal)
        res = a.run("add 2 and 3", on_event=events.append)
        assert res.output == "The sum is 5." and m.calls == 2
        assert all(body.get("stream") for _, body in m.requests)  # asked to stream, answered whole
        assert {"type": "text", "delta": "The sum is 5."} in events
        assert [e["content"] for e in events if e["type"] == "tool_result"] == ["5"]


def test_an_empty_reply_is_asked_again_then_fails_the_run(model, journal):
    model.script = [Reply(), say("Here it is.")]
    a = eg.Agent("e", "openai:scripted", "", [], base_url=model.openai_url, journal=journal)
    assert a.run("hi").output == "Here it is." and model.calls == 2
    model.script += [Reply(), Reply()]
    res = a.run("hi again")
    assert res.status == "failed" and model.calls == 4
    assert "EmptyReplyError" in res.error and "empty reply (no text and no tool call) at turn 0" in res.error
    model.script += [Reply(), Reply()]
    events = list(a.chat("hello", session="s1"))
    assert events[-2]["type"] == "error" and "empty reply" in events[-2]["error"]
    assert events[-1]["status"] == "failed" and events[-1]["text"] == ""
    assert issubclass(EmptyReplyError, RuntimeError)
    # an empty answer cached before empty replies were refused is never replayed
    b = eg.Agent("e2", "openai:scripted", "", [], base_url=model.openai_url, journal=journal, cache=True,
                 answers_ttl=60)
    model.script += [say("Filled.")]
    b.run("say something")
    store = b._store(journal)
    (entry,) = [e for e in store.entries() if e.tags == ["llm-agent:e2"]]
    entry.steps[-1]["reply"]["text"] = ""
    store._exec("UPDATE engrain_cache_entries SET steps = ? WHERE id = ?", (json.dumps(entry.steps), entry.id))
    store._parsed.clear()
    model.script += [say("Asked again.")]
    assert b.run("say something").output == "Asked again."


def test_answers_without_tools_are_cached_only_when_asked_for_and_expire(model, journal):
    store_rows = lambda: [e for e in a._store(journal).entries() if e.tags == [f"llm-agent:{a.name}"]]  # noqa: E731
    model.script = [say("Sunny."), say("Rainy.")]
    a = eg.Agent("w", "openai:scripted", "", [], base_url=model.openai_url, journal=journal, cache=True)
    assert a.run("weather today?").output == "Sunny."
    assert a.run("weather today?").output == "Rainy." and model.calls == 2 and store_rows() == []
    model.script += [say("Cloudy.")]
    a = eg.Agent("w2", "openai:scripted", "", [], base_url=model.openai_url, journal=journal, cache=True,
                 answers_ttl=60)
    assert a.run("weather today?").output == "Cloudy."
    assert a.run("weather today?").output == "Cloudy." and model.calls == 3  # within its ttl
    (entry,) = store_rows()
    store = a._store(journal)
    store._exec("UPDATE engrain_cache_entries SET created = created - 61 WHERE id = ?", (entry.id,))
    store._parsed.clear()
    model.script += [say("Snow.")]
    assert a.run("weather today?").output == "Snow." and model.calls == 4  # expired: asked again
    with pytest.raises(eg.ConfigError, match="answers_ttl"):
        eg.Agent("w3", "openai:m", answers_ttl=0)


def test_savings_per_run_and_in_total(model, journal):
    box = Mailbox()
    model.script = [tool_call("send_email", to="di@example.com", subject="Hi"), say("Sent.")]
    a = _agent(model, journal, [box.send_email])
    first = a.run("email Di")
    events: list[dict] = []
    hit = a.run("email Di", on_event=events.append)
    store = a._store(journal)
    (made,) = store.savings(run_id=first.run_id)
    (saved,) = store.savings(run_id=hit.run_id)
    assert made["calls_made"] == 2 and made["cache_calls"] == 0
    usage = [body for _, body in model.requests]
    assert saved["calls_made"] == 0 and saved["cache_calls"] == 2
    assert saved["input_tokens"] > 0 and saved["output_tokens"] > 0 and saved["model_seconds"] > 0
    assert {"type": "cache", "saved": {k: v for k, v in saved.items() if k not in ("run_id", "agent", "ts")}} in events
    total = store.savings_total()
    assert total["calls_made"] == 2 and total["cache_calls"] == 2 and total["runs"] == 2 and usage


class Crash(BaseException):
    """Stands for the process dying inside a tool."""


def test_a_resumed_run_counts_the_calls_it_did_not_pay_twice(model, journal):
    crash = {"on": True}

    def charge(order: int) -> str:
        """Charge an order."""
        if crash["on"]:
            raise Crash()
        return f"charged {order}"

    model.script = [tool_call("charge", order=7), say("Charged.")]
    a = eg.Agent("payer", "openai:scripted", "", [charge], base_url=model.openai_url, journal=journal)
    with pytest.raises(Crash):
        a.run("charge order 7", run_id="resume-me")
    crash["on"] = False
    assert a.run("charge order 7", run_id="resume-me").output == "Charged." and model.calls == 2
    (row,) = a._store(journal).savings(run_id="resume-me")
    # the first call was paid by the attempt the crash cut short, and not paid again
    assert row["resumed_calls"] == 1 and row["calls_made"] == 2 and row["input_tokens"] > 0


# -- reworded tasks: a similar cached task is proposed as a plan, never replayed -----------------------


def _plans(body: dict) -> list[list]:
    system = body["messages"][0]["content"]
    return [json.loads(x.split("</plan>", 1)[0]) for x in system.split("<plan>")[1:]]


class Office:
    def __init__(self) -> None:
        self.contacts = {"Bob": "bob@example.com", "Carol": "carol@example.com"}
        self.log: list[tuple] = []
        self.files: dict[str, str] = {}

    def search_contacts(self, name: str) -> dict:
        """Find a contact's address."""
        self.log.append(("search", name))
        return {"name": name, "email": self.contacts[name]}

    def send_email(self, to: str, subject: str) -> dict:
        """Send an email."""
        self.log.append(("send", to, subject))
        return {"id": f"msg_{token(12)}", "to": to, "sent_at": _now()}

    def create_file(self, name: str) -> dict:
        """Create a file."""
        fid = str(uuid.uuid4())
        self.files[fid] = ""
        self.log.append(("create", name))
        return {"file_id": fid, "name": name, "created_at": _now()}

    def append_to_file(self, file_id: str, text: str) -> dict:
        """Append to a file."""
        self.log.append(("append", file_id in self.files, text))
        if file_id not in self.files:
            return {"error": "no such file"}
        self.files[file_id] += text
        return {"file_id": file_id, "size": len(self.files[file_id])}


def _policy(name: str):
    """Play 'email <name> the report' step by step from what the conversation shows."""

    def respond(api, body):
        tools = [json.loads(m["content"]) for m in body["messages"] if m["role"] == "tool"
                 and not m["content"].startswith("error:")]
        if not tools:
            return tool_call("search_contacts", name=name)
        if len(tools) == 1:
            return tool_call("send_email", to=tools[0]["email"], subject="Sales report")
        return say(f"Sent to {tools[-1]['to']}.")

    return respond


def test_a_reworded_task_takes_the_proposed_plan_in_one_reply(model, journal, embedder):
    office = Office()
    a = _agent(model, journal, [office.search_contacts, office.send_email], embedder=embedder)
    model.script = _policy("Bob")
    assert a.run("Email Bob the sales report").output == "Sent to bob@example.com." and model.calls == 3

    def accept(api, body):
        plans = _plans(body)
        if plans and not any(m["role"] == "tool" for m in body["messages"]):
            return tool_calls(*[(c["name"], c["arguments"]) for g in plans[0] for c in g])
        return _policy("Bob")(api, body)

    model.script = accept
    events: list[dict] = []
    res = a.run("Send the sales report to Bob by email", on_event=events.append)
    assert res.output == "Sent to bob@example.com." and model.calls == 5  # 2 calls instead of 3
    assert office.log[-2:] == [("search", "Bob"), ("send", "bob@example.com", "Sales report")]  # in the plan's order
    assert {"type": "cache", "plan": "followed", "similar": events[0]["similar"][0]} in events
    body = model.requests[3][1]
    assert "Similar tasks were done before" in body["messages"][0]["content"]
    assert _plans(body)[0] == [[{"name": "search_contacts", "arguments": {"name": "Bob"}}],
                               [{"name": "send_email", "arguments": {"to": "bob@example.com",
                                                                     "subject": "Sales report"}}]]
    # the run's own trajectory is cached as it ran, group by group: the same wording again is a full hit
    assert a.run("Send the sales report to Bob by email").output == "Sent to bob@example.com." and model.calls == 5
    assert office.log[-2:] == [("search", "Bob"), ("send", "bob@example.com", "Sales report")]


def test_an_edited_plan_never_runs_a_call_built_on_a_result_that_changed(model, journal, embedder):
    office = Office()
    a = _agent(model, journal, [office.search_contacts, office.send_email], embedder=embedder)
    model.script = _policy("Bob")
    a.run("Email Bob the sales report")

    def edit(api, body):  # swaps the name in the plan, keeping the address it cannot know yet
        plans = _plans(body)
        if plans and not any(m["role"] == "tool" for m in body["messages"]):
            return tool_calls(*[(c["name"], json.loads(json.dumps(c["arguments"]).replace("Bob", "Carol")))
                                for g in plans[0] for c in g])
        return _policy("Carol")(api, body)

    model.script = edit
    events: list[dict] = []
    res = a.run("Email Carol the sales report", on_event=events.append)
    assert res.output == "Sent to carol@example.com."
    assert ("send", "bob@example.com", "Sales report") not in office.log[2:]  # never sent to the old address
    assert office.log[-2:] == [("search", "Carol"), ("send", "carol@example.com", "Sales report")]
    skipped = [e for e in events if e["type"] == "tool_result" and e["content"].startswith("error: not run")]
    assert len(skipped) == 1 and skipped[0]["name"] == "send_email"
    # a plan ignored costs nothing extra: the model's own first step
    model.script = _policy("Carol")
    before = model.calls
    assert a.run("Please email the sales report to Carol").output == "Sent to carol@example.com."
    assert model.calls - before == 3


def test_a_followed_plan_carries_a_minted_id_and_an_exact_replay_of_it_too(model, journal, embedder):
    office = Office()
    a = _agent(model, journal, [office.create_file, office.append_to_file], embedder=embedder)

    def write(api, body):
        plans = _plans(body)
        tools = [json.loads(m["content"]) for m in body["messages"] if m["role"] == "tool"]
        if plans and not tools:
            return tool_calls(*[(c["name"], c["arguments"]) for g in plans[0] for c in g])
        if not tools:
            return tool_call("create_file", name="todo.txt")
        if len(tools) == 1:
            return tool_call("append_to_file", file_id=tools[0]["file_id"], text="milk")
        return say(f"Wrote {tools[-1].get('size', 'no')} bytes.")

    model.script = write
    assert a.run("Create todo.txt and write milk in it").output == "Wrote 4 bytes." and model.calls == 3
    assert a.run("Make a file todo.txt containing milk").output == "Wrote 4 bytes." and model.calls == 5
    # its trajectory (two groups, then the answer) replays whole; max_turns counts model calls, not replayed turns
    b = _agent(model, journal, [office.create_file, office.append_to_file], embedder=embedder, max_turns=2)
    assert b.run("Make a file todo.txt containing milk").output == "Wrote 4 bytes." and model.calls == 5
    assert [e for e in office.log if e[0] == "append"] == [("append", True, "milk")] * 3


def test_no_embedder_no_plans(model, journal):
    office = Office()
    a = _agent(model, journal, [office.search_contacts, office.send_email])
    model.script = _policy("Bob")
    a.run("Email Bob the sales report")
    a.run("Send the sales report to Bob by email")
    assert model.calls == 6 and not any(_plans(b) for _, b in model.requests)


def test_cli_shows_savings(model, journal, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    if journal.backend != "sqlite":
        pytest.skip("the CLI reads the same tables on both backends; one is enough here")
    box = Mailbox()
    model.script = [tool_call("send_email", to="ed@example.com", subject="Hi"), say("Sent.")]
    a = _agent(model, journal, [box.send_email])
    a.run("email Ed")
    hit = a.run("email Ed")
    a._store(journal).flush()
    engrain = str(Path(sys.executable).with_name("engrain"))
    out = subprocess.run([engrain, "cache", "stats", "--url", journal.url], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "LLM calls over 2 agent runs: 2 made, 2 avoided (50.0% of 4): 2 replayed from the cache" in out.stdout
    js = subprocess.run([engrain, "cache", "stats", "--url", journal.url, "--json"], capture_output=True, text=True,
                        timeout=60)
    assert json.loads(js.stdout)["savings"]["cache_calls"] == 2
    per = subprocess.run([engrain, "cache", "savings", "--run", hit.run_id, "--url", journal.url, "--json"],
                         capture_output=True, text=True, timeout=60)
    (row,) = json.loads(per.stdout)
    assert row["cache_calls"] == 2 and row["calls_made"] == 0 and row["input_tokens"] > 0
    none = subprocess.run([engrain, "cache", "savings", "--run", "nope", "--url", journal.url], capture_output=True,
                          text=True, timeout=60)
    assert none.returncode == 1 and "no savings recorded for run 'nope'" in none.stderr


def test_answers_ttl_over_http(tmp_path, model, monkeypatch):
    import httpx

    from tests.servers import serve

    monkeypatch.setenv("OPENAI_BASE_URL", model.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", "scripted")
    model.script = [say("Sunny.")]
    with serve(f"sqlite:///{tmp_path / 's.db'}", tmp_path, token="t") as base, eg.Client(base, token="t") as c:
        made = c.create_agent("weather", "openai:scripted", cache=True, answers_ttl=3600)
        assert made["answers_ttl"] == 3600
        assert c.create_agent("plain", "openai:scripted")["answers_ttl"] is None
        for _ in range(2):
            assert c.run_agent("weather", "weather today?").output == "Sunny."
        assert model.calls == 1  # the second answer came from the cache, within its ttl
        r = httpx.post(f"{base}/api/agents", json={"name": "w2", "model": "openai:m", "answers_ttl": 0},
                       headers={"Authorization": "Bearer t"})
        assert r.status_code == 422


def test_a_run_cut_short_inside_a_followed_plan_resumes_without_redoing_it(model, journal, embedder):
    office = Office()
    crash = {"on": False}

    def send_email(to: str, subject: str) -> dict:
        """Send an email."""
        if crash["on"]:
            crash["on"] = False
            raise Crash()
        return office.send_email(to, subject)

    a = _agent(model, journal, [office.search_contacts, send_email], embedder=embedder)
    model.script = _policy("Bob")
    a.run("Email Bob the sales report")

    def accept(api, body):
        plans = _plans(body)
        if plans and not any(m["role"] == "tool" for m in body["messages"]):
            return tool_calls(*[(c["name"], c["arguments"]) for g in plans[0] for c in g])
        return _policy("Bob")(api, body)

    model.script = accept
    crash["on"] = True
    with pytest.raises(Crash):
        a.run("Send the sales report to Bob by email", run_id="plan-cut")
    assert model.calls == 4 and office.log[-1] == ("search", "Bob")
    res = a.run("Send the sales report to Bob by email", run_id="plan-cut")
    assert res.output == "Sent to bob@example.com." and model.calls == 5  # the plan's reply was not paid twice
    assert office.log[-2:] == [("search", "Bob"), ("send", "bob@example.com", "Sales report")]
    assert [e for e in office.log if e[0] == "search"] == [("search", "Bob")] * 2  # not searched again on resume
    (row,) = a._store(journal).savings(run_id="plan-cut")
    assert row["resumed_calls"] == 1 and row["calls_made"] == 2  # the plan's reply paid once, before the crash
