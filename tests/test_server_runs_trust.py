"""The run views trust no client-written event: a malformed run never breaks them, a client run never
poses as the runtime's, and a long run's page is bounded.

* A client writes its own runs' events, so a ``call_id`` may be any JSON value: the step fold and
  the pending prompt skip one that is not an integer (an object or a list made ``GET /api/runs/{id}``
  a 500), and the append refuses an object or a list there (422 naming the event and field).
* A LangGraph thread's checkpoint summary is whatever its writer stored: ``channels`` is passed on
  only as a list of strings (the UI joined it: a string broke the thread's page).
* A client run is always kind ``run`` (tagged ``engrain.cache`` it was hidden as internal), may not
  wear the runtime's tags, and may not be created at the ids the runtime keeps its state at
  (``agentdef:squat`` made ``POST /api/agents {"name": "squat"}`` a 409 for ever).
* ``GET /api/runs/{id}`` sends a bounded view (first events, last events, counts): a run of 50,000
  events answered 12 MB and its page drew every row for over a minute.
"""

from __future__ import annotations

import os

import pytest
from fastapi.testclient import TestClient

import engrain as eg
from engrain._server import create_app
from engrain._server.runs import fold_steps, pending_prompt

LOCAL = "http://127.0.0.1:8765"


@pytest.fixture
def api(store_url, tmp_path):
    with TestClient(create_app(store_url, routines_dir=tmp_path / "routines"), base_url=LOCAL) as c:
        yield c


def _stored(journal, run_id: str, tags: list[str], *later: tuple[str, str, dict]) -> None:
    """A run as it may already sit in the store (written before the endpoint refused it, or by the runtime)."""
    journal.append(run_id, [eg.NewEvent("run.started", "", {"task": "t", "inputs": {}, "tags": tags}),
                            *(eg.NewEvent(k, n, d) for k, n, d in later)], 0)


# -- 5: a call_id that names no step ---------------------------------------------------------------


@pytest.mark.parametrize("bad", [{"a": 1}, [1]], ids=["object", "list"])
def test_a_run_whose_call_id_is_an_object_or_a_list_still_opens(api, journal, bad):
    _stored(journal, "cl-type", ["client"],
            ("step.started", "s", {"call_id": 0, "args": {}}),
            ("step.completed", "s", {"call_id": bad, "result": 1}),
            ("step.failed", "s", {"call_id": bad, "message": "x"}),
            ("input.requested", "q", {"call_id": bad, "prompt": "?", "fields": [], "at_most_once": True}),
            ("input.received", "q", {"call_id": bad, "answers": {}}),
            ("input.requested", "q", {"call_id": 1, "prompt": "go?", "fields": []}))
    r = api.get("/api/runs/cl-type")
    assert r.status_code == 200, r.text
    body = r.json()
    # The malformed events fold into nothing: step 0 stays started, step 1's question stays open.
    assert [(s["call_id"], s["state"]) for s in body["steps"]] == [(0, "started"), (1, "waiting")]
    assert body["prompt"]["call_id"] == 1
    events = journal.read("cl-type")
    assert [s["call_id"] for s in fold_steps(events)] == [0, 1]
    assert pending_prompt(events)["prompt"] == "go?"


@pytest.mark.parametrize("kind", ["step.completed", "step.failed", "input.received", "input.requested"])
def test_the_append_refuses_a_call_id_that_is_an_object_or_a_list(api, kind):
    events = [{"kind": "run.started", "data": {"task": "t"}}, {"kind": kind, "data": {"call_id": {"a": 1}}}]
    r = api.post("/api/runs/cl-obj/events", json={"events": events, "expected_seq": 0})
    assert r.status_code == 422, r.text
    assert "events[1].data.call_id" in r.json()["detail"]
    assert api.get("/api/runs/cl-obj").status_code == 404  # nothing stored
    # A scalar that names no step stays a client's to write (every reader skips it).
    events[1]["data"]["call_id"] = "x"
    assert api.post("/api/runs/cl-obj/events", json={"events": events, "expected_seq": 0}).status_code == 200


# -- 6: a thread's channels --------------------------------------------------------------------------


