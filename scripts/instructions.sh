#!/usr/bin/env bash
# instructions.sh counts the user-space instructions lockpool and PgBouncer
# execute per pgbench -S transaction, with valgrind's callgrind: one client,
# a warm-up of 200 transactions, then N counted (instrumentation is switched
# on and off around the counted run). Unlike CPU time on a shared VM the
# count repeats within about 1 % for the same binary (the rest is how many
# loop turns the timing gives), so it shows what a change to the hot path
# saves. System time is not counted
# (it is equal for both poolers; see docs/performance.md).
#
#   scripts/instructions.sh                  # lockpool (built here) and PgBouncer, simple and extended
#   N=6000 MODES=extended TARGETS=lockpool scripts/instructions.sh
#   LOCKPOOL=/tmp/lockpool-old scripts/instructions.sh   # another build
#   KEEP=/tmp/cg scripts/instructions.sh     # keep the callgrind profiles there (callgrind_annotate)
#   SCRIPT="-b tpcb-like" N=1000 MODES=extended scripts/instructions.sh   # another pgbench script than -S
#
# Needs valgrind, PostgreSQL 15's server binaries, pgbench and (for its
# rows) pgbouncer; run as root it runs PostgreSQL and PgBouncer as postgres.
# Caveat: valgrind's virtual CPU has no AVX2, so Go's SIMD byte searches
# take their SSE path there and count more instructions than they run.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${N:-4000}"
MODES="${MODES:-simple extended}"
TARGETS="${TARGETS:-lockpool pgbouncer}"
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
bin="$(pg_config --bindir)"
work="$(mktemp -d)"
as_pg=()
if [ "$(id -u)" = 0 ]; then
	chown postgres "$work"
	as_pg=(runuser -u postgres --)
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pgport="$(free_port)"
cleanup() {
	pkill -f "callgrind-out-file=$work/" 2>/dev/null || true
	"${as_pg[@]}" "$bin/pg_ctl" -D "$work/pg" stop -m immediate >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT
"${as_pg[@]}" "$bin/initdb" -D "$work/pg" -A trust -U postgres >/dev/null
"${as_pg[@]}" "$bin/pg_ctl" -D "$work/pg" -o "-p $pgport -k $work -c listen_addresses=127.0.0.1" -l "$work/pg.log" start -w >/dev/null
psql -h 127.0.0.1 -p "$pgport" -U postgres -qc "CREATE DATABASE bench" >/dev/null
pgbench -h 127.0.0.1 -p "$pgport" -U postgres -i -s 1 -q bench >/dev/null 2>&1

lp="${LOCKPOOL:-}"
if [ -z "$lp" ]; then
	lp="$work/lockpool"
	go build -o "$lp" ./cmd/lockpool
fi
lpport="$(free_port)"
cat > "$work/lockpool.yaml" <<EOF
listen: 127.0.0.1:$lpport
admin_listen: ""
auth_method: trust
server: {host: 127.0.0.1, port: $pgport, max_connections: 14}
users: [{name: postgres}]
applications:
  - {name: bench, user: postgres, database: bench, pool_mode: transaction, max_connections: 10}
EOF
pgbport="$(free_port)"
cat > "$work/pgbouncer.ini" <<EOF
[databases]
bench = host=127.0.0.1 port=$pgport dbname=bench
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $pgbport
unix_socket_dir =
auth_type = trust
auth_file = $work/userlist.txt
pool_mode = transaction
default_pool_size = 10
ignore_startup_parameters = extra_float_digits
logfile =
pidfile =
EOF
echo '"postgres" ""' > "$work/userlist.txt"
[ "$(id -u)" = 0 ] && chown postgres "$work/pgbouncer.ini" "$work/userlist.txt"

# count TARGET MODE prints the instructions per transaction.
count() {
	local target=$1 mode=$2 out="$work/cg.$1.$2" port pid ctl=()
	# Go's preemption signal trips a callgrind assertion; the loop does not need it.
	if [ "$target" = lockpool ]; then
		GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
			"$lp" -config "$work/lockpool.yaml" >"$out.log" 2>&1 &
		pid=$!
		disown "$pid" # no job report when it is killed below
		port=$lpport
	else
		command -v pgbouncer >/dev/null || { echo "pgbouncer: not installed"; return; }
		"${as_pg[@]}" valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
			"$(command -v pgbouncer)" "$work/pgbouncer.ini" >"$out.log" 2>&1 &
		pid=$!
		disown "$pid"
		port=$pgbport
		ctl=("${as_pg[@]}")
	fi
	local i
	for i in $(seq 100); do
		psql -h 127.0.0.1 -p "$port" -U postgres -tAc 'SELECT 1' bench >/dev/null 2>&1 && break
		sleep 0.3
	done
	pgbench -h 127.0.0.1 -p "$port" -U postgres -n ${SCRIPT:--S} -M "$mode" -c 1 -t 200 bench >/dev/null
	"${ctl[@]}" callgrind_control -i on >/dev/null 2>&1
	pgbench -h 127.0.0.1 -p "$port" -U postgres -n ${SCRIPT:--S} -M "$mode" -c 1 -t "$N" bench >/dev/null
	"${ctl[@]}" callgrind_control -i off >/dev/null 2>&1
	"${ctl[@]}" callgrind_control -d >/dev/null 2>&1 # writes $out.1
	pkill -9 -f "callgrind-out-file=$out" || true
	while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
	local total
	total="$(cat "$out".* 2>/dev/null | awk '/^totals:/ {t += $2} END {print t + 0}')"
	if [ -n "${KEEP:-}" ]; then
		mkdir -p "$KEEP"
		cp "$out".* "$KEEP/" 2>/dev/null || true
	fi
	printf '%-9s %-8s %8.0f instructions per transaction (%d transactions)\n' "$target" "$mode" "$(echo "$total / $N" | bc -l)" "$N"
}
for mode in $MODES; do
	for target in $TARGETS; do
		count "$target" "$mode"
	done
done
