"""Per-call latency of the WASM sandbox: a C tool and a Python UDF (targets <= 1 ms and <= 50 ms).

Side by side with the obvious unsandboxed baseline: the same C program built
natively and run as a subprocess, and ``python -c`` running the same UDF.
Usage: python bench/sandbox.py [calls]
"""

from __future__ import annotations

import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def timed(fn, n: int) -> tuple[float, float]:
    fn()  # warm-up (compiles / fills caches)
    xs = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t) * 1000)
    return statistics.median(xs), sorted(xs)[int(len(xs) * 0.95) - 1]


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
    # A generalizing UDF: the real parse_csv the csv_report example compiles into udfs.py.
    example = ROOT / "examples/csv_report"
    parse_host = engrain.sandbox.SandboxUdfHost(example / "routine" / "udfs.py")
    csv_text = (example / "data" / "employees.csv").read_text()

    rows = [
        ("C tool in wasm sandbox", timed(lambda: tool.call(args), n), "<= 1 ms"),
        ("C tool native subprocess", timed(lambda: subprocess.run([str(native)], input=b"{}", capture_output=True), n), ""),
        ("Python UDF in wasm sandbox", timed(lambda: host.call("score", {"items": [1, 2, 3]}), max(10, n // 10)), "<= 50 ms"),
        ("compiled parse_csv (csv, io) in sandbox",
         timed(lambda: parse_host.call("parse_csv", {"text": csv_text}), max(10, n // 10)), "<= 50 ms"),
        (
            "Python UDF native subprocess",
            timed(
                lambda: subprocess.run(
                    [sys.executable, "-S", "-c", "import json; print(json.dumps({'total': 6}))"], capture_output=True
                ),
                max(10, n // 10),
            ),
            "",
        ),
    ]
    print(f"UDF host start-up (module from cache or compiled): {first * 1000:.0f} ms")
    print(f"{'case':40} {'median ms':>10} {'p95 ms':>8}  target")
    for name, (med, p95), target in rows:
        print(f"{name:40} {med:10.2f} {p95:8.2f}  {target}")
    host.close()


if __name__ == "__main__":
    main()