def test_a_threads_channels_are_passed_on_only_as_a_list_of_strings(api, journal):
    _stored(journal, "langgraph:t-str", ["langgraph"],
            ("log.entry", "checkpoint", {"id": "c1", "summary": {"step": 1, "source": "loop", "channels": "messages"}}),
            ("log.entry", "checkpoint", {"id": "c2", "summary": {"step": 2, "source": "loop", "channels": [1, {"a": 2}]}}),
            ("log.entry", "checkpoint", {"id": "c3", "summary": {"step": 3, "source": "loop", "channels": ["messages"]}}))
    log = api.get("/api/runs/langgraph:t-str").json()["log"]
    assert log["kind"] == "thread"
    assert [(c["id"], c["channels"]) for c in log["history"]] == [("c3", ["messages"]), ("c2", []), ("c1", [])]


# -- 7: a client run never poses as the runtime's --------------------------------------------------


def test_a_client_run_is_always_kind_run(api, journal):
    # Stored before the endpoint refused these tags: still listed as what it is, a client's run.
    _stored(journal, "cl-cache", ["engrain.cache", "client"])
    _stored(journal, "langgraph:cl", ["langgraph", "client"],
            ("log.entry", "checkpoint", {"id": "c1", "summary": {"channels": "x"}}))
    _stored(journal, "real-cache", ["engrain.cache"])
    rows = {r["run_id"]: r["kind"] for r in api.get("/api/runs").json()}
    assert rows == {"cl-cache": "run", "langgraph:cl": "run", "real-cache": "internal"}
    shown = {r["run_id"] for r in api.get("/api/runs", params={"internal": "false"}).json()}
    assert shown == {"cl-cache", "langgraph:cl"}
    assert api.get("/api/runs/langgraph:cl").json()["log"] is None


@pytest.mark.parametrize("tag", ["engrain.cache", "llm-agent-definition", "llm-agent-api", "langgraph",
                                 "openai-agents", "agent:support", "routine", "client"])
def test_a_client_run_may_not_wear_a_runtime_tag(api, tag):
    events = [{"kind": "run.started", "data": {"task": "t", "tags": ["mine", tag]}}]
    r = api.post("/api/runs/cl-tag/events", json={"events": events, "expected_seq": 0})
    assert r.status_code == 403 and r.json()["error"] == "RuntimeOnlyError", r.text
    assert tag in r.json()["detail"]
    assert api.get("/api/runs/cl-tag").status_code == 404


@pytest.mark.parametrize("run_id", ["agentdef:squat", "chat:support:s-1:0", "langgraph:t-1", "openai-agents:s-1"])
def test_a_client_run_may_not_be_created_at_a_runtime_id(api, run_id):
    events = [{"kind": "run.started", "data": {"task": "t"}}]
    r = api.post(f"/api/runs/{run_id}/events", json={"events": events, "expected_seq": 0})
    assert r.status_code == 403 and r.json()["error"] == "RuntimeOnlyError", r.text
    assert run_id.split(":")[0] + ":" in r.json()["detail"]
    assert api.get(f"/api/runs/{run_id}").status_code == 404


def test_a_squatted_agent_name_stays_free(api):
    events = [{"kind": "run.started", "data": {"task": "t"}}]
    assert api.post("/api/runs/agentdef:squat/events", json={"events": events, "expected_seq": 0}).status_code == 403
    r = api.post("/api/agents", json={"name": "squat", "model": "openai:gpt-4.1-mini"})
    assert r.status_code == 201, r.text


# -- 4: a long run's page is bounded ------------------------------------------------------------------


def _long_run(api, run_id: str, steps: int) -> int:
    """A client run of ``steps`` completed steps (2 events each) after its start; its event count."""
    events = [{"kind": "run.started", "data": {"task": "long"}}]
    for i in range(steps):
        events.append({"kind": "step.started", "name": "s", "data": {"call_id": i, "args": {}}})
        events.append({"kind": "step.completed", "name": "s", "data": {"call_id": i, "result": i}})
    seq = 0
    for at in range(0, len(events), 1000):
        r = api.post(f"/api/runs/{run_id}/events", json={"events": events[at:at + 1000], "expected_seq": seq})
        assert r.status_code == 200, r.text
        seq += len(events[at:at + 1000])
    return seq


