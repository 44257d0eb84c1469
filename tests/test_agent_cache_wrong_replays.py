"""Adversarial cases for the agent cache's default comparison of volatile results: each one is a
difference that looks generated (an id, a stamp) but that the model's next step depended on, so a
replay must end there and the model be asked again. A real store and a scripted model over the
official SDK, as in tests/test_agent_cache.py.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid

import pytest

import engrain as eg
from minted import token

from engrain._agent.scripted import Reply, ScriptedModel, say, tool_call, tool_calls
from engrain._agent.volatile import Replayer


@pytest.fixture
def model():
    m = ScriptedModel().start()
    yield m
    m.stop()


def _agent(model, journal, tools, **kw) -> eg.Agent:
    return eg.Agent(f"a{uuid.uuid4().hex[:6]}", "openai:scripted", "Work.", list(tools), base_url=model.openai_url,
                    journal=journal, cache=True, **kw)


def _parse(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def _results(body: dict) -> list:
    return [_parse(m["content"]) for m in body["messages"] if m["role"] == "tool"
            and not m["content"].startswith("error:")]


def _drive():
    """``(files, create_file)``: a tool minting a UUID per file, and the names it created by id."""
    files: dict[str, str] = {}

    def create_file(name: str) -> dict:
        """Create a file."""
        fid = str(uuid.uuid4())
        files[fid] = name
        return {"file_id": fid, "name": name}

    return files, create_file


def _iso(t: float, zone: bool = True) -> str:
    d = dt.datetime.fromtimestamp(t, dt.timezone.utc)
    return d.isoformat() if zone else d.replace(tzinfo=None).isoformat()


def _twice(model, agent, task: str, change) -> tuple[str, int]:
    """Run ``task`` (filling the cache), apply ``change``, run it again; the second answer and the
    model calls it made."""
    agent.run(task)
    before = model.calls
    change()
    out = agent.run(task).output
    return out, model.calls - before


def test_a_status_inside_an_id_is_not_a_generated_difference(model, journal):
    state = {"status": "approved"}

    def charge(order: str) -> dict:
        """Charge an order."""
        return {"charge": f"ch_{state['status']}_{token(8)}", "order": order}

    model.script = lambda api, body: (
        tool_call("charge", order="o-1") if not _results(body)
        else say("Charged." if "_approved_" in _results(body)[0]["charge"] else "The card was declined."))
    a = _agent(model, journal, [charge])
    out, calls = _twice(model, a, "charge order o-1", lambda: state.update(status="declined"))
    assert out == "The card was declined." and calls == 1


def test_a_code_that_differs_in_a_few_characters_is_not_a_fresh_id(model, journal):
    sku = {"v": "PHONE15PRO256GB01"}

    def add_to_cart(product: str) -> dict:
        """Add a product to the cart."""
        return {"added": sku["v"], "cart_id": f"cart_{token(10)}"}

    model.script = lambda api, body: (
        tool_call("add_to_cart", product="phone 15 pro 256") if not _results(body)
        else say("Added the 256 GB phone." if "256" in _results(body)[0]["added"] else "Wrong variant added."))
    a = _agent(model, journal, [add_to_cart])
    out, calls = _twice(model, a, "add the 256 GB phone to my cart", lambda: sku.update(v="PHONE15PRO512GB01"))
    assert out == "Wrong variant added." and calls == 1


def test_an_all_digit_number_is_never_taken_for_a_generated_id(model, journal):
    card = {"v": "4111111111111111"}

    def default_card() -> dict:
        """The customer's default card."""
        return {"card": card["v"], "request_id": str(uuid.uuid4())}

    model.script = lambda api, body: (
        tool_call("default_card") if not _results(body) else say(f"Your card ends in {_results(body)[0]['card'][-4:]}."))
    a = _agent(model, journal, [default_card])
    out, calls = _twice(model, a, "which card will you charge?", lambda: card.update(v="4242424242424242"))
    assert out == "Your card ends in 4242." and calls == 1


