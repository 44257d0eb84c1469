"""A child process for tests/test_learn.py's crash test: a learning agent, killed inside a learned routine.

    learn_child.py STORE_URL MODEL_URL EFFECTS_FILE TASK RUN_ID

Each tool appends a line to EFFECTS_FILE (name, argument, idempotency key). ``pay`` SIGKILLs its own
process, before any effect, while the file EFFECTS_FILE.crash exists (the test removes it to resume).
"""

from __future__ import annotations

import json
import os
import signal
import sys

import engrain as eg

url, model_url, effects, task, run_id = sys.argv[1:6]
FILES = {"bills/may.txt": {"amount": 120.5, "iban": "DE001", "status": "unpaid"},
         "bills/jun.txt": {"amount": 99.0, "iban": "DE002", "status": "unpaid"},
         "bills/jul.txt": {"amount": 75.25, "iban": "DE003", "status": "unpaid"}}


def read_file(path: str) -> dict:
    """Read a bill file."""
    with open(effects, "a") as f:
        f.write(f"read_file {path} {eg.idempotency_key()}\n")
    return {"path": path, **FILES[path]}


def pay(iban: str, amount: float) -> str:
    """Pay an amount to an IBAN."""
    if os.path.exists(effects + ".crash"):
        os.kill(os.getpid(), signal.SIGKILL)
    with open(effects, "a") as f:
        f.write(f"pay {iban} {eg.idempotency_key()}\n")
    return f"paid {amount} to {iban}"


agent = eg.Agent("biller", "openai:scripted", "Pay bills.", [read_file, pay], base_url=model_url,
                 journal=eg.open(url), learn=True)
res = agent.run(task, run_id=run_id)
print(json.dumps({**res.to_dict(), "learned": agent.last_learned.to_dict() if agent.last_learned else None}), flush=True)
