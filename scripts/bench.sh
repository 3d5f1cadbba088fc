#!/usr/bin/env bash
# bench.sh runs lockpool's benchmark harness (tools/bench) end to end:
# it installs PostgreSQL and PgBouncer with apt-get when missing, then starts
# its own PostgreSQL, a freshly built lockpool and PgBouncer (same
# server-connection budget), runs pgbench against direct PostgreSQL,
# lockpool and PgBouncer in turn, the idle-client memory test (2,000 and
# 10,000 clients, each on fresh processes), the lease
# throughput test, the advisory lock throughput test (advisory_locks: hold),
# the login storm (pgbench -C -S -M simple -c 50 -j 2: a SCRAM-SHA-256 login
# per transaction, both poolers checking the role's verifier; -login-clients
# 0 skips it) and the mixed pinned run, then one 10-client run per pooler under tcpdump
# that splits each transaction's latency into the pooler's way in, the
# server and the pooler's way out, and one under perf sched that gives how
# long the pooler's threads, PostgreSQL and pgbench waited for a CPU after
# each wake-up (when perf is installed), prints one table and writes
# bench-results/<date>.json. Takes about 20 minutes on 2 cores (about 47
# with -rounds 5, as the runs in docs/performance.md use; about 60 with -T 8
# -rounds 5 -direct-max-clients 10, as its latest does).
#
#   scripts/bench.sh                      # the full run
#   scripts/bench.sh -T 2 -clients 10,100 -idle 1000   # a quick smoke run
#   BENCH_LOOPS= scripts/bench.sh -clients 0 -idle 0 -lease-sessions 0 -lock-sessions 0 \
#     -mixed-sessions 0 -latency-split 0 -sched-latency 0 -rounds 5 -T 8   # the login storm alone
#
# Any flag is passed to `go run ./tools/bench` (see -h).
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v pgbench >/dev/null || need+=(postgresql postgresql-contrib)
command -v pgbouncer >/dev/null || need+=(pgbouncer)
command -v tcpdump >/dev/null || need+=(tcpdump)
command -v perf >/dev/null || need+=(linux-perf)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} (apt-get)…" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  # The Debian package starts a system-wide PgBouncer on port 6432; the
  # harness runs its own on a free port, so stop the service if it started.
  if command -v systemctl >/dev/null && systemctl is-active --quiet pgbouncer 2>/dev/null; then
    $SUDO systemctl stop pgbouncer || true
  fi
fi
stamp="$(date -u +%Y-%m-%dT%H%M%SZ)"
# The whole matrix: lockpool (its default event loops), PgBouncer and direct.
go run ./tools/bench -out "bench-results/$stamp.json" "$@"
# How lockpool's throughput and CPU scale with its event loops on this
# machine (BENCH_LOOPS, default 1,2,4; empty skips), PgBouncer alongside.
loops="${BENCH_LOOPS-1,2,4}"
for n in ${loops//,/ }; do
  echo "=== lockpool with event_loops: $n"
  go run ./tools/bench -out "bench-results/$stamp-loops$n.json" -event-loops "$n" \
    -direct-max-clients 0 -clients 50 -modes simple,extended -scripts select -idle 0 -lease-sessions 0 -lock-sessions 0 -mixed-sessions 0 -latency-split 0 -sched-latency 0 -login-clients 0
done
