"""Routine run time: the compiled csv_report example, in process and through the CLI.

In process: the median wall time of ``run_routine`` on the example package
(fetch a CSV, two UDFs, a prompt answered up front, an assert, the return),
every step journaled in a SQLite file store. The package is compiled
``trusted: false``; the timed copy is marked ``trusted: true`` as a human
would, so its UDFs run in process (the untrusted package, whose UDFs run in
the WASM sandbox, is timed on its own row: see bench/sandbox.py for the
per-call target). Next to it:
  - the durable-run floor: ``engrain.run`` of an agent that does nothing
    (run.started + lease + run.completed), which every journaled run pays;
  - the scripted agent the routine was compiled from, run durably with the
    same tools (its approval answered in the journal beforehand);
  - the tool's own time (``fetch_csv`` reads a small local file), excluded.
CLI: the median wall time of ``engrain run`` (process start to exit; it takes
the CLI's fast path, without typer), of ``engrain --help`` (the typer app) and
of ``python -c pass`` (the interpreter's own start-up, the floor), measured
alternately in one loop, with engrain byte-compiled first as an install would.

There is no installable peer that runs em-core routine packages, so the
comparison is with engrain's own durable agent run.

Usage: python bench/routines.py [--quick]
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "csv_report"
PACKAGE = ROOT / "tests" / "fixtures" / "csv_report" / "routine"  # the example compiled (tests/test_examples.py checks it still is)
QUICK = "--quick" in sys.argv
RUNS = 300 if QUICK else 2000
CLI_RUNS = 5 if QUICK else 15


def _agent():
    spec = importlib.util.spec_from_file_location("csv_report_agent", EXAMPLE / "agent.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["csv_report_agent"] = mod
    spec.loader.exec_module(mod)
    return mod


def median_ms(fn, n: int) -> float:
    for _ in range(min(50, n)):
        fn()  # warm caches (parsed package, validators, imported udfs)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> None:
    import engrain as eg

    agent = _agent()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="engrain-bench-"))
    untrusted = PACKAGE
    trusted = tmp / "routine"
    shutil.copytree(PACKAGE, trusted)
    (trusted / "routine.yaml").write_text((trusted / "routine.yaml").read_text().replace("trusted: false", "trusted: true"))
    try:
        j = eg.open(f"sqlite:///{tmp / 'bench.db'}")
        answers = {"step3": {}}
        res = eg.run_routine(trusted, agent.INPUTS, tools=agent.tools, journal=j, answers=answers)
        assert res.status == "ok", res.error

        routine = median_ms(lambda: eg.run_routine(trusted, agent.INPUTS, tools=agent.tools, journal=j, answers=answers), RUNS)
        floor = median_ms(lambda: eg.run(lambda task: None, "noop", journal=j), RUNS)
        fetch = agent.fetch_csv.__wrapped__
        tool = median_ms(lambda: fetch(agent.INPUTS["source"]), RUNS)

        def agent_run() -> None:
            rid = eg.new_run_id()
            first = eg.run(agent.report_agent, "csv report", run_id=rid, inputs=agent.INPUTS, journal=j)
            assert first.status == "needs_input"
            eg.answer(rid, {"approved": True}, journal=j)
            assert eg.run(agent.report_agent, "csv report", run_id=rid, inputs=agent.INPUTS, journal=j)

        agent_ms = median_ms(agent_run, max(50, RUNS // 10))
        sandboxed = median_ms(
            lambda: eg.run_routine(untrusted, agent.INPUTS, tools=agent.tools, journal=j, answers=answers), 5 if QUICK else 15
        )
        mem = eg.open("sqlite:///:memory:")
        routine_mem = median_ms(
            lambda: eg.run_routine(trusted, agent.INPUTS, tools=agent.tools, journal=mem, answers=answers), RUNS
        )

        def row(label: str, ms: float, note: str = "") -> None:
            print(f"  {label:<48}{ms:9.3f} ms  {note}")

        print(f"in-process, median of {RUNS} runs (csv_report routine: 1 tool, 2 UDFs, 1 prompt, 1 assert, return)")
        row("engrain run_routine, SQLite file store", routine)
        row(f"  minus tool time ({tool:.3f} ms)", routine - tool, "(target <= 1 ms)")
        row("  durable-run floor (no-op engrain.run)", floor)
        row("  routine layer (total - tool - floor)", routine - tool - floor)
        row("engrain run_routine, SQLite :memory:", routine_mem)
        row("scripted agent, durable (ask, answer, resume)", agent_ms)
        row("untrusted (as compiled): 2 UDFs in the WASM sandbox", sandboxed, "(2 sandbox calls: <= 5 ms, <= 10 ms each)")

        ans = tmp / "answers.json"
        ans.write_text(json.dumps(answers))
        exe = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")
        url = f"sqlite:///{tmp / 'cli.db'}"
        tools = f"{EXAMPLE / 'agent.py'}:tools"

        run_args = [exe, "run", str(trusted), "--tools", tools, "--answers", str(ans), "--url", url]
        lines = {
            "engrain run (the csv_report routine)": (run_args, "(target <= 150 ms)"),
            "engrain --help (typer app, start-up reference)": ([exe, "--help"], ""),
            "python -c pass (interpreter floor)": ([sys.executable, "-c", "pass"], ""),
        }
        # Byte-compile engrain as pip does when it installs a package: with PYTHONDONTWRITEBYTECODE
        # set (as on some CI and dev machines), an editable install never gets its .pyc files, and
        # every process would compile engrain from source (about 60 ms more per run).
        import compileall

        compileall.compile_dir(str(pathlib.Path(eg.__file__).parent), quiet=2)
        subprocess.run(run_args, capture_output=True, timeout=120, check=True)  # first run fills the parsed-YAML cache
        times: dict[str, list[float]] = {k: [] for k in lines}
        for _ in range(CLI_RUNS):  # alternate, so every line sees the same machine load
            for label, (argv, _note) in lines.items():
                t0 = time.perf_counter()
                p = subprocess.run(argv, capture_output=True, timeout=120, check=False)
                times[label].append((time.perf_counter() - t0) * 1000)
                assert p.returncode == 0, p.stderr.decode()
        print(f"CLI, median (min-max) of {CLI_RUNS} processes each, run alternately; load average {os.getloadavg()[0]:.2f}")
        for label, (_argv, note) in lines.items():
            xs = times[label]
            print(f"  {label:<48}{statistics.median(xs):9.1f} ms  ({min(xs):.0f}-{max(xs):.0f}) {note}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
