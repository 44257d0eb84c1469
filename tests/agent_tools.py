"""Python tools an ``engrain serve --tools tests/agent_tools.py:tools`` server offers to LLM agents."""

from __future__ import annotations

import os

import engrain as eg

tools = eg.ToolRegistry()


@eg.tool(registry=tools)
def lookup_order(order_id: int) -> dict:
    """Look up an order by id."""
    if os.environ.get("ENGRAIN_TEST_EFFECTS"):  # a test counting executions across a server kill
        with open(os.environ["ENGRAIN_TEST_EFFECTS"], "a") as f:
            f.write(f"lookup_order {order_id}\n")
    return {"order": order_id, "status": "shipped", "total": 19.5}
