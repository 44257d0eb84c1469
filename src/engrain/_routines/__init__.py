"""Routines: a finished run compiled into a package that runs again with no LLM.

Holds the routine model (:mod:`.model`), the package loader (:mod:`.loader`) and
the checks of ``routine.yaml`` (:mod:`.validator`), the trace
compiler (:mod:`.compiler`) and the JSON Schemas of the traces it reads
(:mod:`.trace_schema`), the durable runner (:mod:`.runner`), the sandboxed
``when``/``assert`` evaluator (:mod:`.expr`, its limits in :mod:`.expr_limits`), ``{{ path }}`` templates
(:mod:`.template`, shared with the behavior cache), input/output schemas
(:mod:`.schema`), the writer of compiled ``udfs.py`` files (:mod:`.udfs_file`),
em-core's package format converted on load (:mod:`.emcore`), answers to
prompts (:mod:`.answers`), and routines learned from agent runs: the runs as
induction reads them (:mod:`.agent_trace`), the induction (:mod:`.induce`) and
what an edited learned routine may hold (:mod:`.learned_check`).

May import: ``_durable``, ``_sandbox``, ``_journal``, ``_events``, ``_errors``.
"""
