"""Behavior cache: a hit never replays a call the agent would not make now, and bad call inputs are typed errors.

Each test names the wrong replay it guards against: values changed after they
were recorded, a value taken from an earlier result that is different now, a
step 0 left unchecked on a resume, a tool whose parameters changed, an entry of
another tool set or namespace, an output kept from the recording, a run whose
trajectory was incomplete.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import engrain as eg
from engrain import Check, Engine
from engrain._errors import CacheError, JSONTooDeepError


def _url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'cache.db'}"


def _engine(tmp_path, **kw: Any) -> Engine:
    return Engine(eg.open(_url(tmp_path)), **kw)


# -- values changed after the call -----------------------------------------------------------------


@pytest.mark.parametrize("durability", ["step", "run", "off"])
def test_an_argument_changed_after_the_call_is_recorded_as_called(tmp_path, durability):
    eng = _engine(tmp_path, durability=durability)
    sent: list[list[str]] = []

    @eng.function()
    def send(items: list) -> int:
        sent.append(list(items))
        items.append("SENT")  # the tool marks what it got
        return len(items)

    def agent(task: str) -> str:
        batch = ["a", "b"]
        send(batch)
        batch.append("later")  # and the agent keeps using its list
        return "done"

    eng.set_agent(agent).finalize()
    assert not eng("send the batch")
    assert eng.entries()[0].steps[0]["args"] == {"items": ["a", "b"]}
    for _ in range(3):  # a replayed call that changes its argument leaves the cached entry as it was
        assert eng("send the batch")
    assert sent == [["a", "b"]] * 4


def test_a_result_the_agent_changed_is_not_the_output_a_hit_returns(tmp_path):
    eng = _engine(tmp_path)

    @eng.function()
    def get_items() -> list:
        return ["a"]

    def agent(task: str) -> list:
        items = get_items()
        items.append("b")
        return items

    eng.set_agent(agent).finalize()
    assert eng("list the items").output == ["a", "b"]
    hit = eng("list the items")
    assert hit and hit.output == ["a", "b"]


def test_params_the_agent_consumes_are_keyed_as_called(tmp_path):
    eng = _engine(tmp_path)
    done: list[str] = []

    @eng.function()
    def process(job: str) -> str:
        done.append(job)
        return "ok"

    def agent(task: str, queue: Any = None) -> str:
        while queue:
            process(queue.pop())
        return "queue drained"

    eng.set_agent(agent).finalize()
    queue = ["a", "b"]
    assert not eng("drain the queue", params={"queue": queue}, queue=queue)
    done.clear()
    empty = eng("drain the queue", params={"queue": []}, queue=[])
    assert not empty and done == []  # the entry was keyed on ["a", "b"], not on the emptied list
    again = eng("drain the queue", params={"queue": ["a", "b"]}, queue=["a", "b"])
    assert again and done == ["b", "a"]


# -- outputs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("first,later", [(0, 3), (1, 3), (1.0, 3.0), (0.0, 2.5)])
def test_an_output_of_0_or_1_from_a_tool_is_the_replayed_result(tmp_path, first, later):
    eng = _engine(tmp_path)
    box = {"n": first}

    @eng.function()
    def count_unread() -> Any:
        return box["n"]

    eng.set_agent(lambda task: count_unread()).finalize()
    assert eng("how many unread?").output == first
    box["n"] = later
    hit = eng("how many unread?")
    assert hit and hit.output == later and type(hit.output) is type(later)


# -- keys ----------------------------------------------------------------------------------------------


def test_a_pinned_minus_zero_is_not_zero(tmp_path):
    eng = _engine(tmp_path)
    headings: list[float] = []

    @eng.function()
    def set_heading(deg: float) -> str:
        headings.append(deg)
        return f"heading {deg}"

    def agent(task: str, angle: float = 0.0) -> str:
        import math

        return set_heading(math.copysign(180.0, angle))  # derived: angle is pinned into the key

    eng.set_agent(agent).finalize()
    assert eng("turn", params={"angle": 0.0}, angle=0.0).output == "heading 180.0"
    out = eng("turn", params={"angle": -0.0}, angle=-0.0)
    assert not out and out.output == "heading -180.0" and headings == [180.0, -180.0]


def test_a_tag_cannot_reach_another_namespace(tmp_path):
    url = _url(tmp_path)
    prod = Engine(eg.open(url), namespace="prod")
    deployed: list[str] = []

    @prod.function()
    def deploy() -> str:
        deployed.append("prod")
        return "deployed"

    prod.set_agent(lambda task: deploy()).finalize()
    prod("ship it")
    other = Engine(eg.open(url))

    @other.function(name="deploy")
    def deploy_other() -> str:
        deployed.append("other")
        return "deployed"

    other.set_agent(lambda task: "not deploying").finalize()
    with pytest.raises(CacheError, match="reserved"):
        other("ship it", tags=["engrain.namespace=prod"])
    assert deployed == ["prod"]


@pytest.mark.parametrize("durability", ["step", "off"])
def test_call_inputs_of_other_types_are_typed_errors(tmp_path, durability):
    eng = _engine(tmp_path, durability=durability)

    @eng.function()
    def f(x: Any) -> int:
        return 1

    eng.set_agent(lambda task, **kw: f(1)).finalize()
    assert not eng("t", tags=["a", "b", "c"])
    with pytest.raises(CacheError, match="tags must be a list of strings"):
        eng("t", tags="abc")  # would have keyed as ["a", "b", "c"] and replayed that entry
    for tags in ([1, "a"], [["x"]], {"a": 1}):
        with pytest.raises(CacheError, match="tags must be a list of strings"):
            eng("t", tags=tags)
    assert not eng("t", params={"a": "b"})
    with pytest.raises(CacheError, match="params must be a dict"):
        eng("t", params=["ab"])  # dict(["ab"]) == {"a": "b"}: would have replayed that entry
    deep: Any = 1
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(JSONTooDeepError):
        eng("t", params={"p": deep})
    assert eng("t", tags=("c", "b", "a")) and eng("t", params={"a": "b"})
    assert eng.stats()["entries"] == 2


@pytest.mark.parametrize("depth", [150, 600, 5000])
def test_a_snapshot_too_deep_is_a_typed_error(tmp_path, depth):
    eng = _engine(tmp_path)
    snap: Any = 1
    for _ in range(depth):
        snap = [snap]
    box = {"snap": ("ok",)}

    @eng.function(pre_check=Check(lambda: box["snap"], lambda a, b: a == b))
    def f() -> int:
        return 1

    eng.set_agent(lambda task: f()).finalize()
    assert not eng("fine")  # a tuple snapshot goes through the tagged encoding too
    box["snap"] = (snap,)
    out = eng("too deep")
    assert out.status == "failed" and "JSONTooDeepError" in out.error
    box["snap"] = ("ok",)
    assert eng("fine") and eng.stats()["entries"] == 1


# -- checks ----------------------------------------------------------------------------------------------


def test_a_resumed_hit_checks_step_0_again(tmp_path):
    eng = _engine(tmp_path)
    env = {"account": "open", "crash": False}
    withdrawn: list[int] = []

    @eng.function(pre_check=Check(lambda amount: env["account"], lambda a, b: a == b))
    def withdraw(amount: int) -> str:
        if env["crash"]:
            raise KeyboardInterrupt  # the process dies in step 0 of a hit
        withdrawn.append(amount)
        return "ok"

    def agent(task: str, continuation: Any = None) -> str:
        return withdraw(100) if env["account"] == "open" else "the account is frozen: nothing withdrawn"

    eng.set_agent(agent).finalize()
    assert not eng("withdraw 100")
    env["crash"] = True
    with pytest.raises(KeyboardInterrupt):
        eng("withdraw 100", run_id="r1")
    env["crash"], env["account"] = False, "frozen"  # changed while the run was down
    withdrawn.clear()
    out = eng("withdraw 100", run_id="r1")
    assert not out and out.agent_called and withdrawn == []
    assert out.output == "the account is frozen: nothing withdrawn" and "pre-check of step 0" in out.reason


# -- tools -------------------------------------------------------------------------------------------


def test_a_tool_whose_parameters_changed_hands_over_instead_of_failing(tmp_path):
    url = _url(tmp_path)
    old = Engine(eg.open(url))

    @old.function()
    def pay(amount: int) -> str:
        return f"paid {amount}"

    old.set_agent(lambda task: pay(5)).finalize()
    assert not old("pay the bill")
    new = Engine(eg.open(url))
    paid: list[tuple] = []

    @new.function(name="pay")
    def pay_v2(amount: int, currency: str = "EUR") -> str:  # the recorded call never chose a currency
        paid.append((amount, currency))
        return f"paid {amount} {currency}"

    new.set_agent(lambda task: pay_v2(5, "USD")).finalize()
    out = new("pay the bill")
    assert out.status == "ok" and not out and out.agent_called and paid == [(5, "USD")]
    assert "parameters changed" in out.reason
    newer = Engine(eg.open(url))

    @newer.function(name="pay")
    def pay_v3(cents: int) -> str:
        paid.append(("cents", cents))
        return "paid"

    newer.set_agent(lambda task: pay_v3(500)).finalize()
    out = newer("pay the bill")  # was: TypeError from the replayed call, every time, and never the agent
    assert out.status == "ok" and out.agent_called and paid[-1] == ("cents", 500)


def test_an_entry_with_a_tool_this_engine_lacks_is_never_started(tmp_path):
    url = _url(tmp_path)
    a = Engine(eg.open(url))

    @a.function()
    def archive_inbox() -> str:
        return "archived"

    @a.function()
    def send_digest() -> str:
        return "sent"

    a.set_agent(lambda task: (archive_inbox(), send_digest())[1]).finalize()
    a("tidy up")
    b = Engine(eg.open(url))
    ran: list[str] = []

    @b.function(name="archive_inbox")
    def archive_b() -> str:
        ran.append("archive")
        return "archived"

    @b.function()
    def label_all() -> str:
        ran.append("label")
        return "labelled"

    b.set_agent(lambda task, continuation=None: label_all()).finalize()
    out = b("tidy up")
    assert not out and ran == ["label"]  # archive_inbox of a's trajectory was not run for b
    assert "has no tool for" in out.reason


def test_a_tool_run_in_a_thread_the_agent_started_keeps_the_run_out_of_the_cache(tmp_path):
    eng = _engine(tmp_path)
    sent: list[str] = []

    @eng.function()
    def find_customer(name: str) -> str:
        return "c-42"

    @eng.function()
    def send_email(to: str) -> str:
        sent.append(to)
        return "sent"

    def agent(task: str) -> str:
        cid = find_customer("Ada")
        with ThreadPoolExecutor(1) as pool:  # no context: the call is in no engine call's trajectory
            pool.submit(send_email, cid).result()
        return "emailed " + cid

    eng.set_agent(agent).finalize()
    first = eng("email Ada")
    assert first.status == "ok" and first.stored is None and "not stored" in first.reason
    again = eng("email Ada")
    assert not again and sent == ["c-42", "c-42"]  # was: a hit that sent no email
    send_email("outside")  # outside any engine call: nothing to mark
    t = threading.Thread(target=send_email, args=("x",))
    t.start()
    t.join()
    assert eng.entries() == []


# -- values taken from earlier results --------------------------------------------------------------


def _invoice_engine(tmp_path) -> tuple[Engine, list[str]]:
    eng = _engine(tmp_path)
    ids = {"alice": "c-1001", "bob": "c-2002", "carol": "c-3003"}
    sent: list[str] = []

    @eng.function()
    def find_customer(name: str) -> str:
        return ids[name]

    @eng.function()
    def send_invoice(customer_id: str) -> str:
        sent.append(customer_id)
        return "sent"

    def agent(task: str, name: str = "", continuation: Any = None) -> str:
        return send_invoice(find_customer(name))

    eng.set_agent(agent).finalize()
    return eng, sent


def test_a_value_taken_from_an_earlier_result_is_never_replayed_stale(tmp_path):
    eng, sent = _invoice_engine(tmp_path)
    assert not eng("send the invoice to alice", params={"name": "alice"}, name="alice")
    sent.clear()
    bob = eng("send the invoice to bob", params={"name": "bob"}, name="bob")
    assert sent == ["c-2002"]  # was: a hit that sent alice's invoice again
    assert not bob and bob.agent_called and "returned another result" in bob.reason
    assert [s["source"] for s in bob.steps] == ["replayed", "continued", "agent"]  # find_customer ran once
    for name, cid in [("alice", "c-1001"), ("bob", "c-2002"), ("carol", "c-3003"), ("alice", "c-1001")]:
        sent.clear()
        out = eng(f"send the invoice to {name}", params={"name": name}, name=name)
        assert out.status == "ok" and sent == [cid]  # a hit (switched to the entry that fits) or a hand-over


def test_an_id_a_call_made_is_not_reused_by_a_hit(tmp_path):
    eng = _engine(tmp_path)
    orders: dict[str, list[str]] = {}

    @eng.function()
    def create_order() -> dict:
        oid = f"o-{len(orders) + 1:03d}"
        orders[oid] = []
        return {"order": {"id": oid}, "status": "open"}

    @eng.function()
    def add_item(order_id: str, item: str) -> str:
        orders[order_id].append(item)
        return f"added {item} to {order_id}"

    def agent(task: str) -> str:
        return add_item(create_order()["order"]["id"], "widget")  # after a hand-over, create_order is answered

    eng.set_agent(agent).finalize()
    eng("order a widget")
    out = eng("order a widget")
    assert orders == {"o-001": ["widget"], "o-002": ["widget"]}  # was: two widgets in o-001, none in o-002
    assert out.output == "added widget to o-002"


def test_an_output_kept_from_the_recording_is_not_returned_stale(tmp_path):
    eng = _engine(tmp_path)
    box = {"id": "ticket-1001"}

    @eng.function()
    def open_ticket() -> str:
        return box["id"]

    def agent(task: str) -> str:
        return f"opened {open_ticket()}"

    eng.set_agent(agent).finalize()
    assert eng("open a ticket").output == "opened ticket-1001"
    assert eng("open a ticket").output == "opened ticket-1001"  # the same ticket: a hit
    box["id"] = "ticket-1002"
    out = eng("open a ticket")
    assert out.output == "opened ticket-1002" and out.agent_called


def test_feeds_find_keys_nested_values_and_fall_back_to_the_whole_result():
    from engrain._cache.values import feeds_hold, find_feeds

    results = [{"items": [{"id": "x-77", "at": "12:00"}], "by": {"k-9": 1}}, "ok"]
    args = [{}, {"id": "x-77", "note": "for k-9 only"}]
    feeds = find_feeds(results, args)
    assert {"at": ["items", 0, "id"], "value": "x-77"} in feeds[0] and {"at": ["by"], "key": "k-9"} in feeds[0]
    assert all(f.get("at") != ["items", 0, "at"] for f in feeds[0]) and feeds[1] == []
    fresh = {"items": [{"id": "x-77", "at": "12:05"}], "by": {"k-9": 2}}
    assert feeds_hold(feeds[0], fresh)  # a changed part no later step used does not stop a replay
    assert not feeds_hold(feeds[0], {"items": [{"id": "x-78"}], "by": {"k-9": 1}})
    assert not feeds_hold(feeds[0], {"items": [], "by": {"k-9": 1}})
    big = list(range(1000))
    (fed,), _ = find_feeds([big, 1], [{}, {"n": 5}])
    assert "digest" in fed and feeds_hold([fed], list(range(1000))) and not feeds_hold([fed], list(range(999)))
    assert find_feeds([True, None, ""], [{}, {"flag": True}, {"x": None}]) == [[], [], []]  # says too little to trace
