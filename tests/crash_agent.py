"""Scripted crash-test agent (a child process of tests/test_crash.py; not a real agent).

Usage: python tests/crash_agent.py STORE_URL SIDE_EFFECT_FILE STEPS

Reads run ids from stdin, one a line. For each it prints ``go RUN_ID``, runs a
durable ``engrain.run`` of STEPS tool steps to the end, and prints the
RunResult as one JSON line. Even steps are default tools (only the completion
is journaled: a step running at a crash runs again); odd steps are
``at_most_once`` tools (a durable start before the call: a step started at a
crash is never run again, the run pauses ``needs_input``). Each tool step
appends ``KEY STEP PID TIME`` to the side-effect file (O_APPEND + fsync) before
it returns, KEY being the step's idempotency key, so the parent can count how
often each step really ran, and when. The parent SIGKILLs this process at
random points, answers the at-most-once questions and resumes the runs.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

import engrain as eg

#: Upper bound of each of the two random pauses inside a tool (seconds): they
#: spread the kill points over the step body, including the window between the
#: side effect and the journaled completion.
PAUSE = 0.0006


def main() -> None:
    url, side_path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    journal = eg.open(url)
    fd = os.open(side_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    registry = eg.ToolRegistry()

    def body(n: int) -> int:
        time.sleep(random.uniform(0, PAUSE))
        # One write(2) of a short line with O_APPEND: a kill never leaves half a line.
        os.write(fd, f"{eg.idempotency_key()} {n} {os.getpid()} {time.time():.6f}\n".encode())
        os.fsync(fd)
        time.sleep(random.uniform(0, PAUSE))
        return n * n + 1

    @eg.tool(registry=registry, name="crash.work")
    def work(n: int) -> int:
        return body(n)

    @eg.tool(registry=registry, name="crash.pay", at_most_once=True)
    def pay(n: int) -> int:
        return body(n)

    def agent(task: str, steps: int) -> dict:
        results = [(pay if n % 2 else work)(n) for n in range(steps)]
        return {"results": results, "sum": sum(results)}

    for line in sys.stdin:
        run_id = line.strip()
        if not run_id:
            continue
        sys.stdout.write(f"go {run_id}\n")
        sys.stdout.flush()
        result = eg.run(agent, "crash test", run_id=run_id, inputs={"steps": steps}, journal=journal)
        sys.stdout.write(json.dumps(result.to_dict()) + "\n")
        sys.stdout.flush()
    journal.close()


if __name__ == "__main__":
    main()
