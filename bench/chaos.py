"""Chaos loop: SIGKILL a durable agent at random points and resume at once, many times, and count.

The PostgreSQL takeover race (issue 12 item 3): a warm executor resumes a run
right after its previous executor was killed, while the killed client's last
statement may still be running on the server. Before lease epochs this made
``eg.run`` raise ``ConflictError: expected seq N, journal at N+1`` in about 1
run in 8 under load. This script repeats the kill/resume loop of
``tests/test_crash.py`` (its ``crash_agent.py`` children, its kill timing) and
prints what happened instead of asserting, so a regression shows as a count:

- runs, kills (and kills that hit a run in flight);
- conflicts surfaced: ``ConflictError`` tracebacks printed by any executor (must be 0);
- other executor errors (tracebacks other than conflicts; must be 0);
- completed steps re-executed: a step whose completion was journaled ran again (must be 0);
- in-flight steps retried: a step killed between its start and its journaled
  completion called again with the same idempotency key (expected, that is the design);
- runs with a wrong outcome or a hole in the journal (must be 0).

Usage: python bench/chaos.py [--runs 200] [--url STORE_URL]
Default store: a fresh schema on ``$ENGRAIN_TEST_PG_URL`` (dropped afterwards).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import select
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import engrain as eg  # noqa: E402
from test_crash import STEPS, Child, _expected, _side_effects, _Tail, _wait_effects  # noqa: E402

PG_URL = os.environ.get("ENGRAIN_TEST_PG_URL", "postgresql://engrain:engrain@127.0.0.1:5432/engrain_test")


def _fresh_pg_schema() -> tuple[str, str]:
    import psycopg

    schema = "chaos_" + uuid.uuid4().hex[:10]
    with psycopg.connect(PG_URL, autocommit=True) as c:
        c.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    return schema, f"{PG_URL}{sep}options={quote(f'-csearch_path={schema}', safe='')}"


def _drop_pg_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _audit(journal, run_id: str, effects: dict[str, list[int]]) -> tuple[int, int, bool]:
    """(completed steps re-executed, in-flight steps retried, run is whole and right) for one run."""
    events = journal.read(run_id)
    kinds = [e.kind for e in events]
    whole = (
        [e.seq for e in events] == list(range(len(events)))
        and kinds[:1] == ["run.started"]
        and kinds[-1:] == ["run.completed"]
        and kinds.count("run.completed") == 1
        and "run.failed" not in kinds
        and events[-1].data.get("output") == _expected(STEPS)
    )
    starts: dict[int, list[int]] = collections.defaultdict(list)
    done: dict[int, list[int]] = collections.defaultdict(list)
    for e in events:
        if e.kind == "step.started":
            starts[e.data["call_id"]].append(e.seq)
        elif e.kind == "step.completed":
            done[e.data["call_id"]].append(e.seq)
    reexecuted = retried = 0
    for n in range(STEPS):
        pids = effects.get(f"{run_id}:{n}", [])
        whole = whole and len(done[n]) == 1
        # More effects than journaled starts, or a start after the completion: a finished step ran again.
        reexecuted += max(0, len(pids) - len(starts[n])) + sum(1 for s in starts[n] if done[n] and s > done[n][0])
        retried += max(0, len(starts[n]) - 1)
    return reexecuted, retried, whole


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--url", default=None, help="store URL (default: a fresh schema on $ENGRAIN_TEST_PG_URL)")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    schema = None
    url = args.url
    if url is None:
        schema, url = _fresh_pg_schema()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    tmp = Path(tempfile.mkdtemp(prefix="engrain-chaos-"))
    side, log = tmp / "side-effects.log", tmp / "executors-stderr.log"
    journal = eg.open(url)
    counts = collections.Counter()
    t0 = time.monotonic()
    finisher = Child(url, side, log)
    try:
        tail = _Tail(side)
        run_ids = [f"chaos-{i:04d}" for i in range(args.runs)]
        for i, run_id in enumerate(run_ids):
            counts["runs"] += 1
            for _ in range(rng.randint(1, 2)):
                child = Child(url, side, log)
                try:
                    child.send(run_id)
                    child.readline()
                    ended = _wait_effects(child, tail, rng.randint(0, STEPS))
                    time.sleep(rng.uniform(0, 0.003))
                    ended = ended or bool(select.select([child.proc.stdout], [], [], 0)[0])
                except AssertionError:  # the executor died on its own: counted from its stderr below
                    ended = True
                finally:
                    child.kill()
                counts["kills"] += 1
                counts["kills in flight"] += not ended
            # The warm finisher resumes at once: its read races the killed client's last statement.
            for attempt in range(3):
                try:
                    finisher.send(run_id)
                    finisher.readline()
                    result = json.loads(finisher.readline())
                    counts["finisher ok" if result["status"] == "ok" else "finisher not ok"] += 1
                    break
                except AssertionError:  # the finisher raised (a conflict surfaced): start another
                    counts["finisher crashed"] += 1
                    finisher.kill()
                    finisher = Child(url, side, log)
            if (i + 1) % 50 == 0:
                print(f"  {i + 1} runs, {counts['kills']} kills, {time.monotonic() - t0:.0f}s", flush=True)
        finisher.close()
        effects = _side_effects(side)
        for run_id in run_ids:
            reexecuted, retried, whole = _audit(journal, run_id, effects)
            counts["completed steps re-executed"] += reexecuted
            counts["in-flight steps retried"] += retried
            counts["runs wrong or with holes"] += not whole
        text = log.read_text(errors="replace") if log.exists() else ""
        counts["conflicts surfaced"] = text.count("ConflictError")
        counts["other executor errors"] = text.count("Traceback") - text.count("ConflictError")
    finally:
        finisher.kill()
        journal.close()
        if schema:
            _drop_pg_schema(schema)
    order = [
        "runs",
        "kills",
        "kills in flight",
        "conflicts surfaced",
        "other executor errors",
        "finisher crashed",
        "completed steps re-executed",
        "in-flight steps retried",
        "runs wrong or with holes",
    ]
    backend = "postgres" if url.startswith("postgres") else "sqlite"
    print(f"chaos on {backend}, seed {seed}, {time.monotonic() - t0:.0f}s:")
    for k in order:
        print(f"  {k:<30} {counts[k]}")
    bad = counts["conflicts surfaced"] + counts["other executor errors"] + counts["completed steps re-executed"]
    bad += counts["runs wrong or with holes"]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
