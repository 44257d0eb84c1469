"""CSV report: a *scripted demo agent* whose run compiles into a routine.

The agent (no LLM: its plan is fixed, so it runs offline and the same way every
time) fetches a CSV file through a tool, parses it with a UDF, asks a human to
approve, and summarizes headcount and salary by department with a second UDF.
Both UDFs are ``@eg.udf``: their source is recorded with the run, so the
compiled routine carries the real functions and runs on any CSV of this shape.
The compiled routine is untrusted (its UDFs run in the WASM sandbox) until a
human sets ``trusted: true`` in its routine.yaml.

    python examples/csv_report/agent.py            # record a run: out/csv_report/trace.json and routine/
    engrain run out/csv_report/routine --tools examples/csv_report/agent.py:tools   # exit 3: asks to approve

It writes into ``out/csv_report/`` under the current directory (``--out`` for
another folder), never into the repository's tracked files. The tool reads only
files under ``data/`` next to this script (no network).
"""

from __future__ import annotations

import csv
import io
import json
import pathlib
import sys
from typing import Any

import engrain as eg

HERE = pathlib.Path(__file__).resolve().parent
DATA = HERE / "data"

#: The tools this example's routine calls (``--tools examples/csv_report/agent.py:tools``).
tools = eg.ToolRegistry()


@eg.tool(registry=tools)
def fetch_csv(source: str) -> str:
    """The text of ``data/<source>``; a path leaving ``data/`` is refused."""
    path = (DATA / source).resolve()
    if path.parent != DATA:
        raise ValueError(f"fetch_csv: {source!r} is outside the data folder")
    return path.read_text(encoding="utf-8")


@eg.udf(registry=tools)
def parse_csv(text: str) -> list[dict[str, Any]]:
    """Rows of a CSV text as dicts, salary as an int."""
    rows = list(csv.DictReader(io.StringIO(text)))
    return [{"name": r["name"], "department": r["department"], "salary": int(r["salary"])} for r in rows]


@eg.udf(registry=tools)
def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Headcount and total salary per department, sorted by department."""
    by: dict[str, dict[str, Any]] = {}
    for r in rows:
        d = by.setdefault(r["department"], {"department": r["department"], "headcount": 0, "total_salary": 0})
        d["headcount"] += 1
        d["total_salary"] += r["salary"]
    return [by[k] for k in sorted(by)]


def report_agent(task: str, source: str, title: str) -> dict[str, Any]:
    """The scripted demo agent: fetch, parse, approve, summarize."""
    text = fetch_csv(source)
    rows = parse_csv(text)
    answer = eg.ask(
        f"Found {len(rows)} rows in {source}. Build the report?",
        [{"name": "approved", "type": "boolean"}],
    )
    if not answer.get("approved"):
        raise RuntimeError("the report was not approved")
    return {"title": title, "source": source, "departments": summarize(rows)}


INPUTS = {"source": "employees.csv", "title": "Headcount by department"}


def record(journal: Any, inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the agent (approving when asked) and return the trace of the finished run."""
    from engrain._durable.trace import export_run

    inputs = inputs or INPUTS
    first = eg.run(report_agent, "csv report", inputs=inputs, journal=journal)
    assert first.status == "needs_input", first
    eg.answer(first.run_id, {"approved": True}, journal=journal)
    done = eg.run(report_agent, "csv report", run_id=first.run_id, inputs=inputs, journal=journal)
    assert done.status == "ok", done
    return export_run(journal, first.run_id)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    from engrain import compile_trace

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="out/csv_report", help="folder for trace.json and routine/ (default out/csv_report)")
    a = p.parse_args(argv)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        journal = eg.open(f"sqlite:///{tmp}/trace.db")
        trace = record(journal)
        journal.close()
    (out / "trace.json").write_text(json.dumps(trace, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    path = compile_trace(trace, out / "routine")
    print(f"wrote {out / 'trace.json'} and {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
