"""UDFs compiled by engrain from a trace.

Each function is the source recorded with @engrain.udf: it runs on any input.
"""

from __future__ import annotations

import csv
import io


def parse_csv(text: str) -> list[dict[str, Any]]:
    """Rows of a CSV text as dicts, salary as an int."""
    rows = list(csv.DictReader(io.StringIO(text)))
    return [{"name": r["name"], "department": r["department"], "salary": int(r["salary"])} for r in rows]


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Headcount and total salary per department, sorted by department."""
    by: dict[str, dict[str, Any]] = {}
    for r in rows:
        d = by.setdefault(r["department"], {"department": r["department"], "headcount": 0, "total_salary": 0})
        d["headcount"] += 1
        d["total_salary"] += r["salary"]
    return [by[k] for k in sorted(by)]
