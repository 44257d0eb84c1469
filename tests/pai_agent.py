"""A PydanticAI agent for the crash test, on PydanticAI's FunctionModel driven by a script (a scripted model).

Turn 1 asks for the ``charge_card`` tool, turn 2 answers; the turn is read from
the conversation (one more than the tool results in it), as a real model would.
Each model call and tool execution appends a line to an effects file. With
``crash``, the process SIGKILLs itself during turn 2, after the tool ran.

Usage: python pai_agent.py STORE_URL EFFECTS_FILE run|crash
"""

from __future__ import annotations

import os
import pathlib
import signal
import sys

from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel

import engrain as eg
from engrain.integrations.pydantic_ai import durable

URL, EFFECTS, MODE = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]


def effect(line: str) -> None:
    with EFFECTS.open("a") as f:
        f.write(line + "\n")


def scripted_model(messages, info) -> ModelResponse:
    turn = 1 + sum(isinstance(p, ToolReturnPart) for m in messages for p in getattr(m, "parts", []))
    effect(f"model turn {turn}")
    if turn == 1:
        return ModelResponse(parts=[ToolCallPart("charge_card", {"amount": 42}, tool_call_id="c1")])
    if MODE == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    return ModelResponse(parts=[TextPart("Charged 42 and done.")])


agent = Agent(FunctionModel(scripted_model), instructions="Charge what the user asks.")


@agent.tool_plain
def charge_card(amount: int) -> str:
    """Charge the customer's card."""
    effect(f"charge {amount}")
    return f"charged {amount}"


def billing(task: str) -> str:
    with durable(agent):
        return agent.run_sync(task).output


result = eg.run(billing, "charge 42", run_id="bill-42", journal=eg.open(URL))
print(result.status, result.output)
