"""Web UI for the durable toolkit, in headless Debian Chromium over a real server on SQLite and on
PostgreSQL: the run waterfall, cancel and fork buttons, and the queues/workers page. Screenshots go
to ``test-artifacts/ui/``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, expect, sync_playwright

import engrain as eg
from tests.servers import serve

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "ui"
CHROMIUM = os.environ.get("ENGRAIN_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
TOKEN = "ui-durable-token"

tools = eg.ToolRegistry()
_flaky = {"n": 0}
_crash = {"on": False}


@eg.tool(registry=tools)
def fetch(q: str) -> str:
    time.sleep(0.01)
    return f"page {q}"


@eg.tool(registry=tools, retries=2, backoff=0.01, retry_on=(IOError,))
def flaky_api(q: str) -> str:
    _flaky["n"] += 1
    if _flaky["n"] % 2:
        raise IOError("timeout")
    return q.upper()


@eg.tool(registry=tools)
def parse(page: str) -> str:
    if _crash["on"]:
        raise KeyboardInterrupt  # the process dies here; the run resumes later
    return page[::-1]


_charged: list[str] = []


@eg.tool(registry=tools, at_most_once=True)
def charge(amount: int) -> str:
    _charged.append(eg.idempotency_key())
    return f"charged {amount}"


def pay(task: str) -> str:
    return charge(5)


def _crashed_payment(j, run_id: str) -> None:
    """A run whose process died inside its at-most-once charge: a durable start, no outcome."""
    j.append(run_id, [
        eg.NewEvent("run.started", "", {"task": "pay", "inputs": {}, "tags": []}),
        eg.NewEvent("step.started", "charge", {"call_id": 0, "type": "tool", "args": {"amount": 5}, "attempt": 1,
                                               "at_most_once": True}),
    ], 0)
    assert eg.run(pay, "pay", run_id=run_id, journal=j).status == "needs_input"


def pipeline(task: str) -> str:
    page = fetch(task)
    eg.sleep(0.05)
    loud = flaky_api(page)
    return parse(loud)


def broken(task: str) -> str:
    fetch(task)
    raise RuntimeError("a bug in the agent")


WORKER = "worker-host:4242:beef"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request, tmp_path_factory):
    from conftest import drop_pg_schema, pg_schema_url

    tmp = tmp_path_factory.mktemp("ui-durable")
    schema = "ui_" + os.urandom(6).hex()
    url = f"sqlite:///{tmp / 'ui.db'}" if request.param == "sqlite" else pg_schema_url(schema)
    _flaky["n"] = 0
    j = eg.open(url)
    try:
        _crash["on"] = True
        with pytest.raises(KeyboardInterrupt):
            eg.run(pipeline, "resumed run", run_id="resumed", journal=j)
        _crash["on"] = False
        time.sleep(0.05)
        assert eg.run(pipeline, "resumed run", run_id="resumed", journal=j)
        assert eg.run(broken, "broken run", run_id="broken", journal=j).status == "failed"
        assert eg.run(lambda t: eg.ask("go on?"), "waiting run", run_id="waiting", journal=j).status == "needs_input"
        eg.queue("emails", concurrency=5, rate=(100, 60), journal=j)
        for i in range(3):
            eg.enqueue("send", f"email {i}", queue="emails", journal=j)
        eg.enqueue("send", "queued to cancel", queue="emails", run_id="to-cancel", journal=j)
        for rid in ("pay-result", "pay-retry"):
            _crashed_payment(j, rid)
        # A run a worker process holds right now (its lease outlives the test).
        j.append("held", [eg.NewEvent("run.started", "", {"task": "held run"})], 0, lease=(WORKER, 3600.0))
    finally:
        j.close()
    try:
        with serve(url, tmp, token=TOKEN, allow_fork=True) as base:  # the fork button forks agent runs
            yield {"base": base, "url": url}
    finally:
        if request.param == "postgres":
            drop_pg_schema(schema)


@pytest.fixture
def page(server):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (scripts/test.sh does)")
    with sync_playwright() as p:
        b: Browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True, timeout=30_000)
        ctx = b.new_context(viewport={"width": 1280, "height": 900})
        ctx.add_init_script(f"sessionStorage.setItem('engrain.token', {TOKEN!r})")
        pg = ctx.new_page()
        pg.set_default_timeout(15_000)
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.on("dialog", lambda d: d.accept())
        try:
            yield pg
        finally:
            b.close()
        assert not errors, f"JavaScript errors: {errors}"


def shot(pg, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_waterfall_shows_the_runs_life(page, server):
    page.goto(f"{server['base']}/#/runs/resumed")
    wf = page.locator("#waterfall")
    expect(wf.get_by_role("heading", name="Timeline")).to_be_visible()
    rows = wf.locator(".wf-row")
    expect(rows).to_have_count(4)  # fetch, sleep, flaky_api, parse
    kinds = [rows.nth(i).get_attribute("data-kind") for i in range(4)]
    assert kinds == ["executed", "sleep", "retried", "executed"]
    # The sleep is drawn to its wake-up time, the crash/resume boundary is marked.
    expect(wf.locator(".wf-bar.sleeping")).to_have_count(1)
    expect(wf.locator(".wf-resume")).to_have_count(1)
    assert "resumed at" in wf.locator(".wf-resume").get_attribute("title")
    # Bars sit on one time axis: each step starts no earlier than the previous one.
    lefts = [float(rows.nth(i).locator(".wf-bar").first.evaluate("e => parseFloat(e.style.left)")) for i in range(4)]
    assert lefts == sorted(lefts) and lefts[-1] > lefts[0]
    shot(page, "run-waterfall")

    page.goto(f"{server['base']}/#/runs/broken")
    expect(page.locator("#waterfall .wf-row")).to_have_count(1)


def test_fork_button_makes_a_new_run(page, server):
    page.goto(f"{server['base']}/#/runs/broken")
    page.fill("#fork-at", "1")
    page.click("#fork-run")
    expect(page.locator("h1 .mono")).not_to_have_text("broken")
    new_id = page.locator("h1 .mono").inner_text()
    expect(page.locator("#waterfall .wf-row")).to_have_count(1)  # the copied fetch step
    r = httpx.get(f"{server['base']}/api/runs/{new_id}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.json()["events"][0]["data"]["forked_from"] == {"run_id": "broken", "at_step": 1}


def test_cancel_button_cancels_a_waiting_run(page, server):
    page.goto(f"{server['base']}/#/runs/waiting")
    page.click("#cancel-run")
    expect(page.locator("#run-view .badge.cancelled")).to_be_visible()
    expect(page.locator("#cancel-run")).to_have_count(0)  # finished: nothing to cancel
    shot(page, "run-cancelled")


def test_queues_page_lists_queues_workers_and_queued_runs(page, server):
    page.goto(f"{server['base']}/#/queues")
    row = page.locator("tr[data-queue='emails']")
    expect(row).to_contain_text("100 / 60 s")
    expect(row.locator("td").nth(1)).to_have_text("5")
    expect(row.locator("td").nth(3)).to_have_text("4")
    expect(page.get_by_role("heading", name="Workers")).to_be_visible()
    worker = page.locator(f"tr[data-worker='{WORKER}']")
    expect(worker.locator("td").nth(1)).to_have_text("1")
    expect(worker.locator("a")).to_have_text("held")
    shot(page, "queues")
    row.locator("a").click()
    expect(page.locator("#runs-status")).to_have_value("queued")
    expect(page.locator("tr[data-run-id]")).to_have_count(4)


def test_cancel_button_cancels_a_queued_run(page, server):
    page.goto(f"{server['base']}/#/runs/to-cancel")
    expect(page.locator("#run-view .badge.queued")).to_be_visible()
    page.click("#cancel-run")
    expect(page.locator("#run-view .badge.cancelled")).to_be_visible()
    j = eg.open(server["url"])
    try:
        assert j.get_run("to-cancel").status == "cancelled"
        assert [q.queued for q in eg.queues(journal=j) if q.name == "emails"] == [3]
    finally:
        j.close()


def test_did_this_step_happen_is_answered_with_a_result(page, server):
    page.goto(f"{server['base']}/#/runs/pay-result")
    panel = page.locator("#happened")
    expect(panel).to_contain_text("did this step happen?")
    expect(panel.get_by_role("heading")).to_have_text("Did step 0 (charge) happen?")
    shot(page, "did-this-step-happen")
    page.fill("#happened-result", "{not json")
    page.click("#happened-yes")
    expect(panel.locator(".error-box")).to_contain_text("not valid JSON")
    page.fill("#happened-result", '{"id": "ch_123"}')
    page.click("#happened-yes")
    expect(page.locator("#happened")).to_have_count(0)
    expect(page.locator("#run-view .badge.running")).to_be_visible()
    j = eg.open(server["url"])
    try:
        _charged.clear()
        done = eg.run(pay, "pay", run_id="pay-result", journal=j)
        assert done and done.output == {"id": "ch_123"} and _charged == []  # it happened: never charged again
    finally:
        j.close()


def test_did_this_step_happen_is_answered_with_a_retry(page, server):
    page.goto(f"{server['base']}/#/runs/pay-retry")
    page.click("#happened-fail")  # no reason given: refused in the page, nothing sent
    expect(page.locator("#happened .error-box")).to_contain_text("say why")
    page.click("#happened-retry")
    expect(page.locator("#happened")).to_have_count(0)
    j = eg.open(server["url"])
    try:
        _charged.clear()
        done = eg.run(pay, "pay", run_id="pay-retry", journal=j)
        assert done and done.output == "charged 5" and _charged == ["pay-retry:0"]
    finally:
        j.close()
