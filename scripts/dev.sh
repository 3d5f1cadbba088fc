#!/usr/bin/env bash
# dev.sh start|stop — lockpool in front of a local PostgreSQL, for trying it.
#
#   scripts/dev.sh start    (the default)
#     1. installs PostgreSQL 15 with apt when no PostgreSQL server is
#        installed (no service is started and no default cluster is left);
#     2. when nothing accepts connections on 127.0.0.1:$PGPORT, starts a
#        private cluster there (data in $LOCKPOOL_DEV_DIR/pg);
#     3. creates role app (password $APP_PASSWORD) and database appdb, which
#        the shipped config.yaml expects, when they are missing;
#     4. builds lockpool and runs it in the foreground with config.yaml on
#        127.0.0.1:$LOCKPOOL_PORT (admin on $LOCKPOOL_ADMIN_PORT), and once
#        it listens prints the psql line to connect. Ctrl-C stops lockpool.
#   scripts/dev.sh stop
#     stops the lockpool and the private cluster a start started (it reads
#     them from $LOCKPOOL_DEV_DIR/state; no other environment is needed).
#     A PostgreSQL this script did not start is never stopped.
#
# Environment, all optional: PGPORT (5432), LOCKPOOL_PORT (6432),
# LOCKPOOL_ADMIN_PORT (9930), APP_PASSWORD (lockpool-dev),
# LOCKPOOL_DEV_DIR (/tmp/lockpool-dev-<uid>). Run from anywhere; as root,
# PostgreSQL runs as the user postgres.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${LOCKPOOL_DEV_DIR:-/tmp/lockpool-dev-$(id -u)}"
STATE="$DIR/state"
export PATH="/usr/local/go/bin:${HOME:-/root}/go/bin:${PATH:-/usr/local/bin:/usr/bin:/bin}:/usr/sbin:/sbin"

say() { printf 'dev.sh: %s\n' "$*" >&2; }
die() {
	say "$*"
	exit 1
}

