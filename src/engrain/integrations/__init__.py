"""engrain under the agent frameworks people already use.

One module per framework, each a thin adapter that implements the framework's
own published interface over engrain's pillars (the journal, durable runs,
memory, the cache). Import the module you need; each imports its framework,
which is an optional extra:

* ``engrain.integrations.langgraph``: ``EngrainCheckpointer``, ``EngrainStore`` (``pip install engrain[langgraph]``)
* ``engrain.integrations.openai_agents``: ``EngrainSession``, ``durable``, ``durable_run_config``,
  ``cached`` (``pip install engrain[openai-agents]``)
* ``engrain.integrations.pydantic_ai``: ``durable`` (``pip install engrain[pydantic-ai]``)

May import: the pillars and the base. Machinery an adapter needs goes into a
pillar, not into the adapter.
"""
