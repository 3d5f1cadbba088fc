package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/testenv"
)

const (
	benchUser     = "bench"
	benchPassword = "bench-secret"
	benchDB       = "bench"
)

// target is one place pgbench connects to.
type target struct {
	Name string // direct, lockpool, pgbouncer
	Host string
	Port int
	Proc *testenv.Process // nil for direct
	// AdminURL is lockpool's admin listener (pprof, metrics).
	AdminURL string
	// start starts the process anew (nil for direct). PgBouncer's logs to
	// name.log; lockpool's restart names its own log (testenv.Stack).
	start  func(ctx context.Context, name string) (*testenv.Process, error)
	starts int // processes started
}

// env is everything the run uses: the stack (PostgreSQL and the lockpool
// process), PgBouncer, and the three targets.
type env struct {
	*testenv.Stack
	work      string
	direct    *target
	lockpool  *target
	pgbouncer *target
	pgbFail   string // why PgBouncer is missing
}

func (e *env) targets() []*target {
	t := []*target{e.direct, e.lockpool}
	if e.pgbouncer != nil {
		t = append(t, e.pgbouncer)
	}
	return t
}

// roundTargets is the order of the targets in round (from 1): direct
// first, then the poolers, lockpool first in odd rounds and PgBouncer first
// in even ones, so that neither always runs right after the direct run (or
// always last) and an effect of the order shows in the rounds' spread
// instead of in the ratio.
func (e *env) roundTargets(round int) []*target {
	t := e.targets()
	if round%2 == 0 && len(t) == 3 {
		t[1], t[2] = t[2], t[1]
	}
	return t
}

func (e *env) poolers() []*target {
	t := []*target{e.lockpool}
	if e.pgbouncer != nil {
		t = append(t, e.pgbouncer)
	}
	return t
}

func (e *env) close() {
	if e.pgbouncer != nil {
		_ = e.pgbouncer.Proc.Stop(10 * time.Second)
	}
	if e.Stack != nil {
		e.Stack.Close()
	}
}

// lockpoolConfig is lockpool's configuration for the run: its client and
// admin ports, PostgreSQL's port, and the budgets of o. secret is the bench
// role's SCRAM verifier as pg_authid holds it, the secret PgBouncer's
// auth_file holds too, so both poolers check the same verifier (and log in
// to PostgreSQL with the keys of a client's SCRAM proof).
func lockpoolConfig(o *options, secret string, port, adminPort, pgPort int) string {
	return fmt.Sprintf(`# written by tools/bench
listen: 127.0.0.1:%d
admin_listen: 127.0.0.1:%d
auth_method: scram-sha-256
server:
  host: 127.0.0.1
  port: %d
  max_connections: %d       # application budget + lease connections + headroom
users:
  - name: %s
    password: "%s"
applications:
  - name: bench
    user: %s
    database: %s
    pool_mode: transaction
    max_connections: %d       # the same server-connection budget PgBouncer gets (default_pool_size)
    max_pinned: %d
    advisory_locks: pin
    wait_timeout: 120s        # PgBouncer's query_wait_timeout default
  - name: benchlocks          # the advisory lock throughput test (tools/bench/locks.go)
    user: %s
    database: benchlocks
    pool_mode: transaction
    max_connections: %d
    advisory_locks: hold
    wait_timeout: 120s
leases:
  max_connections: 2
event_loops: %d
`, port, adminPort, pgPort, o.budget+4, benchUser, secret, benchUser, benchDB, o.budget, o.maxPinned, benchUser, o.budget, o.eventLoops)
}