@pytest.mark.parametrize("form", ["upper", "prefix", "url"])
def test_a_minted_id_the_model_used_in_another_form_ends_the_replay(model, journal, form):
    files, create_file = _drive()
    opened: list[str] = []

    def open_link(link: str) -> str:
        """Open a link to a file."""
        opened.append(link)
        return "opened" if any(f in link.lower() or link.startswith(f"ref:{f[:8]}") for f in files) else "not found"

    def ref(fid: str) -> str:
        return {"upper": f"https://drive.example/f/{fid.upper()}", "prefix": f"ref:{fid[:8]}",
                "url": f"https://drive.example/f?id={fid.replace('-', '')}"}[form]

    def script(api, body):
        res = _results(body) if body["messages"][-1]["role"] == "tool" else []
        tools = [m for m in body["messages"] if m["role"] == "tool"]
        if not tools:
            return tool_call("create_file", name="plan.txt")
        if len(tools) == 1:
            return tool_call("open_link", link=ref(res[0]["file_id"]))
        return say("Done.")

    model.script = script
    a = _agent(model, journal, [create_file, open_link])
    a.run("create plan.txt and open it")
    a.run("create plan.txt and open it")
    fids = list(files)
    assert opened[-1] == ref(fids[-1])  # the second run opened the file it created, not the first run's


@pytest.mark.parametrize("shape", ["iso", "naive", "epoch"])
def test_a_record_stamp_the_model_judged_is_not_a_stamp_of_the_call(model, journal, shape):
    updated = {"t": time.time() - 10 * 86400}
    comments: list[str] = []

    def get_ticket(ticket: str) -> dict:
        """A support ticket."""
        t = updated["t"]
        stamp = _iso(t) if shape == "iso" else _iso(t, zone=False) if shape == "naive" else int(t)
        return {"ticket": ticket, "status": "open", "updated_at": stamp}

    def comment(ticket: str, text: str) -> str:
        """Comment on a ticket."""
        comments.append(text)
        return "ok"

    def script(api, body):
        res = _results(body)
        if not res:
            return tool_call("get_ticket", ticket="T-1")
        if len(res) == 1:
            u = res[0]["updated_at"]
            t = u if isinstance(u, int) else dt.datetime.fromisoformat(u).replace(tzinfo=dt.timezone.utc).timestamp()
            if time.time() - t > 7 * 86400:
                return tool_call("comment", ticket="T-1", text="Escalating: no activity for a week.")
            return say("T-1 is active.")
        return say("Escalated T-1.")

    model.script = script
    a = _agent(model, journal, [get_ticket, comment])
    out, calls = _twice(model, a, "escalate T-1 if it went quiet", lambda: updated.update(t=time.time() - 3600))
    assert out == "T-1 is active." and comments == ["Escalating: no activity for a week."] and calls == 1


def test_a_quote_that_went_stale_is_not_replayed_as_fresh(model, journal):
    feed = {"lag": 0.0}
    bought: list[float] = []

    def get_quote(symbol: str) -> dict:
        """The latest quote."""
        return {"symbol": symbol, "price": 100.0, "as_of": _iso(time.time() - feed["lag"])}

    def buy(symbol: str, price: float) -> str:
        """Buy one share at a limit price."""
        bought.append(price)
        return "filled"

    def script(api, body):
        res = _results(body)
        if not res:
            return tool_call("get_quote", symbol="ACME")
        if len(res) == 1:
            age = time.time() - dt.datetime.fromisoformat(res[0]["as_of"]).timestamp()
            return tool_call("buy", symbol="ACME", price=100.0) if age < 900 else say("The quote is stale; no trade.")
        return say("Bought ACME at 100.0.")

    model.script = script
    a = _agent(model, journal, [get_quote, buy])
    out, calls = _twice(model, a, "buy ACME if the quote is fresh", lambda: feed.update(lag=7200))
    assert out == "The quote is stale; no trade." and bought == [100.0] and calls == 1


def test_write_stamps_of_the_call_still_do_not_end_a_replay(model, journal):
    sent: list[str] = []

    def send_email(to: str) -> dict:
        """Send an email."""
        sent.append(to)
        now = time.time()
        return {"id": f"msg_{token(12)}", "to": to, "sent_at": _iso(now), "created": int(now),
                "uuid": str(uuid.uuid4()), "timestamp": _iso(now, zone=False)}

    model.script = [tool_call("send_email", to="ann@example.com"), say("Sent.")]
    a = _agent(model, journal, [send_email])
    a.run("email Ann")
    assert a.run("email Ann").output == "Sent." and model.calls == 2 and len(sent) == 2


