"""Python tools an ``engrain serve --tools tests/agent_tools.py:tools`` server offers to LLM agents."""

from __future__ import annotations

import engrain as eg

tools = eg.ToolRegistry()


@eg.tool(registry=tools)
def lookup_order(order_id: int) -> dict:
    """Look up an order by id."""
    return {"order": order_id, "status": "shipped", "total": 19.5}
