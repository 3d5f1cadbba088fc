#!/usr/bin/env bash
# state-diff.sh runs the session-state differential test
# (TestSessionStateDifferential in integration/) for many random seeds:
# twelve clients' random scripts of SET / RESET / set_config / SET ROLE /
# PREPARE / temporary tables / WITH HOLD cursors / DISCARD / transactions and
# savepoints, each run directly against PostgreSQL and through lockpool on a
# budget of 3 with 2 pin slots, compared statement by statement. It prints
# the seeds first, then each seed's result and, at the end, the seeds that
# failed and the command that replays one. The whole output is kept in a
# file (its name is printed). Exits 1 when any seed failed.
#
#   scripts/state-diff.sh                      # 10 random seeds × 150 statements per client
#   SEEDS=25 STEPS=300 scripts/state-diff.sh   # more seeds, longer scripts
#   scripts/state-diff.sh 42 1796283984        # these seeds
#
# Needs PostgreSQL's server binaries (scripts/dev.sh or scripts/install-packages.sh
# installs them) and Go with a C compiler (the test runs with -race).
set -euo pipefail
cd "$(dirname "$0")/.."

steps="${STEPS:-150}"
count="${SEEDS:-10}"
if [ "$#" -gt 0 ]; then
  seeds=("$@")
else
  seeds=()
  for _ in $(seq "$count"); do
    # 40 random bits: short enough to type, many enough not to repeat.
    seeds+=("$(( $(od -An -N5 -tu8 /dev/urandom | tr -d ' ') % 1099511627776 ))")
  done
fi
list="$(IFS=,; echo "${seeds[*]}")"
out="${TMPDIR:-/tmp}/lockpool-state-diff-$(date -u +%Y%m%dT%H%M%SZ).log"

echo "seeds: ${seeds[*]}"
echo "statements per client: $steps; output: $out"
start=$(date +%s)
status=0
LOCKPOOL_STATEDIFF_SEEDS="$list" LOCKPOOL_STATEDIFF_STEPS="$steps" \
  go test -race -count=1 -timeout 0 -run '^TestSessionStateDifferential$' ./integration/ -v >"$out" 2>&1 || status=$?

grep -E '^\s+--- (PASS|FAIL|SKIP): TestSessionStateDifferential/|waits that ended in 53300|divergent statements|by field:' "$out" || true
failed=$(grep -oE -- '--- FAIL: TestSessionStateDifferential/seed=[0-9]+' "$out" | sed 's/.*seed=//' | tr '\n' ' ' || true)
echo "took $(( $(date +%s) - start )) s"
if [ -n "$failed" ]; then
  echo "FAILED seeds: $failed"
  echo "replay one: LOCKPOOL_STATEDIFF_SEEDS=<seed> LOCKPOOL_STATEDIFF_STEPS=$steps go test -race -count=1 -run TestSessionStateDifferential ./integration/ -v"
  echo "(LOCKPOOL_STATEDIFF_TRACE=<client>[,<client>…] logs every statement of those clients on both sides)"
  exit 1
fi
if [ "$status" -ne 0 ]; then
  echo "go test failed (exit $status) without a failing seed; see $out" >&2
  tail -n 40 "$out" >&2
  exit "$status"
fi
echo "all ${#seeds[@]} seeds passed"