func setup(o *options, work string, rep *Report) (*env, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := &env{work: work}
	// pgtest starts with max_connections = 300; direct runs at 1000 clients
	// need more (o.directMax).
	var err error
	e.Stack, err = testenv.StartStack(ctx, testenv.StackOptions{
		Dir: work, Binary: o.lockpoolBy,
		User: benchUser, Password: benchPassword, DB: benchDB,
		PgbenchScale: o.scale, MaxConnections: o.directMax,
		Config: func(port, adminPort, pgPort int) string {
			secret, err := roleSecret(ctx, fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable", pgPort))
			if err != nil {
				logf("reading the bench role's SCRAM verifier: %v", err)
				secret = "unreadable" // lockpool then refuses every login: the run fails at once
			}
			return lockpoolConfig(o, secret, port, adminPort, pgPort)
		},
		Logf: logf,
	})
	if err != nil {
		return e, err
	}
	c := e.Cluster
	e.direct = &target{Name: "direct", Host: c.Host, Port: c.Port}
	e.lockpool = &target{Name: "lockpool", Host: "127.0.0.1", Port: e.Port, Proc: e.Lockpool, AdminURL: e.AdminURL}
	e.lockpool.start = func(ctx context.Context, _ string) (*testenv.Process, error) {
		if err := e.RestartLockpool(ctx); err != nil {
			return nil, err
		}
		return e.Lockpool, nil
	}
	rep.Settings = Settings{
		DurationSec: o.duration, Rounds: o.rounds, Threads: 2, Clients: o.clients, Scale: o.scale,
		Budget: o.budget, MaxPinned: o.maxPinned, DirectMaxConn: o.directMax,
		LockpoolConfig: e.Config, Scripts: o.scripts, Modes: o.modes,
	}

	// PgBouncer
	if o.noPgb {
		e.pgbFail = "skipped (-no-pgbouncer)"
		rep.Notes = append(rep.Notes, "PgBouncer: "+e.pgbFail)
		return e, nil
	}
	pgbBin, err := exec.LookPath("pgbouncer")
	if err != nil {
		e.pgbFail = "not installed (scripts/bench.sh installs it with apt-get)"
		rep.Notes = append(rep.Notes, "PgBouncer: "+e.pgbFail)
		logf("PgBouncer %s", e.pgbFail)
		return e, nil
	}
	t, conf, err := startPgBouncer(ctx, o, e, pgbBin)
	rep.Settings.PgBouncerConfig = conf
	if err != nil {
		return e, fmt.Errorf("pgbouncer: %w", err)
	}
	e.pgbouncer = t
	logf("PgBouncer pid %d on port %d", t.Proc.PID(), t.Port)
	return e, nil
}

func startPgBouncer(ctx context.Context, o *options, e *env, bin string) (*target, string, error) {
	dir := filepath.Join(e.work, "pgbouncer")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, "", err
	}
	port, err := testenv.UnusedPort()
	if err != nil {
		return nil, "", err
	}
	// As a new user would: the role's SCRAM secret from pg_authid in
	// userlist.txt (what the PgBouncer docs suggest for auth_type
	// scram-sha-256; PgBouncer then logs in to the server with the client's
	// SCRAM keys).
	secret, err := roleSecret(ctx, e.Cluster.SuperuserDSN("postgres"))
	if err != nil {
		return nil, "", err
	}
	userlist := fmt.Sprintf("%q %q\n", benchUser, secret)
	conf := fmt.Sprintf(`;; written by tools/bench
[databases]
%s = host=127.0.0.1 port=%d dbname=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = scram-sha-256
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 20000
ignore_startup_parameters = extra_float_digits
logfile =
pidfile =
`, benchDB, e.Cluster.Port, benchDB, port, filepath.Join(dir, "userlist.txt"), o.budget)
	if err := os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(userlist), 0o600); err != nil {
		return nil, "", err
	}
	confPath := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, "", err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root.
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, conf, fmt.Errorf("running as root needs a postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		for _, p := range []string{dir, confPath, filepath.Join(dir, "userlist.txt")} {
			if err := os.Chown(p, uid, gid); err != nil {
				return nil, conf, err
			}
		}
	}
	t := &target{Name: "pgbouncer", Host: "127.0.0.1", Port: port}
	t.start = func(ctx context.Context, name string) (*testenv.Process, error) {
		p, err := testenv.StartLogged(dir, name, cred, bin, confPath)
		if err != nil {
			return nil, err
		}
		if err := testenv.WaitReady(ctx, p, t.dsn()); err != nil {
			_ = p.Stop(10 * time.Second)
			return nil, fmt.Errorf("%w\n%s", err, p.LogTail(3000))
		}
		return p, nil
	}
	if t.Proc, err = t.start(ctx, "pgbouncer"); err != nil {
		return nil, conf, err
	}
	return t, conf, nil
}

// roleSecret reads the bench role's secret (its SCRAM verifier) from
// pg_authid as the superuser of dsn.
func roleSecret(ctx context.Context, dsn string) (string, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var secret string
	err = conn.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", benchUser).Scan(&secret)
	return secret, err
}

// restart stops t's process and starts a fresh one (same binary,
// configuration and port). How the old process exited does not matter
// (PgBouncer exits with status 1 on SIGTERM).
func (t *target) restart(ctx context.Context) error {
	if t.Proc.Alive() {
		_ = t.Proc.Stop(10 * time.Second)
	}
	t.starts++
	p, err := t.start(ctx, fmt.Sprintf("%s-%d", t.Name, t.starts))
	if err != nil {
		return err
	}
	t.Proc = p
	return nil
}

func (t *target) dsn() string { return t.dsnDB(benchDB) }

// dsnDB is t's connection string for database db.
func (t *target) dsnDB(db string) string {
	return fmt.Sprintf("host=%s port=%d user=%s password=%s dbname=%s sslmode=disable",
		t.Host, t.Port, benchUser, benchPassword, db)
}

// tempDir makes a directory for one test's files under the run's work
// directory; done removes it unless -keep.
func (e *env) tempDir(o *options, prefix string) (dir string, done func(), err error) {
	dir, err = os.MkdirTemp(e.work, prefix)
	if err != nil {
		return "", nil, err
	}
	return dir, func() {
		if !o.keep {
			os.RemoveAll(dir)
		}
	}, nil
}
