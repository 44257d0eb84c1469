"""Memory's tables: their definitions on SQLite and PostgreSQL, created (and brought up to date) on open."""

from __future__ import annotations

from typing import Any

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS engrain_mem_records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE, skill TEXT NOT NULL, content TEXT NOT NULL, hint TEXT NOT NULL,
    metadata TEXT NOT NULL, digest TEXT NOT NULL, created REAL NOT NULL, expires REAL,
    article_id TEXT, embedding BLOB NOT NULL, importance REAL, UNIQUE (skill, digest));
-- A metadata filter (recall/find where=) reads every record's metadata: this covering index holds just what that
-- scan reads, not the rows with their content and 1.5 kB vectors (10k records: 8.0 against 2.3 ms).
CREATE INDEX IF NOT EXISTS engrain_mem_records_meta ON engrain_mem_records (metadata, expires, skill, id);
CREATE TABLE IF NOT EXISTS engrain_mem_articles (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE, skill TEXT NOT NULL, title TEXT NOT NULL, content TEXT NOT NULL,
    sources TEXT NOT NULL, metadata TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
    version INTEGER NOT NULL, synthesizer TEXT NOT NULL, embedding BLOB NOT NULL, importance REAL);
CREATE TABLE IF NOT EXISTS engrain_mem_buffer (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL, skill TEXT, ref TEXT, data TEXT NOT NULL, created REAL NOT NULL,
    claim TEXT, claimed_at REAL);
CREATE TABLE IF NOT EXISTS engrain_mem_state (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE VIRTUAL TABLE IF NOT EXISTS engrain_mem_fts USING fts5(
    text, skill UNINDEXED, tokenize = 'porter unicode61');
"""

_PG_SCHEMA = """
CREATE TABLE IF NOT EXISTS engrain_mem_records (
    seq BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL UNIQUE, skill TEXT NOT NULL, content TEXT NOT NULL, hint TEXT NOT NULL,
    metadata TEXT NOT NULL, digest TEXT NOT NULL, created DOUBLE PRECISION NOT NULL,
    expires DOUBLE PRECISION, article_id TEXT, embedding BYTEA NOT NULL, importance DOUBLE PRECISION,
    tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', hint || ' ' || content)) STORED,
    UNIQUE (skill, digest));
DROP INDEX IF EXISTS engrain_mem_records_tsv;
CREATE INDEX IF NOT EXISTS engrain_mem_records_skill_seq ON engrain_mem_records (skill, seq);
CREATE INDEX IF NOT EXISTS engrain_mem_records_meta ON engrain_mem_records USING GIN ((metadata::jsonb) jsonb_path_ops);
-- Which of a recall's candidates are folded into an article (folded_records): read from this index alone,
-- not from ~150 wide heap rows (0.4 ms a recall at 10k), as it holds folded records only.
CREATE INDEX IF NOT EXISTS engrain_mem_records_folded ON engrain_mem_records (id) WHERE article_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS engrain_mem_articles (
    seq BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL UNIQUE, skill TEXT NOT NULL, title TEXT NOT NULL, content TEXT NOT NULL,
    sources TEXT NOT NULL, metadata TEXT NOT NULL, created DOUBLE PRECISION NOT NULL,
    updated DOUBLE PRECISION NOT NULL, version INTEGER NOT NULL, synthesizer TEXT NOT NULL,
    embedding BYTEA NOT NULL, importance DOUBLE PRECISION,
    tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', title || ' ' || content)) STORED);
DROP INDEX IF EXISTS engrain_mem_articles_tsv;
CREATE TABLE IF NOT EXISTS engrain_mem_buffer (
    seq BIGSERIAL PRIMARY KEY,
    kind TEXT NOT NULL, skill TEXT, ref TEXT, data TEXT NOT NULL, created DOUBLE PRECISION NOT NULL,
    claim TEXT, claimed_at DOUBLE PRECISION);
CREATE TABLE IF NOT EXISTS engrain_mem_state (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS engrain_mem_text (
    rowid BIGINT PRIMARY KEY, id TEXT NOT NULL, skill TEXT NOT NULL, expires DOUBLE PRECISION,
    tsv tsvector NOT NULL);
CREATE INDEX IF NOT EXISTS engrain_mem_text_tsv ON engrain_mem_text USING GIN (tsv);
"""


def sqlite_tables(db: Any) -> None:
    """Create memory's tables in the SQLite connection ``db`` (WAL mode), adding columns older stores lack."""
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(_SQLITE_SCHEMA)
    for table in ("engrain_mem_records", "engrain_mem_articles"):  # stores made before importance existed
        if "importance" not in {r[1] for r in db.execute(f"PRAGMA table_info({table})")}:
            db.execute(f"ALTER TABLE {table} ADD COLUMN importance REAL")


def pg_tables(db: Any) -> None:
    """Create memory's tables on the PostgreSQL connection ``db``, inside the caller's transaction."""
    # Concurrent first opens race on CREATE TABLE IF NOT EXISTS; a lock serialises them.
    db.execute("SELECT pg_advisory_xact_lock(hashtext('engrain_mem_schema'))")
    for stmt in _PG_SCHEMA.split(";"):
        if stmt.strip():
            db.execute(stmt)
    for table in ("engrain_mem_records", "engrain_mem_articles"):  # stores made before importance
        db.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS importance DOUBLE PRECISION")
    if not db.execute("SELECT 1 FROM engrain_mem_text LIMIT 1").fetchone():  # stores made before it
        db.execute(
            "INSERT INTO engrain_mem_text (rowid, id, skill, expires, tsv) SELECT seq, id, skill, expires, "
            "tsv FROM engrain_mem_records UNION ALL SELECT -seq, id, skill, NULL, tsv FROM engrain_mem_articles")
