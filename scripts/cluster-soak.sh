#!/usr/bin/env bash
# cluster-soak.sh runs the cluster budget soak (tools/clustersoak): its own
# PostgreSQL and three lockpool processes of one cluster sharing a budget of
# 6 (max_pinned 2, min_share 0, cluster.ttl 2s), 4 clients per instance
# running short transactions, instances killed (kill -9, or SIGTERM one time
# in four) and restarted at random every 3–10 s, and a sampler that counts
# the application's backends in pg_stat_activity every 20 ms. It prints one
# line — PASS or FAIL, samples, the largest count, kills, transactions — and
# exits 1 when any sample exceeded the budget.
#
#   scripts/cluster-soak.sh                          # 10 minutes
#   CLUSTER_SOAK_MINUTES=2 scripts/cluster-soak.sh   # a short run
#   scripts/cluster-soak.sh -seed 42 -keep           # extra flags go to the program (see -h)
set -euo pipefail
cd "$(dirname "$0")/.."
minutes="${CLUSTER_SOAK_MINUTES:-10}"
exec go run ./tools/clustersoak -minutes "$minutes" "$@"
