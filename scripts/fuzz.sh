#!/usr/bin/env bash
# fuzz.sh runs every fuzz target of lockpool for FUZZTIME each (default
# 100s: about 19 minutes for the eleven targets) and stops at the first
# failure. A failing input is saved under the package's testdata/fuzz/ and
# becomes a regression seed that `go test` replays from then on.
#
#   scripts/fuzz.sh               # ~19 minutes
#   FUZZTIME=10m scripts/fuzz.sh  # longer
set -euo pipefail
cd "$(dirname "$0")/.."
t="${FUZZTIME:-100s}"
for entry in "FuzzAnalyze ./rewrite" "FuzzParse ./config" "FuzzFrame ./proxy" "FuzzStartup ./proxy" "FuzzParseOptions ./proxy/startupparam" "FuzzSession ./proxy" "FuzzRelay ./proxy" "FuzzTxCommand ./proxy/txcmd" "FuzzParseMessages ./internal/wire" "FuzzReadHeader ./internal/wire" "FuzzFromBody ./internal/pgerr"; do
	read -r target pkg <<<"$entry"
	echo "=== $target ($pkg) for $t"
	go test -run='^$' -fuzz="^${target}\$" -fuzztime="$t" "$pkg"
done
echo "=== all fuzz targets ran $t each without a failure"