def test_a_long_runs_detail_is_bounded_and_counts_the_rest(api):
    total = _long_run(api, "long", 1500)  # 3001 events
    r = api.get("/api/runs/long")
    body = r.json()
    assert body["events_total"] == total and body["steps_total"] == 1500
    assert [e["seq"] for e in body["events"]] == list(range(1000))
    assert [e["seq"] for e in body["events_tail"]] == list(range(total - 100, total))
    assert [s["call_id"] for s in body["steps"]] == list(range(1000))
    assert body["steps"][999]["state"] == "completed"  # folded over every event, not only those sent
    # The gap is read through the paged endpoint; the limits are the caller's to choose.
    assert api.get("/api/runs/long/events", params={"after": 999, "limit": 5}).json()[0]["seq"] == 1000
    small = api.get("/api/runs/long", params={"events_limit": 10, "steps_limit": 3}).json()
    assert len(small["events"]) == 10 and len(small["events_tail"]) == 100 and len(small["steps"]) == 3
    # A run within the limit is sent whole, as before.
    _long_run(api, "short", 2)
    body = api.get("/api/runs/short").json()
    assert len(body["events"]) == 5 and body["events_tail"] == [] and body["events_total"] == 5


# -- a finished client run stays finished ----------------------------------------------------------

def test_an_append_after_a_client_runs_end_is_a_409_run_finished_error(api, journal):
    """The journal refuses any event after a run's end; over HTTP that is 409 ``RunFinishedError`` (nothing to retry,
    unlike a ConflictError), and the run stays as it ended: no steps after its outcome, never running again."""
    start = {"kind": "run.started", "data": {"task": "t", "inputs": {}, "tags": []}}
    done = {"kind": "run.completed", "data": {"output": 1}}
    assert api.post("/api/runs/cl-end/events", json={"events": [start, done], "expected_seq": 0}).status_code == 200
    step = {"kind": "step.completed", "name": "s", "data": {"call_id": 0, "result": 1}}
    alive = {"kind": "input.received", "name": "q", "data": {"call_id": 0, "answers": {}}}
    for events in ([step], [alive], [alive, step], [{"kind": "run.failed", "data": {"error": "x"}}]):
        r = api.post("/api/runs/cl-end/events", json={"events": events, "expected_seq": 2})
        assert r.status_code == 409, r.text
        body = r.json()
        assert body["error"] == "RunFinishedError" and events[0]["kind"] in body["detail"] and "cl-end" in body["detail"]
        assert body["run_status"] == "ok"
    # A stale seq is still the lost race it always was.
    r = api.post("/api/runs/cl-end/events", json={"events": [step], "expected_seq": 1})
    assert r.status_code == 409 and r.json()["error"] == "ConflictError"
    # A batch that goes on after its own end is refused whole, as it is in the journal.
    r = api.post("/api/runs/cl-end2/events", json={"events": [start, done, step], "expected_seq": 0})
    assert r.status_code == 409 and r.json()["error"] == "RunFinishedError", r.text
    assert api.get("/api/runs/cl-end2").status_code == 404
    run = api.get("/api/runs/cl-end").json()["run"]
    assert run["status"] == "ok" and run["events"] == 2
    assert [e.kind for e in journal.read("cl-end")] == ["run.started", "run.completed"]


# -- the UI: the thread page and the long run's page ---------------------------------------------------

CHROMIUM = os.environ.get("ENGRAIN_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
TOKEN = "runs-trust-token"


@pytest.fixture
def browser_page(tmp_path):
    """A served SQLite store and a Chromium page with the token set: (journal, base, page)."""
    from playwright.sync_api import sync_playwright

    from tests.servers import serve

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (scripts/test.sh does)")
    url = f"sqlite:///{tmp_path / 'ui.db'}"
    journal = eg.open(url)
    with serve(url, tmp_path, token=TOKEN) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True, timeout=30_000)
        try:
            ctx = browser.new_context()
            ctx.add_init_script(f"sessionStorage.setItem('engrain.token', {TOKEN!r})")
            page = ctx.new_page()
            page.set_default_timeout(15_000)
            yield journal, base, page
        finally:
            browser.close()
            journal.close()


def test_the_ui_shows_a_thread_whose_channels_are_a_string(browser_page):
    from playwright.sync_api import expect

    journal, base, page = browser_page
    _stored(journal, "langgraph:t-str", ["langgraph"],
            ("log.entry", "checkpoint", {"id": "c1", "summary": {"step": 1, "source": "loop", "channels": "messages"}}))
    page.goto(base + "/#/runs/langgraph:t-str")
    expect(page.locator('tr[data-checkpoint="c1"]')).to_be_visible()
    expect(page.locator("h1")).to_contain_text("LangGraph thread")


