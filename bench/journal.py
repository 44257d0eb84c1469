"""Per-step overhead of a durable run, and resume time of a 10k-event run: engrain vs DBOS Transact.

A durable run whose agent calls a trivial tool N times is timed end to end and
divided by N (median of several runs). engrain is measured on SQLite
(``durability=normal``: WAL, survives a process crash; ``full``: fsync per
step), on PostgreSQL (``full``: the server's synchronous commit; ``normal``:
``synchronous_commit=off``) and DBOS Transact with its SQLite system database
(its defaults: rollback journal, synchronous=FULL, i.e. fsync'd), a workflow of
N ``@DBOS.step`` calls. DBOS runs in its own virtualenv (``bench/.peers/dbos``,
created here on first use) in a child process that prints JSON.

Floor: a default step journals only its completion (``step.completed`` with
its type, arguments and start time), so a step is one durable commit, like
DBOS. The floor rows (``journal_floor.py``) commit exactly that row with no
engrain code, their repetitions alternating with engrain's so both see the same
load: raw ``sqlite3`` with engrain's schema and pragmas, and on PostgreSQL libpq
with one prepared autocommit INSERT per step (``synchronous_commit`` on for
``full``, off for ``normal``). Each per-step target is set from the floor
measured in the same run: SQLite ``normal`` at most the floor + 10 µs; an
fsync'd step (SQLite ``full``, PostgreSQL ``full``) within 10% of the floor;
engrain's figure minus the floor is engrain's own cost, and each engrain row
gives this thread's CPU per step beside the floor's: a wall gap wider than the
CPU gap is waiting (disk, server, scheduler), not engrain's code. SQLite checkpoints its
WAL inside the commit that passes 1000 pages, which the first SQLite floor pays
like any plain SQLite program (and engrain's ``full`` journal); engrain's
``normal`` journal checkpoints on a thread of its own instead, so a second
floor ("no checkpoint") checkpoints between repetitions, off the clock. A third
("row built per step"), the base of no target, builds each step's record and its
JSON inside the loop, as any program must once a step's result is known: what
the least Python between two commits adds (after an fsync it runs on caches the
wait left cold, so it costs several times what it costs in a warm loop). The
``at_most_once`` rows time tools that also journal a durable ``step.started``
before the call (two commits per step).

Resume: a run with 9,998 completed steps (9,999 events) and no end is resumed:
open the journal, read it, replay every step through ``engrain.run`` and append
``run.completed`` (the 10,000th event). DBOS: a workflow with 4,999 completed
steps whose process died before it returned is run again under its workflow id.

PostgreSQL comes from ``$ENGRAIN_TEST_PG_URL`` or ``scripts/postgres.sh``; it is
skipped, saying so, if neither works. Usage: python bench/journal.py [--quick] [--steps]
(``--steps``: only the per-step rows with a target and their floors, no at_most_once, DBOS or resume:
for repeated A/B runs of a step's cost).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from urllib.parse import quote

import engrain as eg
from engrain import NewEvent
from journal_floor import WARM_STEPS, Floor, PgFloor

ROOT = pathlib.Path(__file__).resolve().parents[1]

PEER = ROOT / "bench" / ".peers" / "dbos"
QUICK = "--quick" in sys.argv
STEPS_ONLY = "--steps" in sys.argv
REPS = 3 if QUICK else 5
BUDGET = 0.25 if QUICK else 0.6  # seconds per repetition, which sets N per backend
# A run's own commits (its start and end) are in engrain's figure and not the floor's: with at
# least this many steps they move it by under 0.2% of a commit each, whatever a slow calibration says.
MIN_STEPS = 500
RESUME_STEPS = 9_998  # 1 run.started + 9,998 step completions = 9,999; run.completed makes 10,000
RESUME_TARGETS = {"sqlite": 30.0, "postgres": 50.0}  # ms, absolute
# Per-step targets are stated against the floor measured in the same run (issue 29):
# "normal" (no fsync) at most the floor + 10 µs, an fsync'd step within 10% of one durable commit.
NORMAL_OVER_FLOOR_US = 10.0
FSYNCD_OVER_FLOOR = 1.10


def step_target(durability: str, floor_us: float) -> tuple[float, str]:
    """The per-step target (µs) for ``durability`` over a floor of ``floor_us``, and how it was set."""
    if durability == "normal":
        return floor_us + NORMAL_OVER_FLOOR_US, f"floor+{NORMAL_OVER_FLOOR_US:g}"
    return floor_us * FSYNCD_OVER_FLOOR, f"floor x{FSYNCD_OVER_FLOOR:g}"

PEER_SCRIPT = r"""
import json, os, sqlite3, statistics, sys, time
from dbos import DBOS, DBOSConfig, SetWorkflowID

