"""An OpenAI Agents SDK agent with a durable session and durable runs in the engrain store.

The model is a scripted model (the SDK's own ``Model`` interface, playing a fixed plan),
so this runs offline; use a real model (``model="gpt-4.1-mini"`` with OPENAI_API_KEY set)
and nothing else changes. The engrain lines:

    session = EngrainSession("customer-7")                 # conversation history in the store
    eg.run(lambda task: Runner.run_sync(durable(agent), task, session=session).final_output, ...)

    python examples/openai_agents/agent.py                 # one durable run
    python examples/openai_agents/agent.py --crash         # dies (SIGKILL) after the tool ran
    python examples/openai_agents/agent.py                 # resumes: no model call or tool runs twice
    engrain show refund-7; engrain runs --tag openai-agents
"""

from __future__ import annotations

import argparse
import json
import os
import signal

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # nothing to export traces to offline

from agents import Agent, Model, ModelResponse, Runner, Usage, function_tool  # noqa: E402
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText  # noqa: E402

import engrain as eg  # noqa: E402
from engrain.integrations.openai_agents import EngrainSession, durable  # noqa: E402


@function_tool
def refund(order: int, amount: float) -> str:
    """Refund an order (a side effect: it must never run twice)."""
    print(f"  [tool] refunding order {order}: {amount:.2f}")
    return f"refunded {amount:.2f} on order {order}"


class ScriptedModel(Model):
    """A scripted model: ask for the refund tool, then report what happened (decided from the conversation)."""

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, *, previous_response_id, conversation_id, prompt) -> ModelResponse:
        results = [i for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"]
        print(f"  [model] call after {len(results)} tool result(s)")
        if not results:
            out = [ResponseFunctionToolCall(type="function_call", call_id="call-1", name="refund",
                                            arguments=json.dumps({"order": 7, "amount": 19.99}))]
        else:
            if os.environ.get("EXAMPLE_CRASH"):
                print("  [model] killed mid-turn (SIGKILL)")
                os.kill(os.getpid(), signal.SIGKILL)
            text = f"Done: {results[-1]['output']}."
            out = [ResponseOutputMessage(id="m", type="message", role="assistant", status="completed",
                                         content=[ResponseOutputText(type="output_text", text=text, annotations=[])])]
        return ModelResponse(output=out, usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the scripted model does not stream")


agent = Agent(name="support", instructions="Refund what the customer asks for.", model=ScriptedModel(),
              tools=[refund])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=None, help="store URL (default: ENGRAIN_URL or ./.engrain/)")
    ap.add_argument("--crash", action="store_true", help="die after the tool ran")
    opts = ap.parse_args()
    if opts.crash:
        os.environ["EXAMPLE_CRASH"] = "1"
    journal = eg.open(opts.url) if opts.url else eg.default_journal()
    session = EngrainSession("customer-7", journal=journal)

    def support(task: str) -> str:
        return Runner.run_sync(durable(agent), task, session=session).final_output

    result = eg.run(support, "Please refund order 7.", run_id="refund-7", journal=journal)
    print(result.status, result.output)


if __name__ == "__main__":
    main()
