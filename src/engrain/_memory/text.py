"""Full-text search over memory (mixed into :class:`~engrain._memory.store.MemoryStore`).

SQLite ranks with FTS5's BM25. PostgreSQL matches in ``engrain_mem_text``
(narrow rows, GIN index) and scores each row by the summed BM25 IDF of the
query words it contains, with word frequencies read from the planner's
statistics; both drop words found in more than ``max_df`` items, which weigh
almost nothing and would make a search linear in the store's size.
"""

from __future__ import annotations

import math
import re
import time as _time
from typing import Any

import numpy as np

from . import filters as _filters

_WORD = re.compile(r"\w+", re.UNICODE)
_STOP = frozenset(
    "a an and are as at be by for from has have how i in is it its of on or that the this to was were what when "
    "where which who why will with do does did my me you your we our".split()
)


def bm25_idf(df: int, total: float) -> float:
    """BM25's IDF of a word found in ``df`` of ``total`` rows (the weight full text gives a matched word)."""
    return math.log(1.0 + (total - df + 0.5) / (df + 0.5))


def query_terms(text: str, limit: int = 16) -> list[str]:
    """The words of ``text`` worth a full-text match (lower case, stop words dropped, deduplicated)."""
    seen: dict[str, None] = {}
    for w in _WORD.findall(text.lower()):
        if w not in _STOP and len(seen) < limit:
            seen.setdefault(w, None)
    return list(seen)


