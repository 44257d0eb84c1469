"""The web UI as a newcomer finds it, in headless Debian Chromium against real ``engrain serve`` processes.

Two servers share one seeded SQLite store: one without any model key (what a fresh machine
has) and one whose OpenAI-compatible endpoint is a scripted model (a local stub server
speaking the wire format, not an LLM). Checked: the Chat page's form that creates an agent
and says when the key is missing, the Memory page's Consolidate button, internal runs hidden
from the runs list until asked, a LangGraph thread shown with its last checkpoint, and
``/favicon.ico``.

The tests also take the screenshots of the main pages that the documentation shows: they are
written to ``test-artifacts/ui/docs/`` and copied over ``docs/img/`` only when
``ENGRAIN_UPDATE_DOCS_IMAGES=1`` (so running the tests leaves the tree as it was).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import TypedDict

import httpx
import pytest
from playwright.sync_api import Page, expect

import engrain as eg
from engrain._agent.scripted import ScriptedModel, say, tool_call
from tests.servers import serve
from tests.test_server_llm_agents import wasm_dir  # noqa: F401 - a fixture: the example WASM tools, built
from tests.test_ui import WAIT_MS, ARTIFACTS, browser, budget_agent, failing_agent, greeter, seed_cache  # noqa: F401

langgraph = pytest.importorskip("langgraph")
from langgraph.graph import START, StateGraph  # noqa: E402

from engrain.integrations.langgraph import EngrainCheckpointer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "ui-newcomer-token"
DOCS_IMG = ROOT / "docs" / "img"
NO_KEY = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")


def docs_shot(page: Page, name: str) -> Path:
    """A screenshot for the documentation: always into test-artifacts, into docs/img/ only when asked."""
    out = ARTIFACTS / "docs" / f"{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out))
    if os.environ.get("ENGRAIN_UPDATE_DOCS_IMAGES") == "1":
        shutil.copyfile(out, DOCS_IMG / f"{name}.png")
    return out


class Counter(TypedDict):
    n: int
    log: list[str]


def seed_thread(url: str) -> str:
    """A LangGraph thread of two nodes kept by EngrainCheckpointer; returns its last checkpoint's id."""
    b = StateGraph(Counter)
    b.add_node("plan", lambda s: {"n": s["n"] + 1, "log": [*s["log"], "planned"]})
    b.add_node("act", lambda s: {"n": s["n"] * 10, "log": [*s["log"], "acted"]})
    b.add_edge(START, "plan")
    b.add_edge("plan", "act")
    saver = EngrainCheckpointer(url)
    graph = b.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "support-42"}}
    graph.invoke({"n": 1, "log": []}, config, durability="sync")
    return graph.get_state(config).config["configurable"]["checkpoint_id"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory, wasm_dir):
    tmp = tmp_path_factory.mktemp("uinew")
    url = f"sqlite:///{tmp / 'ui.db'}"
    j = eg.open(url)
    try:
        ok = eg.run(budget_agent, "add up the budget", inputs={"n": 3}, tags=["demo"], journal=j)
        eg.run(failing_agent, "a run that fails", journal=j)
        eg.run(greeter, "greet someone", journal=j)
    finally:
        j.close()
    seed_cache(url)
    mem = eg.Memory(url)
    for text in ("Deploys happen on Tuesdays after the standup", "Deploys are frozen in the last week of December",
                 "The staging database is called kestrel"):
        mem.remember(text, skill="ops")
    mem.close()
    checkpoint = seed_thread(url)
    model = ScriptedModel([tool_call("lookup_order", order_id=5), say("Order 5 has shipped.")], chunk_delay=0.005).start()
    saved = {k: os.environ.pop(k, None) for k in NO_KEY}
    tools = f"{ROOT / 'tests' / 'agent_tools.py'}:tools"
    try:
        with serve(url, tmp, token=TOKEN, tools=tools, tools_dir=wasm_dir, name="nokey") as bare:
            os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"] = model.openai_url, "scripted"
            with serve(url, tmp, token=TOKEN, tools=tools, tools_dir=wasm_dir, name="keyed") as keyed:
                for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
                    os.environ.pop(k)
                yield {"bare": bare, "keyed": keyed, "ok": ok.run_id, "checkpoint": checkpoint, "model": model}
    finally:
        model.stop()
        for k, v in saved.items():
            if v is not None:
                os.environ[k] = v


@pytest.fixture
def page(browser, servers):
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    ctx.add_init_script(f"sessionStorage.setItem('engrain.token', {TOKEN!r})")
    pg = ctx.new_page()
    pg.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    missing: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    try:
        yield pg
    finally:
        ctx.close()
    assert not errors, f"JavaScript errors: {errors}"
    assert not missing, f"404s: {missing}"


