"""A child process for tests/test_agent.py's crash tests: one agent, SIGKILLed by the test.

    agent_child.py STORE_URL MODEL_URL EFFECTS_FILE run TASK RUN_ID
    agent_child.py STORE_URL MODEL_URL EFFECTS_FILE chat MESSAGE SESSION

The model is a scripted model server in the test process. Each tool appends a
line to EFFECTS_FILE, so the test can count executions. Events are printed as
JSON lines, flushed, so the test can kill the child at a chosen event.
"""

from __future__ import annotations

import json
import sys

import engrain as eg

url, model_url, effects, mode, text, ident = sys.argv[1:7]


def charge(order_id: int, amount: float) -> str:
    """Charge a customer for an order."""
    with open(effects, "a") as f:
        f.write(f"charge {order_id} {eg.idempotency_key()}\n")
    return f"charged {amount} for order {order_id}"


def lookup(order_id: int) -> dict:
    """Look up an order."""
    with open(effects, "a") as f:
        f.write(f"lookup {order_id} {eg.idempotency_key()}\n")
    return {"order": order_id, "total": 12.5}


agent = eg.Agent("crashy", "openai:scripted", "Handle orders.", [charge, lookup], base_url=model_url,
                 journal=eg.open(url))


def emit(e: dict) -> None:
    print(json.dumps(e), flush=True)


if mode == "run":
    res = agent.run(text, run_id=ident, on_event=emit)
    emit({"type": "result", **res.to_dict()})
else:
    for e in agent.chat(text, session=ident):
        emit(e)
