"""The cache page's LLM savings (totals, per run, the chart of calls made against avoided) in headless
Debian Chromium, over a store seeded by an agent with the cache on against a scripted model (a local
stub server speaking the OpenAI wire format, not an LLM)."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

import engrain as eg
from engrain._agent.scripted import ScriptedModel, say, tool_call
from tests.servers import serve
from tests.test_ui import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, WAIT_MS

TOKEN = "ui-savings-token"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uisavings")
    url = f"sqlite:///{tmp / 'savings.db'}"

    def stock(item: str) -> int:
        """Units in stock."""
        return {"widget": 3}[item]

    with ScriptedModel([tool_call("stock", item="widget"), say("3 widgets.")]) as model:
        j = eg.open(url)
        a = eg.Agent("shop", "openai:scripted", "", [stock], base_url=model.openai_url, journal=j, cache=True)
        runs = [a.run("how many widgets?") for _ in range(3)]  # a miss, then two hits
        assert model.calls == 2 and all(runs)
        a._store(j).flush()
        j.close()
    with serve(url, tmp, token=TOKEN) as base:
        yield {"base": base, "runs": [r.run_id for r in runs]}


def test_savings_totals_per_run_and_chart(setup):
    r = httpx.get(setup["base"] + "/api/cache/stats", headers={"Authorization": f"Bearer {TOKEN}"})
    saved = r.json()["savings"]
    assert saved["calls_made"] == 2 and saved["cache_calls"] == 4 and saved["runs"] == 3
    assert saved["input_tokens"] > 0 and saved["output_tokens"] > 0
    auth = {"Authorization": f"Bearer {TOKEN}"}
    (hit,) = httpx.get(setup["base"] + "/api/cache/savings", params={"run_id": setup["runs"][2]}, headers=auth).json()
    assert hit["cache_calls"] == 2 and hit["calls_made"] == 0 and hit["agent"] == "shop"
    assert hit["input_tokens"] * 2 == saved["input_tokens"]  # the recorded usage of the replayed calls
    assert len(httpx.get(setup["base"] + "/api/cache/savings", headers=auth).json()) == 3
    series = httpx.get(setup["base"] + "/api/cache/savings/series", params={"buckets": 5}, headers=auth).json()
    assert len(series["points"]) == 5 and sum(p["made"] for p in series["points"]) == 2
    assert sum(p["avoided"] for p in series["points"]) == 4
    bad = httpx.get(setup["base"] + "/api/cache/savings/series", params={"buckets": 0}, headers=auth)
    assert bad.status_code == 422
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=30_000)
        try:
            ctx = b.new_context(viewport={"width": 1280, "height": 900})
            ctx.add_init_script(f"sessionStorage.setItem('engrain.token', {TOKEN!r})")
            pg = ctx.new_page()
            pg.set_default_timeout(WAIT_MS)
            errors: list[str] = []
            pg.on("pageerror", lambda e: errors.append(str(e)))
            pg.goto(setup["base"] + "/#/cache")
            expect(pg.locator('[data-testid="llm-made"] .value')).to_have_text("2")
            expect(pg.locator('[data-testid="llm-avoided"] .value')).to_have_text("4")
            expect(pg.locator('[data-testid="tokens-avoided"] .value')).to_have_text(
                f"{saved['input_tokens']} / {saved['output_tokens']}")
            rows = pg.locator("tr[data-savings]")
            expect(rows).to_have_count(3)
            hit = pg.locator(f'tr[data-savings="{setup["runs"][1]}"]')
            expect(hit.locator("td").nth(3)).to_have_text("0")  # made
            expect(hit.locator("td").nth(4)).to_have_text("2")  # from the cache
            chart = pg.locator('[data-testid="savings-chart"]')
            expect(chart).to_be_visible()
            expect(chart).to_have_attribute("aria-label", "LLM calls made and avoided over time: 2 made, 4 avoided")
            bars = chart.locator("g[data-bucket]")
            made = sum(int(bars.nth(i).get_attribute("data-made")) for i in range(bars.count()))
            avoided = sum(int(bars.nth(i).get_attribute("data-avoided")) for i in range(bars.count()))
            assert (made, avoided) == (2, 4)
            assert chart.locator("rect.avoided").count() >= 1 and chart.locator("rect.made").count() >= 1
            box = chart.locator("rect.avoided").first.bounding_box()
            assert box is not None and box["height"] > 0 and box["width"] > 0  # drawn, not just in the DOM
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            pg.screenshot(path=str(ARTIFACTS / "cache-savings.png"), full_page=True)
            assert not errors, errors
            ctx.close()
        finally:
            b.close()
