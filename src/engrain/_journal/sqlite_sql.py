"""The SQLite journal's statements: an append's inserts, the lease fence (a TEMP table and trigger), a run's columns.

Kept apart from :mod:`.sqlite` so the journal class reads as what it does; each statement says why it is
shaped as it is.
"""

from __future__ import annotations

# Columns named: a store with an extra column (added by a newer version or by
# hand) still takes our rows.
INTO = "INSERT INTO events (run_id, seq, ts, kind, name, data) VALUES "
INSERT = INTO + "(?, ?, ?, ?, ?, ?)"
CHUNK = 64
INSERTS = {n: INTO + ", ".join(["(?, ?, ?, ?, ?, ?)"] * n) for n in range(1, CHUNK + 1)}
# A fenced append (``Journal.append(fence=...)``) inserts only while the run's
# lease epoch is still the writer's. The writer's epoch sits in a TEMP table of
# this connection, and a TEMP trigger compares it with the run's on every insert,
# so a fenced step is still one plain INSERT: an INSERT ... SELECT reading
# ``runs`` (which the events triggers write) is materialized first, ~10 µs a step.
# WITHOUT ROWID: the trigger's lookup and a fence's write are one B-tree each, not a key index and a table.
FENCE_TABLE = "CREATE TEMP TABLE IF NOT EXISTS engrain_fence (run_id TEXT PRIMARY KEY, epoch INTEGER NOT NULL) WITHOUT ROWID"
# The whole test is in WHEN (NULL, so false, for a run without a fence): the body, a
# trigger program of its own, runs only to refuse an append, not on every fenced step.
FENCE_TRIGGER = """CREATE TEMP TRIGGER IF NOT EXISTS engrain_fenced BEFORE INSERT ON main.events
WHEN (SELECT f.epoch IS NOT r.lease_epoch FROM temp.engrain_fence AS f LEFT JOIN main.runs AS r ON r.run_id = f.run_id
      WHERE f.run_id = NEW.run_id)
BEGIN
    SELECT RAISE(ABORT, 'engrain:fenced');
END"""
FENCE_SET = "INSERT OR REPLACE INTO temp.engrain_fence (run_id, epoch) VALUES (?, ?)"
FENCE_DROP = "DELETE FROM temp.engrain_fence WHERE run_id = ?"
MAX_FENCES = 10_000  # runs this connection remembers a fence for; past it, the table starts over
LAST_KIND = "SELECT kind FROM events WHERE run_id = ? ORDER BY seq DESC LIMIT 1"
LEASE_NEW = "UPDATE runs SET lease_owner = ?, lease_until = ?, lease_epoch = lease_epoch + 1 WHERE run_id = ?"

RUN_COLS = (
    "run_id, status, task, tags, created, updated,"
    " (SELECT COALESCE(MAX(seq) + 1, 0) FROM events WHERE events.run_id = runs.run_id), lease_owner, lease_until,"
    " lease_epoch, agent"
)

# A run's rows, deleted in one transaction (gc): its events, a queued run's queue row (schema v6), its summary.
DELETE_RUN = ("DELETE FROM events WHERE run_id = ?", "DELETE FROM engrain_queue WHERE run_id = ?",
              "DELETE FROM runs WHERE run_id = ?")

# A queued run's row and status, written in the transaction that creates the run (``append_queued``).
QUEUE_DROP = "DELETE FROM engrain_queue WHERE run_id = ?"
QUEUE_ADD = "INSERT INTO engrain_queue (run_id, queue, agent, priority, available, first_claimed) VALUES (?, ?, ?, ?, ?, NULL)"
QUEUED = "UPDATE runs SET status = 'queued', lease_owner = NULL, lease_until = NULL WHERE run_id = ?"