def _drawn(page, selector: str, state: str = "attached") -> None:
    """Wait for ``selector`` with wait_for_selector, not expect: with Playwright 1.65 on a loaded machine,
    a page of a long run sometimes never drew while an expect polled it (1 in 6 tries; never with
    wait_for_selector), and the page's own timers stalled the same way."""
    page.wait_for_selector(selector, state=state, timeout=60_000)


def _gap(page) -> str:
    return page.locator("#events-gap").inner_text()


def test_the_ui_draws_a_long_run_a_page_at_a_time(browser_page):
    journal, base, page = browser_page
    events = [eg.NewEvent("run.started", "", {"task": "long", "inputs": {}, "tags": ["client"]})]
    for i in range(2500):
        events.append(eg.NewEvent("step.started", "s", {"call_id": i, "args": {}}))
        events.append(eg.NewEvent("step.completed", "s", {"call_id": i, "result": i}))
    journal.append("long", events, 0)  # 5001 events
    page.goto(base + "/#/runs/long")
    rows = page.locator("#events-table tr[data-seq]")
    _drawn(page, "#events-gap")
    assert "Showing 1100 of 5001 events: 3901 more" in _gap(page)
    assert rows.count() == 1100  # the first 1000 and the last 100, not 5001
    assert page.locator("h2").filter(has_text="Steps (2500)").count() == 1
    page.locator("#events-more").click()
    _drawn(page, '#events-table tr[data-seq="1999"]')
    assert "Showing 2100 of 5001 events" in _gap(page)
    seqs = [int(s) for s in rows.evaluate_all("rs => rs.map(r => r.dataset.seq)")]
    assert seqs == sorted(seqs) and len(set(seqs)) == 2100  # in order, none twice
    for last in (2999, 3999):
        page.locator("#events-more").click()
        _drawn(page, f'#events-table tr[data-seq="{last}"]')
    page.locator("#events-more").click()
    _drawn(page, "#events-gap", "detached")  # the gap closed: every event, once
    assert rows.count() == 5001
    seqs = [int(s) for s in rows.evaluate_all("rs => rs.map(r => r.dataset.seq)")]
    assert seqs == list(range(5001))


def test_a_dropped_live_stream_keeps_the_pages_loaded(browser_page):
    """A live run's stream that drops reconnects after 2 s; an unchanged run is not redrawn then,
    so the events the reader paged in with "Load more" stay on the page."""
    journal, base, page = browser_page
    events = [eg.NewEvent("run.started", "", {"task": "live", "inputs": {}, "tags": ["client"]})]
    for i in range(1500):
        events.append(eg.NewEvent("step.started", "s", {"call_id": i, "args": {}}))
        events.append(eg.NewEvent("step.completed", "s", {"call_id": i, "result": i}))
    journal.append("live", events, 0)  # running: the page opens a stream
    # Every stream drops at once, in the page itself (a Python route handler only runs while the test
    # calls into Playwright).
    page.add_init_script("""window.__drops = 0;
      window.EventSource = class {
        constructor() { window.__drops += 1; setTimeout(() => this.onerror && this.onerror(new Event("error")), 50); }
        addEventListener() {}
        close() {}
      };""")
    page.goto(base + "/#/runs/live")
    _drawn(page, "#events-gap")
    assert "Showing 1100 of 3001 events" in _gap(page)
    page.locator("#events-more").click()
    _drawn(page, '#events-table tr[data-seq="1999"]')
    assert "Showing 2100 of 3001 events" in _gap(page)
    first = page.evaluate("window.__drops")
    page.wait_for_function("(n) => window.__drops >= n", arg=first + 2, timeout=60_000)  # two reconnects
    assert page.locator("#events-table tr[data-seq]").count() == 2100
    assert "Showing 2100 of 3001 events" in _gap(page)
    # A change is still drawn: a new event shows after the next reconnect.
    journal.append("live", [eg.NewEvent("step.started", "s", {"call_id": 1500, "args": {}})], 3001)
    _drawn(page, '#events-table tr[data-seq="3001"]')
    assert "Showing 1100 of 3002 events" in _gap(page)