db, mode, reps, budget, resume_steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
config: DBOSConfig = {"name": "engrain-bench", "system_database_url": f"sqlite:///{db}", "log_level": "WARNING"}
t_open = time.perf_counter()
DBOS(config=config)

calls = 0

@DBOS.step()
def inc(x: int) -> int:
    global calls
    calls += 1
    return x + 1

@DBOS.workflow()
def agent(n: int) -> int:
    x = 0
    for _ in range(n):
        x = inc(x)
    if mode == "record":  # not an argument: a recovered workflow gets its recorded arguments
        os._exit(0)  # dies with every step recorded and the workflow unfinished
    return x

DBOS.launch()
t_launched = time.perf_counter()
out = {}
if mode == "steps":
    def timed(n, wid):
        t0 = time.perf_counter()
        with SetWorkflowID(wid):
            assert agent(n) == n
        return time.perf_counter() - t0
    timed(20, "warm")
    n = 20
    while True:  # grow n until one run fills the time budget
        took = timed(n, f"cal-{n}")
        if took > budget / 4 or n >= 20000:
            break
        n *= 4
    n = max(20, min(20000, int(n * budget / max(took, 1e-9))))
    out["n"] = n
    out["us_per_step"] = [timed(n, f"rep-{i}") / n * 1e6 for i in range(reps)]
    con = sqlite3.connect(db)
    out["journal_mode"] = con.execute("PRAGMA journal_mode").fetchone()[0]
    out["synchronous"] = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[con.execute("PRAGMA synchronous").fetchone()[0]]
elif mode == "record":
    with SetWorkflowID("resume-" + sys.argv[6]):
        agent(resume_steps)
elif mode == "resume":
    # Timed from DBOS(config), like engrain's from open(): launch may already start
    # recovering the unfinished workflow in the background; either way the figure
    # is the time until its result is back.
    t0 = t_open
    with SetWorkflowID("resume-" + sys.argv[6]):
        assert agent(resume_steps) == resume_steps
    out["resume_ms"] = (time.perf_counter() - t0) * 1e3
    out["launch_ms"] = (t_launched - t0) * 1e3
    out["executed"] = calls
