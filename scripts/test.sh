#!/usr/bin/env bash
# The test command: installs everything the tests need (Python packages into .venv,
# a PostgreSQL server via apt), starts the server, and runs the whole suite.
# Usage: scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
ENGRAIN_TEST_PG_URL=$(bash scripts/postgres.sh)
export ENGRAIN_TEST_PG_URL
# pytest exits 5 when it collects no test; that is a failure here too.
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
