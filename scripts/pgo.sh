#!/usr/bin/env bash
# pgo.sh writes cmd/lockpool/default.pgo, the CPU profile Go's compiler uses
# for profile-guided optimisation of every `go build ./cmd/lockpool`
# (-pgo=auto). The profile comes from the benchmark harness: a freshly
# built lockpool under pgbench -S (simple, extended, prepared) and TPC-B at
# 10 and 50 clients, one CPU profile per run, merged. Run it again after
# large changes to the hot path; the build works with a stale profile too
# (functions it no longer finds are ignored). Takes about 3 minutes.
# The profile is sampled, so a new one is not always better: count both
# builds with scripts/instructions.sh before committing it (on 2026-12-03
# and 2026-12-04 a regenerated profile counted 1–3 % more instructions per
# transaction than the one committed, and was not kept).
#
#   scripts/pgo.sh            # then compare, and commit cmd/lockpool/default.pgo
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
go run ./tools/bench -out "$dir/report.json" -pprof "$dir/profiles" -T 10 -clients 10,50 \
	-modes simple,extended,prepared -scripts select,tpcb -no-pgbouncer -direct-max-clients 0 \
	-idle 0 -lease-sessions 0 -lock-sessions 0 -mixed-sessions 0
go tool pprof -proto "$dir"/profiles/*.pprof > cmd/lockpool/default.pgo
echo "wrote cmd/lockpool/default.pgo ($(wc -c < cmd/lockpool/default.pgo) bytes) from $(ls "$dir"/profiles | wc -l) profiles"
