#!/usr/bin/env bash
# driver-suites.sh runs the drivers' own test suites twice — directly against
# PostgreSQL and through lockpool — and prints each suite's pass/fail counts
# side by side, with every test whose outcome differs.
#
#   scripts/driver-suites.sh                 # pgx, lib/pq and node-postgres
#   scripts/driver-suites.sh pgx libpq       # some of them
#   scripts/driver-suites.sh --check         # exit 1 when a test fails through
#                                            # lockpool but passes directly
#
# Suites (tools/driversuites runs them and prints one line per test):
#   pgx    github.com/jackc/pgx/v5 v5.12.0, every package of the module, from
#          the Go module cache (downloaded through the module proxy)
#   libpq  github.com/lib/pq at the version in go.mod, from the module cache
#   node   node-postgres's integration tests, vendored under
#          integration/driversuites/node-postgres, against the pg package of
#          integration/node (npm ci --prefix integration/node)
#
# It starts a throwaway PostgreSQL (initdb in a temporary directory, a free
# port, run as postgres when we are root) with the setup the suites expect
# (pgx's testsetup SQL, the databases the suites use) and a lockpool built
# from this checkout in front of it (one user, every database, listen:
# shared, advisory_locks: hold, session_state: pin, as config.yaml ships),
# and removes both at the end. pgx's two runs go at once, the one through
# lockpool on a copy of its database; the other suites run one target after
# the other. A test listed in
# integration/driversuites/known-differences.txt (suite, test, reason) may
# differ without failing --check; docs/compatibility.md explains each.
#
# Needs PostgreSQL's server binaries (PG_BINDIR, else pg_config --bindir, else
# the newest /usr/lib/postgresql/*/bin), Go and, for node, Node.js with npm.
# DRIVER_SUITES_KEEP=1 keeps the work directory (logs, each run's output).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
export PATH="/usr/local/go/bin:${HOME:-/root}/go/bin:${PATH:-/usr/local/bin:/usr/bin:/bin}:/usr/sbin:/sbin"

check=0
suites=()
for a in "$@"; do
	case "$a" in
	--check) check=1 ;;
	pgx | libpq | node) suites+=("$a") ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "driver-suites.sh: unknown argument $a (want --check, pgx, libpq, node)" >&2
		exit 2
		;;
	esac
