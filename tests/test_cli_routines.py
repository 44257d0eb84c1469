"""`engrain compile / validate / run / resume` through the installed console script, on a real store."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ENGRAIN = shutil.which("engrain") or os.path.join(os.path.dirname(sys.executable), "engrain")
ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "csv_report"
PACKAGE = ROOT / "tests" / "fixtures" / "csv_report" / "routine"  # the example compiled (tests/test_examples.py checks it still is)
TOOLS = f"{EXAMPLE / 'agent.py'}:tools"


def cli(*args: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([ENGRAIN, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False)


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def test_compile_validate_run_resume(tmp_path, url):
    out = tmp_path / "pkg"
    r = cli("compile", str(PACKAGE.parent / "trace.json"), "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    compiled = json.loads(r.stdout)
    assert compiled["files"] == ["expected_output.json", "input.json", "routine.yaml", "udfs.py"]
    assert compiled["udfs"] == [{"name": "parse_csv", "generalized": True, "reason": None},
                                {"name": "summarize", "generalized": True, "reason": None}]
    assert (out / "routine.yaml").read_text() == (PACKAGE / "routine.yaml").read_text()

    r = cli("validate", str(out), "--tools", TOOLS, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"path": str(out), "valid": True, "issues": [], "dialect": "engrain", "conversions": []}

    r = cli("run", str(out), "--input", str(out / "input.json"), "--tools", TOOLS, "--url", url, "--json")
    assert r.returncode == 3, r.stderr  # needs_input
    paused = json.loads(r.stdout)
    assert paused["status"] == "needs_input" and paused["prompt"]["step"] == "step3"
    r = cli("run", str(out), "--input", str(out / "input.json"), "--tools", TOOLS, "--url", url)
    assert r.returncode == 3 and f"--answers answers.json --tools {TOOLS}" in r.stdout  # the hint works as printed

    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"approved": "maybe"}))
    # The recorded tools spec is named, never imported: the operator passes --tools again.
    r = cli("resume", paused["run_id"], "--answers", str(answers), "--url", url)
    assert r.returncode == 2 and f"--tools {TOOLS}" in r.stderr and "\n" not in r.stderr.strip()
    r = cli("resume", paused["run_id"], "--answers", str(answers), "--tools", TOOLS, "--url", url)
    assert r.returncode == 2 and "approved" in r.stderr and "\n" not in r.stderr.strip()

    answers.write_text(json.dumps({"approved": "yes"}))
    r = cli("resume", paused["run_id"], "--answers", str(answers), "--tools", TOOLS, "--url", url, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout)
    assert done["status"] == "ok"
    assert done["output"] == json.loads((PACKAGE / "expected_output.json").read_text())


def test_run_exit_codes(tmp_path, url):
    given = tmp_path / "a.json"
    given.write_text(json.dumps({"step3": {"approved": False}}))
    r = cli("run", str(PACKAGE), "--tools", TOOLS, "--url", url, "--answers", str(given))
    assert r.returncode == 1 and "not approved" in r.stderr

    given.write_text(json.dumps({"step3": {}}))
    r = cli("run", str(PACKAGE), "--tools", TOOLS, "--url", url, "--answers", str(given))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["departments"][0]["department"] == "Engineering"

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"source": 7, "title": "x"}))
    r = cli("run", str(PACKAGE), "--input", str(bad), "--tools", TOOLS, "--url", url)
    assert r.returncode == 2 and "inputs.source" in r.stderr

    r = cli("run", str(PACKAGE), "--input", str(tmp_path / "missing.json"), "--url", url)
    assert r.returncode == 2 and "missing.json" in r.stderr


def test_validate_prints_every_issue(tmp_path):
    pkg = tmp_path / "bad"
    pkg.mkdir()
    (pkg / "routine.yaml").write_text(
        "name: bad\ninputs: {type: object}\nsteps:\n- {id: a, type: assert, expr: 'x >'}\n- {id: a, type: nope}\n"
    )
    r = cli("validate", str(pkg))
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert any("step 'a' expr" in line for line in lines)
    assert any("step 'a' id" in line for line in lines)
    assert any("steps: missing a return step" in line for line in lines)
    r = cli("validate", str(pkg), "--json")
    issues = json.loads(r.stdout)["issues"]
    assert {"file": "routine.yaml", "step": "a", "field": "type"} in [
        {k: i[k] for k in ("file", "step", "field")} for i in issues
    ]


def test_fast_path_reads_exactly_the_options_typer_declares():
    """`run`/`resume` skip typer (engrain._cli.fast); their option tables must match the typer commands."""
    import typer.main

    from engrain._cli import app
    from engrain._cli.fast import ENVVARS, SPECS

    group = typer.main.get_command(app)
    for name, (positional, options) in SPECS.items():
        params = group.commands[name].params
        declared = {opt: (p.name, not p.is_flag) for p in params for opt in p.opts if opt.startswith("-")}
        assert declared == options, name
        assert [p.name for p in params if not p.opts[0].startswith("-")] == [positional]
        names = {q for q, _ in options.values()}
        assert {p.name: p.envvar for p in params if p.envvar} == {k: v for k, v in ENVVARS.items() if k in names}


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["run", "pkg"], ("run", {"path": "pkg"})),
        (["run", "pkg", "--json", "-i", "in.json", "--url=sqlite:///x.db", "--sandbox"],
         ("run", {"path": "pkg", "json_out": True, "input": "in.json", "url": "sqlite:///x.db", "sandbox": True})),
        (["run", "--input", "-", "pkg"], ("run", {"input": "-", "path": "pkg"})),
        (["resume", "r1", "--answers", "a.json"], ("resume", {"run_id": "r1", "answers": "a.json"})),
        (["run", "pkg", "--help"], None),  # help, usage errors: typer's job
        (["run"], None),
        (["run", "a", "b"], None),
        (["run", "pkg", "--tools"], None),
        (["run", "pkg", "--json=yes"], None),
        (["run", "pkg", "--bogus"], None),
        (["resume", "r1"], None),  # --answers is required
        (["validate", "pkg"], None),
        ([], None),
    ],
)
def test_fast_path_parses_plain_lines_and_leaves_the_rest_to_typer(argv, expected, monkeypatch):
    from engrain._cli.fast import parse

    monkeypatch.delenv("ENGRAIN_URL", raising=False)
    assert parse(argv) == expected


def test_fast_path_reads_the_url_from_the_environment(monkeypatch):
    from engrain._cli.fast import parse

    monkeypatch.setenv("ENGRAIN_URL", "sqlite:///env.db")
    assert parse(["run", "pkg"]) == ("run", {"path": "pkg", "url": "sqlite:///env.db"})
    assert parse(["run", "pkg", "--url", "sqlite:///flag.db"])[1]["url"] == "sqlite:///flag.db"


def test_fast_path_and_typer_print_the_same(tmp_path, url):
    """The same command line through the fast path and through the typer app: same stdout, stderr, exit code."""
    given = tmp_path / "a.json"
    given.write_text(json.dumps({"step3": {}}))
    typer_run = [sys.executable, "-c", "import sys; from engrain._cli import app; sys.argv[0] = 'engrain'; app()"]
    for args in (
        ["run", str(PACKAGE), "--tools", TOOLS, "--url", url, "--answers", str(given), "--json"],
        ["run", str(PACKAGE), "--tools", TOOLS, "--url", url, "--answers", str(given)],
        ["run", str(tmp_path / "nope"), "--url", url],
        ["run", str(PACKAGE), "--input", str(tmp_path / "missing.json"), "--url", url],
    ):
        fast = cli(*args)
        slow = subprocess.run([*typer_run, *args], capture_output=True, text=True, timeout=120, check=False)
        assert (fast.returncode, fast.stderr) == (slow.returncode, slow.stderr), args
        if "--json" in args:  # run ids differ
            a, b = json.loads(fast.stdout), json.loads(slow.stdout)
            assert {k: v for k, v in a.items() if k != "run_id"} == {k: v for k, v in b.items() if k != "run_id"}
        else:
            assert fast.stdout == slow.stdout, args


def test_engrain_run_imports_neither_typer_nor_yaml(tmp_path, url):
    """What keeps `engrain run` fast (bench/routines.py): the facade loads nothing, the fast path skips
    typer, and a routine.yaml parsed before comes from the cache, so PyYAML is not imported."""
    env = {**os.environ, "ENGRAIN_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", "import engrain, sys; print(sorted(m for m in sys.modules if 'engrain' in m))"],
                       capture_output=True, text=True, env=env, check=True)
    assert r.stdout.split() == ["['engrain',", "'engrain._version']"]
    given = tmp_path / "a.json"
    given.write_text(json.dumps({"step3": {}}))
    pkg = tmp_path / "pkg"
    shutil.copytree(PACKAGE, pkg)
    (pkg / "routine.yaml").write_text((pkg / "routine.yaml").read_text().replace("trusted: false", "trusted: true"))
    args = ["run", str(pkg), "--tools", TOOLS, "--url", url, "--answers", str(given)]
    first = subprocess.run([sys.executable, "-X", "importtime", "-m", "engrain", *args], capture_output=True, text=True, env=env)
    again = subprocess.run([sys.executable, "-X", "importtime", "-m", "engrain", *args], capture_output=True, text=True, env=env)
    assert first.returncode == again.returncode == 0, again.stderr[-2000:]
    imported = lambda p: {line.split("|")[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}  # noqa: E731
    assert "yaml" in imported(first) and "typer" not in imported(first)
    assert not {"yaml", "typer", "click"} & imported(again)
    assert json.loads(again.stdout) == json.loads(first.stdout)