print(json.dumps(out), flush=True)
DBOS.destroy()
"""


# -- engrain -----------------------------------------------------------------------------


def _tool_and_agent(at_most_once: bool = False):
    registry = eg.ToolRegistry()

    @eg.tool(registry=registry, name="inc", at_most_once=at_most_once)
    def inc(x: int) -> int:
        return x + 1

    def agent(task: str, n: int) -> int:
        x = 0
        for _ in range(n):
            x = inc(x)
        return x

    return agent


# url -> this thread's CPU µs/step (user + system) in each repetition: engrain's, and each floor's.
# Beside the wall figures: a wall gap larger than the CPU gap is waiting (the disk, the server), not code.
STEP_CPU: dict[str, tuple[list[float], list[list[float]]]] = {}


def per_step(url: str, floors: Sequence[Floor | PgFloor] = (), at_most_once: bool = False) -> tuple[int, list[float], list[list[float]]]:
    """(N, µs/step of each repetition, each floor's µs/step of each) for a durable run of N trivial steps on ``url``.

    Each engrain repetition is followed by one of every floor with the same N,
    so all see the same machine load.
    """
    journal = eg.open(url)
    agent = _tool_and_agent(at_most_once)

    def timed(n: int) -> float:
        t0 = time.perf_counter()
        result = eg.run(agent, "bench", run_id=uuid.uuid4().hex, inputs={"n": n}, journal=journal)
        took = time.perf_counter() - t0
        assert result.output == n, result
        return took

    try:
        timed(20)
        n = 20
        while True:
            took = timed(n)
            if took > BUDGET / 4 or n >= 20000:
                break
            n *= 4
        n = max(MIN_STEPS, min(20000, int(n * BUDGET / max(took, 1e-9))))
        ours: list[float] = []
        raw: list[list[float]] = [[] for _ in floors]
        cpu = STEP_CPU[url] = ([], [[] for _ in floors])
        timed(max(n, WARM_STEPS))  # the WAL past its first checkpoint, as each floor's warm-up takes its own
        for floor in floors:
            floor.warm(n)
        for _ in range(REPS):
            c0 = time.thread_time()
            ours.append(timed(n) / n * 1e6)
            cpu[0].append((time.thread_time() - c0) / n * 1e6)
            for floor, figures, floor_cpu in zip(floors, raw, cpu[1]):
                figures.append(floor.rep(n))
                floor_cpu.append(floor.cpu_us)
        return n, ours, raw
    finally:
        journal.close()
        for floor in floors:
            floor.close()


def _record_unfinished(url: str, run_id: str, steps: int, agent) -> None:
    """Write the events a run of ``steps`` completed steps of ``agent`` leaves when its process dies before returning."""
    from engrain._durable.identity import fingerprint
    from engrain._durable.steps import args_digest

    journal = eg.open(url)
    try:
        started = {"task": "bench", "inputs": {"n": steps}, "tags": [], "agent": eg.agent_name(agent),
                   "agent_code": fingerprint(agent)}
        events = [NewEvent("run.started", "", started)]
        ts = time.time()
        for i in range(steps):
            data = {"call_id": i, "result": i + 1, "type": "tool", "args": {"x": i}, "started": ts,
                    "ad": args_digest({"x": i})}
            events.append(NewEvent("step.completed", "inc", data))
        for start in range(0, len(events), 1000):
            journal.append(run_id, events[start : start + 1000], start)
    finally:
        journal.close()


RESUME_CPU: dict[str, list[float]] = {}  # url -> this thread's CPU ms per resume, printed beside the wall time


def resume(url: str) -> list[float]:
    """ms to open the journal and resume a 9,999-event run to completion, per repetition."""
    agent = _tool_and_agent()
    ids = [uuid.uuid4().hex for _ in range(REPS)]
    for run_id in ids:
        _record_unfinished(url, run_id, RESUME_STEPS, agent)
    out = []
    cpu = RESUME_CPU.setdefault(url, [])
    for run_id in ids:
        c0, t0 = time.thread_time(), time.perf_counter()
        journal = eg.open(url)
        result = eg.run(agent, "bench", run_id=run_id, inputs={"n": RESUME_STEPS}, journal=journal)
        took = time.perf_counter() - t0
        cpu.append((time.thread_time() - c0) * 1e3)
        assert result.output == RESUME_STEPS and result.replayed == RESUME_STEPS and result.executed == 0, result
        assert len(journal.read(run_id)) == RESUME_STEPS + 2
        journal.close()
        out.append(took * 1e3)
    return out


# -- PostgreSQL ----------------------------------------------------------------------------


def postgres_url() -> str | None:
    url = os.environ.get("ENGRAIN_TEST_PG_URL")
    if not url:
        try:
            proc = subprocess.run(
                ["bash", str(ROOT / "scripts" / "postgres.sh")],
                check=False,
                capture_output=True,
                text=True,
                timeout=120,
            )
            url = proc.stdout.strip() if proc.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            url = None
    if not url:
        return None
    try:
        import psycopg

        with psycopg.connect(url, autocommit=True, connect_timeout=5) as c:
            c.execute("SELECT 1")
    except Exception as e:  # noqa: BLE001 - any failure means: no server to measure
        print(f"PostgreSQL at {url.split('@')[-1]} unavailable ({type(e).__name__}); skipping it", file=sys.stderr)
        return None
    return url


class PgSchema:
    """A throwaway schema on the server, so the bench never touches other tables."""

    def __init__(self, url: str):
        self.base = url
        self.name = "bench_" + uuid.uuid4().hex[:10]

    def __enter__(self) -> str:
        import psycopg

        with psycopg.connect(self.base, autocommit=True) as c:
            c.execute(f'CREATE SCHEMA "{self.name}"')
        sep = "&" if "?" in self.base else "?"
        return f"{self.base}{sep}options={quote(f'-csearch_path={self.name}', safe='')}"

    def __exit__(self, *exc: object) -> None:
        import psycopg

        with psycopg.connect(self.base, autocommit=True) as c:
            c.execute(f'DROP SCHEMA IF EXISTS "{self.name}" CASCADE')


# -- DBOS ------------------------------------------------------------------------------------


def _peer_python() -> pathlib.Path:
    py = PEER / "bin" / "python"
    if not py.exists():
        print("creating bench/.peers/dbos (python -m venv; pip install dbos) ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(PEER)], check=True, timeout=300)
    probe = subprocess.run([str(py), "-c", "import dbos"], check=False, capture_output=True, timeout=120)
    if probe.returncode != 0:
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "dbos"], check=True, timeout=600
        )
    return py


def _peer(py: pathlib.Path, db: pathlib.Path, mode: str, tag: str = "", timeout: float = 300) -> dict:
    args = [str(py), "-c", PEER_SCRIPT, str(db), mode, str(REPS), str(BUDGET), str(RESUME_STEPS), tag]
    proc = subprocess.run(
        args, check=False, capture_output=True, text=True, timeout=timeout, cwd=db.parent, stdin=subprocess.DEVNULL
    )
    if mode == "record":
        return {}  # the child died on purpose (os._exit) after its last step
    if proc.returncode != 0:
        raise RuntimeError(f"DBOS {mode} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def dbos_figures(tmp: pathlib.Path) -> dict:
    py = _peer_python()
    version = subprocess.run(
        [str(py), "-c", "import importlib.metadata as m; print(m.version('dbos'))"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    out = {"version": version}
    out.update(_peer(py, tmp / "dbos-steps.sqlite", "steps"))
    # Recording 4,999 fsync'd DBOS steps takes seconds: record once, resume copies.
    recorded = tmp / "dbos-recorded.sqlite"
    _peer(py, recorded, "record", "0")
    resumes, launches = [], []
    for i in range(REPS):
        db = tmp / f"dbos-resume-{i}.sqlite"
        for suffix in ("", "-journal", "-wal", "-shm"):
            if pathlib.Path(f"{recorded}{suffix}").exists():
                shutil.copyfile(f"{recorded}{suffix}", f"{db}{suffix}")
        got = _peer(py, db, "resume", "0")
        assert got["executed"] == 0, f"DBOS re-executed {got['executed']} recorded steps"
        resumes.append(got["resume_ms"])
        launches.append(got["launch_ms"])
    out["resume_ms"], out["launch_ms"] = resumes, launches
    return out


# -- main ----------------------------------------------------------------------------------


def main() -> None:
    t_start = time.perf_counter()
    rows: list[tuple[str, str, float | None, str, str]] = []  # name, detail, median, target, verdict
    overhead: dict[str, float] = {}  # engrain's median minus its floor's, per backend and durability

    def add(name: str, detail: str, values: list[float], target: float | None, unit: str, how: str = "") -> None:
        med = statistics.median(values)
        goal = "" if target is None else f"<= {target:.1f}" + (f" ({how})" if how else "")
        verdict = "" if target is None else ("met" if med <= target else "MISSED")
        rows.append((name, detail, med, goal, verdict))

    def add_step(name: str, dur: str, n: int, us: list[float], floor: list[float], floor_name: str, url: str,
                 target: bool = True) -> None:
        """engrain's per-step row with its target set from ``floor`` (the first floor of ``url``), measured beside it."""
        ours_cpu, floors_cpu = STEP_CPU[url]
        cpu = f"CPU {statistics.median(ours_cpu):.1f} vs the floor's {statistics.median(floors_cpu[0]):.1f} µs/step"
        goal, how = step_target(dur, statistics.median(floor)) if target else (None, "")
        add(name, f"N={n}, {REPS} runs; {cpu}" + (f"; target from the {floor_name} floor" if target else ""),
            us, goal, "µs/step", how)
        overhead[name.removeprefix("engrain ")] = statistics.median(us) - statistics.median(floor)

    with tempfile.TemporaryDirectory(prefix="engrain-bench-") as d:
        tmp = pathlib.Path(d)
        for dur in ("normal", "full"):
            url = f"sqlite:///{tmp / f'steps-{dur}.db'}?durability={dur}"
            floors = (Floor(tmp / f"floor-{dur}.db", dur), Floor(tmp / f"floor-nockpt-{dur}.db", dur, checkpoints=False),
                      Floor(tmp / f"floor-encoded-{dur}.db", dur, encode=True))
            n, us, (raw, bare, encoded) = per_step(url, floors)
            add_step(f"engrain sqlite {dur}", dur, n, us, raw, "sqlite3", url)
            detail = f"N={n}, {REPS} runs alternating with engrain's: raw sqlite3, 1 autocommit INSERT/step"
            add(f"sqlite3 floor {dur}", detail + ", SQLite's checkpoints", raw, None, "µs/step")
            add(f"sqlite3 floor {dur}, no checkpoint", detail + ", checkpoints between runs (RESTART)", bare, None,
                "µs/step")
            # Not a target's base: what the least Python between two commits (a step's record built and
            # encoded once its result is known) adds to the floor; after an fsync it runs on cold caches.
            add(f"sqlite3 floor {dur}, row built per step", detail + ", its dict and JSON made in the loop", encoded,
                None, "µs/step")
            if STEPS_ONLY:
                continue
            n, us, _ = per_step(f"sqlite:///{tmp / f'amo-{dur}.db'}?durability={dur}", at_most_once=True)
            add(f"engrain sqlite {dur} at_most_once", f"N={n}, {REPS} runs, durable start + completion", us, None, "µs/step")
        pg = postgres_url()
        if pg:
            for dur in ("full", "normal"):
                with PgSchema(pg) as url, PgSchema(pg) as floor_url:
                    floors = (PgFloor(floor_url, dur), PgFloor(floor_url, dur, gated=True),
                              PgFloor(floor_url, dur, gated=True, encode=True))
                    n, us, (raw, gated, built) = per_step(f"{url}&durability={dur}", floors)
                sync = "on" if dur == "full" else "off"
                # PostgreSQL "normal" (its commit waits for no WAL flush) has no target in issue 29: its floor is beside it
                add_step(f"engrain postgres {dur}", dur, n, us, raw, "postgres", f"{url}&durability={dur}",
                         target=dur == "full")
                detail = f"N={n}, {REPS} runs alternating with engrain's: libpq, 1 prepared autocommit"
                add(f"postgres floor {dur}", f"{detail} INSERT/step, synchronous_commit={sync}", raw, None, "µs/step")
                # Not targets' bases: the server's share of engrain's step (its fenced statement: the runs
                # row's check and update), then that plus the least Python between two commits.
                add(f"postgres floor {dur}, engrain's statement", f"{detail} fenced step statement/step", gated, None,
                    "µs/step")
                add(f"postgres floor {dur}, its row built per step", f"{detail} fenced step statement/step, its dict"
                    " and JSON made in the loop", built, None, "µs/step")
        try:
            peer = None if STEPS_ONLY else dbos_figures(tmp)
        except Exception as e:  # noqa: BLE001 - report the peer's failure, keep our figures
            print(f"DBOS part failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            peer = None
        if peer:
            mode = f"{peer['journal_mode']}, synchronous={peer['synchronous']}"
            add(
                f"DBOS {peer['version']} sqlite",
                f"N={peer['n']}, {REPS} runs, {mode}",
                peer["us_per_step"],
                None,
                "µs/step",
            )

        if not STEPS_ONLY:
            url = f"sqlite:///{tmp / 'resume.db'}"
            walls = resume(url)
            add("engrain resume sqlite normal", f"{RESUME_STEPS + 2} events; CPU {statistics.median(RESUME_CPU[url]):.1f} ms",
                walls, RESUME_TARGETS["sqlite"], "ms")
            if pg:
                with PgSchema(pg) as url:
                    walls = resume(url)
                    add("engrain resume postgres", f"{RESUME_STEPS + 2} events; client CPU {statistics.median(RESUME_CPU[url]):.1f} ms",
                        walls, RESUME_TARGETS["postgres"], "ms")
        if peer:
            launch = statistics.median(peer["launch_ms"])
            add(
                f"DBOS {peer['version']} resume sqlite",
                f"{RESUME_STEPS} steps; launch {launch:.0f} ms of it",
                peer["resume_ms"],
                None,
                "ms",
            )

    print(f"\njournal bench: per-step overhead (trivial tool) and resume; median of {REPS}")
    width = max(len(r[0]) for r in rows)
    dwidth = max(len(r[1]) for r in rows)
    for name, detail, med, goal, verdict in rows:
        unit = "ms" if "resume" in name else "µs/step"
        print(f"  {name:<{width}}  {med:>9.1f} {unit:<8} {goal:<22} {verdict:<7} {detail:<{dwidth}}")
    print(
        "  engrain's own cost over the floor measured beside it: "
        + ", ".join(f"{name} {us:+.1f} µs/step" for name, us in overhead.items())
    )
    print(f"  load average {os.getloadavg()[0]:.1f} at the end")
    if not pg:
        print("  (PostgreSQL skipped: no server; set ENGRAIN_TEST_PG_URL or run scripts/postgres.sh)")
    print(f"total {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
