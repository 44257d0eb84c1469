"""routine.yaml read within bounds (issue 23 #3, #5): alias bombs, size, depth, empty and non-UTF-8 files.

Every case must fail fast with a typed error naming the file, the same through
``validate_routine``/``load_routine``, ``engrain validate`` and the HTTP API,
and whichever parser (libyaml or pure Python) PyYAML picks.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import engrain as eg
from engrain._routines import yamlfile
from engrain._server import create_app

LOCAL = "http://127.0.0.1:8765"
VALID_TAIL = "name: r\ninputs: {type: object}\nsteps:\n- id: a\n  type: return\n  value: 1\n"


def laughs(levels: int = 9) -> str:
    """The classic alias bomb: each level a list of nine aliases of the one before (9**levels leaves)."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n" + VALID_TAIL


def string_bomb() -> str:
    """One 100 KB string repeated through aliases: few nodes, gigabytes of text."""
    lines = [f"s0: &s0 {'x' * 100_000}"]
    for i in range(1, 6):
        lines.append(f"s{i}: &s{i} [" + ",".join([f"*s{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n" + VALID_TAIL


BAD = {
    "laughs": (laughs().encode(), "expands to more than 2,500,000 nodes"),
    "string_bomb": (string_bomb().encode(), "characters of text"),
    "recursive": (b"a: &a [1, *a]\n" + VALID_TAIL.encode(), "recursive data is not allowed"),
    "undefined_alias": (b"a: *nope\n" + VALID_TAIL.encode(), "refers to no anchor"),
    "empty": (b"", "empty"),
    "comments_only": (b"# nothing here\n\n", "empty"),
    "not_utf8": (b"name: caf\xe9\ninputs: {type: object}\n", "not UTF-8 text (byte 0xe9 at offset 9)"),
    "deep": (b"name: r\nv: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested deeper than 100 levels"),
}


def package(root: Path, name: str, content: bytes) -> Path:
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "routine.yaml").write_bytes(content)
    return pkg


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_routine_file_is_one_issue_naming_the_file_fast(tmp_path, yaml_parser, case):
    content, message = BAD[case]
    pkg = package(tmp_path, case, content)
    # CPU time of this thread, where the file is read: the machine may be loaded, and threads earlier tests left
    # in this process (servers, workers) may run meanwhile, neither of which is the parse's cost.
    t0 = time.thread_time()
    issues = eg.validate_routine(pkg)
    took = time.thread_time() - t0
    assert len(issues) == 1 and issues[0].file == "routine.yaml" and message in issues[0].message, issues
    assert took < 0.5, f"{case}: {took:.2f}s of CPU"
    with pytest.raises(eg.RoutineError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        eg.load_routine(pkg)
    assert str(pkg) in str(e.value)


def test_file_over_the_size_limit_is_refused_before_reading(tmp_path):
    pkg = tmp_path / "big"
    pkg.mkdir()
    with open(pkg / "routine.yaml", "wb") as f:
        f.truncate(yamlfile.MAX_BYTES + 1)  # sparse: reading it would be the bug
    issues = eg.validate_routine(pkg)
    assert len(issues) == 1 and "larger than the 4,194,304 a YAML file may hold" in issues[0].message


def test_aliases_within_bounds_still_load(tmp_path, yaml_parser):
    pkg = package(tmp_path, "ok", (
        "name: r\ninputs: {type: object}\ntools: {}\nsteps:\n"
        "- id: a\n  type: return\n  value: &v {x: [1, 2, 3]}\n"
        "- id: b\n  type: return\n  value: *v\n"
    ).encode())
    r = eg.load_routine(pkg)
    assert r.steps[0].spec["value"] == r.steps[1].spec["value"] == {"x": [1, 2, 3]}


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@pytest.mark.parametrize("case", ["laughs", "string_bomb", "empty", "not_utf8"])
def test_cli_validate_exits_1_with_one_line_under_a_memory_cap(tmp_path, case):
    content, message = BAD[case]
    pkg = package(tmp_path, case, content)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "engrain", "validate", str(pkg)], capture_output=True, text=True,
                       timeout=60, preexec_fn=_limit_memory)
    took = time.perf_counter() - t0
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr and message in p.stderr and f"{pkg}/routine.yaml" in p.stderr, p.stderr
    assert took < 10, took  # interpreter start included; the check itself is milliseconds


def _within_a_cpu_second(call):  # noqa: ANN001, ANN202
    """``call()``'s result and the CPU seconds this process spent on it; over a second, measured once more and the
    least kept. The process-wide clock also counts other threads (the server's, a previous test's), whose bursts do
    not repeat, while work a hostile input makes unbounded does (these inputs are errors, which nothing caches)."""
    t0 = time.thread_time()
    out = call()
    cpu = time.thread_time() - t0
    if cpu >= 1:
        t0 = time.thread_time()
        call()
        cpu = min(cpu, time.thread_time() - t0)
    return out, cpu


@pytest.fixture
def api(store_url, tmp_path):
    root = tmp_path / "routines"
    for case in ("laughs", "string_bomb", "empty", "comments_only", "not_utf8", "deep"):
        package(root, case, BAD[case][0])
    with TestClient(create_app(store_url, routines_dir=root), base_url=LOCAL) as c:
        yield c


@pytest.mark.parametrize("case", ["laughs", "string_bomb", "empty", "comments_only", "not_utf8", "deep"])
def test_api_get_validate_run_give_typed_errors_not_500(api, case):
    message = BAD[case][1]
    g, cpu = _within_a_cpu_second(lambda: api.get(f"/api/routines/{case}"))
    assert g.status_code == 200, g.text
    body = g.json()
    assert body["routine"] is None and len(body["issues"]) == 1 and message in body["issues"][0]["message"]
    assert "routine.yaml" in body["issues"][0]["message"]
    assert cpu < 1, "CPU seconds"
    v = api.post(f"/api/routines/{case}/validate").json()
    assert v["ok"] is False and message in v["issues"][0]["message"] and v["issues"][0]["file"] == "routine.yaml"
    r = api.post(f"/api/routines/{case}/run", json={"inputs": {}})
    assert r.status_code == 422 and r.json()["error"] == "RoutineError" and message in r.json()["detail"], r.text
    listed = {x["name"]: x for x in api.get("/api/routines").json()}
    assert message in listed[case]["error"]


@pytest.mark.parametrize("tail, message", [
    ("oops: ]\n", "invalid YAML"),
    ("description: !!python/object/apply:os.system ['echo pwned']\n", "could not determine a constructor"),
])
def test_a_large_file_wrong_on_its_last_line_costs_what_reading_it_costs(tmp_path, tail, message):
    """libyaml's error is not read again by the pure-Python parser (~50x slower) in a large file:
    a 1 MB routine.yaml wrong on its last line took a minute of CPU for a 4 MB one."""
    import yaml

    assert getattr(yaml, "__with_libyaml__", False), "this PyYAML has no libyaml"
    body = "name: r\ninputs: {type: object}\nsteps:\n- id: a\n  type: return\n  value:\n" + "  - [1, 2, 3, 4, 5, 6]\n" * 40_000
    assert len(body) > 900_000
    bad = package(tmp_path, "bad", (body + tail).encode())
    t0 = time.thread_time()
    yamlfile.load_yaml_text(body, "routine.yaml")  # the file without its last line, read once (never cached)
    valid = time.thread_time() - t0
    t0 = time.thread_time()
    with pytest.raises(eg.RoutineError, match=message) as e:
        eg.load_routine(bad)
    took = time.thread_time() - t0
    assert "routine.yaml" in str(e.value) and "line 40007" in str(e.value)
    assert took < 2 * valid + 0.2, f"{took:.2f}s of CPU for the bad file, {valid:.2f}s for the good one"


@pytest.mark.parametrize("case", ["laughs", "string_bomb", "recursive", "deep"])
def test_an_edited_learned_routine_is_read_within_the_same_bounds(api, case):
    """PUT /api/learned/{ref} takes routine.yaml text: a 478-byte alias bomb there ran for minutes
    (the depth check walked the expanded tree), before the routine was even looked up."""
    content, message = BAD[case]
    r, cpu = _within_a_cpu_second(lambda: api.put("/api/learned/nope", json={"yaml": content.decode()}))
    assert cpu < 1, "CPU seconds"
    assert r.status_code == 422 and r.json()["error"] == "MemoryInputError", r.text
    assert message in r.json()["detail"] and "routine.yaml" in r.json()["detail"]
