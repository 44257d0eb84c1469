"""Streams and connections of a real ``engrain serve`` are bounded (issue 23 #4), over real sockets.

A cancelled run's stream ends; streams are capped per server and per client
(429); readers that stop reading slow no one else; connections that never
finish their request head are closed, and past the connection cap new ones get
503 at once.
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import threading
import time
from pathlib import Path

import httpx

import engrain as eg
from servers import serve


def started_run(url: str, run_id: str) -> None:
    j = eg.open(url)
    try:
        j.append(run_id, [eg.NewEvent("run.started", "", {"task": "t"})], 0)
    finally:
        j.close()


def sse_kinds(lines: list[str]) -> list[str]:
    return [line.split(": ", 1)[1] for line in lines if line.startswith("event: ")]


def test_stream_of_a_cancelled_run_ends_with_run_cancelled(store_url, tmp_path):
    started_run(store_url, "c1")
    with serve(store_url, tmp_path, token=None) as base:
        got: list[str] = []
        ended = threading.Event()

        def read() -> None:
            with httpx.stream("GET", f"{base}/api/runs/c1/stream", timeout=30) as r:
                got.extend(r.iter_lines())
            ended.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(0.5)
        assert httpx.post(f"{base}/api/runs/c1/cancel", json={"reason": "test"}).json()["cancelled"] is True
        assert ended.wait(10), "the stream of a cancelled run never ended"
        assert sse_kinds(got) == ["run.started", "run.cancelled"]
        # Streaming it again after the end: the history, then the end at once.
        t0 = time.monotonic()
        again = httpx.get(f"{base}/api/runs/c1/stream", timeout=10)
        assert sse_kinds(again.text.splitlines()) == ["run.started", "run.cancelled"] and time.monotonic() - t0 < 5


def client_from(address: str) -> httpx.Client:
    """A client whose connections come from ``address`` (any 127.x.y.z reaches a loopback server on Linux)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=10)


