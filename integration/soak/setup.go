package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/pgtest"
)

const (
	soakUser     = "soak"
	soakPassword = "soak-secret"
	soakDB       = "soak"
	soakApp      = "soak"

	appBudget   = 8 // applications[].max_connections
	appPinned   = 3 // applications[].max_pinned
	pgbenchScal = 5
)

// lockpoolConfig is the configuration the soak runs lockpool with. The
// placeholders are lockpool's port, the admin port and PostgreSQL's port.
const lockpoolConfig = `# written by integration/soak
listen: 127.0.0.1:%d
admin_listen: 127.0.0.1:%d
auth_method: scram-sha-256
instance_id: soak
leak_check_interval: 5s
server:
  host: 127.0.0.1
  port: %d
  max_connections: 20
users:
  - name: %s
    password: %s
applications:
  - name: %s
    user: %s
    database: %s
    pool_mode: transaction
    max_connections: %d
    max_pinned: %d
    advisory_locks: pin
    session_state: pin
    wait_timeout: 5s
leases:
  max_connections: 2
`

// leaseLogDDL is the table lease holders record their holds in.
const leaseLogDDL = `CREATE TABLE soak_lease_log (
  id        bigserial PRIMARY KEY,
  name      text        NOT NULL,
  token     bigint      NOT NULL,
  client    int         NOT NULL,
  entered   timestamptz NOT NULL,  -- written under lease_fence right after lease_acquire returned the token
  last_ok   timestamptz NOT NULL,  -- last write made under lease_fence (or entered)
  exited    timestamptz,           -- written right before lease_release
  released  boolean,               -- what that lease_release returned (true proves the hold lasted to exited)
  killed_at timestamptz,           -- set by the killer just before it closed the holder's socket, if lockpool.leases
                                   -- showed the lease still held by this token at that moment
  lost      boolean     NOT NULL DEFAULT false  -- LP001 from a fence, or lease_release = false
)`

// process is the lockpool we started.
type process struct {
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	done    chan struct{}
	exitErr error
}

func (p *process) pid() int { return p.cmd.Process.Pid }

func (p *process) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM and waits up to timeout; it returns how the process
// ended.
func (p *process) stop(timeout time.Duration) (string, error) {
	if !p.alive() {
		return "", fmt.Errorf("lockpool had already exited: %v", p.exitErr)
	}
	t0 := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return "", fmt.Errorf("lockpool did not exit within %v of SIGTERM (killed)", timeout)
	}
	_ = p.logFile.Close()
	if p.exitErr != nil {
		return "", fmt.Errorf("lockpool exited after SIGTERM with %v", p.exitErr)
	}
	return fmt.Sprintf("exit 0 %v after SIGTERM", time.Since(t0).Round(time.Millisecond)), nil
}

func (p *process) logTail(n int) string {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// env is what setup built.
type env struct {
	work      string
	cluster   *pgtest.Cluster
	lp        *process
	lpPort    int
	adminURL  string
	confText  string
	setupTime time.Duration
}

func (e *env) close() {
	if e.lp != nil && e.lp.alive() {
		_ = e.lp.cmd.Process.Kill()
		<-e.lp.done
	}
	if e.cluster != nil {
		_ = e.cluster.Destroy()
	}
}

// dsn is a client DSN through lockpool.
func (e *env) dsn() string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable connect_timeout=10",
		e.lpPort, soakUser, soakPassword, soakDB)
}

func setup(ctx context.Context, o *options) (*env, error) {
	t0 := time.Now()
	work, err := os.MkdirTemp("", "lockpool-soak-")
	if err != nil {
		return nil, err
	}
	_ = os.Chmod(work, 0o755)
	e := &env{work: work}

	logf("starting PostgreSQL (internal/pgtest)")
	c, err := pgtest.Start(ctx)
	if err != nil {
		return e, err
	}
	e.cluster = c
	if err := c.CreateRole(ctx, soakUser, soakPassword); err != nil {
		return e, err
	}
	if err := c.CreateDatabase(ctx, soakDB, soakUser); err != nil {
		return e, err
	}
	logf("PostgreSQL on port %d; pgbench -i -s %d", c.Port, pgbenchScal)
	init := exec.CommandContext(ctx, "pgbench", "-i", "-q", "-s", strconv.Itoa(pgbenchScal),
		"-h", c.Host, "-p", strconv.Itoa(c.Port), "-U", soakUser, soakDB)
	init.Env = append(os.Environ(), "PGPASSWORD="+soakPassword)
	if out, err := init.CombinedOutput(); err != nil {
		return e, fmt.Errorf("pgbench -i: %w\n%s", err, out)
	}
	// The lease log belongs to the soak role: holders write it through lockpool.
	own, err := pgx.Connect(ctx, c.DSN(soakUser, soakPassword, soakDB))
	if err != nil {
		return e, err
	}
	_, err = own.Exec(ctx, leaseLogDDL)
	own.Close(context.Background())
	if err != nil {
		return e, fmt.Errorf("create soak_lease_log: %w", err)
	}

	bin := o.lockpoolBin
	if bin == "" {
		bin = filepath.Join(work, "lockpool")
		logf("building lockpool (go build -o %s ./cmd/lockpool)", bin)
		b := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/lockpool")
		b.Dir = repoRoot()
		if out, err := b.CombinedOutput(); err != nil {
			return e, fmt.Errorf("go build: %w\n%s", err, out)
		}
	}
	lpPort, err := freePort()
	if err != nil {
		return e, err
	}
	adminPort, err := freePort()
	if err != nil {
		return e, err
	}
	e.lpPort = lpPort
	e.adminURL = fmt.Sprintf("http://127.0.0.1:%d", adminPort)
	e.confText = fmt.Sprintf(lockpoolConfig, lpPort, adminPort, c.Port, soakUser, soakPassword,
		soakApp, soakUser, soakDB, appBudget, appPinned)
	confPath := filepath.Join(work, "lockpool.yaml")
	if err := os.WriteFile(confPath, []byte(e.confText), 0o600); err != nil {
		return e, err
	}
	lp, err := startProcess(work, bin, "-config", confPath)
	if err != nil {
		return e, err
	}
	e.lp = lp
	if err := waitReady(ctx, e); err != nil {
		return e, fmt.Errorf("lockpool: %w\n%s", err, lp.logTail(3000))
	}
	e.setupTime = time.Since(t0)
	logf("lockpool pid %d on port %d (admin %s); setup took %v", lp.pid(), lpPort, e.adminURL, e.setupTime.Round(time.Millisecond))
	return e, nil
}

func startProcess(dir, bin string, args ...string) (*process, error) {
	logPath := filepath.Join(dir, "lockpool.log")
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout = lf
	cmd.Stderr = lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start lockpool: %w", err)
	}
	p := &process{cmd: cmd, logPath: logPath, logFile: lf, done: make(chan struct{})}
	go func() {
		p.exitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitReady waits until a client can log in through lockpool and run SELECT 1.
func waitReady(ctx context.Context, e *env) error {
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		if !e.lp.alive() {
			return errors.New("process exited")
		}
		c, err := pgx.Connect(ctx, e.dsn())
		if err == nil {
			var one int
			err = c.QueryRow(ctx, "SELECT 1", pgx.QueryExecModeSimpleProtocol).Scan(&one)
			c.Close(ctx)
			if err == nil {
				return nil
			}
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("not ready after 30s: %v", last)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// repoRoot finds the module root (the directory holding go.mod) from the
// working directory upwards.
func repoRoot() string {
	dir, _ := os.Getwd()
	for d := dir; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/lockpool/lockpool") {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}
