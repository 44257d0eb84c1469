"""The CLI's conventions across every command: one exit-code rule (2 bad usage or input, 1 failure,
3 needs input) with a one-line message, reading commands never create a store, --version, modules
found in the current directory, and status lines for long work (the Python API stays quiet)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import engrain as eg

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENGRAIN = str(pathlib.Path(sys.executable).with_name("engrain")) if pathlib.Path(sys.executable).with_name("engrain").exists() \
    else shutil.which("engrain") or "engrain"
PACKAGE = ROOT / "tests" / "fixtures" / "csv_report" / "routine"
TOOLS = f"{ROOT / 'examples' / 'csv_report' / 'agent.py'}:tools"


def cli(*args: str, cwd: pathlib.Path, env: dict[str, str] | None = None, timeout: float = 120):
    # Status lines only for work past a minute unless a test asks: a loaded machine can make a
    # failing command's store check last half a second, and the messages are what is tested here.
    base = {**{k: v for k, v in os.environ.items() if k != "ENGRAIN_URL"}, "ENGRAIN_PROGRESS_AFTER": "60"}
    return subprocess.run([ENGRAIN, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**base, **(env or {})})


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> pathlib.Path:
    """A folder with a store (a finished run, a paused one), a bad JSON file and a half-written trace."""
    d = tmp_path_factory.mktemp("cli")
    j = eg.open(f"sqlite:///{d / 'store.db'}")
    assert eg.run(lambda t: t.upper(), "done task", run_id="done", journal=j).status == "ok"
    assert eg.run(lambda t: eg.ask("ok?"), "paused task", run_id="paused", journal=j).status == "needs_input"
    j.close()
    (d / "bad.json").write_text("{not json")
    (d / "corrupt.db").write_bytes(b"this is not a database" * 100)
    (d / "broken").mkdir()
    (d / "broken" / "routine.yaml").write_text("name: broken\ninputs: {type: object}\nsteps: []\n")
    return d


URL = ["--url", "sqlite:///store.db"]

#: (command line, exit code, text in the one-line message)
CASES = [
    (["nosuchcommand"], 2, "No such command"),
    (["runs", "--bogus"], 2, "No such option"),
    (["runs", "--status", "bogus", *URL], 2, "unknown run status 'bogus'"),
    (["runs", "--url", "mysql://x"], 2, "unknown scheme"),
    (["runs", "--url", "sqlite:///corrupt.db"], 1, "corrupt.db"),
    (["show", "nope", *URL], 2, "no run with id 'nope'"),
    (["export", "nope", *URL], 2, "no run with id 'nope'"),
    (["cancel", "nope", *URL], 2, "no run with id 'nope'"),
    (["fork", "nope", "--at-step", "0", *URL], 2, "no run with id 'nope'"),
    (["fork", "done", "--at-step", "99", *URL], 2, "cannot fork at step 99"),
    (["gc", "--older-than", "3x", *URL], 2, "older_than must be like 30d"),
    (["gc", "--older-than", "1d", "--status", "running", *URL], 2, "finished runs only"),
    (["answer", "paused", "{bad", *URL], 2, "ANSWERS: not valid JSON"),
    (["answer", "paused", "[1]", *URL], 2, "must be a JSON object"),
    (["enqueue", "a", "t", "--inputs", "{bad", *URL], 2, "--inputs: not valid JSON"),
    (["queues", "q", "--rate", "1/x", *URL], 2, "--rate must be N/PERIOD"),
    (["queues", "--concurrency", "3", *URL], 2, "need a queue NAME"),
    (["compile", "missing.json", "-o", "out"], 2, "missing.json: no such file"),
    (["compile", "bad.json", "-o", "out"], 2, "bad.json: (root): not JSON"),
    (["validate", "missing"], 2, "missing: no such routine folder"),
    (["validate", "broken"], 1, "a non-empty list of steps"),
    (["run", "missing"], 2, "missing: no such routine folder"),
    (["run", str(PACKAGE), "--input", "bad.json", *URL], 2, "--input bad.json: not JSON"),
    (["run", str(PACKAGE), "--input", "missing.json", *URL], 2, "--input missing.json"),
    (["run", str(PACKAGE), "--tools", TOOLS, *URL], 3, ""),
    (["resume", "paused", "--answers", "missing.json", *URL], 2, "--answers missing.json"),
    (["memory", "recall", "x", "--where", "nokv", *URL], 2, "expected key=value"),
    (["memory", "consolidate", "--num-records", "x", *URL], 2, "--num-records"),
    (["memory", "forget", *URL], 2, "give a record/article id or --skill"),
    (["memory", "import", "missing", *URL], 2, "missing is not a folder"),
    (["cache", "evict", "nope", *URL], 2, "no cache entry 'nope'"),
    (["worker", "--agents", "nomod:AGENTS", "--until-idle", *URL], 2, "No module named 'nomod'"),
    (["serve", "--agents", "nomod:X", *URL], 2, "No module named 'nomod'"),
    (["mcp", "--tools", "nomod:X", *URL], 2, "nomod"),
]


@pytest.mark.parametrize(("args", "code", "text"), CASES, ids=[" ".join(c[0][:3]) for c in CASES])
def test_one_exit_code_rule_with_a_one_line_message(place, args, code, text):
    r = cli(*args, cwd=place)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    if code == 3:
        assert "needs input" in r.stdout and r.stderr == ""
        return
    lines = r.stderr.strip().splitlines()
    if args[0] != "validate" or code == 2:  # validate lists every problem of a routine, one per line
        assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert text in r.stderr, r.stderr


READING = [
    ["runs"], ["show", "x"], ["export", "x"], ["cancel", "x"], ["fork", "x", "--at-step", "0"],
    ["gc", "--older-than", "1d"], ["answer", "x", "{}"], ["queues"],
    ["memory", "recall", "x"], ["memory", "stats"], ["memory", "export"], ["memory", "consolidate"],
    ["memory", "forget", "x"], ["memory", "update", "x", "y"],
    ["cache", "entries"], ["cache", "stats"], ["cache", "evict", "x"],
]


@pytest.mark.parametrize("args", READING, ids=lambda a: " ".join(a[:2]))
def test_reading_commands_never_create_a_store(tmp_path, args):
    r = cli(*args, cwd=tmp_path)  # no --url, no ENGRAIN_URL: the default .engrain/engrain.db
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("error: no store at .engrain/engrain.db") and len(r.stderr.splitlines()) == 1
    assert not (tmp_path / ".engrain").exists()


def test_version(tmp_path):
    r = cli("--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == f"engrain {eg.__version__}\n"
    assert "--version" in cli("--help", cwd=tmp_path).stdout


def test_agents_and_tools_are_found_in_the_current_directory(tmp_path):
    (tmp_path / "mymodule.py").write_text("def hello(task):\n    return 'hi ' + task\n\nAGENTS = {'hello': hello}\n")
    url = ["--url", "sqlite:///w.db"]
    for spec in ("mymodule:AGENTS", "mymodule.py:AGENTS", f"{tmp_path / 'mymodule.py'}:AGENTS"):
        assert cli("enqueue", "hello", "world", *url, cwd=tmp_path).returncode == 0
        r = cli("worker", "--agents", spec, "--until-idle", *url, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["finished"] == {"ok": 1}
    (tmp_path / "mytools.py").write_text("import engrain as eg\n\ntools = eg.ToolRegistry()\n")
    base = {k: v for k, v in os.environ.items() if k != "ENGRAIN_URL"}
    proc = subprocess.Popen([ENGRAIN, "serve", "--agents", "mymodule:AGENTS", "--tools", "mytools:tools", "--port", "0",
                             *url], cwd=tmp_path, env=base, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert "engrain serving on http://127.0.0.1:" in line, line + (proc.stderr.read() if proc.poll() else "")
        address = line.split("serving on ", 1)[1].split()[0]
        with eg.Client(address) as c:
            assert c.start_agent("hello", "there").output == "hi there"
    finally:
        proc.terminate()
        proc.wait(10)
    for command in (["worker"], ["serve"], ["run"]):
        text = " ".join(cli(*command, "--help", cwd=tmp_path).stdout.replace("│", " ").split())
        assert "module:attr (a module in the current directory works" in text and "path/to/file.py:attr" in text


def test_long_work_shows_status_lines_in_the_cli_only(place, tmp_path):
    env = {"ENGRAIN_PROGRESS_AFTER": "0"}  # every task, however quick, so the test need not wait
    r = cli("memory", "recall", "deploys", "--url", f"sqlite:///{tmp_path / 'm.db'}", cwd=tmp_path, env=env)
    assert r.returncode == 2  # no store yet: nothing loaded, nothing shown
    assert cli("memory", "remember", "Deploys are on Tuesdays", "--url", f"sqlite:///{tmp_path / 'm.db'}",
               cwd=tmp_path, env=env).returncode == 0
    r = cli("memory", "recall", "deploys", "--url", f"sqlite:///{tmp_path / 'm.db'}", cwd=tmp_path, env=env)
    assert r.returncode == 0 and "Tuesdays" in r.stdout
    assert "loading the embedding model..." in r.stderr and "loading the embedding model: done in" in r.stderr
    r = cli("gc", "--older-than", "0s", "--url", "sqlite:///store.db", "--dry-run", cwd=place, env=env)
    assert r.returncode == 0 and "finding old runs: done in" in r.stderr
    r = cli("compile", "missing.json", "-o", "out", cwd=place, env=env)
    lines = r.stderr.splitlines()
    assert lines[0] == "compiling missing.json..." and lines[1].startswith("compiling missing.json: stopped in ")
    assert lines[2:] == ["error: missing.json: no such file or folder"]
    # The same work through the Python API prints nothing, unless ENGRAIN_PROGRESS=1 asks.
    code = (f"import engrain as eg; m = eg.Memory('sqlite:///{tmp_path / 'm.db'}'); "
            "print(m.recall('deploys')[0].content)")
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env})
    assert quiet.returncode == 0 and quiet.stderr == "" and "Tuesdays" in quiet.stdout
    asked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**os.environ, **env, "ENGRAIN_PROGRESS": "1"})
    assert "loading the embedding model: done in" in asked.stderr


def test_the_sandbox_runtime_compile_says_what_it_does(tmp_path):
    """The first sandboxed routine run compiles CPython-on-WASI for seconds: the CLI says so."""
    (tmp_path / "answers.json").write_text('{"approved": true}')
    r = cli("run", str(PACKAGE), "--tools", TOOLS, "--answers", "answers.json", "--url", "sqlite:///r.db",
            cwd=tmp_path, env={"ENGRAIN_CACHE_DIR": str(tmp_path / "cache"), "ENGRAIN_PROGRESS_AFTER": "0"})
    assert r.returncode == 0, r.stderr
    assert "compiling the sandbox's Python runtime (once per machine)..." in r.stderr
    assert "compiling the sandbox's Python runtime (once per machine): done in" in r.stderr
    again = cli("run", str(PACKAGE), "--tools", TOOLS, "--answers", "answers.json", "--url", "sqlite:///r.db",
                cwd=tmp_path, env={"ENGRAIN_CACHE_DIR": str(tmp_path / "cache"), "ENGRAIN_PROGRESS_AFTER": "0"})
    assert again.returncode == 0 and again.stderr == ""  # cached: nothing long, nothing said


def test_the_terminal_reporter_draws_bars_and_spinners(monkeypatch, capsys):
    from engrain import _progress
    from engrain._cli.progress import RichReporter

    monkeypatch.setenv("ENGRAIN_PROGRESS_AFTER", "0")
    monkeypatch.setattr(_progress, "_reporter", RichReporter())
    with _progress.task("embedding texts", total=3) as advance:
        for _ in range(3):
            advance(1)
    with pytest.raises(RuntimeError), _progress.task("loading the embedding model"):
        with _progress.task("nested work"):
            pass
        raise RuntimeError("boom")
    err = capsys.readouterr().err
    assert "embedding texts" in err and "3/3" in err
    assert "nested work" in err and "loading the embedding model (stopped)" in err
    # No reporter, no ENGRAIN_PROGRESS: nothing at all.
    monkeypatch.setattr(_progress, "_reporter", None)
    monkeypatch.delenv("ENGRAIN_PROGRESS", raising=False)
    with _progress.task("quiet work", total=2) as advance:
        advance(2)
    assert capsys.readouterr().err == ""


def test_remembering_thousands_counts_them_when_asked(monkeypatch, capsys, tmp_path, embedder):
    from engrain import _progress

    monkeypatch.setenv("ENGRAIN_PROGRESS_AFTER", "0")
    monkeypatch.setattr(_progress, "_reporter", _progress.LineReporter(every=0))
    with eg.Memory(f"sqlite:///{tmp_path / 'm.db'}", embedder=embedder) as mem:
        ids = mem.remember_many([f"note {i}" for i in range(300)])
    assert len(ids) == 300
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "embedding texts (300)..." and lines[-1].startswith("embedding texts: done in ")
    assert "embedding texts: 288/300" in lines  # counted batch by batch (32 at a time)
