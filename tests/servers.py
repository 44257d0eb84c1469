"""``engrain serve`` in a subprocess for tests: a free port, a log file, a bounded start, a sure stop."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engrain_exe() -> str:
    """This venv's ``engrain`` console script (not one elsewhere on PATH)."""
    exe = Path(sys.executable).with_name("engrain")
    return str(exe) if exe.exists() else shutil.which("engrain") or "engrain"


@contextmanager
def serve(url: str, workdir: Path, *, token: str | None, name: str = "server", routines: Path | None = None,
          tools: str | None = None, agents: str | None = None, allow_hosts: tuple[str, ...] = (),
          tools_dir: Path | None = None, procs: list[subprocess.Popen] | None = None,
          extra: tuple[str, ...] = (), allow_fork: bool = False) -> Iterator[str]:
    """Run ``engrain serve`` on ``url`` until the block ends; yields its base URL.

    The server's output goes to ``workdir/<name>.log`` (never to our pipes), it must
    answer ``/api/health`` within 30 s, and it is terminated, then killed, on exit.
    ``token=None`` serves without a token (on loopback, with the Host guard).
    ``procs``, if given, receives the server's process (for a test that kills it).
    ``extra``: more ``engrain serve`` options.
    """
    port = free_port()
    log_path = workdir / f"{name}.log"
    args = [engrain_exe(), "serve", "--port", str(port), "--url", url]
    if routines is not None:
        args += ["--routines", str(routines)]
    if tools is not None:
        args += ["--tools", tools]
    if agents is not None:
        args += ["--agents", agents]
    if tools_dir is not None:
        args += ["--tools-dir", str(tools_dir)]
    for h in allow_hosts:
        args += ["--allow-host", h]
    args += list(extra)
    if allow_fork:
        args.append("--allow-fork")
    env = {**os.environ, "ENGRAIN_HOME": str(workdir / f"{name}-home")}
    env.pop("ENGRAIN_TOKEN", None)
    if token is not None:
        env["ENGRAIN_TOKEN"] = token
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir)
    if procs is not None:
        procs.append(proc)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log_path.read_text()}")
            try:
                r = httpx.get(f"{base}/api/health", headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=1)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start within 30 s:\n{log_path.read_text()}")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
