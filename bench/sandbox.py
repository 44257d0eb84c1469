"""Per-call latency of the WASM sandbox: a C tool (<= 1 ms), a Python UDF importing nothing (<= 5 ms), parse_csv (<= 10 ms).

Side by side with the obvious unsandboxed baseline: the same C program built
natively and run as a subprocess, and ``python -S -c`` running the same UDF; the
cases are called in turn, so engrain and its peer see the same machine load.
Usage: python bench/sandbox.py [calls]
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _cpu() -> float:
    """CPU seconds of this thread (a sandboxed guest runs on it) plus those of finished children."""
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.thread_time() + c.ru_utime + c.ru_stime


def alternate(cases: list[tuple[str, object, float | None, int]]) -> dict[str, tuple[float, float, float]]:
    """Median and p95 wall ms, and median CPU ms, per case; the cases called in turn (same load for each)."""
    for _name, fn, _target, _n in cases:
        fn()  # warm-up (compiles / fills caches)
    xs: dict[str, list[float]] = {name: [] for name, *_ in cases}
    cpu: dict[str, list[float]] = {name: [] for name, *_ in cases}
    for i in range(max(n for *_, n in cases)):
        for name, fn, _target, n in cases:
            if i < n:
                c, t = _cpu(), time.perf_counter()
                fn()
                xs[name].append((time.perf_counter() - t) * 1000)
                cpu[name].append((_cpu() - c) * 1000)
    return {k: (statistics.median(v), sorted(v)[max(0, int(len(v) * 0.95) - 1)], statistics.median(cpu[k])) for k, v in xs.items()}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    import engrain

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="engrain-bench-"))
    subprocess.run(["bash", str(ROOT / "scripts/build_wasm_tools.sh"), str(tmp)], check=True, capture_output=True)
    native = tmp / "wordcount-native"
    subprocess.run(["clang", "-O2", "-o", str(native), str(ROOT / "examples/wasm_tools/wordcount.c")], check=True)
    tool = engrain.sandbox.WasmTool(tmp / "wordcount.wasm")
    args = {"text": "the quick brown fox"}
    udfs = tmp / "udfs.py"
    udfs.write_text("def score(items):\n    return {'total': sum(items)}\n")
    t = time.perf_counter()
    host = engrain.sandbox.SandboxUdfHost(udfs)
    first = time.perf_counter() - t
    # A generalizing UDF: the real parse_csv the csv_report example compiles into udfs.py (its test fixture).
    example = ROOT / "examples/csv_report"
    parse_host = engrain.sandbox.SandboxUdfHost(ROOT / "tests/fixtures/csv_report/routine/udfs.py")
    csv_text = (example / "data" / "employees.csv").read_text()

    few = max(10, n // 4)
    udf_native = [sys.executable, "-S", "-c", "import json; print(json.dumps({'total': 6}))"]
    csv_native = [sys.executable, "-S", "-c", "import csv, io, sys; list(csv.DictReader(io.StringIO(sys.stdin.read())))"]
    cases = [
        ("C tool in wasm sandbox", lambda: tool.call(args), 1.0, n),
        ("C tool native subprocess", lambda: subprocess.run([str(native)], input=json.dumps(args).encode(), capture_output=True), None, n),
        ("Python UDF in wasm sandbox", lambda: host.call("score", {"items": [1, 2, 3]}), 5.0, few),
        ("Python UDF native subprocess (python -S)", lambda: subprocess.run(udf_native, capture_output=True), None, few),
        ("compiled parse_csv (csv, io) in sandbox", lambda: parse_host.call("parse_csv", {"text": csv_text}), 10.0, few),
        ("parse_csv native subprocess (python -S)",
         lambda: subprocess.run(csv_native, input=csv_text.encode(), capture_output=True), None, few),
    ]
    results = alternate(cases)
    print(f"UDF host start-up (modules from cache, or the snapshot made and compiled): {first * 1000:.0f} ms")
    print(f"cases run in turn, {n} calls (C tool) / {few} calls (Python); load average {os.getloadavg()[0]:.2f}")
    print("(cpu ms: CPU time of the call, guest or child process; less sensitive to a loaded machine than wall time)")
    print(f"{'case':42} {'median ms':>10} {'p95 ms':>8} {'cpu ms':>8}  target")
    for name, _fn, target, _n in cases:
        med, p95, cpu = results[name]
        verdict = "" if target is None else f"<= {target:g} ms " + ("ok" if med <= target else "MISSED")
        print(f"{name:42} {med:10.2f} {p95:8.2f} {cpu:8.2f}  {verdict}")
    host.close()


if __name__ == "__main__":
    main()