class TextSearch:
    """Full-text methods of the store; needs its ``backend``, ``_db``, ``_lock``, ``_pg_stats`` and ``_lex``."""

    backend: str
    _db: Any
    _lock: Any
    _pg_stats: Any
    _lex: dict[str, str]
    #: Full-text rows this connection wrote or deleted (and rollbacks): with SQLite's ``data_version`` (commits
    #: by other connections), what the cached word counts of :meth:`_frequencies` are valid for.
    _fts_writes = 0
    _df: tuple[Any, dict[str, int], dict[str, tuple[Any, Any, Any]], dict[str, int]] = (None, {}, {}, {})

    def _frequencies(self, terms: list[str], cap: int) -> list[tuple[str, int]]:
        """``(term, rows matching it)`` with each count stopping at ``cap + 1`` (one round trip on PostgreSQL).

        Ranking costs one score per matching row, so a word found in more than
        ``cap`` rows would make every search linear in the store's size while
        adding almost nothing to BM25 (its IDF is near zero); :meth:`text_search`
        leaves such words to the vector side.
        """
        if self.backend == "sqlite":
            # A word's count changes only with the full-text rows: kept until this connection writes one or
            # another connection commits (two round trips of ~0.05 ms each a word otherwise, every recall).
            key = (self._db.execute("PRAGMA data_version").fetchone()[0], self._fts_writes, cap)
            if self._df[0] != key or len(self._df[1]) > 50_000:
                self._df = (key, {}, {}, {})
            known = self._df[1]
            for t in terms:
                if t not in known:
                    known[t] = int(self._db.execute("SELECT count(*) FROM (SELECT rowid FROM engrain_mem_fts WHERE "
                                                    "engrain_mem_fts MATCH ? LIMIT ?)", (f'"{t}"', cap + 1)).fetchone()[0])
            return [(t, known[t]) for t in terms]
        est = self._pg_estimates(terms)
        if est is not None:
            return est
        rows = self._db.execute(
            "SELECT t, (SELECT count(*) FROM (SELECT 1 FROM engrain_mem_text WHERE tsv @@ to_tsquery('english', t)"
            " LIMIT %s) r) FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, i) ORDER BY i", (cap + 1, terms)).fetchall()
        return [(t, int(n)) for t, n in rows]

    def passage_words(self, ids: list[str], text: str, chars: int, max_df: int = 1000
                      ) -> tuple[dict[str, float], dict[str, tuple[str, frozenset[str]]]]:
        """What recall's passage words (:func:`.ranking.add_cover`) need: one round trip on PostgreSQL; on
        SQLite the records' heads in one statement, and each word's rows from the text search's kept ones.

        Returns the words of ``text`` worth a full-text match (those :meth:`text_search`
        matches: stop words and words in more than ``max_df`` rows dropped) with their
        BM25 IDF, and per live record of ``ids`` its first ``chars`` characters and
        which of those words it holds, matched as the full text matches them (stemmed:
        "painting" holds "paint"). Nothing is read when fewer than two words are left.
        """
        terms = query_terms(text)
        out: dict[str, tuple[str, frozenset[str]]] = {}
        with self._lock:
            if len(terms) < 2 or not ids:
                return {}, out
            freq = dict(self._frequencies(terms, max_df))
            terms = [t for t in terms if freq[t] <= max_df]
            if len(terms) < 2:
                return {}, out
            held: list[Any]  # (id, head, bit k set when the record holds terms[k])
            if self.backend == "sqlite":
                n = self._db.execute("SELECT max(seq) FROM engrain_mem_records").fetchone()[0] or 0
                rows: list[tuple[str, int, str]] = []
                for i in range(0, len(ids), 500):
                    chunk = ids[i:i + 500]
                    rows += self._db.execute(f"SELECT id, seq, substr(content, 1, ?) FROM engrain_mem_records WHERE id "
                                             f"IN ({','.join('?' * len(chunk))})", (chars, *chunk)).fetchall()
                seqs = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
                masks = np.zeros(len(rows), dtype=np.int64)  # bit k: the record holds terms[k]
                for k, t in enumerate(terms):  # a word's rows: kept by the text search when it has them, else read
                    kept = self._df[2].get(t)
                    have = kept[0] if kept is not None else np.fromiter((r for (r,) in self._db.execute(
                        "SELECT rowid FROM engrain_mem_fts WHERE engrain_mem_fts MATCH ?", (f'"{t}"',))), dtype=np.int64)
                    masks |= np.isin(seqs, have).astype(np.int64) << k
                held = [(rid, head, m) for (rid, _, head), m in zip(rows, masks.tolist())]
            else:
                lex = self._lexemes(terms)
                terms = [t for t in terms if lex.get(t)]  # PostgreSQL's stop words match nothing
                if len(terms) < 2:
                    return {}, {}
                n = self._pg_text_rows()
                # One bit a word, each test folded to a constant tsquery (never a prepared statement, as in
                # text_search: a generic plan would parse and stem every word for every row).
                bits = " + ".join(f"(CASE WHEN x.tsv @@ to_tsquery('english', %s) THEN {1 << k} ELSE 0 END)"
                                  for k in range(len(terms)))
                held = self._db.execute(
                    f"SELECT r.id, substr(r.content, 1, %s), {bits} FROM engrain_mem_records r JOIN engrain_mem_text x "
                    "ON x.rowid = r.seq WHERE r.id = ANY(%s)", (chars, *terms, list(ids)), prepare=False).fetchall()
        sets: dict[int, frozenset[str]] = {}  # few distinct masks: one set each
        for rid, head, m in held:
            words = sets.get(m)
            if words is None:
                words = sets[m] = frozenset(t for k, t in enumerate(terms) if m >> k & 1)
            out[rid] = (head, words)
        total = max(float(n), float(sum(freq[t] for t in terms)), 1.0)
        return {t: bm25_idf(freq[t], total) for t in terms}, out

    def _pg_text_rows(self) -> float:
        """The full-text table's row count the word counts were estimated with (read with them, kept as long:
        one round trip less a search), or read now when they were counted exactly (no statistics)."""
        stats = self._pg_stats[1].get("engrain_mem_text") if self._pg_stats is not None else None
        return stats[2] if stats is not None else float(self._db.execute(
            "SELECT reltuples FROM pg_class WHERE oid = 'engrain_mem_text'::regclass").fetchone()[0])

    def _pg_estimates(self, terms: list[str]) -> list[tuple[str, int]] | None:
        """Word frequencies from PostgreSQL's own statistics of the ``tsv`` columns, without touching a row.

        ANALYZE keeps each tsvector column's most common lexemes with their
        frequency; a lexeme not listed is rarer than the rarest listed one, which
        bounds it. Counting matches instead reads one heap row per match (these
        rows carry two vectors: ~3 kB each), the cost that made full text slow.
        None when a table has no statistics yet (then counts are exact).
        """
        now = _time.monotonic()
        if self._pg_stats is None or now - self._pg_stats[0] > 60.0:
            tables: dict[str, tuple[dict[str, float], float, float]] = {}
            for table in ("engrain_mem_text",):
                row = self._db.execute(
                    "SELECT s.most_common_elems::text::text[], s.most_common_elem_freqs, c.reltuples FROM pg_class c "
                    "LEFT JOIN pg_stats s ON s.schemaname = current_schema() AND s.tablename = c.relname "
                    "AND s.attname = 'tsv' WHERE c.oid = %s::regclass", (table,)).fetchone()
                if row is None or row[0] is None:  # never analyzed (or nothing common): count exactly, narrow rows
                    self._pg_stats = None  # (text_search reads the row count itself then)
                    return None
                elems, freqs, n = row
                tables[table] = (dict(zip(elems, freqs)), float(freqs[len(elems)]), float(n))
            self._pg_stats = (now, tables)
        lex = self._lexemes(terms)
        out = []
        for t in terms:
            if not lex.get(t):
                out.append((t, 1 << 62))  # no lexeme (a stop word to PostgreSQL): never matched
                continue
            total = 0.0
            for common, floor, n in self._pg_stats[1].values():
                total += common.get(lex[t], floor) * n
            out.append((t, int(round(total))))
        return out

    def _lexemes(self, terms: list[str]) -> dict[str, str]:
        """The English-stemmed lexeme of each term (cached: the mapping never changes)."""
        miss = [t for t in terms if t not in self._lex]
        if miss:
            if len(self._lex) > 50_000:
                self._lex.clear()
            for t, q in self._db.execute("SELECT t, to_tsquery('english', t)::text FROM unnest(%s::text[]) AS t",
                                         (miss,)).fetchall():
                self._lex[t] = q.strip().strip("'") if q and "&" not in q and "|" not in q else ""
        return {t: self._lex.get(t, "") for t in terms}

    def _learn_words(self, terms: list[str]) -> None:
        """Keep each word's own bm25() per row once it comes back while the rows are unchanged (see
        :meth:`_sqlite_ranked`): a word seen once costs nothing more, so a recall after every write never pays."""
        _, _, hits, seen = self._df
        for t in terms:
            seen[t] = seen.get(t, 0) + 1
            if seen[t] < 2 or t in hits:
                continue
            if len(hits) >= 256:  # at most 256 words of at most max_df rows each
                hits.clear()
            # No skill column: reading it reads each row's stored text too (half the statement's time); a
            # search within a skill reads the skills of a word's rows once, when it first needs them.
            rows = self._db.execute("SELECT rowid, bm25(engrain_mem_fts) FROM engrain_mem_fts WHERE "
                                    "engrain_mem_fts MATCH ?", (f'"{t}"',)).fetchall()
            hits[t] = (np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)),
                       np.fromiter((r[1] for r in rows), dtype=np.float64, count=len(rows)), None)

    def _word_skills(self, t: str) -> Any:
        """The skill of each row of a kept word, in the order of its kept rowids (read once, then kept)."""
        rowids, scores, skills = self._df[2][t]
        if skills is None:
            rows = sorted(self._db.execute("SELECT rowid, skill FROM engrain_mem_fts WHERE engrain_mem_fts MATCH ?",
                                           (f'"{t}"',)).fetchall())
            one: dict[str, str] = {}  # one string per skill, not one per row
            have = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            names = np.array([one.setdefault(r[1], r[1]) for r in rows], dtype=object)
            skills = names[np.searchsorted(have, rowids)]
            self._df[2][t] = (rowids, scores, skills)
        return skills

    def _sqlite_ranked(self, terms: list[str], skill: str | None, now: float, limit: int
                       ) -> list[tuple[str, str, float]]:
        """FTS5's BM25 ranking of ``terms`` (OR), from each word's kept scores (:meth:`_learn_words`).

        FTS5's bm25() of an OR query is, for each row, 0.0 plus each word's
        ``idf * tf-part`` in query order, negated; each word's part depends only
        on that word's matches and the table's size. So each word's own bm25()
        per row, summed in query order from 0.0, is the same float for every
        row, and queries that share words (most do) skip scoring those words'
        rows again (~1 µs a row; ~1,100 rows a query at 10k records). The words'
        scores are dropped with the word counts, when a full-text row changes.
        """
        parts = [self._df[2][t] for t in terms]
        rowids = np.concatenate([p[0] for p in parts])
        scores = np.concatenate([p[1] for p in parts])
        if skill is not None:
            keep = np.concatenate([self._word_skills(t) for t in terms]) == skill
            rowids, scores = rowids[keep], scores[keep]
        if not len(rowids):
            return []
        rows, at = np.unique(rowids, return_inverse=True)
        total = np.zeros(len(rows), dtype=np.float64)
        np.add.at(total, at, scores)  # in query order per row, as FTS5 adds them
        if len(total) > limit:  # only rows at or under the limit-th score can be among the best (ties included)
            near = np.flatnonzero(total <= np.partition(total, limit - 1)[limit - 1])
            best = near[np.lexsort((rows[near], total[near]))[:limit]]  # ties by rowid, as FTS5 reads matches
        else:
            best = np.lexsort((rows, total))[:limit]
        rec = [int(r) for r in rows[best] if r > 0]
        art = [-int(r) for r in rows[best] if r < 0]
        ids: dict[int, str] = {}
        if rec:
            ids.update(self._db.execute(f"SELECT seq, id FROM engrain_mem_records WHERE seq IN ({','.join('?' * len(rec))})"
                                        " AND (expires IS NULL OR expires > ?)", (*rec, now)).fetchall())
        if art:
            ids.update((-s, i) for s, i in self._db.execute(
                f"SELECT seq, id FROM engrain_mem_articles WHERE seq IN ({','.join('?' * len(art))})", art).fetchall())
        return [("record" if r > 0 else "article", ids[r], -float(total[j]))
                for r, j in zip(rows[best].tolist(), best.tolist()) if r in ids]

    def text_search(self, text: str, skill: str | None, now: float, limit: int,
                    max_df: int | None = 1000, where: dict[str, Any] | None = None) -> list[tuple[str, str, float]]:
        """Full-text hits ``[(tier, id, rank)]``, best first (rank: higher is better).

        Any query word matches (OR). Words found in more than ``max_df`` rows
        are not matched (see :meth:`_frequencies`); None matches every word.
        ``where`` filters records by metadata (articles are filtered by the caller).
        """
        terms = query_terms(text)
        cond, cparams = _filters.sql(self.backend, where)
        out: list[tuple[str, str, float]] = []
        with self._lock:
            freq: dict[str, int] | None = None
            if terms and max_df is not None:
                freq = dict(self._frequencies(terms, max_df))
                terms = [t for t in terms if freq[t] <= max_df]
            if not terms:
                return []
            learn = self.backend == "sqlite" and freq is not None and not cond
            if learn and all(t in self._df[2] for t in terms):
                return self._sqlite_ranked(terms, skill, now, limit)
            if self.backend == "sqlite":
                match = " OR ".join(f'"{t}"' for t in terms)
                # ORDER BY bm25() keeps the best `limit` in SQLite's bounded sorter; ORDER BY rank sorted every
                # match in FTS5's own (1.0 against 1.5 ms over ~1,100 matches, same rows in the same order). The
                # ids (and a record's expiry) are read for the kept rows only, in the same statement.
                sql = "SELECT rowid, bm25(engrain_mem_fts) AS r FROM engrain_mem_fts WHERE engrain_mem_fts MATCH ?"
                params: list[Any] = [match]
                if skill is not None:
                    sql += " AND skill = ?"
                    params.append(skill)
                if cond:  # records matching the filter, or any article
                    sql += f" AND (rowid < 0 OR rowid IN (SELECT seq FROM engrain_mem_records WHERE 1 = 1{cond}))"
                    params += cparams
                sql = ("SELECT h.rowid, CASE WHEN h.rowid > 0 THEN (SELECT id FROM engrain_mem_records WHERE seq = "
                       "h.rowid AND (expires IS NULL OR expires > ?)) ELSE (SELECT id FROM engrain_mem_articles WHERE "
                       f"seq = -h.rowid) END, h.r FROM ({sql} ORDER BY r LIMIT ?) h ORDER BY h.r")
                for rowid, rid, score in self._db.execute(sql, (now, *params, limit)):
                    if rid is not None:  # an expired record (or a row deleted meanwhile)
                        out.append(("record" if rowid > 0 else "article", rid, -float(score)))
                if learn:
                    self._learn_words(terms)
                return out
            # No ts_rank_cd over every match: each matched word adds its BM25 IDF (from the counts just
            # taken), so scoring a row is a few @@ tests on its stored tsvector. Records are short: a word's
            # frequency within one is nearly always 1, which is what BM25's tf part would weigh.
            if freq is None:
                freq = dict(self._frequencies(terms, 1 << 62))
            terms = [t for t in terms if freq[t] < 1 << 62]  # words PostgreSQL drops as stop words
            if not terms:
                return []
            # Summed over the kept words only: a stop word's count (2**62, "never matched") taken into the
            # total made every IDF nearly the same, on any question holding one ("after", "she", "her").
            total = max(self._pg_text_rows(), float(sum(freq[t] for t in terms)), 1.0)
            weights = [bm25_idf(freq[t], total) for t in terms]
            score = " + ".join("(CASE WHEN tsv @@ to_tsquery('english', %s) THEN %s ELSE 0 END)" for _ in terms)
            sparams = [x for t, w in zip(terms, weights) for x in (t, w)]
            sql = (f"SELECT rowid, id, {score} AS r FROM engrain_mem_text WHERE tsv @@ to_tsquery('english', %s) "
                   "AND (expires IS NULL OR expires > %s)")
            params = [*sparams, " | ".join(terms), now]
            if skill is not None:
                sql += " AND skill = %s"
                params.append(skill)
            if cond:  # records matching the filter, or any article
                sql += (" AND (rowid < 0 OR rowid IN (SELECT seq FROM engrain_mem_records WHERE 1 = 1"
                        f"{cond.replace('?', '%s')}))")
                params += cparams
            # Never a prepared statement: a generic plan would run to_tsquery (parse and stem) once per row
            # and word, where a plan for these values folds each call to a constant (2.5x faster at 10k).
            rows = [("record" if q > 0 else "article", i, r) for q, i, r in
                    self._db.execute(sql + " ORDER BY r DESC LIMIT %s", (*params, limit), prepare=False).fetchall()]
        rows.sort(key=lambda r: -r[2])
        return [(r[0], r[1], float(r[2])) for r in rows[:limit]]
