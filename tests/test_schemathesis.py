"""Schemathesis against the server's OpenAPI document: the document is true (issue 12 #17, issue 23 #5).

Every generated request must get a response the document declares: no server
error, a declared status code, a body matching the declared schema (errors all
use the shared ``{error, detail}`` model), the declared content type, and an
``Allow`` header on 405. And the other way round, over real sockets against
``engrain serve``: every request the document calls valid is accepted (no 400
or 422 for schema-valid data), a method the document does not declare for a
path is 405 naming the declared ones, and ``OPTIONS`` lists exactly those.
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

import engrain as eg
from engrain._server import create_app

_tmp = Path(tempfile.mkdtemp(prefix="engrain-schemathesis-"))
atexit.register(shutil.rmtree, _tmp, True)
_url = f"sqlite:///{_tmp / 'engrain.db'}"
(_tmp / "routines" / "hello").mkdir(parents=True)
(_tmp / "routines" / "hello" / "routine.yaml").write_text(
    "name: hello\ninputs: {type: object, properties: {who: {type: string}}}\n"
    "steps:\n  - id: result\n    type: return\n    value: 'hello {{ inputs.who }}'\n"
)
_j = eg.open(_url)
_j.append("seeded", [eg.NewEvent("run.started", "", {"task": "seeded", "inputs": {}, "tags": ["t"]})], 0)
_j.append("seeded", [eg.NewEvent("run.completed", "", {"output": 1})], 1)
_j.close()

# Schemathesis sends Host: testserver, which the DNS-rebinding guard would refuse.
app = create_app(_url, routines_dir=_tmp / "routines", allow_hosts=["testserver"])
# The SSE stream of a run that never finishes is open-ended by design; its 404 and auth are tested elsewhere.
schema = schemathesis.openapi.from_asgi("/openapi.json", app).exclude(path_regex=r".*/stream$")

# Not unsupported_method: GET /api/memory/remember is GET /api/memory/{id} of an item that does not
# exist (404), which is right; the 405 + Allow contract is tested below.
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance, content_type_conformance]


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_openapi_document(case):
    case.call_and_validate(checks=CHECKS)


def test_error_responses_use_the_declared_model():
    doc = app.openapi()
    assert "ErrorBody" in doc["components"]["schemas"] and "HTTPValidationError" not in doc["components"]["schemas"]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for code in ("404", "409", "422"):
                ref = op["responses"][code]["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorBody"), (method, path, code)
    with TestClient(app, base_url="http://127.0.0.1") as c:
        r = c.post("/api/runs", json={"wait": "soon"})
        assert r.status_code == 422 and set(r.json()) == {"error", "detail", "fields"}
        assert r.json()["fields"][0]["field"] == "body.wait"


def test_405_names_the_allowed_methods():
    with TestClient(app, base_url="http://127.0.0.1") as c:
        r = c.delete("/api/runs")
        assert r.status_code == 405 and set(r.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST"}
        assert r.json()["error"] == "MethodNotAllowed"


#: Schemathesis' positive data generation with the checks that compare the server with its document.
POSITIVE_CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,"
                   "response_schema_conformance,positive_data_acceptance,unsupported_method,allow_header_conformance")
CONFIG = """
[generation]
mode = "positive"

[[operations]]
include-path = "/api/runs/{run_id}/answers"
include-method = "POST"
# The answers' names are the pending prompt's fields, which only the run knows (422 names the unknown ones).
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429"]
"""


def test_schema_valid_requests_are_accepted_over_http(tmp_path):
    """schemathesis run --mode positive against a real engrain serve: ST202, ST204 and ST205 found nothing."""
    from servers import serve

    routines = tmp_path / "routines" / "hello"
    routines.mkdir(parents=True)
    (routines / "routine.yaml").write_text((_tmp / "routines" / "hello" / "routine.yaml").read_text())
    url = f"sqlite:///{tmp_path / 'engrain.db'}"
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    exe = Path(sys.executable).with_name("schemathesis")
    with serve(url, tmp_path, token=None, routines=tmp_path / "routines") as base:
        out = subprocess.run(
            [str(exe), "--config-file", str(tmp_path / "schemathesis.toml"), "run", f"{base}/openapi.json",
             "-c", POSITIVE_CHECKS, "-n", "15", "--seed", "7", "--exclude-path-regex", ".*/stream$",
             "--max-failures", "10"],
            capture_output=True, text=True, timeout=600, cwd=tmp_path,
        )
    tail = out.stdout[-6000:]
    assert out.returncode == 0, tail
    assert " passed" in tail and "failures" not in tail.splitlines()[-1], tail
