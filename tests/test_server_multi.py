"""Two ``engrain serve`` processes on one PostgreSQL store, driven by concurrent clients."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import pytest

import engrain as eg
from tests.conftest import drop_pg_schema, pg_schema_url
from tests.servers import serve

TOKEN = "multi-secret"
ASK = """\
name: ask
inputs:
  type: object
  properties:
    who: {type: string}
  required: [who]
steps:
  - id: q
    type: prompt.user
    prompt: "Say hi to {{ inputs.who }}?"
    fields:
      - {name: greeting, type: text}
  - id: result
    type: return
    value: "{{ q.greeting }} {{ inputs.who }}"
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two server processes on one fresh PostgreSQL schema; stopped in teardown."""
    tmp = tmp_path_factory.mktemp("multi")
    schema = "t_" + uuid.uuid4().hex[:12]
    url = pg_schema_url(schema)
    routines = tmp / "routines"
    (routines / "ask").mkdir(parents=True)
    (routines / "ask" / "routine.yaml").write_text(ASK)
    try:
        with ExitStack() as stack:
            bases = [stack.enter_context(serve(url, tmp, token=TOKEN, name=f"server{i}", routines=routines)) for i in range(2)]
            yield bases, url
    finally:
        drop_pg_schema(schema)


def test_both_servers_share_the_store(cluster):
    (a, b), _url = cluster
    ca, cb = eg.Client(a, token=TOKEN), eg.Client(b, token=TOKEN)
    assert ca.health()["backend"] == cb.health()["backend"] == "postgres"
    ca.append("shared-view", [{"kind": "run.started", "data": {"task": "seen by both"}}], 0)
    assert cb.get_run("shared-view").task == "seen by both"
    with pytest.raises(eg.ConflictError):
        cb.append("shared-view", [{"kind": "run.started", "data": {"task": "again"}}], 0)


def test_concurrent_appends_through_two_servers_lose_nothing(cluster):
    (a, b), _url = cluster
    run_id = "race-" + uuid.uuid4().hex[:8]
    eg.Client(a, token=TOKEN).append(run_id, [{"kind": "run.started", "data": {"task": "race"}}], 0)
    workers, per_worker = 6, 15
    conflicts = []

    def work(w: int) -> None:
        c = eg.Client(a if w % 2 else b, token=TOKEN)
        for i in range(per_worker):
            while True:
                seq = c.get_run(run_id).next_seq
                try:
                    c.append(run_id, [{"kind": "step.started", "name": f"w{w}", "data": {"call_id": 0, "i": i}}], seq)
                    break
                except eg.ConflictError:
                    conflicts.append(w)
        c.close()

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(work, range(workers)))
    events = eg.Client(a, token=TOKEN).events(run_id)
    assert [e.seq for e in events] == list(range(1 + workers * per_worker))
    written = sorted((e.name, e.data["i"]) for e in events[1:])
    assert written == sorted((f"w{w}", i) for w in range(workers) for i in range(per_worker))
    assert conflicts, "the workers never raced; the test did not exercise concurrency"


def test_each_waiting_run_takes_exactly_one_answer(cluster):
    (a, b), url = cluster
    j = eg.open(url)

    def agent(task: str) -> str:
        return eg.ask("name?", [{"name": "name"}])["name"]

    run_ids = [eg.run(agent, f"ask {i}", journal=j).run_id for i in range(8)]
    outcomes: dict[str, list[int]] = {r: [] for r in run_ids}
    lock = threading.Lock()

    def answer(args: tuple[str, str, str]) -> None:
        base, run_id, who = args
        with eg.Client(base, token=TOKEN) as c:
            try:
                c.answer(run_id, {"name": who})
                code = 200
            except eg.RemoteError as e:
                code = e.status
        with lock:
            outcomes[run_id].append(code)

    jobs = [(base, r, who) for r in run_ids for base, who in ((a, "A"), (b, "B"))]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(answer, jobs))
    for r in run_ids:
        assert sorted(outcomes[r]) == [200, 409], outcomes[r]
        received = [e for e in j.read(r) if e.kind == "input.received"]
        assert len(received) == 1
        assert eg.run(agent, f"ask {run_ids.index(r)}", run_id=r, journal=j).output in ("A", "B")
    j.close()


def test_routine_started_on_one_server_is_answered_on_the_other(cluster):
    (a, b), _url = cluster
    ca, cb = eg.Client(a, token=TOKEN), eg.Client(b, token=TOKEN)

    def start(i: int) -> str:
        res = (ca if i % 2 else cb).run_routine("ask", {"who": f"p{i}"})
        assert res.status == "needs_input", res
        return res.run_id

    with ThreadPoolExecutor(4) as pool:
        run_ids = list(pool.map(start, range(6)))
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda t: (cb if t[0] % 2 else ca).answer(t[1], {"greeting": "hi"}), enumerate(run_ids)))
    assert [r.output for r in results] == [f"hi p{i}" for i in range(6)]
    assert all(ca.get_run(r).status == "ok" for r in run_ids)


def test_stream_on_one_server_sees_appends_made_through_the_other(cluster):
    (a, b), _url = cluster
    run_id = "stream-" + uuid.uuid4().hex[:8]
    cb = eg.Client(b, token=TOKEN)
    cb.append(run_id, [{"kind": "run.started", "data": {"task": "stream"}}], 0)
    got: list[str] = []

    def consume() -> None:
        with eg.Client(a, token=TOKEN) as ca:
            for e in ca.stream(run_id):
                got.append(e.kind)

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.3)
    cb.append(run_id, [{"kind": "step.started", "name": "t", "data": {"call_id": 0, "args": {}}}], 1)
    time.sleep(0.2)
    assert got == ["run.started", "step.started"]  # delivered live, before the run ends
    cb.append(run_id, [{"kind": "run.completed", "data": {"output": 1}}], 2)
    t.join(10)
    assert not t.is_alive() and got == ["run.started", "step.started", "run.completed"]
