"""A consolidation's claim on buffer rows is a lease: renewed while the pass runs, free soon after it dies."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

from engrain._memory import Memory
from engrain._memory import consolidate as C
from engrain._memory.synth import ExtractiveSynthesizer

FACTS = ["The release train leaves every second Wednesday.", "Hotfixes skip the release train."]


class _Slow(ExtractiveSynthesizer):
    """The extractive synthesizer, taking ``delay`` seconds per article (a slow LLM)."""

    def __init__(self, delay: float):
        super().__init__()
        self.delay = delay

    def synthesize(self, skill, records, previous):
        time.sleep(self.delay)
        return super().synthesize(skill, records, previous)


def _claimed(db: str) -> int:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT count(*) FROM engrain_mem_buffer WHERE claim IS NOT NULL").fetchone()[0]


def test_killed_consolidator_frees_its_rows_within_the_lease(tmp_path, embedder):
    db = str(tmp_path / "m.db")
    url = f"sqlite:///{db}"
    with Memory(url, embedder=embedder, synthesizer=ExtractiveSynthesizer()) as m:
        m.remember_many(FACTS)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from engrain._memory import Memory
        from engrain._memory.synth import ExtractiveSynthesizer
        class Hang(ExtractiveSynthesizer):
            def synthesize(self, *a):
                time.sleep(3600)
        Memory({url!r}, synthesizer=Hang()).consolidate()
        """)], cwd=os.getcwd())
    try:
        deadline = time.time() + 60
        while _claimed(db) < len(FACTS):
            assert child.poll() is None and time.time() < deadline, "the child never claimed the rows"
            time.sleep(0.05)
        time.sleep(C.LEASE_RENEW * 1.5)  # let it renew at least once while it hangs
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        killed_at = time.time()
        with Memory(url, embedder=embedder, synthesizer=ExtractiveSynthesizer()) as m:
            s = m.consolidate()
            assert s.formed == 0 and s.kept == len(FACTS)  # still leased right after the kill
            while True:
                s = m.consolidate()
                if s.formed:
                    break
                assert time.time() - killed_at < C.LEASE + 3 * C.LEASE_RENEW, "rows stayed locked"
                time.sleep(0.5)
            freed = time.time() - killed_at
            assert not s.errors and s.formed == 1 and s.kept == 0 and m.stats()["buffer"] == 0
            assert freed <= C.LEASE + 2 * C.LEASE_RENEW
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_live_slow_pass_keeps_its_rows_past_the_lease(tmp_path, embedder):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    slow = Memory(url, embedder=embedder, synthesizer=_Slow(C.LEASE + 2 * C.LEASE_RENEW))
    other = Memory(url, embedder=embedder, synthesizer=ExtractiveSynthesizer())
    try:
        slow.remember_many(FACTS)
        out: list = []
        t = threading.Thread(target=lambda: out.append(slow.consolidate()))
        t.start()
        time.sleep(C.LEASE + C.LEASE_RENEW)  # past one lease: only renewal keeps the rows claimed
        s = other.consolidate()
        assert s.formed == 0 and s.kept == len(FACTS)
        t.join(60)
        assert out and not out[0].errors and out[0].formed == 1 and out[0].flushed == len(FACTS)
    finally:
        slow.close()
        other.close()
