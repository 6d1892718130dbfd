#!/bin/bash
# The official postgres image's start, for the stand-in (Dockerfile beside this file):
# initialise PGDATA once from POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB, then run the
# server as `postgres` in the foreground, listening on every address.
set -euo pipefail
if [ "${1:-}" != postgres ]; then
  exec "$@"
fi
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown -R postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "Error: Database is uninitialized and superuser password is not specified." >&2
    echo "       You must specify POSTGRES_PASSWORD to a non-empty value." >&2
    exit 1
  fi
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb --username="$user" --pwfile="$pwfile" --auth-local=trust \
    --auth-host=scram-sha-256 -D "$PGDATA" >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  # the database, from a server only this script can reach (no TCP)
  pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  if [ "$db" != postgres ]; then
    psql -v ON_ERROR_STOP=1 --username "$user" --dbname postgres \
      -c "CREATE DATABASE \"$db\"" >/dev/null
  fi
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  echo "PostgreSQL init process complete; ready for start up."
fi
exec postgres -c listen_addresses='*' "${@:2}"