def test_a_volatile_field_is_never_substituted_into_unrelated_text(model, journal):
    etag = iter(str(i) for i in range(3, 100))
    sent: list[str] = []

    @eg.tool(volatile=["etag"])
    def get_report(name: str) -> dict:
        """A report."""
        return {"name": name, "etag": next(etag)}

    def send_email(to: str, subject: str) -> str:
        """Send an email."""
        sent.append(subject)
        return "sent"

    model.script = lambda api, body: (
        tool_call("get_report", name="q3") if not _results(body)
        else tool_call("send_email", to="cfo@example.com", subject="Q3 report") if len(_results(body)) == 1
        else say("Sent the Q3 report."))
    a = _agent(model, journal, [get_report, send_email])
    a.run("send the CFO the Q3 report")
    a.run("send the CFO the Q3 report")
    assert sent == ["Q3 report", "Q3 report"]  # never "Q4 report": the etag went 3 -> 4


def test_a_volatile_value_the_model_copied_is_not_replayed_stale(model, journal):
    version = current = {"v": 7}
    saved: list[int] = []

    @eg.tool(volatile=["version"])
    def get_doc(doc: str) -> dict:
        """A document and its version."""
        return {"doc": doc, "version": version["v"]}

    def save_doc(doc: str, text: str, version: int) -> str:
        """Save a document if it is still at ``version``."""
        saved.append(version)
        return "saved" if version == current["v"] else "conflict"

    model.script = lambda api, body: (
        tool_call("get_doc", doc="d1") if not _results(body)
        else tool_call("save_doc", doc="d1", text="hi", version=_results(body)[0]["version"]) if len(_results(body)) == 1
        else say("Saved."))
    a = _agent(model, journal, [get_doc, save_doc])
    a.run("write hi into d1")
    version["v"] = 8
    a.run("write hi into d1")
    assert saved == [7, 8]


def test_a_value_the_session_named_is_never_volatile():
    turns = [{"reply": {"text": "", "tool_calls": [{"id": "1", "name": "t", "arguments": "{}"}], "ts": "x"},
              "results": [json.dumps({"order": "ord_a1b2c3d4e5f6", "state": "open"})]},
             {"reply": {"text": "It is open.", "tool_calls": []}, "results": []}]
    fresh = [json.dumps({"order": "ord_9z8y7x6w5v4u", "state": "open"})]
    assert Replayer(turns, "is my order open?").matches(0, ["t"], fresh, {})
    assert not Replayer(turns, "is my order open?", ["My order is ORD_A1B2C3D4E5F6."]).matches(0, ["t"], fresh, {})
    assert not Replayer(turns, "is my order open?", ["Mine is ord_9z8y7x6w5v4u."]).matches(0, ["t"], fresh, {})


def _editing(old: str, new: str, otherwise):
    """A model that takes the first proposed plan with ``new`` put in place of ``old`` in its arguments
    (it cannot know the results yet), and plays ``otherwise`` after."""

    def respond(api, body):
        system = body["messages"][0]["content"]
        if "<plan>" in system and not any(m["role"] == "tool" for m in body["messages"]):
            plan = json.loads(system.split("<plan>")[1].split("</plan>")[0])
            return tool_calls(*[(c["name"], json.loads(json.dumps(c["arguments"]).replace(old, new)))
                                for g in plan for c in g])
        return otherwise(api, body)

    return respond


def test_an_edited_plan_never_runs_a_call_on_a_value_taken_from_a_result_in_another_case(model, journal, embedder):
    contacts = {"Bob": "Bob@Example.com", "Carol": "Carol@Example.com"}
    log: list[tuple] = []

    def search_contacts(name: str) -> dict:
        """Find a contact's address."""
        return {"name": name, "email": contacts[name]}

    def send_email(to: str, subject: str) -> dict:
        """Send an email."""
        log.append(("send", to))
        return {"id": f"msg_{token(12)}", "to": to}

    def policy(name):
        def respond(api, body):
            res = _results(body)
            if not res:
                return tool_call("search_contacts", name=name)
            if len(res) == 1:
                return tool_call("send_email", to=res[0]["email"].lower(), subject="Sales report")
            return say(f"Sent to {res[-1]['to']}.")
        return respond

    a = _agent(model, journal, [search_contacts, send_email], embedder=embedder)
    model.script = policy("Bob")
    a.run("Email Bob the sales report")

    model.script = _editing("Bob", "Carol", policy("Carol"))
    assert a.run("Email Carol the sales report").output == "Sent to carol@example.com."
    assert ("send", "bob@example.com") not in log[1:]