def api(base: str, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(method, base + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30, **kw)


def test_favicon_is_served(page, servers):
    r = httpx.get(servers["bare"] + "/favicon.ico", timeout=10)
    assert r.status_code == 200 and r.content[:4] == b"\x00\x00\x01\x00"  # an ICO file (holding a PNG)
    assert r.headers["content-type"] in ("image/x-icon", "image/vnd.microsoft.icon")
    page.goto(servers["bare"] + "/#/runs")
    expect(page.locator("tr[data-run-id]").first).to_be_visible()
    # The page names it, and the browser fetched it without a 404 (the fixture fails on any 404).
    assert page.evaluate("document.querySelector('link[rel=icon]').href").endswith("/favicon.ico")
    assert page.evaluate("fetch('/favicon.ico').then(r => r.status)") == 200


def test_runs_list_hides_internal_runs_until_asked(page, servers):
    base = servers["bare"]
    every = api(base, "GET", "/api/runs", params={"limit": 1000}).json()
    internal = [r["run_id"] for r in every if r["kind"] == "internal"]
    assert len(internal) == 3 and all(r.startswith("01") for r in internal)  # the three cache calls seeded
    users = api(base, "GET", "/api/runs", params={"limit": 1000, "internal": "false"}).json()
    assert {r["run_id"] for r in users} == {r["run_id"] for r in every} - set(internal)
    # The filter keeps pages full: a page of 2 user runs, then the next, skip internal ones.
    first, second = (api(base, "GET", "/api/runs", params={"limit": 2, "offset": o, "internal": "false"}).json()
                     for o in (0, 2))
    assert [r["run_id"] for r in first + second] == [r["run_id"] for r in users[:4]]
    page.goto(base + "/#/runs")
    rows = page.locator("tr[data-run-id]")
    expect(rows).to_have_count(len(users))
    expect(page.locator('tr[data-kind="internal"]')).to_have_count(0)
    docs_shot(page, "runs")
    page.get_by_label("Show internal runs").check()
    expect(page).to_have_url(base + "/#/runs?internal=1")
    expect(page.locator('tr[data-kind="internal"]')).to_have_count(len(internal))
    expect(page.locator('tr[data-kind="internal"]').first).to_contain_text("internal")
    page.get_by_label("Show internal runs").uncheck()
    expect(page.locator('tr[data-kind="internal"]')).to_have_count(0)


def test_langgraph_thread_shows_as_a_thread_with_its_last_checkpoint(page, servers):
    base = servers["bare"]
    page.goto(base + "/#/runs")
    row = page.locator('tr[data-run-id="langgraph:support-42"]')
    expect(row).to_have_attribute("data-kind", "thread")
    expect(row.locator("td").nth(1)).to_have_text("thread")  # not "running", which it would stay forever
    row.get_by_role("link").click()
    expect(page.get_by_role("heading", name="LangGraph thread support-42")).to_be_visible()
    last = page.locator("#last-checkpoint")
    expect(last).to_contain_text(servers["checkpoint"])
    expect(last).to_contain_text("step 2")  # input (-1), plan (0)... act is the last: step 2 of the loop
    expect(page.locator("tr[data-checkpoint]").first).to_have_attribute("data-checkpoint", servers["checkpoint"])
    assert page.locator("tr[data-checkpoint]").count() == 4  # input, the start, plan, act
    expect(page.locator(".waterfall")).to_have_count(0)
    data = api(base, "GET", "/api/runs/langgraph:support-42").json()
    assert data["log"]["kind"] == "thread" and data["log"]["last"]["id"] == servers["checkpoint"]
    assert data["run"]["kind"] == "thread"


def test_run_page_waterfall_for_the_docs(page, servers):
    page.goto(servers["bare"] + f"/#/runs/{servers['ok']}")
    expect(page.locator("tr[data-step]").first).to_be_visible()
    docs_shot(page, "run")
    page.goto(servers["bare"] + "/#/cache")
    expect(page.locator("tr[data-entry]").first).to_be_visible()
    docs_shot(page, "cache")


def test_memory_consolidate_button(page, servers):
    base = servers["bare"]
    before = api(base, "GET", "/api/memory/stats").json()
    assert before["buffer"] == 3 and before["articles"] == 0
    page.goto(base + "/#/memory")
    expect(page.locator('[data-testid="buffer"] .value')).to_have_text("3")
    expect(page.locator("li[data-article]")).to_have_count(0)
    page.get_by_role("button", name="Consolidate").click()
    expect(page.locator("li[data-article]").first).to_be_visible()
    after = api(base, "GET", "/api/memory/stats").json()
    assert after["articles"] >= 1 and after["consolidations"] == before["consolidations"] + 1
    expect(page.locator('[data-testid="articles"] .value')).to_have_text(str(after["articles"]))
    expect(page.locator("#status")).to_contain_text("Consolidated:")
    expect(page.locator("li[data-article]").filter(has_text="Deploys happen on Tuesdays")).to_have_count(1)
    expect(page.get_by_role("button", name="Consolidate")).to_be_disabled()  # the buffer is empty now
    page.get_by_label("Search memory", exact=True).fill("when do we deploy?")
    page.get_by_role("button", name="Recall").click()
    expect(page.locator("#recall-results li[data-hit]").first).to_contain_text("Deploy")
    docs_shot(page, "memory")


def test_chat_form_says_plainly_when_the_model_key_is_missing(page, servers):
    base = servers["bare"]
    page.goto(base + "/#/chat")
    form = page.locator("#create-agent")
    expect(form.locator('label:has-text("lookup_order")')).to_contain_text("python")
    expect(form.locator('label:has-text("wordcount")')).to_contain_text("wasm")
    note = page.locator("#agent-model-key")
    expect(note).to_be_visible()  # the default model is openai's, and this server has no key
    expect(note).to_contain_text("The server has no OPENAI_API_KEY")
    page.get_by_label("Model").fill("ollama:llama3.2")  # a local server: no key to miss
    expect(note).to_be_hidden()
    page.get_by_label("Model").fill("anthropic:claude-sonnet-4-5")
    expect(note).to_contain_text("ANTHROPIC_API_KEY")
    page.get_by_label("Model").fill("openai:gpt-4.1-mini")
    page.get_by_label("Name", exact=True).fill("helper")
    page.get_by_label("Instructions").fill("Help with orders.")
    form.get_by_label("lookup_order").check()
    form.get_by_label("wordcount").check()
    page.get_by_role("button", name="Create agent").click()
    expect(page).to_have_url(re.compile(re.escape(base) + r"/#/chat/helper\?session=web-"))
    expect(page.get_by_role("heading", name="Chat: helper")).to_be_visible()
    expect(page.locator("#model-key-missing")).to_contain_text("no OPENAI_API_KEY")
    made = [a for a in api(base, "GET", "/api/agents").json() if a["name"] == "helper"]
    assert made and made[0]["tools"] == ["lookup_order", "wordcount"] and made[0]["model"] == "openai:gpt-4.1-mini"
    again = api(base, "POST", "/api/agents", json={"name": "helper", "model": "openai:gpt-4.1-mini",
                                                  "instructions": "Help with orders.",
                                                  "tools": ["lookup_order", "wordcount"]})
    assert again.status_code == 201 and "OPENAI_API_KEY" in again.json()["warning"]
    page.goto(base + "/#/chat")
    expect(page.locator('tr[data-agent="helper"]')).to_contain_text("no OPENAI_API_KEY")
    # A name the server would refuse is caught by the form first; one it refuses anyway is shown.
    page.get_by_label("Name", exact=True).fill("no spaces allowed")
    page.get_by_role("button", name="Create agent").click()
    assert page.evaluate("document.getElementById('agent-name').validity.patternMismatch") is True
    page.get_by_label("Name", exact=True).fill("helper")
    page.get_by_label("Instructions").fill("Something else.")
    page.get_by_role("button", name="Create agent").click()
    expect(page.locator("#create-agent .error-box")).to_contain_text("AgentExistsError (409)")


def test_chat_form_creates_an_agent_that_answers(page, servers):
    base = servers["keyed"]
    page.goto(base + "/#/chat")
    expect(page.locator("#agent-model-key")).to_be_hidden()  # this server reaches its model
    page.get_by_label("Name", exact=True).fill("support")
    page.get_by_label("Model").fill("openai:scripted")
    page.get_by_label("Instructions").fill("Answer order questions.")
    page.locator("#create-agent").get_by_label("lookup_order").check()
    page.get_by_role("button", name="Create agent").click()
    expect(page.get_by_role("heading", name="Chat: support")).to_be_visible()
    expect(page.locator("#model-key-missing")).to_have_count(0)
    page.get_by_label("Message", exact=True).fill("Where is order 5?")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("li.msg.tool[data-tool=lookup_order] .tool-result")).to_contain_text('"shipped"')
    expect(page.locator("li.msg.assistant").last.locator(".content")).to_have_text("Order 5 has shipped.")
    assert servers["model"].calls == 2
    docs_shot(page, "chat")
