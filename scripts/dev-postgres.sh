#!/usr/bin/env bash
# dev-postgres.sh starts a throwaway local PostgreSQL on 127.0.0.1:5432 (if
# nothing listens there yet) with the role and database the shipped
# config.yaml expects: role "app" with password $APP_PASSWORD, database
# "appdb". Data lives in ${LOCKPOOL_DEV_PGDATA:-/tmp/lockpool-dev-pg}.
# Stop it with: scripts/dev-postgres.sh stop
set -euo pipefail
: "${APP_PASSWORD:?set APP_PASSWORD first (the password lockpool and clients use for role app)}"
DIR="${LOCKPOOL_DEV_PGDATA:-/tmp/lockpool-dev-pg}"
PORT="${PGPORT:-5432}"
if ! command -v pg_config >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "installing PostgreSQL (apt-get)…" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
BIN="$(pg_config --bindir 2>/dev/null || true)"
[ -x "$BIN/initdb" ] || BIN="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if [ "${1:-}" = stop ]; then as_pg "$BIN/pg_ctl" -D "$DIR/data" stop -m fast; exit 0; fi
if "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" 2>/dev/null; then
  echo "PostgreSQL already accepts connections on 127.0.0.1:$PORT; leaving it alone" >&2
  exit 0
fi
mkdir -p "$DIR"
[ "$(id -u)" = 0 ] && chown postgres "$DIR" && chmod 755 "$DIR"
if [ ! -f "$DIR/data/PG_VERSION" ]; then
  as_pg "$BIN/initdb" -D "$DIR/data" -U postgres --auth-local=trust --auth-host=scram-sha-256 >/dev/null
fi
as_pg "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1" start >/dev/null
PW="${APP_PASSWORD//\'/\'\'}"
as_pg "$BIN/psql" -h "$DIR" -p "$PORT" -U postgres -qX -v ON_ERROR_STOP=1 <<SQL
DO \$\$BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'app') THEN CREATE ROLE app LOGIN; END IF;
END\$\$;
ALTER ROLE app PASSWORD '$PW';
SELECT 'CREATE DATABASE appdb OWNER app' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'appdb')\gexec
SQL
echo "PostgreSQL ready on 127.0.0.1:$PORT (role app, database appdb; data in $DIR)" >&2
