package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/lockpool/lockpool/internal/pgtest"
)

// StackOptions says what [StartStack] builds.
type StackOptions struct {
	// Dir holds lockpool's configuration, its log (lockpool.log) and, unless
	// Binary is set, the binary built for the run.
	Dir string
	// Binary is the lockpool binary to run; "" builds ./cmd/lockpool.
	Binary string
	// User (with Password) owns database DB; clients log in as User.
	User, Password, DB string
	// PgbenchScale, if not 0, fills DB with pgbench -i -s PgbenchScale.
	PgbenchScale int
	// MaxConnections, if not 0, sets PostgreSQL's max_connections (one
	// restart); pgtest starts with 300.
	MaxConnections int
	// Config is lockpool's YAML for its client port, its admin port and
	// PostgreSQL's port.
	Config func(port, adminPort, pgPort int) string
	// Logf reports progress (nil: silent).
	Logf func(format string, args ...any)
}

// Stack is a PostgreSQL cluster and a lockpool process in front of it, what
// the load tools (tools/bench, tools/soak) run against.
type Stack struct {
	Cluster  *pgtest.Cluster
	Lockpool *Process
	Port     int    // lockpool's client port
	AdminURL string // lockpool's admin listener, http://127.0.0.1:port
	Config   string // the YAML lockpool runs with

	o        StackOptions
	bin      string // the lockpool binary
	confPath string // Config's file
	restarts int
}

// StartStack starts a cluster (internal/pgtest) with o.User, o.DB and the
// pgbench tables, then lockpool from o.Config, and waits until a client can
// log in through it. On error the returned Stack holds what was started:
// Close it.
func StartStack(ctx context.Context, o StackOptions) (*Stack, error) {
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	s := &Stack{o: o}
	logf("starting PostgreSQL (internal/pgtest)")
	c, err := pgtest.Start(ctx)
	if err != nil {
		return s, err
	}
	s.Cluster = c
	if o.MaxConnections != 0 {
		if err := c.Exec(ctx, "postgres", fmt.Sprintf("ALTER SYSTEM SET max_connections = %d", o.MaxConnections)); err != nil {
			return s, err
		}
		if err := c.Restart(); err != nil {
			return s, err
		}
	}
	if err := c.CreateRole(ctx, o.User, o.Password); err != nil {
		return s, err
	}
	if err := c.CreateDatabase(ctx, o.DB, o.User); err != nil {
		return s, err
	}
	if o.PgbenchScale != 0 {
		logf("PostgreSQL on port %d; pgbench -i -s %d", c.Port, o.PgbenchScale)
		init := exec.CommandContext(ctx, "pgbench", "-i", "-q", "-s", strconv.Itoa(o.PgbenchScale),
			"-h", c.Host, "-p", strconv.Itoa(c.Port), "-U", o.User, o.DB)
		init.Env = append(os.Environ(), "PGPASSWORD="+o.Password)
		if out, err := init.CombinedOutput(); err != nil {
			return s, fmt.Errorf("pgbench -i: %w\n%s", err, out)
		}
		if err := c.Exec(ctx, o.DB, "VACUUM ANALYZE"); err != nil {
			return s, err
		}
	}

	bin := o.Binary
	if bin == "" {
		bin = filepath.Join(o.Dir, "lockpool")
		logf("building lockpool (go build -o %s ./cmd/lockpool)", bin)
		if err := BuildLockpool(ctx, bin); err != nil {
			return s, err
		}
	}
	if s.Port, err = UnusedPort(); err != nil {
		return s, err
	}
	adminPort, err := UnusedPort()
	if err != nil {
		return s, err
	}
	s.AdminURL = fmt.Sprintf("http://127.0.0.1:%d", adminPort)
	s.Config = o.Config(s.Port, adminPort, c.Port)
	confPath := filepath.Join(o.Dir, "lockpool.yaml")
	if err := os.WriteFile(confPath, []byte(s.Config), 0o600); err != nil {
		return s, err
	}
	s.bin, s.confPath = bin, confPath
	if err := s.startLockpool(ctx, "lockpool"); err != nil {
		return s, err
	}
	logf("lockpool pid %d on port %d (admin %s)", s.Lockpool.PID(), s.Port, s.AdminURL)
	return s, nil
}

func (s *Stack) startLockpool(ctx context.Context, name string) error {
	var err error
	if s.Lockpool, err = StartLogged(s.o.Dir, name, nil, s.bin, "-config", s.confPath); err != nil {
		return err
	}
	if err := WaitReady(ctx, s.Lockpool, s.DSN()); err != nil {
		return fmt.Errorf("lockpool: %w\n%s", err, s.Lockpool.LogTail(3000))
	}
	return nil
}

// RestartLockpool stops lockpool (SIGTERM, killed after 10 s) and starts a
// fresh process of the same binary and configuration, on the same ports
// (its log is lockpool-N.log for the Nth restart), and waits until a client
// can log in through it.
func (s *Stack) RestartLockpool(ctx context.Context) error {
	if s.Lockpool.Alive() {
		if err := s.Lockpool.Stop(10 * time.Second); err != nil {
			return fmt.Errorf("stopping lockpool (pid %d): %w", s.Lockpool.PID(), err)
		}
	}
	s.restarts++
	return s.startLockpool(ctx, fmt.Sprintf("lockpool-%d", s.restarts))
}

// DSN is a libpq-style connection string through lockpool for the stack's
// user and database.
func (s *Stack) DSN() string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable connect_timeout=10",
		s.Port, s.o.User, s.o.Password, s.o.DB)
}

// Close stops lockpool if it still runs (SIGTERM, killed after 10 s) and
// destroys the cluster.
func (s *Stack) Close() {
	if s.Lockpool != nil && s.Lockpool.Alive() {
		_ = s.Lockpool.Stop(10 * time.Second)
	}
	if s.Cluster != nil {
		_ = s.Cluster.Destroy()
	}
}
