#!/usr/bin/env bash
# listen-soak.sh runs the randomized LISTEN/NOTIFY test (TestListenRandomized
# in integration/) for longer, with -race: 22 clients (16 pgx, 6
# node-postgres) LISTEN, UNLISTEN and NOTIFY at random while the
# 'lockpool listener' backend is terminated every few seconds, first directly
# against PostgreSQL (which must give 0 violations: that proves the oracle)
# and then through lockpool. It prints each target's summary and
# violations; the whole output is kept in a file (its name is printed).
# Exits 1 when a target had violations.
#
#   scripts/listen-soak.sh                         # 30 s per target, a kill every ~4 s
#   DURATION=120s scripts/listen-soak.sh           # longer
#   KILLS=20 TARGETS=lockpool scripts/listen-soak.sh
#   MODE=pin scripts/listen-soak.sh                # lockpool with applications[].listen: pin
#   SEED=42 scripts/listen-soak.sh                 # the clients' random choices (not their interleaving)
#
# Needs PostgreSQL's server binaries, Go with a C compiler (-race), node and
# integration/node/node_modules (npm ci --prefix integration/node).
set -euo pipefail
cd "$(dirname "$0")/.."

duration="${DURATION:-30s}"
targets="${TARGETS:-direct,lockpool}"
# Seconds in the duration, for the default number of kills (s, m or h).
case "$duration" in
  *h) secs=$(( ${duration%h} * 3600 )) ;;
  *m) secs=$(( ${duration%m} * 60 )) ;;
  *s) secs=${duration%s} ;;
  *) echo "DURATION=$duration: write it as 45s, 2m or 1h" >&2; exit 2 ;;
esac
kills="${KILLS:-$(( secs / 4 > 3 ? secs / 4 : 3 ))}"
out="${TMPDIR:-/tmp}/lockpool-listen-soak-$(date -u +%Y%m%dT%H%M%SZ).log"

if [ ! -d integration/node/node_modules/pg ]; then
  npm ci --prefix integration/node --no-audit --no-fund
fi

echo "duration $duration per target ($targets), $kills kills, lockpool listen: ${MODE:-shared}; output: $out"
start=$(date +%s)
status=0
env LOCKPOOL_LISTEN_RANDOM_DURATION="$duration" LOCKPOOL_LISTEN_RANDOM_KILLS="$kills" \
  LOCKPOOL_LISTEN_RANDOM_TARGETS="$targets" ${MODE:+LOCKPOOL_LISTEN_MODE="$MODE"} \
  ${SEED:+LOCKPOOL_LISTEN_RANDOM_SEED="$SEED"} \
  go test -race -count=1 -timeout 0 -run '^TestListenRandomized$' ./integration/ -v >"$out" 2>&1 || status=$?

grep -E -- '--- (PASS|FAIL|SKIP): TestListenRandomized|connections;|kills:|violations|^\s+[0-9]+ × ' "$out" | cut -c1-400 || true
echo "took $(( $(date +%s) - start )) s"
if [ "$status" -ne 0 ]; then
  echo "FAILED; the violations are in $out (and every event of a failed target in the .jsonl file it names)" >&2
  exit 1
fi
echo "no violations"
