"""Every Python example in README.md and docs/ runs, and prints what the page shows it printing.

See tests/docs_snippets.py for how blocks are found, paired with their output and opted out.
"""

from __future__ import annotations

import doctest
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict

import pytest

from tests.docs_snippets import ROOT, blocks, pages

PAGES = [p for p in pages() if blocks(p)]
CHECKER = doctest.OutputChecker()
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def test_pages_with_python_examples_are_found():
    names = {str(p.relative_to(ROOT)) for p in PAGES}
    assert "README.md" in names and any(n.startswith("docs/guides/") for n in names), names


def test_skip_markers_are_rare_and_give_a_reason():
    every = [b for p in pages() for b in blocks(p)]
    skipped = [b for b in every if b.skip]
    assert all(b.skip.strip() for b in skipped)
    assert len(skipped) * 10 <= len(every), [f"{b.page}:{b.line} ({b.skip})" for b in skipped]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run_and_print_what_the_page_shows(page, tmp_path):
    found = blocks(page)
    missing = sorted({m for b in found[:1] for m in b.requires if importlib.util.find_spec(m) is None})
    if missing:
        pytest.skip(f"{page.name} is written against {', '.join(missing)}, not in this tree yet")
    runnable = [b for b in found if not b.skip and all(importlib.util.find_spec(m) for m in b.requires)]
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENGRAIN_", "OPENAI_", "ANTHROPIC_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    # The pages speak from a clone's root: its examples/ and scripts/ are there (copied: running them dirties nothing).
    for folder in ("examples", "scripts"):
        shutil.copytree(ROOT / folder, work / folder, ignore=shutil.ignore_patterns("__pycache__", "build", "out"))
    results_path = tmp_path / "results.json"
    (tmp_path / "blocks.json").write_text(json.dumps([asdict(b) for b in runnable]))
    # Output to files, not pipes: a server an example starts must not keep the test waiting on a pipe.
    with open(tmp_path / "blocks.json") as stdin, open(tmp_path / "stderr.txt", "w+") as stderr:
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "docs_snippets.py"), str(results_path)],
                                stdin=stdin, stdout=stderr, stderr=stderr, cwd=work, env=env, start_new_session=True)
        try:
            proc.wait(600)
        finally:
            try:  # whatever the page started and left running (a server) goes with it
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        stderr.seek(0)
        log = stderr.read()
    assert results_path.exists(), f"the page's runner died (exit {proc.returncode}):\n{log[-4000:]}"
    results = json.loads(results_path.read_text())
    for block, result in zip(runnable, results):
        where = f"{block.page}:{block.line}"
        assert result["error"] is None, f"{where} raised:\n{result['error']}"
        if block.output is not None:
            assert CHECKER.check_output(block.output, result["stdout"], FLAGS), (
                f"{where} printed:\n{result['stdout']}\nthe page shows:\n{block.output}")
    assert len(results) == len(runnable)
