"""Workers and queues: long-running processes that claim and execute queued and orphaned runs.

Holds the queue tables and their SQL on both backends (:mod:`.store`: enqueue,
queue limits, claiming with ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, parking
sleeping runs) and the worker loop (:mod:`.worker`: claim within the limits,
execute in threads, renew leases, park long sleeps, stop gracefully on
SIGTERM).

May import: ``_durable``, ``_journal``, ``_events``, ``_errors``.
"""
