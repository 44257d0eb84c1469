"""Events appended per second over HTTP (``engrain serve``), on SQLite and PostgreSQL.

For each backend this starts one ``engrain serve`` process, then drives it with
``--clients`` threads, each appending one event per request to its own run via
``POST /api/runs/{id}/events`` (optimistic concurrency, ``expected_seq``) for
``--seconds``. Printed side by side with the same appends made in-process on
the journal (no HTTP), so the cost of the HTTP layer is visible.

    python bench/server.py                 # both backends
    python bench/server.py --backend sqlite --clients 8 --seconds 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import engrain as eg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.servers import serve  # noqa: E402 - the same start/stop as the tests

PG_URL = os.environ.get("ENGRAIN_TEST_PG_URL", "postgresql://engrain:engrain@127.0.0.1:5432/engrain_test")


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


def drive(append, clients: int, seconds: float, batch: int = 1) -> tuple[int, list[float]]:
    """Run ``clients`` threads calling ``append(run_id, seq, kind, n)`` until time is up; (events, latencies)."""
    stop = time.monotonic() + seconds
    counts = [0] * clients
    lats: list[list[float]] = [[] for _ in range(clients)]

    def worker(k: int) -> None:
        run_id = f"bench-{k}-{uuid.uuid4().hex[:6]}"
        append(run_id, 0, "run.started", 1)
        seq = 1
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            append(run_id, seq, "step.completed", batch)
            lats[k].append(time.perf_counter() - t0)
            seq += batch
        counts[k] = seq - 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts), [x for ls in lats for x in ls]


def event(kind: str, seq: int) -> dict:
    if kind == "run.started":
        return {"kind": kind, "data": {"task": "bench", "inputs": {}, "tags": ["bench"]}}
    return {"kind": kind, "name": "tool", "data": {"call_id": seq, "result": {"n": seq, "text": "x" * 64}}}


def bench_http(url: str, clients: int, seconds: float, tmp: Path, batch: int) -> tuple[int, list[float]]:
    token = uuid.uuid4().hex
    with serve(url, tmp, token=token, name=f"serve-{uuid.uuid4().hex[:6]}") as base:
        local = threading.local()

        def append(run_id: str, seq: int, kind: str, n: int) -> None:
            c = getattr(local, "c", None)
            if c is None:
                c = local.c = eg.Client(base, token=token)
            c.append(run_id, [event(kind, seq + i) for i in range(n)], seq)

        return drive(append, clients, seconds, batch)


def bench_direct(url: str, clients: int, seconds: float) -> tuple[int, list[float]]:
    j = eg.open(url)

    def append(run_id: str, seq: int, kind: str, n: int) -> None:
        e = event(kind, seq)
        j.append(run_id, [eg.NewEvent(e["kind"], e.get("name", ""), e["data"])], seq)

    try:
        return drive(append, clients, seconds)
    finally:
        j.close()


def fmt(n: int, lats: list[float], seconds: float) -> str:
    if not lats:
        return "no events"
    q = statistics.quantiles(lats, n=100) if len(lats) > 1 else [lats[0]] * 99
    return f"{n / seconds:9.0f} ev/s   p50 {q[49] * 1000:6.2f} ms   p99 {q[98] * 1000:7.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    print(f"engrain server bench: {args.clients} client threads, {args.seconds:.0f} s per row; "
          "latency is per append request")
    print(f"{'backend':<10} {'path':<22} {'throughput':>12}")
    for backend in backends:
        tmp = Path(tempfile.mkdtemp(prefix="engrain-bench-server-"))
        schema = None
        try:
            for path, batch in (("in-process journal", 1), ("HTTP (engrain serve)", 1), ("HTTP, 10 ev/request", 10)):
                if backend == "sqlite":
                    url = f"sqlite:///{tmp / (uuid.uuid4().hex[:8] + '.db')}"
                else:
                    schema = "bench_" + uuid.uuid4().hex[:10]
                    url = pg_schema(schema)
                if path.startswith("HTTP"):
                    n, lats = bench_http(url, args.clients, args.seconds, tmp, batch)
                else:
                    n, lats = bench_direct(url, args.clients, args.seconds)
                print(f"{backend:<10} {path:<22} {fmt(n, lats, args.seconds)}", flush=True)
                if schema:
                    drop_schema(schema)
                    schema = None
        finally:
            if schema:
                drop_schema(schema)
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