done
((${#suites[@]})) || suites=(pgx libpq node)

say() { printf 'driver-suites: %s\n' "$*" >&2; }

bindir="${PG_BINDIR:-}"
if [[ -z $bindir ]] && command -v pg_config >/dev/null && [[ -x "$(pg_config --bindir)/initdb" ]]; then
	bindir="$(pg_config --bindir)"
fi
if [[ -z $bindir ]]; then
	bindir="$(compgen -G '/usr/lib/postgresql/*/bin' | sort -V | tail -n1 || true)"
fi
if [[ -z $bindir || ! -x $bindir/initdb ]]; then
	echo "driver-suites: no PostgreSQL server binaries (set PG_BINDIR or install postgresql-15)" >&2
	exit 1
fi

# free_port prints a TCP port nothing listens on, below Linux's ephemeral
# range, so that no outgoing connection takes it before the server binds it.
free_port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 12000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
}

work="$(mktemp -d "${TMPDIR:-/tmp}/lockpool-driver-suites-XXXXXX")"
chmod 755 "$work"
pgdata="$work/pgdata"
mkdir -p "$pgdata" "$work/sock"
as_pg=()
if [[ $(id -u) -eq 0 ]]; then
	chown postgres: "$pgdata" "$work/sock"
	as_pg=(runuser -u postgres --)
fi
lockpool_pid=""
cleanup() {
	if [[ -n $lockpool_pid ]]; then
		kill "$lockpool_pid" 2>/dev/null || true
		wait "$lockpool_pid" 2>/dev/null || true
	fi
	if [[ -f $pgdata/postmaster.pid ]]; then
		(cd "$work" && "${as_pg[@]}" "$bindir/pg_ctl" stop -D "$pgdata" -m immediate -w -t 30 >/dev/null 2>&1) || true
	fi
	if [[ ${DRIVER_SUITES_KEEP:-} == 1 ]]; then
		say "work directory kept: $work"
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT

pgport="$(free_port)"
say "PostgreSQL on 127.0.0.1:$pgport ($pgdata)"
(cd "$work" && "${as_pg[@]}" "$bindir/initdb" -D "$pgdata" -U postgres -E UTF8 --locale=C \
	--auth-local=trust --auth-host=scram-sha-256 --no-instructions >"$work/initdb.log")
# The suites prepare many statements and open many connections; pgx's
# testsetup also logs in as md5 and scram users over TCP.
(cd "$work" && "${as_pg[@]}" "$bindir/pg_ctl" -D "$pgdata" -l "$work/sock/postgres.log" -w -t 60 \
	-o "-p $pgport -k $work/sock -c listen_addresses=127.0.0.1 -c max_connections=200 -c max_prepared_transactions=10" \
	start >/dev/null)
psql_super() { (cd "$work" && "${as_pg[@]}" "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h "$work/sock" -p "$pgport" -U postgres "$@"); }

# One superuser role for every suite (they create types, extensions and
# roles), the databases they use, and pgx's own setup in the pgx database.
user=suites password=suites-pw
psql_super -d postgres >/dev/null <<SQL
CREATE ROLE $user LOGIN SUPERUSER PASSWORD '$password';
CREATE DATABASE pgx_test OWNER $user;
CREATE DATABASE pqgotest OWNER $user;
CREATE DATABASE node_test OWNER $user;
-- lib/pq's TestAuth logs in as these (its testdata/postgres setup); here
-- every TCP login is scram-sha-256, directly as through lockpool.
CREATE ROLE pqgomd5 LOGIN PASSWORD 'wordpass';
CREATE ROLE pqgopassword LOGIN PASSWORD 'wordpass';
CREATE ROLE pqgoscram LOGIN PASSWORD 'wordpass';
SQL
if [[ " ${suites[*]} " == *" pgx "* ]]; then
	# Outside this module, so that go.mod and go.sum stay as they are.
	pgx_dir="$(cd "$work" && GOFLAGS= go mod download -json github.com/jackc/pgx/v5@v5.12.0 | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
	# testsetup runs `whoami` through psql's backquotes: run it as postgres.
	cp "$pgx_dir/testsetup/postgresql_setup.sql" "$work/pgx_setup.sql"
	chmod 644 "$work/pgx_setup.sql"
	psql_super -d pgx_test -f "$work/pgx_setup.sql" >/dev/null
	# The run through lockpool uses a copy (pgx's tests make tables and
	# types), so that both runs go at once.
	psql_super -d postgres -c "CREATE DATABASE pgx_test_lockpool TEMPLATE pgx_test OWNER $user" >/dev/null
fi

lpport="$(free_port)"
say "building lockpool; it listens on 127.0.0.1:$lpport"
go build -o "$work/lockpool" ./cmd/lockpool
cat >"$work/lockpool.yaml" <<YAML
listen: 127.0.0.1:$lpport
admin_listen: ""
auth_method: scram-sha-256
log_level: warn
server:
  host: 127.0.0.1
  port: $pgport
  max_connections: 80
  tls: disable
users:
  - name: $user
    password: $password
  - {name: pqgomd5, password: wordpass}
  - {name: pqgopassword, password: wordpass}
  - {name: pqgoscram, password: wordpass}
applications:
  - {name: pqgomd5, user: pqgomd5, max_connections: 2, max_pinned: 1}
  - {name: pqgopassword, user: pqgopassword, max_connections: 2, max_pinned: 1}
  - {name: pqgoscram, user: pqgoscram, max_connections: 2, max_pinned: 1}
  - name: suites
    user: $user
    pool_mode: transaction
    max_connections: 70
    max_pinned: 60
    advisory_locks: hold
    session_state: pin
    listen: shared
    wait_timeout: 10s
YAML
"$work/lockpool" -config "$work/lockpool.yaml" >"$work/lockpool.log" 2>&1 &
lockpool_pid=$!
for _ in $(seq 1 300); do
	if ! kill -0 "$lockpool_pid" 2>/dev/null; then
		cat "$work/lockpool.log" >&2
		echo "driver-suites: lockpool exited before it listened" >&2
		exit 1
	fi
	(exec 3<>"/dev/tcp/127.0.0.1/$lpport") 2>/dev/null && break
	sleep 0.1
done

go build -o "$work/driversuites" ./tools/driversuites
if [[ " ${suites[*]} " == *" node "* && ! -f integration/node/node_modules/pg/lib/index.js ]]; then
	say "npm ci --prefix integration/node (node-postgres and what its tests load)"
	npm ci --prefix integration/node --no-audit --no-fund >"$work/npm.log" 2>&1 || { cat "$work/npm.log" >&2; exit 1; }
fi

known="$root/integration/driversuites/known-differences.txt"
status=0
summary=()
for suite in "${suites[@]}"; do
	case "$suite" in
	pgx) db=pgx_test ;;
	libpq) db=pqgotest ;;
	node) db=node_test ;;
	esac
	# run_target runs the suite against one target: PostgreSQL directly
	# (port pgport) or lockpool (lpport), in database db.
	run_target() {
		local target=$1 db=$2 port=$pgport
		[[ $target == lockpool ]] && port=$lpport
		say "$suite: running $target (port $port, database $db)"
		"$work/driversuites" -suite "$suite" -dsn "postgres://$user:$password@127.0.0.1:$port/$db" \
			-workdir "$work/$suite-$target" -srcdir "$work/$suite-src" -timeout 45s \
			>"$work/$suite-$target.out" 2>"$work/$suite-$target.err" || true
	}
	if [[ $suite == pgx ]]; then
		# pgx's tests mostly wait on the server: the two targets run at
		# once, each on its own database, from one build.
		"$work/driversuites" -suite pgx -build-only -dsn "postgres://$user:$password@127.0.0.1:$pgport/$db" \
			-workdir "$work/pgx-build" -srcdir "$work/pgx-src" >/dev/null 2>"$work/pgx-build.err" || true
		run_target direct "$db" &
		direct_pid=$!
		run_target lockpool pgx_test_lockpool &
		wait "$direct_pid" $!
	else
		# One after the other: node-postgres's tests end every idle backend
		# of the cluster, and lib/pq's have tight time limits.
		run_target direct "$db"
		run_target lockpool "$db"
	fi
	for target in direct lockpool; do
		if ! grep -qE '^(PASS|FAIL|SKIP) ' "$work/$suite-$target.out"; then
			say "$suite: $target ran no test; its output:"
			tail -n 40 "$work/$suite-$target.err" >&2
			status=1
		fi
	done
	count() { grep -c "^$1 " "$work/$suite-$2.out" || true; }
	summary+=("$(printf '%-6s  direct: %4d pass %3d fail %3d skip   lockpool: %4d pass %3d fail %3d skip' "$suite" \
		"$(count PASS direct)" "$(count FAIL direct)" "$(count SKIP direct)" \
		"$(count PASS lockpool)" "$(count FAIL lockpool)" "$(count SKIP lockpool)")")
	# Every test whose outcome differs, as "test direct→lockpool".
	join -a1 -a2 -e MISSING -o 0,1.2,2.2 \
		<(awk '{print $2, $1}' "$work/$suite-direct.out" | sort -k1,1 -u) \
		<(awk '{print $2, $1}' "$work/$suite-lockpool.out" | sort -k1,1 -u) |
		awk '$2 != $3' >"$work/$suite.diff"
	while read -r test d l; do
		note=""
		if [[ $d == PASS && $l != PASS && $l != SKIP ]]; then
			if [[ -f $known ]] && awk -v s="$suite" -v t="$test" '$1 == s && $2 == t {f=1} END {exit !f}' "$known"; then
				note="(known difference, see docs/compatibility.md)"
			else
				note="(lockpool only)"
				((check)) && status=1
			fi
		fi
		summary+=("        $test: direct $d, lockpool $l $note")
	done <"$work/$suite.diff"
done

printf '\n'
printf '%s\n' "${summary[@]}"
if ((status)); then
	if ((check)); then
		DRIVER_SUITES_KEEP=1
		echo "driver-suites: FAILED (see above; logs kept in $work)" >&2
	fi
	exit "$status"
fi
