#!/usr/bin/env bash
# The test command: installs everything the tests need (Python packages into .venv,
# a PostgreSQL server via apt), starts the servers, and runs the whole suite.
# The servers it started (PostgreSQL on port 5432, PostgreSQL + pgvector on 5433) are stopped
# at the end; servers already running are left running (stop them with
# `scripts/postgres.sh stop` and `scripts/pgvector.sh stop`).
# Usage: scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
# WASM sandbox tests build their C tools with Debian's clang + wasi-libc.
command -v clang >/dev/null && [ -e /usr/lib/wasm32-wasi/crt1-command.o ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang lld wasi-libc libclang-rt-dev-wasm32 >/dev/null; }
# Browser tests (tests/test_ui.py) drive Debian's Chromium through Playwright (no `playwright install`).
command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
started=()
bash scripts/postgres.sh status || started+=(postgres)
bash scripts/pgvector.sh status || started+=(pgvector)
stop_started() { for s in "${started[@]}"; do bash "scripts/$s.sh" stop || true; done; }
trap stop_started EXIT
ENGRAIN_TEST_PG_URL=$(bash scripts/postgres.sh)
export ENGRAIN_TEST_PG_URL
# Memory's pgvector path runs on the PostgreSQL + pgvector build from the dev extra.
ENGRAIN_TEST_PGVECTOR_URL=$(bash scripts/pgvector.sh)
export ENGRAIN_TEST_PGVECTOR_URL
# pytest exits 5 when it collects no test; that is a failure here too.
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
