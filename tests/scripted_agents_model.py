"""A scripted model for the OpenAI Agents SDK: the SDK's ``Model`` interface, replies played from a script.

No LLM can be reached from the test machine, so tests name this a scripted
model. It counts its calls (``calls``), so tests can assert how many model
calls a run really paid for.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agents import Model, ModelResponse, Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText


def text(s: str) -> list[Any]:
    """A reply that is a final assistant message."""
    return [ResponseOutputMessage(id="msg", type="message", role="assistant", status="completed",
                                  content=[ResponseOutputText(type="output_text", text=s, annotations=[])])]


def tool_call(name: str, args: dict[str, Any], call_id: str = "call-1") -> list[Any]:
    """A reply that asks for one function tool call."""
    return [ResponseFunctionToolCall(type="function_call", call_id=call_id, name=name, arguments=json.dumps(args))]


def _turn(input: Any) -> int:
    """Which reply a conversation is at: one more than the tool results it holds (as a real model would see)."""
    if isinstance(input, str):
        return 1
    return 1 + sum(1 for item in input if isinstance(item, dict) and item.get("type") == "function_call_output")


class ScriptedModel(Model):
    """Plays ``script``: reply n answers a conversation holding n-1 tool results (the last one repeats).

    ``on_call(n)`` runs before reply n; ``calls`` counts the calls this model really received.
    """

    def __init__(self, script: list[list[Any]], on_call: Callable[[int], None] | None = None):
        self.script, self.on_call, self.calls, self.inputs = script, on_call, 0, []

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, *, previous_response_id, conversation_id, prompt) -> ModelResponse:
        self.calls += 1
        self.inputs.append(input)
        turn = _turn(input)
        if self.on_call:
            self.on_call(turn)
        reply = self.script[min(turn, len(self.script)) - 1]
        return ModelResponse(output=reply, usage=Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15),
                             response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any):
        raise NotImplementedError("the scripted model does not stream")
