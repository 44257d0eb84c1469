"""The PostgreSQL journal's statements: an append's (one statement each), a step's, and the lease's.

Kept apart from :mod:`.postgres` so the journal class reads as what it does; each statement says why it
is shaped as it is.
"""

from __future__ import annotations

from .postgres_wire import STEP_FORMATS, STEP_TYPES

# One statement per append: the runs row is created (seq 0) or advanced only if
# next_seq still equals expected_seq, and the events are inserted only if that
# happened. A concurrent writer of the same run waits on the row lock, re-checks
# next_seq, and inserts nothing: its rowcount of 0 is the ConflictError.
# A new run may be created leased (append's ``lease``: owner and ttl, else two
# NULLs); an append that finishes a run drops its lease in the same statement.
# The agent is set only on creation: a later run.started cannot hand the run to another agent.
_CREATE = (
    "gate AS (INSERT INTO engrain_runs (run_id, status, task, tags, created, updated, next_seq, lease_owner, lease_until,"
    " lease_epoch, agent) VALUES (%s, %s, %s, %s::jsonb, %s, %s, %s, %s, extract(epoch from clock_timestamp()) + %s::float8,"
    " %s, %s)"
    " ON CONFLICT (run_id) DO NOTHING RETURNING 1)"
)
# A fenced append (``fence=epoch``) also requires the lease epoch to be the
# writer's: a takeover that committed first makes a stale writer's statement
# insert nothing, and one that waits on the row lock sees its events.
# A finished run takes nothing more (see ``_common``): the gate's row is the one the
# update reads anyway, so the test is a comparison, not a query, and a writer that
# waited on the row lock for the finishing append re-checks it on the new row.
_OPEN = " AND status <> 'ok' AND status <> 'failed' AND status <> 'cancelled'"
_ADVANCE = (
    "gate AS (UPDATE engrain_runs SET next_seq = %s, updated = COALESCE(%s, updated),"
    " status = COALESCE(%s, status), task = COALESCE(%s, task), tags = COALESCE(%s::jsonb, tags){finish}"
    " WHERE run_id = %s AND next_seq = %s" + _OPEN + "{fence} RETURNING 1)"
)
_FENCE = " AND lease_epoch = %s"
_FINISH = ", lease_owner = NULL, lease_until = NULL"
# A batch travels as six arrays; a single event (every step of a durable run)
# as six scalars, which psycopg adapts several times faster than lists.
_ROWS_MANY = "SELECT * FROM unnest(%s::text[], %s::int[], %s::float8[], %s::text[], %s::text[], %s::text[])"
_ROWS_ONE = "SELECT %s::text, %s::int, %s::float8, %s::text, %s::text, %s::text"
# durable=False on a "full" journal: SET LOCAL inside the statement's own
# transaction, so its commit skips the WAL flush without the BEGIN / SET /
# COMMIT round trips of an explicit transaction.
_NO_FLUSH = "cfg AS (SELECT set_config('synchronous_commit', 'off', true)), "


def _append_sql(create: bool, one: bool, flush: bool, finish: bool, fenced: bool) -> str:
    gate = _CREATE if create else _ADVANCE.format(finish=_FINISH if finish else "", fence=_FENCE if fenced else "")
    return (
        f"WITH {'' if flush else _NO_FLUSH}{gate}"
        " INSERT INTO engrain_events (run_id, seq, ts, kind, name, data)"
        f" {_ROWS_ONE if one else _ROWS_MANY} WHERE EXISTS (SELECT 1 FROM gate)"
        f"{'' if flush else ' AND EXISTS (SELECT 1 FROM cfg)'}"
    )


APPEND_SQL = {
    (create, one, flush, finish, fenced): _append_sql(create, one, flush, finish, fenced)
    for create in (False, True)
    for one in (False, True)
    for flush in (False, True)
    for finish in (False, True)
    for fenced in (False, True)
}

# A step's event (one event on an existing run that changes no status, the common append by
# far) only advances next_seq: a statement of its own with the event's six fields, the fence
# and nothing else as parameters ($1 and $2 serve the gate and the row), whose insert takes
# the gate's one row, if any, as its FROM. Fewer parameters and no COALESCEs of NULLs to
# evaluate: cheaper to encode here and to execute there than the general statement.
def _step_sql(flush: bool, fenced: bool) -> str:
    return (
        f"WITH {'' if flush else _NO_FLUSH}gate AS (UPDATE engrain_runs SET next_seq = $2 + 1"
        f" WHERE run_id = $1 AND next_seq = $2{_OPEN}{' AND lease_epoch = $7' if fenced else ''} RETURNING 1)"
        " INSERT INTO engrain_events (run_id, seq, ts, kind, name, data)"
        f" SELECT $1, $2, $3::float8, $4::text, $5::text, $6::text FROM gate{'' if flush else ', cfg'}"
    )


# By (flush, fenced): the statement, its parameters' types and their formats (the fence is the seventh).
STEP = {
    (flush, fenced): (_step_sql(flush, fenced), STEP_TYPES[: 6 + fenced], STEP_FORMATS[: 6 + fenced])
    for flush in (False, True)
    for fenced in (False, True)
}

RUN_COLS = "run_id, status, task, tags, created, updated, next_seq, lease_owner, lease_until, lease_epoch, agent"
DB_NOW = "extract(epoch from clock_timestamp())"
# The epoch moves only when the lease changes hands (SET sees the old row).
TAKE = f"lease_epoch = lease_epoch + CASE WHEN lease_owner IS DISTINCT FROM %s THEN 1 ELSE 0 END, lease_owner = %s, lease_until = {DB_NOW} + %s"

# A queued run's row, written in the transaction that creates the run ``queued`` (``append_queued``);
# available from the database's clock, which the workers' claims compare it with.
QUEUE_DROP = "DELETE FROM engrain_queue WHERE run_id = %s"
QUEUE_ADD = (
    "INSERT INTO engrain_queue (run_id, queue, agent, priority, available, first_claimed)"
    f" VALUES (%s, %s, %s, %s, {DB_NOW}, NULL)"
)
