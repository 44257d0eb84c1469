"""`engrain demo` end to end through the console script: kill -9, resume, nothing completed runs twice;
a compiled routine runs with no LLM call and pauses for a human; memory recalls by meaning."""

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
from engrain._durable.context import steps_of

ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")


def _demo(cwd: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    # Without API keys the memory part uses the offline synthesizer: the tour stays local and repeatable.
    drop = {"ENGRAIN_URL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ENGRAIN_EMBEDDER"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
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
    _check_routines(url, cwd, out)
    _check_memory(url, out)


def _check_routines(url: str, cwd: pathlib.Path, out: str) -> None:
    """Part 3: the agent's run made the LLM calls; the compiled routine's runs made none, and resumed."""
    package = pathlib.Path(cwd, ".engrain", "demo", "routines", "expense-report")
    assert eg.validate_routine(package) == []
    assert "udf.call" in (package / "routine.yaml").read_text()
    j = eg.open(url)
    try:
        (agent_run,) = j.runs(task="expense report")
        routine_runs = j.runs(task="routine expense-report")
        step_types = {r.run_id: [s.type for s in steps_of(j.read(r.run_id)).values()] for r in routine_runs}
        outputs = [next(e.data["output"] for e in j.read(r.run_id) if e.kind == "run.completed") for r in routine_runs]
        agent_types = [s.type for s in steps_of(j.read(agent_run.run_id)).values()]
    finally:
        j.close()
    assert agent_run.status == "ok" and agent_types.count("llm") == 2
    assert len(routine_runs) == 2 and all(r.status == "ok" for r in routine_runs)
    for types in step_types.values():  # zero LLM calls: the compiled UDFs replayed them
        assert "llm" not in types and types.count("tool") == 2 and types.count("input") == 1
    assert sorted(o["filed_by"] for o in outputs) == ["Ada Lovelace", "Grace Hopper"]
    assert all(o["total"] == 1216 for o in outputs)
    assert re.search(r"answers given up front\s+ok\s+6\s+0\s+2\s", out)
    assert re.search(r"no answers: pauses at the prompt\s+needs_input\s+4\s+0\s", out)
    assert re.search(r"resumed with Grace Hopper's answers\s+ok\s+6\s+0\s+1\s", out)


def _check_memory(url: str, out: str) -> None:
    """Part 4: a paraphrase finds the right record first; consolidation formed articles offline."""
    first_hit = re.search(r"recall 'when do releases go live\?'.*\n\s+[\d.]+\s+record\s+deploys\s+(.*)", out)
    assert first_hit and "Tuesday" in first_hit.group(1), out
    refund = re.search(r"recall 'can a customer get their money back\?' in support.*\n\s+[\d.]+\s+record\s+support\s+(.*)", out)
    assert refund and "refund" in refund.group(1).lower(), out
    assert "synthesizer: extractive (offline" in out
    assert re.search(r"recall 'when do releases go live\?' again: article 'deploy day'", out)
    with eg.Memory(url) as mem:
        st = mem.stats()
        arts = mem.store.articles()
    assert st["records"] == 7  # eight observations, one of them repeated
    assert len(arts) == 4 and {a.skill for a in arts} == {"deploys", "support"}
    assert all(a.synthesizer.startswith("extractive") for a in arts)
    assert sorted(len(a.sources) for a in arts) == [1, 2, 2, 2]


def _check_agent(out: str) -> None:
    """Part 5: offline it names the scripted model; a crash costs no second payment; the cache hit is free."""
    assert "a scripted model (a local stub server speaking the OpenAI wire format, no LLM)" in out
    assert "tool executions: lookup_order 42, refund 42 19.5 (run twice: 0)" in out
    assert "model calls 1 before + 2 after the crash" in out
    assert re.search(r"behavior cache: the same task again → 0 model calls \(first time: 3\)", out)
    assert re.search(r"'What is the secret code\?' → 'The secret code is 42; you told me at \d{4}-\d\d-\d\dT", out)
    assert "agent part failed" not in out


def test_demo_on_the_embedded_default(tmp_path):
    p = _demo(tmp_path)
    assert p.returncode == 0, p.stderr + p.stdout
    assert "replayed from journal" in p.stdout
    assert "recorded time replayed" in p.stdout
    # Part 2: the same task with a new name is a hit without the agent; a changed page hands off.
    assert re.search(r"Grace Hopper \(same task, new name\)\s+hit\s+0 agent decisions", p.stdout)
    assert re.search(r"Alan Turing .*diverged, handed off", p.stdout)
    assert "steps run twice in the hand-off: 0" in p.stdout
    _check_agent(p.stdout)
    _check_store(f"sqlite:///{tmp_path / '.engrain' / 'demo' / 'demo.db'}", tmp_path, p.stdout)
    _check_next_commands(tmp_path, p.stdout)


def test_demo_on_a_given_store(tmp_path, store_url):
    p = _demo(tmp_path, "--url", store_url)
    assert p.returncode == 0, p.stderr + p.stdout
    _check_store(store_url, tmp_path, p.stdout)


def _next_commands(out: str) -> list[str]:
    """The commands the demo ends with, as printed (a ``#`` comment dropped, as a shell does)."""
    tail = out.split("Try next:", 1)[1]
    return [line.split("#", 1)[0].strip() for line in tail.splitlines() if line.startswith("  engrain ")]


def _check_next_commands(tmp_path: pathlib.Path, out: str) -> None:
    """The demo ends with where its store is and commands that work as printed, from the same directory."""
    import shlex
    import time
    import urllib.request

    assert "are in sqlite:///.engrain/demo/demo.db. Try next:" in out
    runs, show, serve = _next_commands(out)
    env = {k: v for k, v in os.environ.items() if k != "ENGRAIN_URL"}  # a fresh shell: no store chosen
    listed = subprocess.run([ENGRAIN, *shlex.split(runs)[1:]], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert listed.returncode == 0, listed.stderr
    assert "Book a 3-night trip to Lisbon" in listed.stdout
    shown = subprocess.run([ENGRAIN, *shlex.split(show)[1:]], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "status=ok" in shown.stdout and "Lisbon" in shown.stdout
    # `engrain serve` as printed (on a free port instead of 8765, which may be taken here).
    assert serve.startswith("engrain serve --url sqlite:///.engrain/demo/demo.db --routines .engrain/demo/routines")
    proc = subprocess.Popen([ENGRAIN, *shlex.split(serve)[1:], "--port", "0"], cwd=tmp_path, env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        m = re.search(r"serving on (http://\S+)", line)
        assert m, line + proc.stderr.read() if proc.poll() is not None else line
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(m.group(1) + "/api/runs?limit=200") as r:
                    body = json.loads(r.read())
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert any(r["task"] == "Book a 3-night trip to Lisbon" for r in (body["runs"] if isinstance(body, dict) else body))
        with urllib.request.urlopen(m.group(1) + "/api/routines") as r:
            assert "expense-report" in r.read().decode()
    finally:
        proc.terminate()
        proc.wait(10)
