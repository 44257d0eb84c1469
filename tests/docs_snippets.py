"""The Python examples of README.md and docs/**/*.md, found and run the way a reader would run them.

A page's ```python blocks run in order, in one fresh interpreter (``python tests/docs_snippets.py
RESULTS.json``), in an empty temporary directory, so each page starts with no store. A block followed
by an ```output block must print exactly that (doctest rules: ``...`` stands for any text, runs of
whitespace compare equal). Two more kinds take part, in the same order:

- ```python title="report.py"``` (a title ending in ``.py``) is a file the reader saves: it is
  written to the directory, not run;
- ```console``` is a shell transcript: each ``$ command`` line runs (bash, in that directory, with
  this venv's ``python`` and ``engrain`` first on PATH) and must print the lines under it.

A block can be left out only with a visible marker on the line just before its fence, and a reason:

    <!-- docs-test: skip (needs an OpenAI key) -->
    <!-- docs-test: requires engrain.testing -->    (runs once that module can be imported)

``requires`` on a page's first block applies to the whole page (later blocks build on it).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)$")
MARKER = re.compile(r"^\s*<!-- docs-test: (?P<what>skip|requires) ?(?P<arg>.*?) -->\s*$")
OUTPUT_LANGS = {"output", "console-output", "text output"}


@dataclass
class Block:
    """One fenced ```python block of a page, with the output shown after it (if any)."""

    page: str
    line: int
    code: str
    kind: str = "python"  # python | file | console
    filename: str | None = None
    output: str | None = None
    skip: str | None = None
    requires: list[str] = field(default_factory=list)


def pages() -> list[Path]:
    """README.md and every page under docs/, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The page's python blocks, each with its following output block and its marker."""
    lines = path.read_text(encoding="utf-8").splitlines()
    rel = str(path.relative_to(ROOT))
    out: list[Block] = []
    i, pending, last_python = 0, None, None
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            marker = MARKER.match(lines[i])
            if marker:
                pending = marker
            elif lines[i].strip():
                pending = None
                if not lines[i].lstrip().startswith("<!--"):
                    last_python = None  # prose between a code block and an output block unpairs them
            i += 1
            continue
        indent, fence, info = len(m["indent"]), m["fence"], m["info"].strip()
        body, j = [], i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence) and lines[j].strip().strip(fence[0]) == ""):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        lang = info.split()[0].lstrip("{.").rstrip("}") if info else ""
        text = "\n".join(body) + "\n"
        title = re.search(r'title="([^"]+)"', info)
        if lang in ("python", "py", "console"):
            block = Block(rel, i + 1, text)
            if lang == "console":
                block.kind, block.output = "console", text
            elif title and title.group(1).endswith(".py"):
                block.kind, block.filename = "file", title.group(1)
            if pending is not None:
                if pending["what"] == "skip":
                    reason = pending["arg"].strip()
                    if not (reason.startswith("(") and reason.endswith(")") and len(reason) > 4):
                        raise ValueError(f"{rel}:{i}: a skip marker needs a reason in parentheses")
                    block.skip = reason[1:-1]
                else:
                    block.requires = pending["arg"].split()
            out.append(block)
            last_python = block if block.kind == "python" else None
        elif lang in OUTPUT_LANGS and last_python is not None:
            last_python.output = text
            last_python = None
        else:
            last_python = None
        pending = None
        i = j + 1
    return out


def transcript(console: str) -> str:
    """Run each ``$ command`` of a console block; the transcript as it would read with this output."""
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    out = []
    for line in console.splitlines():
        if line.startswith("$ "):
            proc = subprocess.run(["bash", "-c", line[2:]], capture_output=True, text=True, env=env, timeout=300)
            out.append(line + "\n" + proc.stdout + proc.stderr)
    return "".join(out)


def run_page(page_blocks: list[dict[str, str]]) -> list[dict[str, str | None]]:
    """Exec each block in one namespace; the stdout each printed, and the traceback that stopped it."""
    namespace: dict[str, object] = {"__name__": "__main__"}
    results = []
    for b in page_blocks:
        buf = io.StringIO()
        error = None
        try:
            if b["kind"] == "file":
                Path(b["filename"]).write_text(b["code"], encoding="utf-8")
            elif b["kind"] == "console":
                buf.write(transcript(b["code"]))
            else:
                with contextlib.redirect_stdout(buf):
                    exec(compile(b["code"], f"{b['page']}:{b['line']}", "exec"), namespace)  # noqa: S102 - the docs' own examples
        except BaseException:  # noqa: BLE001 - reported to the test, which fails with it
            error = traceback.format_exc()
        results.append({"stdout": buf.getvalue(), "error": error})
        if error:
            break
    return results


if __name__ == "__main__":  # python tests/docs_snippets.py RESULTS.json < BLOCKS.json
    sys.path.insert(0, os.getcwd())  # as in `python -c` or the REPL: the reader's own files import
    results = run_page(json.loads(sys.stdin.read()))
    Path(sys.argv[1]).write_text(json.dumps(results))
