#!/usr/bin/env bash
# soak.sh runs lockpool's soak test (tools/soak): it starts its own
# PostgreSQL (pgbench -i -s 5) and a freshly built lockpool process, then for
# SOAK_MINUTES (default 10) runs mixed load through lockpool — pgbench -S
# -c 8 -j 2, advisory-lock churn with try-locks (held on lockpool's lock
# connections; pinned sessions with -advisory pin), lease churn, plain
# transactions, abrupt client kills and, under hold, a terminated lock
# connection every 20 s (-kill-lock-conn) — while it samples lockpool's
# goroutines, open fds and RSS every 10 s and checks lock and lease
# invariants. It prints a sample table and a summary and exits 1 on any
# invariant violation, unexpected client error or growth trend.
#
#   scripts/soak.sh                    # 10 minutes
#   SOAK_MINUTES=2 scripts/soak.sh     # a short run
#   scripts/soak.sh -keep -seed 42     # extra flags go to the program (see -h)
#   scripts/soak.sh -advisory pin      # the lock clients under advisory_locks: pin (default: hold)
#
# Installs PostgreSQL with apt-get when pgbench or the server is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
need=0
command -v pgbench >/dev/null || need=1
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && ! command -v pg_ctl >/dev/null; then
  need=1
fi
if [ "$need" = 1 ]; then
  echo "installing postgresql postgresql-contrib (apt-get)…" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql postgresql-contrib >/dev/null
fi
minutes="${SOAK_MINUTES:-10}"
exec go run ./tools/soak -minutes "$minutes" "$@"
