"""The agent engine's own costs, against a scripted model (a local stub server, not an LLM).

Three figures, each with the scripted model's own time taken out:

1. Creating an agent over HTTP (``POST /api/agents`` on ``engrain serve``, SQLite):
   median request latency through httpx, next to ``GET /api/health`` on the same
   connection (the HTTP floor) and Engram's stated figure for ``CreateAgent``
   (about 4 ms; a published number, not measured here). Target: <= 2 ms. For
   scale, the same create written on a plain socket: what is left once the
   client library's own time is out.
2. engrain's overhead per LLM turn (in-process ``Agent.run``, SQLite and
   PostgreSQL): the run's wall time minus the time spent inside the provider
   call (SDK + scripted model), divided by the turns. Each turn journals the LLM
   step and one tool step; only the LLM step that asks for tools is flushed to
   disk on its own, and the tool's result is sent without waiting for the
   store's answer, which the next LLM step's append reads (see
   ``engrain._agent.loop``). Target: <= 1 ms.
3. First streamed token through ``engrain serve``: a client ``POST
   /api/agents/{name}/chat`` reads the SSE stream; the delay from the moment
   the scripted model wrote its first text chunk to its socket (timestamped in
   the model's process) to the moment the client read it as a ``text`` event
   (timestamped in this one), both on the system's monotonic clock. Target:
   <= 1 ms. Printed next to one hop alone (the scripted model read directly by
   the openai SDK in this process).

The scripted model runs in a process of its own: in-process, its threads
would take turns on this process's GIL and their time would land in the
figures.

    python bench/agent.py [--n 200] [--turns 5] [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

import engrain as eg
from engrain._journal.base import Journal
from engrain._agent.scripted import ScriptedModel, say, tool_call

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.servers import serve  # noqa: E402 - the same start/stop as the tests

PG_URL = os.environ.get("ENGRAIN_TEST_PG_URL", "postgresql://engrain:engrain@127.0.0.1:5432/engrain_test")
ENGRAM_CREATE_AGENT_MS = 4.0  # Engram's stated CreateAgent latency


class RemoteModel:
    """A :class:`ScriptedModel` in its own process, so its threads never share this process's GIL.

    In-process, the stub's handler threads run while engrain and the client do,
    and their time lands in engrain's figures. Forked (the script may be a
    closure), it reports its URL and its first-token timestamps over a pipe;
    ``time.monotonic`` is the system's clock, the same in both processes.
    """

    def __init__(self, script, **kw):
        ctx = multiprocessing.get_context("fork")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=self._serve, args=(child, script, kw), daemon=True)
        self._proc.start()
        self.url = self._conn.recv()
        self.openai_url = self.url + "/v1"

    @staticmethod
    def _serve(conn, script, kw) -> None:
        model = ScriptedModel(script, **kw).start()
        conn.send(model.url)
        while (cmd := conn.recv()) != "stop":
            conn.send(list(model.first_text_sent) if cmd == "first" else model.calls)
        model.stop()

    @property
    def first_text_sent(self) -> list[float]:
        self._conn.send("first")
        return self._conn.recv()

    @property
    def calls(self) -> int:
        self._conn.send("calls")
        return self._conn.recv()

    def stop(self) -> None:
        self._conn.send("stop")
        self._proc.join(5)


class PlainHTTP:
    """HTTP/1.1 requests written on a plain keep-alive socket: the server's time without a client library's."""

    def __init__(self, base: str):
        import socket

        host, port = base.rsplit("//", 1)[1].split(":")
        self.host = f"{host}:{port}"
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def post(self, path: str, body: bytes) -> int:
        """POST a JSON body; the response's status once it is read whole (by its Content-Length)."""
        self.sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += self.sock.recv(65536)
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = next(int(v) for k, _, v in (x.partition(b":") for x in lines[1:]) if k.lower() == b"content-length")
        while len(rest) < length:
            rest += self.sock.recv(65536)
        return int(lines[0].split()[1])

    def close(self) -> None:
        self.sock.close()


def pg_schema(schema: str) -> str:
    from urllib.parse import quote

    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as c:
        c.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    return f"{PG_URL}{'&' if '?' in PG_URL else '?'}options={quote(f'-csearch_path={schema}', safe='')}"


def drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def ms(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"median {statistics.median(xs) * 1000:7.3f} ms   p90 {xs[int(len(xs) * 0.9)] * 1000:7.3f} ms"


def verdict(xs: list[float], target_ms: float) -> str:
    """``target <= N ms ok`` or ``MISSED``, by the median."""
    return f"target <= {target_ms:g} ms " + ("ok" if statistics.median(xs) * 1000 <= target_ms else "MISSED")


def bench_create_and_stream(n: int, runs: int) -> None:
    model = RemoteModel(lambda api, body: say("Hello there, this is the scripted model answering."),
                        first_token_delay=0.02)
    os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"] = model.openai_url, "scripted"
    tmp = Path(tempfile.mkdtemp(prefix="engrain-bench-agent-"))
    try:
        with serve(f"sqlite:///{tmp / 'bench.db'}", tmp, token=None) as base, httpx.Client(base_url=base) as http:
            for _ in range(20):  # warm up the connection and the route
                http.get("/api/health")
            plain = PlainHTTP(base)
            health, create, bare = [], [], []
            for i in range(n):  # the HTTP floor and the creates alternately, under the same load
                t0 = time.perf_counter()
                http.get("/api/health")
                health.append(time.perf_counter() - t0)
                body = {"name": f"a{i}-{uuid.uuid4().hex[:6]}", "model": "openai:scripted",
                        "instructions": "Answer briefly.", "tools": []}
                t0 = time.perf_counter()
                r = http.post("/api/agents", json=body)
                create.append(time.perf_counter() - t0)
                r.raise_for_status()
                raw = json.dumps({**body, "name": f"p{i}-{uuid.uuid4().hex[:6]}"}).encode()
                t0 = time.perf_counter()
                status = plain.post("/api/agents", raw)
                bare.append(time.perf_counter() - t0)
                assert status == 201, status
            plain.close()
            print("1. create an agent over HTTP (engrain serve, SQLite)")
            print(f"   POST /api/agents      {ms(create)}   "
                  f"({verdict(create, 2)}; Engram states ~{ENGRAM_CREATE_AGENT_MS:.0f} ms; N={n})")
            print(f"   GET /api/health       {ms(health)}   (the HTTP floor on the same connection)")
            print(f"   POST, plain socket    {ms(bare)}   (the same create without httpx: the server's share)")

            http.post("/api/agents", json={"name": "streamer", "model": "openai:scripted"}).raise_for_status()
            import openai

            sdk = openai.OpenAI(base_url=model.openai_url, api_key="scripted")
            lat, first, direct = [], [], []
            for i in range(runs + 3):  # engrain and the one-hop peer alternately, under the same load
                sent_before = len(model.first_text_sent)
                t_req = time.monotonic()
                with http.stream("POST", "/api/agents/streamer/chat",
                                 json={"session": f"b{i}-{uuid.uuid4().hex[:6]}", "message": "hi"}) as resp:
                    got = None
                    for line in resp.iter_lines():
                        if got is None and line.startswith("event: text"):
                            got = time.monotonic()
                    sent = model.first_text_sent
                    assert got is not None and len(sent) == sent_before + 1
                stream = sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                     stream=True)
                got_direct = None
                for chunk in stream:
                    if got_direct is None and chunk.choices and chunk.choices[0].delta.content:
                        got_direct = time.monotonic()
                if i >= 3:  # the first chats warm the server's agent and SDK client
                    lat.append(got - sent[-1])
                    first.append(got - t_req)
                    direct.append(got_direct - model.first_text_sent[-1])
            print("3. first streamed token through engrain serve (POST /api/agents/{name}/chat, SSE)")
            print(f"   model's first token written -> client reads it   {ms(lat)}   ({verdict(lat, 1)}; N={len(lat)})")
            print(f"   for scale, one hop: the model straight to the openai SDK  {ms(direct)}   "
                  "(same runs, alternately)")
            print(f"   request sent -> first token at the client        {ms(first)}   "
                  f"(includes the model's 20 ms first-token delay)")
    finally:
        model.stop()


class Counts:
    """Appends asking for a flush (``durable=True``) and those sent without waiting (``wait=False``)."""

    flushed = sent = 0


def counting(journal) -> Counts:
    """Count ``journal``'s appends: both ``append`` and ``append_one`` (a run's steps), as instance attributes."""
    counts = Counts()
    inner, inner_one = journal.append, journal.append_one

    def append(*a, durable=True, wait=True, **kw):
        counts.flushed += durable
        counts.sent += not wait
        return inner(*a, durable=durable, wait=wait, **kw)

    # A backend without its own append_one (PostgreSQL) runs it through append, counted there.
    own = type(journal).append_one is not Journal.append_one

    def append_one(*a, durable=True, wait=True, **kw):
        if own:
            counts.flushed += durable
            counts.sent += not wait
        return inner_one(*a, durable=durable, wait=wait, **kw)

    journal.append, journal.append_one = append, append_one
    return counts