def test_streams_are_capped_per_client_and_per_server(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    started_run(url, "r")
    extra = ("--max-streams", "5", "--max-client-streams", "3")
    with serve(url, tmp_path, token="tok", extra=extra) as base:
        auth = {"Authorization": "Bearer tok"}
        clients = {a: client_from(a) for a in ("127.0.0.2", "127.0.0.3", "127.0.0.4")}
        held = []

        def open_stream(address: str) -> httpx.Response:
            req = clients[address].build_request("GET", f"{base}/api/runs/r/stream", headers=auth)
            return clients[address].send(req, stream=True)

        for _ in range(3):
            r = open_stream("127.0.0.2")
            assert r.status_code == 200
            held.append(r)
        over = open_stream("127.0.0.2")
        assert over.status_code == 429 and over.headers["retry-after"] == "5"
        over.read()
        assert over.json()["error"] == "TooManyStreams" and "127.0.0.2" in over.json()["detail"]
        for _ in range(2):  # another client still has room, up to the server's cap
            r = open_stream("127.0.0.3")
            assert r.status_code == 200
            held.append(r)
        full = open_stream("127.0.0.4")
        assert full.status_code == 429
        full.read()
        assert "5 streams" in full.json()["detail"]
        assert httpx.get(f"{base}/api/health", headers=auth).json()["streams"] == 5
        held.pop().close()  # a slot comes back when its client leaves
        deadline = time.monotonic() + 10
        while httpx.get(f"{base}/api/health", headers=auth).json()["streams"] != 4:
            assert time.monotonic() < deadline, "a closed stream kept its slot"
            time.sleep(0.1)
        ok = open_stream("127.0.0.4")
        assert ok.status_code == 200
        held.append(ok)
        for r in held:
            r.close()
        for c in clients.values():
            c.close()


def _median_get(base: str, n: int = 15) -> float:
    times = []
    with httpx.Client(timeout=60) as c:
        for _ in range(n):
            t0 = time.perf_counter()
            assert c.get(f"{base}/api/runs?limit=20").status_code == 200
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stalled_stream(port: int, run_id: str) -> socket.socket:
    """A stream request whose client never reads a byte (a tiny receive buffer, so the server's writes block)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET /api/runs/{run_id}/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return s


def test_readers_that_never_read_slow_no_one_else(store_url, tmp_path):
    """300 streams whose clients never read, while their runs get events through the API.

    Before: every stream polled the journal through the thread pool the routes
    share, so reads and appends queued behind them (the report: 28 ms -> 3,255 ms).
    """
    url = store_url
    n = 300
    extra = ("--max-streams", "400", "--max-client-streams", "400")
    procs: list = []
    with serve(url, tmp_path, token=None, extra=extra, procs=procs) as base:
        port = int(base.rsplit(":", 1)[1])
        with httpx.Client(timeout=60) as c:
            for i in range(n):  # client runs: the API lets a client append to them
                start = {"kind": "run.started", "data": {"task": "t"}}
                assert c.post(f"{base}/api/runs/s{i}/events", json={"events": [start], "expected_seq": 0}).status_code == 200
        baseline = _median_get(base)
        socks = [_stalled_stream(port, f"s{i}") for i in range(n)]
        deadline = time.monotonic() + 30
        while httpx.get(f"{base}/api/health").json()["streams"] < n:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(1)
        # Idle streams cost the server next to nothing: one poll of their runs per tick, not one per stream.
        cpu0, t0 = _cpu(procs[0].pid), time.monotonic()
        time.sleep(3)
        idle_cpu = (_cpu(procs[0].pid) - cpu0) / (time.monotonic() - t0)
        loaded = _median_get(base)
        big = "x" * 20_000
        t0 = time.perf_counter()
        with httpx.Client(timeout=120) as c:
            for i in range(n):
                ev = {"kind": "log.entry", "name": "n", "data": {"text": big}}
                r = c.post(f"{base}/api/runs/s{i}/events", json={"events": [ev], "expected_seq": 1})
                assert r.status_code == 200, r.text
        appends = time.perf_counter() - t0
        after = _median_get(base)
        print(f"GET /api/runs median: {baseline * 1000:.1f} ms alone, {loaded * 1000:.1f} ms with {n} stalled streams, "
              f"{after * 1000:.1f} ms after their runs got events; {n} appends over HTTP {appends:.2f} s; "
              f"server CPU with {n} idle streams {idle_cpu:.0%}")
        assert idle_cpu < 0.08, idle_cpu
        assert loaded < max(5 * baseline, baseline + 0.1), (baseline, loaded)
        assert after < max(5 * baseline, baseline + 0.1), (baseline, after)
        assert appends < n * 0.05, appends
        for s in socks:
            s.close()


def test_a_reader_that_stops_reading_is_dropped_after_write_timeout(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    started_run(url, "w")
    with serve(url, tmp_path, token=None, extra=("--write-timeout", "2")) as base:
        port = int(base.rsplit(":", 1)[1])
        socks = [_stalled_stream(port, "w") for _ in range(3)]
        deadline = time.monotonic() + 10
        while httpx.get(f"{base}/api/health").json()["streams"] < 3:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # More than the kernel's socket buffers take, so the server's writes block.
        j = eg.open(url)
        for k in range(40):
            j.append("w", [eg.NewEvent("log.entry", "n", {"text": "x" * 100_000})], 1 + k)
        j.close()
        deadline = time.monotonic() + 20
        while (open_ := httpx.get(f"{base}/api/health").json()["streams"]) > 0:
            assert time.monotonic() < deadline, f"{open_} stalled streams still held"
            time.sleep(0.2)
        for s in socks:
            s.close()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_connections_that_never_finish_headers_are_closed_and_capped(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    procs: list = []
    extra = ("--header-timeout", "1.5", "--max-connections", "100")
    with serve(url, tmp_path, token=None, extra=extra, procs=procs) as base:
        port = int(base.rsplit(":", 1)[1])
        pid = procs[0].pid
        before = _fds(pid)
        socks = []
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the head never ends
            socks.append(s)
        time.sleep(0.5)
        assert _fds(pid) <= before + 100 + 5, "connections past --max-connections were kept"
        refused = 0
        for s in socks[100:]:
            s.settimeout(2)
            data = s.recv(4096)
            refused += data.startswith(b"HTTP/1.1 503")
        assert refused == 200
        # Past the deadline every held one is answered 408 and closed.
        t0 = time.monotonic()
        for s in socks[:100]:
            s.settimeout(5)
            data = b""
            while chunk := s.recv(4096):
                data += chunk
            assert data.startswith(b"HTTP/1.1 408"), data[:80]
        assert time.monotonic() - t0 < 4
        for s in socks:
            s.close()
        deadline = time.monotonic() + 5
        while _fds(pid) > before + 2:
            assert time.monotonic() < deadline, (before, _fds(pid))
            time.sleep(0.1)
        assert httpx.get(f"{base}/api/health").status_code == 200


def test_an_endless_request_head_is_431_and_an_idle_keepalive_connection_is_closed(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with serve(url, tmp_path, token=None, extra=("--header-timeout", "1")) as base:
        port = int(base.rsplit(":", 1)[1])
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        try:
            for _ in range(200):
                s.sendall(b"X-Filler: " + b"a" * 1000 + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        s.settimeout(5)
        assert s.recv(4096).startswith(b"HTTP/1.1 431")
        s.close()
        # A keep-alive connection that goes quiet after its response does not stay open.
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        s.settimeout(5)
        first = s.recv(65536)
        while b"\r\n\r\n" not in first:  # the head and the body may come in separate segments
            first += s.recv(65536)
        head, body = first.split(b"\r\n\r\n", 1)
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
        while len(body) < length:
            body += s.recv(65536)
        assert head.startswith(b"HTTP/1.1 200") and json.loads(body)["ok"] is True
        t0 = time.monotonic()
        rest = b""
        while chunk := s.recv(4096):
            rest += chunk
        assert time.monotonic() - t0 < 3
        s.close()


def test_x_forwarded_for_never_picks_the_client_a_stream_counts_for(tmp_path):
    """A client on the server's own host (uvicorn trusts loopback's proxy headers by default) cannot
    name another address per request to get past the per-client cap."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    started_run(url, "r")
    with serve(url, tmp_path, token=None, extra=("--max-client-streams", "2")) as base:
        with httpx.Client(timeout=10) as c:
            held = []
            for i in range(2):
                r = c.send(c.build_request("GET", f"{base}/api/runs/r/stream",
                                           headers={"X-Forwarded-For": f"10.0.0.{i}", "Forwarded": f"for=10.0.1.{i}"}),
                           stream=True)
                assert r.status_code == 200
                held.append(r)
            over = c.send(c.build_request("GET", f"{base}/api/runs/r/stream", headers={"X-Forwarded-For": "10.0.0.9"}),
                          stream=True)
            assert over.status_code == 429
            over.read()
            assert "client 127.0.0.1 " in over.json()["detail"]
            for r in held:
                r.close()