def test_a_replayed_plan_counts_the_model_calls_it_really_saved(model, journal, embedder):
    texts: dict[str, str] = {}
    files, create_file = _drive()

    def append_to_file(file_id: str, text: str) -> dict:
        """Append to a file."""
        texts[file_id] = texts.get(file_id, "") + text
        return {"file_id": file_id, "size": len(texts[file_id])}

    def write(api, body):
        system = body["messages"][0]["content"]
        res = _results(body)
        if "<plan>" in system and not res:
            plan = json.loads(system.split("<plan>")[1].split("</plan>")[0])
            return tool_calls(*[(c["name"], c["arguments"]) for g in plan for c in g])
        if not res:
            return tool_call("create_file", name="todo.txt")
        if len(res) == 1:
            return tool_call("append_to_file", file_id=res[0]["file_id"], text="milk")
        return say(f"Wrote {res[-1]['size']} bytes.")

    model.script = write
    a = _agent(model, journal, [create_file, append_to_file], embedder=embedder)
    a.run("Create todo.txt and write milk in it")
    made = a.run("Make a file todo.txt containing milk")  # follows the plan: 2 model calls
    hit = a.run("Make a file todo.txt containing milk")  # replays that run: it saved those 2 calls, not 3
    store = a._store(journal)
    (row_made,) = store.savings(run_id=made.run_id)
    (row_hit,) = store.savings(run_id=hit.run_id)
    assert row_made["calls_made"] == 2
    assert row_hit["calls_made"] == 0 and row_hit["cache_calls"] == 2


def test_a_reply_of_only_whitespace_is_an_empty_reply(model, journal):
    model.script = [say(" \n"), say("Here it is.")]
    a = eg.Agent("ws", "openai:scripted", "", [], base_url=model.openai_url, journal=journal)
    assert a.run("hi").output == "Here it is." and model.calls == 2
    model.script += [Reply(text="\n\n"), say("  ")]
    res = a.run("hi again")
    assert res.status == "failed" and "empty reply" in res.error


def test_an_edited_plan_is_judged_against_the_plan_it_edited():
    from engrain._agent.cache import plan_followed

    def plan(task: str, to: str) -> dict:
        calls = [{"id": "1", "name": "search_contacts", "arguments": json.dumps({"name": task.split()[1]})},
                 {"id": "2", "name": "send_email", "arguments": json.dumps({"to": to, "subject": "Report"})}]
        return {"entry": task, "task": task, "turns": [
            {"reply": {"text": "", "tool_calls": calls[:1]}, "results": [json.dumps({"email": to})]},
            {"reply": {"text": "", "tool_calls": calls[1:]}, "results": ["sent"]},
            {"reply": {"text": "Sent.", "tool_calls": []}, "results": []}]}

    nearest, other = plan("Email Bob the report", "team@example.com"), plan("Email Carol the report", "carol@x.org")
    edited = [{"id": "a", "name": "search_contacts", "arguments": json.dumps({"name": "Carol"})},
              {"id": "b", "name": "send_email", "arguments": json.dumps({"to": "carol@x.org", "subject": "Weekly"})}]
    assert plan_followed([nearest, other], edited) is other  # its stale address came from that plan's results
    assert plan_followed([nearest, other], [{**c, "arguments": json.dumps({"x": 1})} for c in edited]) is nearest


@pytest.mark.parametrize("where", ["same result", "earlier result"])
def test_an_id_the_model_compared_with_another_is_not_a_fresh_draw(model, journal, where):
    sha = {"deployed": uuid.uuid4().hex + "0a1b2c3d", "latest": None}
    sha["latest"] = sha["deployed"]
    deploys: list[str] = []

    def get_release(repo: str) -> dict:
        """The deployed and the latest commit of a repository."""
        return {"repo": repo, "deployed": sha["deployed"], "latest": sha["latest"]}

    def get_deployed(repo: str) -> dict:
        """The deployed commit."""
        return {"repo": repo, "sha": sha["deployed"]}

    def get_latest(repo: str) -> dict:
        """The latest commit."""
        return {"repo": repo, "sha": sha["latest"]}

    def deploy(repo: str, commit: str) -> str:
        """Deploy a commit."""
        deploys.append(commit)
        return "deployed"

    def script(api, body):
        res = _results(body)
        if where == "same result":
            if not res:
                return tool_call("get_release", repo="shop")
            deployed, latest = res[0]["deployed"], res[0]["latest"]
        else:
            if not res:
                return tool_call("get_deployed", repo="shop")
            if len(res) == 1:
                return tool_call("get_latest", repo="shop")
            deployed, latest = res[0]["sha"], res[1]["sha"]
        if deployed == latest:
            return say("Already up to date.")
        if len(res) == (1 if where == "same result" else 2):
            return tool_call("deploy", repo="shop", commit=latest)
        return say("Deployed.")

    model.script = script
    a = _agent(model, journal, [get_release, get_deployed, get_latest, deploy])
    out, calls = _twice(model, a, "deploy shop if it is behind", lambda: sha.update(latest=uuid.uuid4().hex + "9f8e7d6c"))
    assert out == "Deployed." and deploys == [sha["latest"]]


