"""Test your agents offline: models that need no network, no key and no server.

Two models, in the spirit of PydanticAI's ``TestModel`` and ``FunctionModel``:

* :class:`TestModel` calls every tool once with arguments made up from the
  tool's JSON schema, then answers with what the tools returned. It checks the
  wiring: tools are offered, their schemas accept valid arguments, they run and
  their results reach the model.
* :class:`FunctionModel` replies with what your function decides from the
  conversation (``function(messages, info)``), or plays a list of replies.

Both work two ways, deciding the same replies:

* in process, as an agent's model: ``eg.Agent("support", TestModel(), tools=[...])``;
* over HTTP, in the OpenAI Chat Completions and Responses and the Anthropic
  Messages wire formats (tool calls and streaming included), for code that calls
  an SDK itself, such as an agent using ``eg.wrap(openai.OpenAI(...))``:

.. code-block:: python

    import openai
    import engrain as eg
    from engrain.testing import FunctionModel, tool_call

    model = FunctionModel([tool_call("lookup_order", order_id=42), "Order 42 has shipped."])
    with model.serve() as server:
        client = eg.wrap(openai.OpenAI(base_url=server.openai_url, api_key="test"))
        ...                                    # your agent, using client
    assert model.calls == 2                    # requests answered, to assert "0 calls on a cache hit"

Replies are built with :func:`say` (text), :func:`tool_call` (one call) and
:func:`tool_calls` (several at once, run in parallel by the agent); a plain
``str`` is a text reply. Every request is kept in ``model.requests`` as
``(messages, info)``.
"""

from __future__ import annotations

from ._agent.scripted import Reply, say, tool_call, tool_calls
from ._agent.testmodels import AgentInfo, FunctionModel, ScriptExhaustedError, TestModel

__all__ = [
    "AgentInfo",
    "FunctionModel",
    "Reply",
    "ScriptExhaustedError",
    "TestModel",
    "say",
    "tool_call",
    "tool_calls",
]
