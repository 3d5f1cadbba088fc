#!/usr/bin/env bash
# failover-soak.sh runs the failover oracle tests of integration/ as a soak:
# TestFailoverLockOracle (random advisory-lock clients under hold, under pin
# and direct on the primary, with their oracle) and TestFailoverLeaseOracle
# (leases and fencing tokens, with theirs), each over its own primary and
# synchronous standby, with LOCKPOOL_FAILOVER_SOAK set: the tests run that
# long with a failover every 30 s (switchovers; one in four a crash failover
# with -m immediate and the old primary rewound and rejoined). It prints
# each test's `soak summary:` line (failovers, acquisitions, FATALs received,
# violations) and PASS or FAIL; the whole output is kept in a file (its name
# is printed). Exits 1 when a test failed or one printed no summary.
#
#   scripts/failover-soak.sh                  # 10 minutes
#   scripts/failover-soak.sh 2m               # a short run (at least 30s)
#   GOFLAGS=-race scripts/failover-soak.sh    # with the race detector
#   LOCKPOOL_LOCKS_SEED=42 scripts/failover-soak.sh   # the lock clients' random choices
#
# Needs PostgreSQL's server binaries (initdb, pg_ctl, pg_basebackup,
# pg_rewind) and Go.
set -euo pipefail
cd "$(dirname "$0")/.."

duration="${1:-${LOCKPOOL_FAILOVER_SOAK:-10m}}"
# Seconds in the duration, for go test's timeout (the duration + 10m).
case "$duration" in
  *h) secs=$(( ${duration%h} * 3600 )) ;;
  *m) secs=$(( ${duration%m} * 60 )) ;;
  *s) secs=${duration%s} ;;
  *) echo "failover-soak: duration $duration: write it as 90s, 10m or 1h" >&2; exit 2 ;;
esac
timeout="$(( secs + 600 ))s"
out="${TMPDIR:-/tmp}/lockpool-failover-soak-$(date -u +%Y%m%dT%H%M%SZ).log"

echo "failover soak: $duration, a failover every 30 s; go test timeout $timeout; output: $out"
start=$(date +%s)
status=0
LOCKPOOL_FAILOVER_SOAK="$duration" \
  go test -count=1 -timeout "$timeout" -v -run 'TestFailoverLockOracle|TestFailoverLeaseOracle' ./integration/ >"$out" 2>&1 || status=$?

grep -E -- '--- (PASS|FAIL|SKIP): TestFailover' "$out" || true
summaries=$(grep -E 'soak summary:' "$out" | sed -E 's/^.*(soak summary:)/\1/' || true)
echo "$summaries"
echo "took $(( $(date +%s) - start )) s"
if [ "$status" -ne 0 ] || [ "$(grep -c 'soak summary:' <<<"$summaries")" -ne 2 ]; then
  echo "FAIL (the violations and lockpool's log are in $out)"
  exit 1
fi
echo "PASS"