def test_a_request_body_that_never_arrives_is_408_and_closed(tmp_path):
    """Slowloris on bodies: a complete head, then a body that stops or trickles, is answered 408 and closed
    after --body-timeout (it would otherwise hold its connection, and one of --max-connections, forever)."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    procs: list = []
    extra = ("--body-timeout", "1.5", "--header-timeout", "1", "--max-connections", "20")
    with serve(url, tmp_path, token=None, extra=extra, procs=procs) as base:
        port = int(base.rsplit(":", 1)[1])
        head = (b"POST /api/runs/slow/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100000\r\n\r\n{")
        stalled = []
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(head)
            stalled.append(s)
        t0 = time.monotonic()
        trickle = stalled.pop()
        trickle.settimeout(0.2)
        while True:  # a byte every 0.2 s keeps it busy, never done: closed all the same
            try:
                trickle.sendall(b" ")
                if not trickle.recv(4096):
                    break
            except socket.timeout:
                assert time.monotonic() - t0 < 5, "a trickling body held its connection"
            except (BrokenPipeError, ConnectionResetError):  # closed while we were still sending
                break
        assert 1.4 < time.monotonic() - t0 < 5
        for s in stalled:
            s.settimeout(5)
            data = b""
            while chunk := s.recv(4096):
                data += chunk
            assert data.startswith(b"HTTP/1.1 408"), data[:80]
            assert b"body" in data
        assert time.monotonic() - t0 < 5
        stalled.append(trickle)
        for s in stalled:
            s.close()
        # The connections are free again, and a body sent at once is served as ever.
        r = httpx.post(f"{base}/api/runs/fine/events",
                       json={"events": [{"kind": "run.started", "data": {"task": "t"}}], "expected_seq": 0}, timeout=10)
        assert r.status_code == 200, r.text


def test_serve_help_lists_the_limits():
    from typer.testing import CliRunner

    from engrain._cli import app

    out = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    for opt in ("--max-connections", "--max-streams", "--max-client-streams", "--header-timeout", "--body-timeout",
                "--write-timeout"):
        assert opt in out




def test_a_reader_far_behind_still_gets_every_event_in_order(tmp_path):
    """More events than a stream keeps queued arrive while its reader is not reading: it reads the journal again."""
    from engrain._server.streams import MAX_QUEUED

    url = f"sqlite:///{tmp_path / 'e.db'}"
    started_run(url, "far")
    n = MAX_QUEUED * 2 + 50
    with serve(url, tmp_path, token=None) as base:
        port = int(base.rsplit(":", 1)[1])
        s = _stalled_stream(port, "far")
        time.sleep(1)
        j = eg.open(url)
        for k in range(n):
            j.append("far", [eg.NewEvent("log.entry", "n", {"k": k, "pad": "y" * 10_000})], 1 + k)
        j.append("far", [eg.NewEvent("run.completed", "", {"output": 1})], 1 + n)
        j.close()
        time.sleep(2)  # the hub hands over far more than the stream may queue while nobody reads
        s.settimeout(20)
        data = b""
        while not data.endswith(b"0\r\n\r\n"):  # the chunked body's end: the stream ended
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            data += chunk
        s.close()
    ids = [int(line.split(b": ", 1)[1]) for line in data.split(b"\n") if line.startswith(b"id: ")]
    assert ids == list(range(n + 2)), (len(ids), ids[:5], ids[-5:])