def bench_turns(turns: int, runs: int) -> None:
    print(f"2. engrain's overhead per LLM turn (Agent.run in-process; {turns} tool turns + 1 final per run)")
    for backend in ("sqlite", "postgres"):
        schema = None
        if backend == "sqlite":
            url = f"sqlite:///{tempfile.mkdtemp(prefix='engrain-bench-turn-')}/t.db"
        else:
            schema = "bench_" + uuid.uuid4().hex[:8]
            url = pg_schema(schema)
        journal = eg.open(url)
        model = RemoteModel(lambda api, body: (tool_call("add", a=1, b=2) if sum(
            1 for m in body["messages"] if m["role"] == "tool") < turns else say("Done.")))

        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        for streamed in (False, True):
            agent = eg.Agent("bench", "openai:scripted", "Add numbers.", [add], base_url=model.openai_url,
                             journal=journal, stream=streamed, max_turns=turns + 2)
            inner = agent.provider.complete
            spent = [0.0, 0.0]  # wall and CPU time inside the provider call

            def timed(*a, **kw):
                t0, c0 = time.perf_counter(), time.process_time()
                try:
                    return inner(*a, **kw)
                finally:
                    spent[0] += time.perf_counter() - t0
                    spent[1] += time.process_time() - c0

            agent.provider.complete = timed
            per_turn, cpu = [], []
            counts = None
            for i in range(runs + 2):
                if i == runs + 1:  # the last run also counts its flushed appends (a wrapper costs ~1 us)
                    counts = counting(journal)
                spent[:] = [0.0, 0.0]
                t0, c0 = time.perf_counter(), time.process_time()
                res = agent.run("add things")
                wall, used = time.perf_counter() - t0, time.process_time() - c0
                assert res, res.error
                if i >= 2:
                    per_turn.append((wall - spent[0]) / (turns + 1))
                    cpu.append((used - spent[1]) / (turns + 1))
            flushed, sent = counts.flushed / (turns + 1), counts.sent / (turns + 1)
            del journal.append, journal.append_one
            kind = "streamed" if streamed else "whole   "
            appends = len(journal.read(res.run_id)) / (turns + 1)
            print(f"   {backend:<8} {kind}  {ms(per_turn)}   ({verdict(per_turn, 1)}; {appends:.1f} journal appends "
                  f"per turn, {flushed:.1f} of them flushed, {sent:.1f} not waited for; N={len(per_turn)} runs)")
            print(f"   {'':<8} {'':<8}  of which this process's CPU: median {statistics.median(cpu) * 1000:7.3f} ms "
                  "(the rest waits for the store)")
        # What those appends cost alone on this backend, for reading the figures above.
        rid, lat = f"bench-append-{uuid.uuid4().hex[:6]}", []
        journal.append(rid, [eg.NewEvent("run.started", "", {"task": "x", "inputs": {}, "tags": []})], 0)
        for seq in range(1, 201):
            t0 = time.perf_counter()
            journal.append(rid, [eg.NewEvent("step.completed", "x", {"call_id": seq, "result": 1})], seq)
            lat.append(time.perf_counter() - t0)
        print(f"   {backend:<8} one journal append alone  {ms(lat)}")
        if backend == "postgres":  # what the turn's unflushed commits cost (tool results, final reply)
            lat = []
            for seq in range(201, 401):
                t0 = time.perf_counter()
                journal.append(rid, [eg.NewEvent("step.completed", "x", {"call_id": seq, "result": 1})], seq,
                               durable=False)
                lat.append(time.perf_counter() - t0)
            print(f"   {backend:<8} one unflushed append alone  {ms(lat)}")
            lat = []
            for seq in range(401, 501):  # each after the server sat idle, as a step's append after a model call
                time.sleep(0.003)
                t0 = time.perf_counter()
                journal.append(rid, [eg.NewEvent("step.completed", "x", {"call_id": seq, "result": 1})], seq)
                lat.append(time.perf_counter() - t0)
            print(f"   {backend:<8} one journal append after 3 ms idle  {ms(lat)}   (what a model step's flush costs "
                  "here: the server wakes up)")
        model.stop()
        journal.close()
        if schema:
            drop_schema(schema)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200, help="agents to create")
    ap.add_argument("--turns", type=int, default=5, help="tool turns per run")
    ap.add_argument("--runs", type=int, default=20, help="runs / chats measured")
    args = ap.parse_args()
    bench_create_and_stream(args.n, args.runs)
    bench_turns(args.turns, args.runs)


if __name__ == "__main__":
    main()
