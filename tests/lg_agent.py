"""A LangGraph agent for the crash test: a scripted model node, a real ToolNode, the engrain checkpointer.

The "model" is scripted (no LLM can be reached here): its first turn asks for the
``charge_card`` tool, its second turn answers. Each tool execution and each model
turn appends a line to an effects file, so the test can count what really ran.
With ``crash`` as argv[3], the process SIGKILLs itself during the second model
turn, after the tool node has finished and been checkpointed.

Usage: python lg_agent.py STORE_URL EFFECTS_FILE run|crash|resume
"""

from __future__ import annotations

import os
import pathlib
import signal
import sys
from typing import Annotated, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition

from engrain.integrations.langgraph import EngrainCheckpointer

URL, EFFECTS, MODE = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]


def effect(line: str) -> None:
    with EFFECTS.open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@tool
def charge_card(amount: int) -> str:
    """Charge the customer's card."""
    effect(f"charge {amount}")
    return f"charged {amount}"


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def scripted_model(state: State) -> dict:
    """Turn 1: call charge_card(42). Turn 2: the final answer."""
    turn = sum(isinstance(m, AIMessage) for m in state["messages"]) + 1
    effect(f"model turn {turn}")
    if turn == 1:
        return {"messages": [AIMessage("", tool_calls=[{"name": "charge_card", "args": {"amount": 42}, "id": "c1"}])]}
    if MODE == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"messages": [AIMessage("Charged 42 and done.")]}


builder = StateGraph(State)
builder.add_node("model", scripted_model)
builder.add_node("tools", ToolNode([charge_card]))
builder.add_edge(START, "model")
builder.add_conditional_edges("model", tools_condition)
builder.add_edge("tools", "model")
graph = builder.compile(checkpointer=EngrainCheckpointer(URL))

config = {"configurable": {"thread_id": "order-42"}}
# Resuming passes no input: LangGraph continues the thread from its last checkpoint. durability="sync"
# saves each checkpoint before the next step starts (LangGraph's default, "async", saves it in the
# background, so a kill can lose the last step with any checkpointer).
state = graph.invoke(None if MODE == "resume" else {"messages": [HumanMessage("charge 42")]}, config,
                     durability="sync")
print(state["messages"][-1].content)
