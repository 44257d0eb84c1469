#!/usr/bin/env bash
# Install (if needed) and start a local PostgreSQL server for tests and benchmarks,
# create the engrain role and test database, and print the URL to use.
# Idempotent: safe to run when the server is already up.
# Usage: scripts/postgres.sh [start|status|stop]   (status: exit 0 when it is running)
set -euo pipefail
# Only the URL goes to stdout (callers capture it); everything else to stderr.
exec 3>&1 1>&2
case ${1:-start} in
  start) ;;
  status) command -v pg_isready >/dev/null && exec pg_isready -q -h 127.0.0.1 -p 5432; exit 1 ;;
  stop)
    if command -v pg_isready >/dev/null && pg_isready -q -h 127.0.0.1 -p 5432; then
      pg_ctlcluster "$(ls /usr/lib/postgresql | sort -n | tail -1)" main stop
      echo "postgres.sh: stopped the server on port 5432"
    fi
    exit 0 ;;
  *) echo "usage: scripts/postgres.sh [start|status|stop]"; exit 2 ;;
esac
export DEBIAN_FRONTEND=noninteractive
if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq postgresql >/dev/null
fi
ver=$(ls /usr/lib/postgresql | sort -n | tail -1)
if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -q "^$ver main$"; then
  pg_createcluster "$ver" main >/dev/null
fi
# The server daemon inherits open descriptors; give it none of ours, or a caller
# reading our stdout (a command substitution, a CI log pipe) never sees EOF.
pg_ctlcluster "$ver" main start </dev/null >/dev/null 2>&1 3>&- || true
for _ in $(seq 1 50); do
  pg_isready -q -h 127.0.0.1 -p 5432 && break
  sleep 0.2
done
pg_isready -h 127.0.0.1 -p 5432 >/dev/null || { tail -20 "/var/log/postgresql/postgresql-$ver-main.log"; exit 1; }
run_psql() { su postgres -c "psql -qtA -v ON_ERROR_STOP=1 -c \"$1\"" ; }
[ "$(run_psql "select 1 from pg_roles where rolname='engrain'")" = "1" ] || \
  run_psql "create role engrain login superuser password 'engrain'"
[ "$(run_psql "select 1 from pg_database where datname='engrain_test'")" = "1" ] || \
  run_psql "create database engrain_test owner engrain"
echo "postgresql://engrain:engrain@127.0.0.1:5432/engrain_test" >&3
