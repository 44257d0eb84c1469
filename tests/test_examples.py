"""The examples run as the README says, write only where they are told, and the test fixtures
taken from them (tests/fixtures/csv_report) are still what they produce."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "csv_report"


def _example(path: str, cwd: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ENGRAIN_URL": f"sqlite:///{cwd / 'default.db'}"}
    return subprocess.run([sys.executable, str(ROOT / path), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env)


def _tracked_examples() -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in (ROOT / "examples").rglob("*") if p.is_file()}


def test_csv_report_writes_out_csv_report_and_compiles_the_fixture(tmp_path):
    before = _tracked_examples()
    p = _example("examples/csv_report/agent.py", tmp_path)
    assert p.returncode == 0, p.stderr
    out = tmp_path / "out" / "csv_report"
    assert p.stdout.strip() == f"wrote {pathlib.Path('out/csv_report/trace.json')} and out/csv_report/routine"
    assert sorted(f.name for f in (out / "routine").iterdir()) == sorted(f.name for f in (FIXTURE / "routine").iterdir())
    for f in (FIXTURE / "routine").iterdir():  # the tests' copy is what the example compiles today
        assert (out / "routine" / f.name).read_text() == f.read_text(), f.name
    assert _tracked_examples() == before  # nothing written next to the example
    other = tmp_path / "elsewhere"
    assert _example("examples/csv_report/agent.py", tmp_path, "--out", str(other)).returncode == 0
    assert (other / "trace.json").is_file() and (other / "routine" / "routine.yaml").is_file()


def test_agent_example_runs_offline(tmp_path):
    p = _example("examples/agent/agent.py", tmp_path, "--url", f"sqlite:///{tmp_path / 'agent.db'}")
    assert p.returncode == 0, p.stderr + p.stdout
    assert re.search(r"run \w+: ok: Order 42 is shipped \(total 19\.50\)\.  \(model calls: 2\)", p.stdout)
    assert "same run again: Order 42 is shipped (total 19.50).  (model calls: 2, replayed steps: 4)" in p.stdout
    assert ('TestModel called each tool once: {"lookup_order": {"order": 0, "status": "unknown", "total": 0}, '
            '"refund": "refunded 0.00 on order 0"}') in p.stdout
    assert not (tmp_path / "default.db").exists()  # --url was used, not the default store


def test_cache_example_replays_with_zero_model_calls(tmp_path):
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    p = _example("examples/cache/agent.py", tmp_path, "--url", url)
    assert p.returncode == 0, p.stderr + p.stdout
    lines = p.stdout.splitlines()
    assert lines[0].startswith("Jane  on 'sign-up form': the agent ran (miss") and "model calls 2" in lines[0]
    assert lines[1] == "Ann   on 'sign-up form': replayed from the cache; model calls 0; form {'name': 'Ann'}"
    assert "the agent ran (miss: pre-checks failed" in lines[2] and "model calls 2" in lines[2]
    again = _example("examples/cache/agent.py", tmp_path, "--url", url)  # every task is cached now
    assert again.returncode == 0 and again.stdout.count("replayed from the cache; model calls 0") == 3
