"""Web UI: the Routines page lists what agents learned, and promote / delete work from it.

A real ``engrain serve`` over a SQLite store seeded by an ``eg.Agent(learn=True)``
on the scripted model (through the openai SDK), driven in headless Debian Chromium.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

import engrain as eg
from engrain._agent.scripted import ScriptedModel, say, tool_call
from engrain._memory.learned import LearnedRoutines
from tests.servers import serve
from tests.test_ui import TOKEN, browser, page, shot  # noqa: F401  (browser, page: fixtures; page uses our server)


def _read_file(path: str) -> dict:
    """Read a bill file."""
    return {"path": path, "amount": 10.0 + len(path), "iban": f"DE{len(path)}00", "status": "unpaid"}


def _pay(iban: str, amount: float) -> str:
    """Pay an amount to an IBAN."""
    return "paid"


def _notify(text: str) -> str:
    """Tell the user something."""
    return "sent"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui-learned")
    url = f"sqlite:///{tmp / 'ui.db'}"
    j = eg.open(url)
    try:
        for f in ("bills/may.txt", "bills/june.txt"):
            bill = _read_file(f)
            with ScriptedModel([tool_call("_read_file", path=f), tool_call("_pay", iban=bill["iban"], amount=bill["amount"]),
                                say("Paid.")]) as m:
                a = eg.Agent("biller", "openai:scripted", "Pay bills.", [_read_file, _pay], base_url=m.openai_url,
                             journal=j, learn=True)
                assert a.run(f"Pay the bill in {f}")
        for note in ("Tell me hello", "Tell me goodbye"):  # composed after a result: not compilable
            with ScriptedModel([tool_call("_read_file", path="bills/may.txt"), tool_call("_notify", text=note + "!"),
                                say("ok")]) as m:
                eg.Agent("notifier", "openai:scripted", "", [_read_file, _notify], base_url=m.openai_url, journal=j,
                         learn=True).run(note)
    finally:
        j.close()
    with serve(url, tmp, token=TOKEN) as base:
        yield {"base": base, "url": url}


def test_routines_page_lists_learned_routines_and_reviews_them(page: Page, server):
    page.goto(f"{server['base']}/#/routines")
    rows = page.locator("tr[data-learned]")
    expect(rows).to_have_count(2)
    pay = page.locator('tr[data-learned]').filter(has_text="confirmed")
    expect(pay).to_contain_text("biller")
    expect(pay).to_contain_text("untrusted")
    expect(pay).to_contain_text("path")
    stuck = page.locator('tr[data-learned]').filter(has_text="not_compilable")
    expect(stuck).to_contain_text("notifier")
    stuck.locator("summary", has_text="not compilable").click()
    expect(stuck).to_contain_text("the model composed or computed it after seeing results")
    shot(page, "learned")

    name = pay.locator("td").first.inner_text()
    # Confirmed by runs and never reviewed, it is offered: a human can withhold it without promoting it.
    pay.get_by_role("button", name="Withhold").click()
    expect(page.locator("#status")).to_contain_text("Withhold")
    expect(page.locator('tr[data-learned]').filter(has_text="confirmed")).to_contain_text("withheld")
    assert LearnedRoutines(server["url"]).get(name, "biller").demoted is True

    pay.get_by_role("button", name="Promote").click()
    expect(page.locator("#status")).to_contain_text("Promote")
    expect(page.locator('tr[data-learned]').filter(has_text="confirmed")).to_contain_text("trusted")
    got = LearnedRoutines(server["url"]).get(name, "biller")
    assert got.trusted is True and got.demoted is False

    pay.get_by_role("button", name="Take back").click()
    expect(page.locator('tr[data-learned]').filter(has_text="confirmed")).to_contain_text("withheld")
    got = LearnedRoutines(server["url"]).get(name, "biller")
    assert got.trusted is False and got.demoted is True

    page.once("dialog", lambda d: d.accept())
    page.locator('tr[data-learned]').filter(has_text="not_compilable").get_by_role("button", name="Delete").click()
    expect(page.locator("tr[data-learned]")).to_have_count(1)
    assert [r.skill for r in LearnedRoutines(server["url"]).list()] == ["biller"]
