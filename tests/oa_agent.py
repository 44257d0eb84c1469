"""An OpenAI Agents SDK agent for the crash test, on a scripted model (no LLM can be reached here).

The scripted model implements the SDK's own ``Model`` interface: turn 1 asks for
the ``charge_card`` tool, turn 2 answers. Each model call and each tool
execution appends a line to an effects file. With ``crash``, the process
SIGKILLs itself during model turn 2, after the tool call has been journaled.

Usage: python oa_agent.py STORE_URL EFFECTS_FILE run|crash
"""

from __future__ import annotations

import os
import pathlib
import signal
import sys

from agents import Agent, Runner, function_tool

import engrain as eg
from engrain.integrations.openai_agents import durable

sys.path.insert(0, os.path.dirname(__file__))
from scripted_agents_model import ScriptedModel, text, tool_call  # noqa: E402

URL, EFFECTS, MODE = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]


def effect(line: str) -> None:
    with EFFECTS.open("a") as f:
        f.write(line + "\n")


@function_tool
def charge_card(amount: int) -> str:
    """Charge the customer's card."""
    effect(f"charge {amount}")
    return f"charged {amount}"


def on_call(turn: int) -> None:
    effect(f"model turn {turn}")
    if turn == 2 and MODE == "crash":
        os.kill(os.getpid(), signal.SIGKILL)


model = ScriptedModel([tool_call("charge_card", {"amount": 42}), text("Charged 42 and done.")], on_call=on_call)
agent = Agent(name="billing", instructions="Charge what the user asks.", model=model, tools=[charge_card])


def billing(task: str) -> str:
    return Runner.run_sync(durable(agent), task).final_output


result = eg.run(billing, "charge 42", run_id="bill-42", journal=eg.open(URL))
print(result.status, result.output)
