"""The agent engine: a durable LLM agent loop, chat sessions and wrapped LLM clients.

Holds :class:`~.agent.Agent` (:mod:`.agent`), its conversation loop with
parallel journaled tool calls (:mod:`.loop`), tool schemas (:mod:`.toolspec`),
the OpenAI/Anthropic providers (:mod:`.providers`), chat sessions as durable
runs (:mod:`.sessions`), :func:`~.wrap.wrap` for users' own SDK clients
(:mod:`.wrap`) and the scripted model server that tests and the offline demo
use in place of an LLM (:mod:`.scripted`).

May import: ``_durable``, ``_cache`` (its entry store), ``_memory``, ``_routines`` (learning), ``_journal``,
``_events``, ``_errors``.
"""
