"""The web UI shows framework threads: a LangGraph thread kept by EngrainCheckpointer, in headless Chromium."""

from __future__ import annotations

import os
from typing import TypedDict

import pytest

pytest.importorskip("langgraph")

from langgraph.graph import START, StateGraph  # noqa: E402
from playwright.sync_api import expect, sync_playwright  # noqa: E402

from engrain.integrations.langgraph import EngrainCheckpointer  # noqa: E402
from tests.servers import serve  # noqa: E402

CHROMIUM = os.environ.get("ENGRAIN_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
TOKEN = "ui-integrations-token"


class S(TypedDict):
    n: int


def test_langgraph_thread_is_listed_and_its_checkpoints_readable(tmp_path):
    url = f"sqlite:///{tmp_path / 'ui.db'}"
    b = StateGraph(S)
    b.add_node("bump", lambda s: {"n": s["n"] + 1})
    b.add_edge(START, "bump")
    graph = b.compile(checkpointer=EngrainCheckpointer(url))
    graph.invoke({"n": 1}, {"configurable": {"thread_id": "ui-thread"}})
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (scripts/test.sh does)")
    with serve(url, tmp_path, token=TOKEN) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True, timeout=30_000)
        try:
            ctx = browser.new_context()
            ctx.add_init_script(f"sessionStorage.setItem('engrain.token', {TOKEN!r})")
            pg = ctx.new_page()
            pg.set_default_timeout(15_000)
            pg.goto(base + "/")
            row = pg.locator('tr[data-run-id="langgraph:ui-thread"]')
            expect(row).to_contain_text("LangGraph thread ui-thread")
            pg.goto(base + "/#/runs/langgraph:ui-thread")
            entries = pg.locator("tr[data-seq]").filter(has_text="log.entry")
            expect(entries.first).to_be_visible()
            # Checkpoint rows lead with their summary (step, source, channels), not the serialized payload.
            expect(pg.locator("tr[data-seq]").filter(has_text="checkpoint").first).to_contain_text('"source"')
            assert entries.count() >= 3
        finally:
            browser.close()
