"""``engrain demo``, part 2: the behavior cache in front of a scripted demo agent.

``ScriptedSignupAgent`` is a *scripted demo agent*: each of its decisions is a
call to a scripted stand-in for an LLM that sleeps like a real one and is
counted. It signs people up on a simulated web form (:class:`DemoSite`) with
three tools whose pre-checks look at the page the browser shows.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import engrain as eg

from .._journal import Journal

#: Seconds a scripted "LLM decision" takes.
DECISION_LATENCY = 0.2


class DemoSite:
    """A simulated sign-up site: a page, a form, and (once changed) a cookie banner."""

    def __init__(self) -> None:
        self.page = "home"
        self.banner = False
        self.dismissed = False
        self.form: dict[str, str] = {}
        self.signups: list[str] = []

    def screen(self) -> str:
        """What a screenshot would show: the page, and the banner over the form."""
        return f"{self.page}+banner" if self.banner and not self.dismissed and self.page == "form" else self.page


def build(journal: Journal, site: DemoSite) -> tuple[eg.Engine, dict[str, int]]:
    """The engine with its three tools and the scripted agent; returns it and the decision counter."""
    engine = eg.Engine(journal)
    on_screen = eg.Check(lambda *a, **k: site.screen(), lambda now, then: now == then)
    counter = {"decisions": 0}

    @engine.function(pre_check=on_screen, name="open_page")
    def open_page(url: str) -> str:
        site.page = "form"
        return f"opened {url}"

    @engine.function(pre_check=on_screen, name="fill")
    def fill(field: str, value: str) -> str:
        if site.screen() == "form+banner":
            raise RuntimeError("the cookie banner covers the form")
        site.form[field] = value
        return f"{field}={value}"

    @engine.function(pre_check=on_screen, name="click")
    def click(button: str) -> str:
        if button == "accept cookies":
            site.dismissed = True
            return "banner dismissed"
        site.signups.append(site.form.get("name", "?"))
        site.page = "thanks"
        return f"clicked {button}"

    def decide(observation: str) -> str:
        counter["decisions"] += 1
        time.sleep(DECISION_LATENCY)
        return observation

    def ScriptedSignupAgent(task: str, continuation: Any = None) -> str:
        name = task.split("Sign up ", 1)[-1].split(" for", 1)[0]
        done = {s.name for s in continuation.steps} if continuation else set()
        if "open_page" not in done:
            decide("open the sign-up page")
            open_page("https://demo.example/signup")
        if site.screen() == "form+banner":
            decide("a cookie banner is in the way: accept it")
            click("accept cookies")
        decide("type the name")
        fill("name", name)
        decide("type the e-mail")
        fill("email", name.split()[0].lower() + "@example.com")
        decide("submit")
        return click("subscribe")

    engine.set_agent(ScriptedSignupAgent).finalize()
    return engine, counter


def cache_section(journal: Journal, workdir: Any, out: Callable[[str], None]) -> bool:
    """Part 2: a miss, a hit with zero agent calls, then a changed site that diverges and hands off."""
    site = DemoSite()
    engine, counter = build(journal, site)
    out("2. Behavior cache: replay what worked, fall back to the agent when the page changed")
    ok = True
    # Tagged per demo run: on a reused store (--url) the first call is still a miss.
    session = f"demo-{uuid.uuid4().hex[:8]}"

    def attempt(label: str, person: str) -> eg.Outcome:
        site.page, site.form, site.dismissed = "home", {}, False
        before = counter["decisions"]
        t0 = time.perf_counter()
        o = engine(f"Sign up {person} for the newsletter", tags=["demo", session], params={"name": person})
        ms = (time.perf_counter() - t0) * 1000
        kind = "hit" if o else ("diverged, handed off" if o.reason.startswith("diverged") else "miss")
        out(f"   {label:<38}{kind:<22}{counter['decisions'] - before} agent decisions  {ms:8.1f} ms")
        return o

    first = attempt("Ada Lovelace (first time)", "Ada Lovelace")
    ok = ok and not first and counter["decisions"] == 4
    second = attempt("Grace Hopper (same task, new name)", "Grace Hopper")
    ok = ok and bool(second) and site.signups[-1] == "Grace Hopper"
    site.banner = True  # the site changed: a cookie banner now covers the form
    third = attempt("Alan Turing (site now has a banner)", "Alan Turing")
    ok = ok and third.status == "ok" and site.signups[-1] == "Alan Turing"
    sources = ", ".join(f"{s['name']}:{s['source']}" for s in third.steps)
    out(f"   hand-off: {third.reason}")
    out(f"   steps of the third call: {sources}")
    fourth = attempt("Edsger Dijkstra (banner again)", "Edsger Dijkstra")
    ok = ok and bool(fourth)
    ran_twice = [s for s in third.steps if s["source"] == "agent" and s["name"] == "open_page"]
    st = engine.stats()
    out(f"   cache: {st['entries']} entries, {st['hits']} hits, {st['misses']} misses, {st['diverged']} divergences; "
        f"steps run twice in the hand-off: {len(ran_twice)}")
    engine.close()
    return ok and not ran_twice