def test_stamps_of_the_call_that_came_in_another_order_end_the_replay(model, journal):
    flip = {"on": False}

    def send_all(to: list[str]) -> list[dict]:
        """Send an email to each address (in parallel: the order they go out varies)."""
        now = time.time()
        gaps = [0.0, 0.5] if not flip["on"] else [0.5, 0.0]
        return [{"to": t, "sent_at": _iso(now + g)} for t, g in zip(to, gaps)]

    def script(api, body):
        res = _results(body)
        if not res:
            return tool_call("send_all", to=["ann@example.com", "bob@example.com"])
        last = max(res[0], key=lambda m: m["sent_at"])["to"]
        return say(f"The last email went to {last.split('@')[0].title()}.")

    model.script = script
    a = _agent(model, journal, [send_all])
    out, calls = _twice(model, a, "email Ann and Bob; who got theirs last?", lambda: flip.update(on=True))
    assert out == "The last email went to Ann." and calls == 1


def test_an_edited_plan_never_runs_a_call_that_wraps_a_stale_result(model, journal, embedder):
    files, create_file = _drive()
    shared: list[str] = []

    def share(link: str) -> str:
        """Share a link with the team."""
        shared.append(link)
        return "shared"

    def policy(name):
        def respond(api, body):
            res = _results(body)
            if not res:
                return tool_call("create_file", name=name)
            if len(res) == 1:
                return tool_call("share", link=f"https://drive.example/f/{res[0]['file_id']}")
            return say(f"Shared {name}.")
        return respond

    a = _agent(model, journal, [create_file, share], embedder=embedder)
    model.script = policy("notes.txt")
    a.run("Create notes.txt and share it with the team")

    model.script = _editing("notes", "todo", policy("todo.txt"))
    assert a.run("Create todo.txt and share it with the team").output == "Shared todo.txt."
    todo = [f for f, n in files.items() if n == "todo.txt"]
    assert shared[1:] == [f"https://drive.example/f/{todo[0]}"]  # never the link to notes.txt


class Crash(BaseException):
    """Stands for the process dying inside a tool."""


def test_a_replay_resumed_later_decides_as_the_first_attempt_did(model, journal, monkeypatch):
    from engrain._agent import volatile

    crash = {"on": False}
    notes: list[str] = []

    def send_email(to: str) -> dict:
        """Send an email."""
        return {"id": f"msg_{token(12)}", "to": to, "sent_at": _iso(time.time())}

    def note(text: str) -> str:
        """Write a note."""
        if crash["on"]:
            crash["on"] = False
            raise Crash()
        notes.append(text)
        return "noted"

    model.script = [tool_call("send_email", to="ann@example.com"), tool_call("note", text="mailed Ann"), say("Done.")]
    a = _agent(model, journal, [send_email, note])
    a.run("email Ann and note it")
    crash["on"] = True
    with pytest.raises(Crash):
        a.run("email Ann and note it", run_id="replay-cut")

    class Later:  # the resume comes an hour later: the journaled stamps are old by then
        @staticmethod
        def time() -> float:
            return time.time() + 3600

    monkeypatch.setattr(volatile, "time", Later)
    res = a.run("email Ann and note it", run_id="replay-cut")
    assert res.status == "ok" and res.output == "Done." and model.calls == 3
    assert notes == ["mailed Ann", "mailed Ann"]


def test_calls_paid_for_empty_replies_and_by_failed_runs_are_counted(model, journal):
    model.script = [Reply(), say("Here it is.")]
    a = eg.Agent("counted", "openai:scripted", "", [], base_url=model.openai_url, journal=journal, cache=True)
    ok = a.run("hi")
    model.script += [Reply(), Reply()]
    failed = a.run("hi again")

    def ping() -> str:
        """Ping."""
        return "pong"

    b = eg.Agent("looper", "openai:scripted", "", [ping], base_url=model.openai_url, journal=journal, cache=True,
                 max_turns=2)
    model.script += [tool_call("ping"), tool_call("ping")]
    looped = b.run("ping forever")
    assert failed.status == looped.status == "failed" and model.calls == 6
    store = a._store(journal)
    assert [store.savings(run_id=r.run_id)[0]["calls_made"] for r in (ok, failed, looped)] == [2, 2, 2]
