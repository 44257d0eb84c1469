"""`engrain demo` end to end through the console script: kill -9, resume, nothing completed runs twice."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
from collections import Counter

import engrain as eg

ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")


def _demo(cwd: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ENGRAIN_URL"}
    return subprocess.run([ENGRAIN, "demo", *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def _check_store(url: str, cwd: pathlib.Path, out: str) -> None:
    j = eg.open(url)
    try:
        (run,) = j.runs(task="Book a 3-night trip to Lisbon")
        events = j.read(run.run_id)
    finally:
        j.close()
    kinds = [e.kind for e in events]
    assert [e.seq for e in events] == list(range(len(events)))  # no event lost
    assert kinds[-1] == "run.completed"
    assert kinds.count("step.completed") == 8
    effects = pathlib.Path(cwd, ".engrain", "demo", f"effects-{run.run_id}.jsonl").read_text().splitlines()
    per_key = Counter(json.loads(line)["key"] for line in effects)
    assert len(per_key) == 7  # every tool step ran (the clock is not a tool)
    # Only the step cut by the kill may have run twice, and then with one idempotency key.
    assert sum(1 for n in per_key.values() if n > 1) <= 1
    assert {json.loads(line)["phase"] for line in effects} == {"first process", "resume"}
    assert "completed steps executed twice: 0" in out


def test_demo_on_the_embedded_default(tmp_path):
    p = _demo(tmp_path)
    assert p.returncode == 0, p.stderr + p.stdout
    assert "replayed from journal" in p.stdout
    assert "recorded time replayed" in p.stdout
    # Part 2: the same task with a new name is a hit without the agent; a changed page hands off.
    assert re.search(r"Grace Hopper \(same task, new name\)\s+hit\s+0 agent decisions", p.stdout)
    assert re.search(r"Alan Turing .*diverged, handed off", p.stdout)
    assert "steps run twice in the hand-off: 0" in p.stdout
    _check_store(f"sqlite:///{tmp_path / '.engrain' / 'demo' / 'demo.db'}", tmp_path, p.stdout)


def test_demo_on_a_given_store(tmp_path, store_url):
    p = _demo(tmp_path, "--url", store_url)
    assert p.returncode == 0, p.stderr + p.stdout
    _check_store(store_url, tmp_path, p.stdout)
