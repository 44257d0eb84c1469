"""The web UI's chat page in headless Debian Chromium, against a real ``engrain serve`` whose model
is a scripted model (a local stub server speaking the OpenAI wire format, not an LLM)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

import engrain as eg
from engrain._agent.scripted import ScriptedModel, say, tool_call
from tests.servers import serve
from tests.test_ui import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, WAIT_MS

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "ui-chat-token"
XSS = '<img src=x onerror="window.__xss=1">'


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uichat")
    model = ScriptedModel([
        tool_call("lookup_order", order_id=5),
        say(f"Order 5 has shipped. {XSS}"),
        say("You asked about order 5."),
    ], chunk_delay=0.01).start()
    old = {k: os.environ.get(k) for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY")}
    os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"] = model.openai_url, "scripted"
    url = f"sqlite:///{tmp / 'chat.db'}"
    try:
        with serve(url, tmp, token=TOKEN, tools=f"{ROOT / 'tests' / 'agent_tools.py'}:tools") as base:
            with eg.Client(base, token=TOKEN) as c:
                c.create_agent("support", "openai:scripted", "Answer order questions.", ["lookup_order"])
            yield {"base": base, "model": model}
    finally:
        model.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_chat_page_streams_replies_with_tool_calls_inline(setup):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=30_000)
        ctx = browser.new_context(viewport={"width": 1280, "height": 900})
        ctx.add_init_script(f"sessionStorage.setItem('engrain.token', {TOKEN!r})")
        page = ctx.new_page()
        page.set_default_timeout(WAIT_MS)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            page.goto(setup["base"] + "/#/chat")
            page.get_by_role("link", name="support").click()
            expect(page.get_by_role("heading", name="Chat: support")).to_be_visible()
            assert "session=web-" in page.url
            page.get_by_label("Message", exact=True).fill("Where is order 5?")
            page.get_by_role("button", name="Send").click()
            tool = page.locator("li.msg.tool[data-tool=lookup_order]")
            expect(tool).to_contain_text('{"order_id": 5}')
            expect(tool.locator(".tool-result")).to_have_text('{"order": 5, "status": "shipped", "total": 19.5}')
            reply = page.locator("li.msg.assistant").last
            expect(reply.locator(".content")).to_have_text(f"Order 5 has shipped. {XSS}")
            expect(page.locator("#status")).to_contain_text("Reply done")
            assert page.evaluate("window.__xss") is None  # model text is shown as text, never markup
            page.screenshot(path=str(ARTIFACTS / "chat.png"), full_page=True)
            # the session survives a reload: history comes back from the journal, tool call inline
            page.reload()
            expect(page.locator("li.msg.user")).to_have_count(1)
            expect(page.locator("li.msg.tool .tool-result")).to_contain_text('"shipped"')
            expect(page.locator("li.msg.user time")).to_have_count(1)
            page.get_by_label("Message", exact=True).fill("What did I ask?")
            page.get_by_role("button", name="Send").click()
            expect(page.locator("li.msg.assistant").last.locator(".content")).to_have_text("You asked about order 5.")
            assert setup["model"].calls == 3
        finally:
            ctx.close()
            browser.close()
    assert not errors, f"JavaScript errors: {errors}"
