"""The documentation site: it builds strictly (no broken link, no public name without a docstring),
its references are generated from the code, and ``engrain docs`` builds and serves it."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

import engrain as eg
from tests.servers import engrain_exe, free_port

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import docs_hooks  # noqa: E402

#: Every module the Python reference documents (engrain.testing once it exists).
REFERENCED = ["engrain", "engrain.sandbox", "engrain.muscle_mem", "engrain.testing", "engrain.integrations.langgraph",
              "engrain.integrations.openai_agents", "engrain.integrations.pydantic_ai"]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                                reason="the docs extra is not installed (pip install -e '.[docs]'; the dev extra has it)")


def build(site: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([engrain_exe(), "docs", "--build-only", "--site-dir", str(site)], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = build(out)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return out


def test_the_site_builds_with_every_page(site):
    for page in ("index.html", "get-started/first-run/index.html", "guides/durable-runs/index.html",
                 "operate/security/index.html", "benchmarks/index.html", "architecture/index.html"):
        assert (site / page).is_file(), page
    arch = (site / "architecture/index.html").read_text()
    assert "One journal, four uses" in arch  # ARCHITECTURE.md is included, not copied
    for img in ("runs", "run", "cache", "memory", "chat"):
        assert (site / "img" / f"{img}.png").stat().st_size > 10_000, img


def test_python_reference_documents_every_public_name(site):
    html = (site / "reference/python/index.html").read_text()
    for name in eg.__all__:
        assert f'id="engrain.{name}"' in html, name
    assert "Run <code>agent(task, **inputs)</code> durably" in html or "durably and return its" in html


def test_every_public_name_has_a_docstring():
    missing = [n for m in REFERENCED for n in docs_hooks.missing_docstrings(m)]
    assert missing == []


def test_the_docstring_check_finds_an_undocumented_name(monkeypatch):
    mod = types.ModuleType("fake_public")
    mod.__all__ = ["documented", "bare", "Thing"]
    mod.documented = lambda: None
    mod.documented.__doc__ = "Has one."
    mod.bare = lambda: None

    class Thing:
        """A class."""

        def method(self):
            pass

    mod.Thing = Thing
    monkeypatch.setitem(sys.modules, "fake_public", mod)
    assert docs_hooks.missing_docstrings("fake_public") == ["fake_public.bare", "fake_public.Thing.method"]


def test_cli_reference_is_the_typer_app(site):
    import typer.main

    from engrain._cli import app

    html = (site / "reference/cli/index.html").read_text()
    root = typer.main.get_command(app)
    for name, cmd in root.commands.items():
        assert f"engrain {name}" in html, name
        for sub in getattr(cmd, "commands", {}):
            assert f"engrain {name} {sub}" in html, (name, sub)
    assert "--older-than" in html and "ENGRAIN_URL" in html


def test_http_reference_is_the_openapi_document(site):
    published = json.loads((site / "openapi.json").read_text())
    current = docs_hooks.openapi_document()
    assert published["paths"].keys() == current["paths"].keys()
    html = (site / "reference/http/index.html").read_text()
    for path in current["paths"]:
        assert path.replace("{", "").replace("}", "") in re.sub(r"[{}]", "", html), path
    assert "DNS rebinding" in html  # the hand-written conventions (docs/api.md) come first


def test_a_broken_link_fails_the_build(tmp_path):
    tree = tmp_path / "clone"
    tree.mkdir()
    for name in ("mkdocs.yml", "README.md", "ARCHITECTURE.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "docs", tree / "docs")
    (tree / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "docs_hooks.py", tree / "scripts" / "docs_hooks.py")
    (tree / "src").symlink_to(ROOT / "src")
    page = tree / "docs" / "guides" / "cache.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    proc = build(tmp_path / "site", cwd=tree)
    assert proc.returncode != 0
    assert "no-such-page.md" in proc.stdout + proc.stderr and "guides/cache.md" in proc.stdout + proc.stderr


def test_engrain_docs_serves_the_site(tmp_path):
    port = free_port()
    log = open(tmp_path / "docs.log", "w+")
    proc = subprocess.Popen([engrain_exe(), "docs", "--port", str(port)], cwd=ROOT, env=ENV, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (log.seek(0), log.read())[1]
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/guides/cache/", timeout=2)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "engrain docs did not serve within 300 s"
            time.sleep(0.5)
        assert "Moving from muscle-mem" in r.text
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)
        log.close()


def test_engrain_docs_without_the_extra_says_how_to_install(monkeypatch):
    from engrain._cli import app
    from engrain._cli import docs as docs_cmd

    monkeypatch.setattr(docs_cmd, "missing_modules", lambda: ["mkdocs", "material"])
    res = CliRunner().invoke(app, ["docs"])
    assert res.exit_code == 1
    assert "the docs extra is not installed (missing: mkdocs, material)" in res.output
    assert "pip install 'engrain[docs]'" in res.output


def test_readme_is_a_landing_page_whose_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 80
    assert "scripts/test.sh" in text and "engrain demo" in text
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        if not link.startswith("http"):
            assert (ROOT / link).exists(), link
