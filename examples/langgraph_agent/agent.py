"""A LangGraph agent whose checkpoints live in the engrain store: run it, kill it, run it again.

The model is a scripted model (a graph node that plays a fixed plan), so this runs offline;
swap in a real chat model node and nothing else changes. The one engrain line is the
checkpointer:

    graph = builder.compile(checkpointer=EngrainCheckpointer())

    python examples/langgraph_agent/agent.py              # runs the thread to its end
    python examples/langgraph_agent/agent.py --crash      # dies (SIGKILL) after the tool ran
    python examples/langgraph_agent/agent.py --resume     # continues from the last checkpoint
    engrain runs --tag langgraph; engrain show langgraph:refund-42
"""

from __future__ import annotations

import argparse
import os
import signal
from typing import Annotated, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition

from engrain.integrations.langgraph import EngrainCheckpointer


@tool
def refund(order: int, amount: float) -> str:
    """Refund an order (a side effect: it must never run twice)."""
    print(f"  [tool] refunding order {order}: {amount:.2f}")
    return f"refunded {amount:.2f} on order {order}"


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def scripted_model(state: State) -> dict:
    """A scripted model: first ask for the refund tool, then report what happened."""
    if not any(m.type == "tool" for m in state["messages"]):
        call = {"name": "refund", "args": {"order": 42, "amount": 19.99}, "id": "call-1"}
        return {"messages": [AIMessage("", tool_calls=[call])]}
    if os.environ.get("EXAMPLE_CRASH"):
        print("  [model] killed mid-turn (SIGKILL)")
        os.kill(os.getpid(), signal.SIGKILL)
    return {"messages": [AIMessage(f"Done: {state['messages'][-1].content}.")]}


def build(url: str | None = None):
    builder = StateGraph(State)
    builder.add_node("model", scripted_model)
    builder.add_node("tools", ToolNode([refund]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=EngrainCheckpointer(url))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=None, help="store URL (default: ENGRAIN_URL or ./.engrain/)")
    ap.add_argument("--crash", action="store_true", help="die after the tool ran")
    ap.add_argument("--resume", action="store_true", help="continue the thread from its last checkpoint")
    opts = ap.parse_args()
    if opts.crash:
        os.environ["EXAMPLE_CRASH"] = "1"
    graph = build(opts.url)
    config = {"configurable": {"thread_id": "refund-42"}}
    inputs = None if opts.resume else {"messages": [HumanMessage("Please refund order 42.")]}
    # durability="sync": each checkpoint is saved before the next step starts, so a kill loses no step.
    state = graph.invoke(inputs, config, durability="sync")
    print(state["messages"][-1].content)


if __name__ == "__main__":
    main()
