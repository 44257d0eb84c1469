"""The behavior cache in front of an LLM agent: a repeated task replays with zero LLM calls.

The agent fills a sign-up form with the tool calls its LLM asks for. The LLM is
engrain.testing's ``FunctionModel`` served in the OpenAI wire format and called
through the official ``openai`` SDK (``eg.wrap`` journals each call), so this runs
offline; point the client at a real endpoint and nothing else changes.

The tool ``type_text`` has a pre-check: the screen must look as it did when the
trajectory was recorded. ``params`` make one trajectory serve every name.

    python examples/cache/agent.py                          # on the default store (.engrain/engrain.db)
    python examples/cache/agent.py --url sqlite:///out/cache.db
    engrain cache entries; engrain cache stats
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

import openai

import engrain as eg
from engrain.testing import AgentInfo, FunctionModel, tool_calls

FORM: dict[str, str] = {}
SCREEN = {"page": "sign-up form"}
TOOLS = [{"type": "function", "function": {
    "name": "type_text", "description": "Type text into a form field.",
    "parameters": {"type": "object", "properties": {"field": {"type": "string"}, "text": {"type": "string"}},
                   "required": ["field", "text"]}}}]


def screen() -> str:
    """What the agent sees (a real one would take a screenshot)."""
    return SCREEN["page"]


def form_model(messages: list[dict[str, Any]], info: AgentInfo) -> Any:
    """The stand-in LLM: type each ``field: value`` of the task, then say it is done."""
    if messages[-1]["role"] == "tool":
        return "The form is filled."
    pairs = re.findall(r"(\w+): ([^,]+)", messages[-1]["content"])
    return tool_calls(*[("type_text", {"field": f, "text": v.strip()}) for f, v in pairs])


def build(journal: eg.Journal, client: Any) -> eg.Engine:
    """The engine: one checked tool, and the agent that asks the LLM which calls to make."""
    engine = eg.Engine(journal, namespace="examples.cache")

    @engine.function(pre_check=eg.Check(capture=lambda field, text: screen(), compare=lambda now, then: now == then))
    def type_text(field: str, text: str) -> None:
        FORM[field] = text

    def my_agent(task: str) -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
        while True:
            reply = client.chat.completions.create(model="form-filler", messages=messages, tools=TOOLS)
            msg = reply.choices[0].message
            if not msg.tool_calls:
                return msg.content or ""
            messages.append({"role": "assistant", "content": msg.content, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in msg.tool_calls]})
            for c in msg.tool_calls:
                type_text(**json.loads(c.function.arguments))
                messages.append({"role": "tool", "tool_call_id": c.id, "content": "done"})

    return engine.set_agent(my_agent).finalize()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=None, help="store URL (default: ENGRAIN_URL or ./.engrain/engrain.db)")
    opts = ap.parse_args(argv)
    journal = eg.open(opts.url) if opts.url else eg.default_journal()
    model = FunctionModel(form_model)
    with model.serve() as server:
        engine = build(journal, eg.wrap(openai.OpenAI(base_url=server.openai_url, api_key="test")))
        tasks = [("Jane", "sign-up form"), ("Ann", "sign-up form"), ("Bob", "sign-up form (redesigned)")]
        for name, page in tasks:
            SCREEN["page"] = page
            before = model.calls
            out = engine(f"fill the form with name: {name}", params={"name": name})
            how = "replayed from the cache" if out else f"the agent ran ({out.reason})"
            print(f"{name:<5} on '{page}': {how}; model calls {model.calls - before}; form {FORM}")
            if FORM.get("name") != name:
                print(f"error: the form holds {FORM.get('name')!r}, not {name!r}", file=sys.stderr)
                return 1
    print(f"see them: engrain cache entries{f' --url {opts.url}' if opts.url else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