# as_pg runs a PostgreSQL server command: as the user postgres when root
# (PostgreSQL refuses to run as root), else as the caller.
as_pg() {
	if [[ $(id -u) -eq 0 ]]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

pg_bindir() {
	local d
	for d in /usr/lib/postgresql/15/bin $(compgen -G '/usr/lib/postgresql/*/bin' | sort -rV); do
		if [[ -x $d/initdb && -x $d/pg_ctl ]]; then
			echo "$d"
			return 0
		fi
	done
	return 1
}

# state_get KEY prints KEY's value from the state file ("" when absent).
state_get() {
	[[ -f $STATE ]] || return 0
	sed -n "s/^$1=//p" "$STATE" | tail -n1
}

# ---------------------------------------------------------------- stop
stop() {
	if [[ ! -f $STATE ]]; then
		say "nothing to stop (no $STATE: nothing was started by dev.sh start)"
		return 0
	fi
	local pid bin pgdata bindir
	pid="$(state_get lockpool_pid)"
	bin="$(state_get lockpool_bin)"
	if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$bin" ]]; then
		say "stopping lockpool (pid $pid)"
		kill -TERM "$pid"
		for _ in $(seq 1 400); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
	fi
	pgdata="$(state_get pg_data)"
	bindir="$(state_get pg_bindir)"
	if [[ -n $pgdata && -f $pgdata/postmaster.pid ]]; then
		say "stopping the PostgreSQL dev.sh started ($pgdata)"
		as_pg "$bindir/pg_ctl" -D "$pgdata" stop -m fast -w >/dev/null
	fi
	rm -f "$STATE"
	say "stopped (data kept in $DIR; remove that directory to start afresh)"
}

# ---------------------------------------------------------------- start
start() {
	local pgport="${PGPORT:-5432}" port="${LOCKPOOL_PORT:-6432}" admin="${LOCKPOOL_ADMIN_PORT:-9930}"
	local password="${APP_PASSWORD:-lockpool-dev}"
	command -v go >/dev/null 2>&1 || die "Go is not installed (https://go.dev/doc/install); lockpool needs Go 1.26"

	local bindir
	if ! bindir="$(pg_bindir)"; then
		"$ROOT/scripts/install-packages.sh" postgresql-15 postgresql-client-15
		bindir="$(pg_bindir)" || die "PostgreSQL server binaries not found after the install"
	fi
	local psql="$bindir/psql"

	mkdir -p "$DIR"
	chmod 0755 "$DIR"
	local pgdata="$DIR/pg" sock="$DIR/pg"
	local ours=0
	if "$bindir/pg_isready" -q -h 127.0.0.1 -p "$pgport"; then
		if [[ "$(state_get pg_data)" == "$pgdata" && "$(state_get pg_port)" == "$pgport" && -f $pgdata/postmaster.pid ]]; then
			ours=1
			say "PostgreSQL from an earlier dev.sh start runs on 127.0.0.1:$pgport"
		else
			say "PostgreSQL already accepts connections on 127.0.0.1:$pgport: using it (dev.sh will not stop it)"
		fi
	else
		ours=1
		if [[ ! -f $pgdata/PG_VERSION ]]; then
			say "creating a private PostgreSQL cluster in $pgdata"
			mkdir -p "$pgdata"
			if [[ $(id -u) -eq 0 ]]; then chown postgres: "$pgdata"; fi
			chmod 0700 "$pgdata"
			as_pg "$bindir/initdb" -D "$pgdata" -U postgres -E UTF8 --locale=C \
				--auth-local=trust --auth-host=scram-sha-256 --no-instructions >/dev/null
		fi
		say "starting PostgreSQL on 127.0.0.1:$pgport ($pgdata)"
		as_pg "$bindir/pg_ctl" -D "$pgdata" -l "$pgdata/server.log" -w -t 60 \
			-o "-p $pgport -k $sock -c listen_addresses=127.0.0.1" start >/dev/null ||
			die "PostgreSQL did not start; see $pgdata/server.log"
		{
			echo "pg_data=$pgdata"
			echo "pg_port=$pgport"
			echo "pg_bindir=$bindir"
		} >"$STATE"
	fi

	# A superuser connection: the private cluster's socket; else the
	# system's usual ways (peer auth as postgres, or postgres over TCP).
	local -a super=()
	if ((ours)); then
		super=(as_pg "$psql" -X -q -h "$sock" -p "$pgport" -U postgres)
	elif [[ $(id -u) -eq 0 ]] && runuser -u postgres -- "$psql" -X -q -w -p "$pgport" -d postgres -c 'SELECT 1' >/dev/null 2>&1; then
		super=(runuser -u postgres -- "$psql" -X -q -w -p "$pgport")
	elif "$psql" -X -q -w -h 127.0.0.1 -p "$pgport" -U "${PGUSER:-postgres}" -d postgres -c 'SELECT 1' >/dev/null 2>&1; then
		super=("$psql" -X -q -w -h 127.0.0.1 -p "$pgport" -U "${PGUSER:-postgres}")
	fi
	app_login() { PGPASSWORD="$password" "$psql" -X -q -w -h 127.0.0.1 -p "$pgport" -U app -d appdb -c 'SELECT 1' >/dev/null 2>&1; }
	if ((${#super[@]})); then
		local pw_sql="${password//\'/\'\'}"
		local set_pw=""
		# Only the private cluster's role gets its password set; a role app
		# that exists elsewhere keeps its own.
		if ((ours)); then set_pw="ALTER ROLE app PASSWORD '$pw_sql';"; fi
		"${super[@]}" -d postgres -v ON_ERROR_STOP=1 >/dev/null <<SQL
SELECT format('CREATE ROLE app LOGIN PASSWORD %L', '$pw_sql') WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'app')\gexec
$set_pw
SELECT 'CREATE DATABASE appdb OWNER app' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'appdb')\gexec
SQL
	fi
	if ! app_login; then
		die "cannot log in to PostgreSQL on 127.0.0.1:$pgport as role app to database appdb with APP_PASSWORD.
  If role app exists there with another password, run with APP_PASSWORD=<its password>;
  otherwise, as a superuser: CREATE ROLE app LOGIN PASSWORD '…'; CREATE DATABASE appdb OWNER app;
  (and pg_hba.conf must allow scram-sha-256 logins from 127.0.0.1), or use another PGPORT for a private cluster."
	fi

	say "building lockpool"
	local bin="$DIR/lockpool" rev ver
	rev="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
	ver="$(git -C "$ROOT" describe --tags --dirty 2>/dev/null || echo devel)"
	(cd "$ROOT" && go build -o "$bin.new" -ldflags "-X main.version=$ver -X main.revision=$rev" ./cmd/lockpool)
	mv -f "$bin.new" "$bin"

	export APP_PASSWORD="$password" PGPORT="$pgport" LOCKPOOL_PORT="$port" LOCKPOOL_ADMIN_PORT="$admin"
	"$bin" -config "$ROOT/config.yaml" &
	local lp=$!
	{
		grep -v '^lockpool_' "$STATE" 2>/dev/null || true
		echo "lockpool_pid=$lp"
		echo "lockpool_bin=$bin"
	} >"$STATE.new"
	mv -f "$STATE.new" "$STATE"
	trap 'kill -TERM "$lp" 2>/dev/null || true' INT TERM
	for _ in $(seq 1 300); do
		if ! kill -0 "$lp" 2>/dev/null; then
			wait "$lp" || true
			die "lockpool exited before it listened (see its log above)"
		fi
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			break
		fi
		sleep 0.1
	done
	cat >&2 <<EOF

lockpool listens on 127.0.0.1:$port in front of PostgreSQL on 127.0.0.1:$pgport (metrics: http://127.0.0.1:$admin/metrics).
Connect with:
EOF
	# The one line on stdout: what to run to connect.
	echo "psql \"postgres://app:$password@127.0.0.1:$port/appdb\""
	echo "Ctrl-C stops lockpool; scripts/dev.sh stop also stops the PostgreSQL it started." >&2
	# wait returns early when the trap runs; lockpool then drains and exits.
	while kill -0 "$lp" 2>/dev/null; do
		wait "$lp" || true
	done
	local code=0
	wait "$lp" 2>/dev/null || code=$?
	return "$code"
}

case "${1:-start}" in
start) start ;;
stop) stop ;;
*)
	echo "usage: scripts/dev.sh [start|stop]" >&2
	exit 2
	;;
esac
