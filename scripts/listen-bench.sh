#!/usr/bin/env bash
# listen-bench.sh runs the LISTEN/NOTIFY fan-out benchmark (tools/listenbench)
# end to end: it starts a throwaway PostgreSQL (initdb in a temporary
# directory, a free port, its socket in that directory, run as postgres when
# we are root) and a lockpool built from this checkout with one user and one
# application under listen: shared, then runs the tool — CLIENTS connections
# through lockpool each LISTEN bench while senders (four by default) send RATE NOTIFY per
# second for DURATION — prints its figures and removes everything.
#
#   scripts/listen-bench.sh                                  # 1000 clients, 200/s, 20 s
#   CLIENTS=2000 RATE=500 DURATION=30s scripts/listen-bench.sh
#   scripts/listen-bench.sh -connect-concurrency 64          # extra flags go to the tool
#
# Needs PostgreSQL's server binaries (PG_BINDIR, else pg_config --bindir, else
# the newest /usr/lib/postgresql/*/bin) and Go.
set -euo pipefail
cd "$(dirname "$0")/.."

clients="${CLIENTS:-1000}"
rate="${RATE:-200}"
duration="${DURATION:-20s}"

bindir="${PG_BINDIR:-}"
if [ -z "$bindir" ] && command -v pg_config >/dev/null && [ -x "$(pg_config --bindir)/initdb" ]; then
  bindir="$(pg_config --bindir)"
fi
if [ -z "$bindir" ]; then
  bindir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
fi
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
  echo "no PostgreSQL server binaries (set PG_BINDIR or install postgresql-15)" >&2
  exit 1
fi

# Each client is one socket in lockpool and one in the tool.
want_fds=$(( clients * 2 + 1024 ))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$want_fds" ]; then
  ulimit -n "$want_fds" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

work="$(mktemp -d "${TMPDIR:-/tmp}/lockpool-listen-bench-XXXXXX")"
chmod 755 "$work"
pgdata="$work/pgdata"
mkdir -p "$pgdata" "$work/sock" "$work/pglog"
as_pg=()
if [ "$(id -u)" = 0 ]; then
  chown postgres: "$pgdata" "$work/sock" "$work/pglog"
  as_pg=(runuser -u postgres --)
fi
lockpool_pid=""
cleanup() {
  if [ -n "$lockpool_pid" ]; then
    kill "$lockpool_pid" 2>/dev/null || true
    wait "$lockpool_pid" 2>/dev/null || true
  fi
  if [ -f "$pgdata/postmaster.pid" ]; then
    (cd "$work" && "${as_pg[@]}" "$bindir/pg_ctl" stop -D "$pgdata" -m immediate -w -t 30 >/dev/null 2>&1) || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

pgport="$(free_port)"
port="$(free_port)"
admin_port="$(free_port)"
user=bench
password="bench-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
db=bench
max_clients=$(( clients + 100 < 1100 ? 1100 : clients + 100 ))

echo "PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') on port $pgport, lockpool on $port (admin $admin_port), work dir $work"
(cd "$work" && "${as_pg[@]}" env LC_ALL=C "$bindir/initdb" -D "$pgdata" -U postgres -E UTF8 --locale=C -A trust --no-sync --no-instructions >/dev/null)
cat >"$work/pg_hba.conf" <<EOF
local all all                trust
host  all postgres 127.0.0.1/32 trust
host  all all      127.0.0.1/32 scram-sha-256
EOF
cat >>"$work/postgresql.extra" <<EOF
listen_addresses = '127.0.0.1'
port = $pgport
unix_socket_directories = '$work/sock'
max_connections = $max_clients
shared_buffers = 64MB
fsync = off
synchronous_commit = off
full_page_writes = off
password_encryption = 'scram-sha-256'
logging_collector = off
EOF
cat "$work/pg_hba.conf" >"$pgdata/pg_hba.conf"
cat "$work/postgresql.extra" >>"$pgdata/postgresql.conf"
(cd "$work" && "${as_pg[@]}" "$bindir/pg_ctl" start -D "$pgdata" -l "$work/pglog/postgres.log" -w -t 60 >/dev/null)

psql_su() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pgport" -U postgres "$@"; }
psql_su -d postgres -c "CREATE ROLE $user LOGIN PASSWORD '$password'" -c "CREATE DATABASE $db OWNER $user" >/dev/null

echo "building lockpool (go build ./cmd/lockpool)"
go build -o "$work/lockpool" ./cmd/lockpool
cat >"$work/lockpool.yaml" <<EOF
# written by scripts/listen-bench.sh
listen: 127.0.0.1:$port
admin_listen: 127.0.0.1:$admin_port
auth_method: scram-sha-256
instance_id: listen-bench
max_client_connections: $max_clients
log_level: warn
server:
  host: 127.0.0.1
  port: $pgport
  max_connections: 20
  tls: disable
users:
  - name: $user
    password: $password
applications:
  - name: bench
    user: $user
    database: $db
    pool_mode: transaction
    max_connections: 8
    max_pinned: 2
    listen: shared
    wait_timeout: 30s
EOF
"$work/lockpool" -config "$work/lockpool.yaml" >"$work/lockpool.log" 2>&1 &
lockpool_pid=$!
for _ in $(seq 100); do
  if curl -fsS "http://127.0.0.1:$admin_port/up" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$lockpool_pid" 2>/dev/null; then
    echo "lockpool exited:" >&2; cat "$work/lockpool.log" >&2; exit 1
  fi
  sleep 0.1
done

echo "go build ./tools/listenbench"
go build -o "$work/listenbench" ./tools/listenbench
echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) listenbench -clients $clients -rate $rate -duration $duration (ulimit -n $(ulimit -n), $(nproc) CPUs)"
status=0
"$work/listenbench" -clients "$clients" -rate "$rate" -duration "$duration" \
  -dsn "postgres://$user:$password@127.0.0.1:$port/$db?sslmode=disable" \
  -direct-dsn "postgres://postgres@127.0.0.1:$pgport/$db?sslmode=disable" \
  -admin "http://127.0.0.1:$admin_port" -pid "$lockpool_pid" "$@" || status=$?
if [ "$status" -ne 0 ]; then
  echo "--- listenbench exited $status; lockpool log tail:" >&2
  tail -n 30 "$work/lockpool.log" >&2
fi
exit "$status"
