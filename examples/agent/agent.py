"""An LLM agent run offline: engrain.testing's models stand in for the LLM.

``FunctionModel`` replies with what a Python function decides from the conversation
(here: look the order up, then answer from the tool's result), ``TestModel`` calls
every tool once with arguments made from its schema and reports what they returned:
a quick check that the tools are wired up. No network, no key. Use a real model
(``"openai:gpt-4.1-mini"`` with OPENAI_API_KEY set) and nothing else changes.

    python examples/agent/agent.py                          # on the default store (.engrain/engrain.db)
    python examples/agent/agent.py --url sqlite:///out/agent.db
    engrain runs --tag llm-agent:support
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

import engrain as eg
from engrain.testing import AgentInfo, FunctionModel, TestModel, tool_call

ORDERS = {42: {"status": "shipped", "total": 19.5}, 7: {"status": "packing", "total": 120.0}}


def lookup_order(order_id: int) -> dict[str, Any]:
    """Look up an order by id."""
    return {"order": order_id, **ORDERS.get(order_id, {"status": "unknown", "total": 0})}


def refund(order_id: int, amount: float, reason: str = "") -> str:
    """Refund part of an order."""
    return f"refunded {amount:.2f} on order {order_id}"


def support_model(messages: list[dict[str, Any]], info: AgentInfo) -> Any:
    """The stand-in LLM: decides each reply from the conversation, as a real model would."""
    last = messages[-1]
    if last["role"] == "tool":
        order = json.loads(last["content"])
        return f"Order {order['order']} is {order['status']} (total {order['total']:.2f})."
    ids = re.findall(r"\d+", last["content"])
    return tool_call("lookup_order", order_id=int(ids[0])) if ids else "Which order do you mean?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=None, help="store URL (default: ENGRAIN_URL or ./.engrain/engrain.db)")
    opts = ap.parse_args(argv)
    journal = eg.open(opts.url) if opts.url else eg.default_journal()

    model = FunctionModel(support_model)
    agent = eg.Agent("support", model, "Answer questions about orders.", tools=[lookup_order, refund],
                     journal=journal)
    run_id = eg.new_run_id()
    res = agent.run("Where is order 42?", run_id=run_id)
    print(f"run {run_id}: {res.status}: {res.output}  (model calls: {model.calls})")
    # The same run_id again (as after a crash): the recorded replies and tool results are replayed.
    again = agent.run("Where is order 42?", run_id=run_id)
    print(f"same run again: {again.output}  (model calls: {model.calls}, replayed steps: {again.replayed})")

    smoke = TestModel()
    checked = eg.Agent("support-check", smoke, tools=[lookup_order, refund], journal=journal).run("check the tools")
    print(f"TestModel called each tool once: {checked.output}")
    ok = res.status == again.status == checked.status == "ok" and model.calls == 2 and smoke.calls == 2
    print(f"see them: engrain runs{f' --url {opts.url}' if opts.url else ''} --tag llm-agent:support")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
