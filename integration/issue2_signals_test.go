package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
)

// Issue 2, acceptance 9: signals, on the real binary.

var (
	sigBuildOnce sync.Once
	sigBinPath   string
	sigBuildErr  error
	sigBuildDir  string
)

// issue2Binary builds cmd/lockpool once per package run.
func issue2Binary(t *testing.T) string {
	t.Helper()
	sigBuildOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			sigBuildErr = fmt.Errorf("go env GOMOD: %w", err)
			return
		}
		root := filepath.Dir(strings.TrimSpace(string(out)))
		sigBuildDir, err = os.MkdirTemp("", "lockpool-bin-")
		if err != nil {
			sigBuildErr = err
			return
		}
		sigBinPath = filepath.Join(sigBuildDir, "lockpool")
		cmd := exec.Command("go", "build", "-o", sigBinPath, "./cmd/lockpool")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			sigBuildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if sigBuildErr != nil {
		t.Fatal(sigBuildErr)
	}
	return sigBinPath
}

// sigBuffer is a goroutine-safe buffer for a process's stderr.
type sigBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *sigBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *sigBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type sigProc struct {
	cmd    *exec.Cmd
	port   int
	cfg    string
	stderr *sigBuffer
	exited chan struct{}
	err    error
}

func (p *sigProc) dsn(user, db string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s dbname=%s sslmode=disable", p.port, user, appPassword, db)
}

// sigConfig is a config file for the binary.
func sigConfig(c *pgtest.Cluster, port int, extra, user string, budget int) string {
	return fmt.Sprintf(`listen: 127.0.0.1:%d
admin_listen: ""
leak_check_interval: 0s
%s
server:
  host: %s
  port: %d
  max_connections: 10
users:
  - name: %s
    password: %s
applications:
  - name: sig
    user: %[5]s
    database: appdb
    max_connections: %[7]d
    max_pinned: 1
    wait_timeout: 30s
`, port, extra, c.Host, c.Port, user, appPassword, budget)
}

// startSigBinary runs the lockpool binary with the config text and waits until
// it accepts connections.
func startSigBinary(t *testing.T, cfgText func(port int) string) *sigProc {
	t.Helper()
	bin := issue2Binary(t)
	dir := t.TempDir()
	p := &sigProc{cfg: filepath.Join(dir, "config.yaml"), stderr: &sigBuffer{}, exited: make(chan struct{})}
	for attempt := 0; ; attempt++ {
		p.port = freePort(t)
		if err := os.WriteFile(p.cfg, []byte(cfgText(p.port)), 0o600); err != nil {
			t.Fatal(err)
		}
		p.cmd = exec.Command(bin, "-config", p.cfg)
		p.cmd.Stderr = p.stderr
		p.cmd.Stdout = p.stderr
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			p.err = p.cmd.Wait()
			close(p.exited)
		}()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(p.stderr.String(), "lockpool listening") {
			select {
			case <-p.exited:
			default:
				if time.Now().Before(deadline) {
					time.Sleep(20 * time.Millisecond)
					continue
				}
			}
			break
		}
		select {
		case <-p.exited:
			if attempt < 2 && strings.Contains(p.stderr.String(), "address already in use") {
				p.stderr = &sigBuffer{}
				p.exited = make(chan struct{})
				continue
			}
			t.Fatalf("lockpool exited at start: %v\n%s", p.err, p.stderr.String())
		default:
		}
		if !strings.Contains(p.stderr.String(), "lockpool listening") {
			t.Fatalf("lockpool did not start listening:\n%s", p.stderr.String())
		}
		break
	}
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("lockpool stderr:\n%s", p.stderr.String())
		}
	})
	return p
}

// SIGTERM with a transaction in flight: it commits, then lockpool exits 0.
func TestSIGTERMLetsTransactionCommit(t *testing.T) {
	t.Parallel()
	c := pgtest.Require(t)
	p := startSigBinary(t, func(port int) string {
		return sigConfig(c, port, "shutdown_timeout: 20s", "app", 4)
	})
	ctx := context.Background()
	tbl := uniqueName(t, "t")
	super := superConn(t, "appdb")
	if _, err := super.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (id int); GRANT ALL ON %[1]s TO PUBLIC", tbl)); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, p.dsn("app", "appdb"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// An idle client with no transaction: it must not hold up the exit.
	idle, err := pgx.Connect(ctx, p.dsn("app", "appdb"))
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close(ctx)

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+tbl+" VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// lockpool stops accepting.
	eventually(t, 5*time.Second, "lockpool to stop accepting new clients", func() bool {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		nc, err := pgx.Connect(cctx, p.dsn("app", "appdb"))
		if err == nil {
			_ = nc.Close(ctx)
			return false
		}
		return true
	})
	select {
	case <-p.exited:
		t.Fatalf("lockpool exited with a transaction in flight: %v", p.err)
	default:
	}
	// The transaction goes on and commits.
	if _, err := tx.Exec(ctx, "INSERT INTO "+tbl+" VALUES (2)"); err != nil {
		t.Fatalf("statement in the running transaction after SIGTERM: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("COMMIT after SIGTERM: %v", err)
	}
	committed := time.Now()
	var n int
	if err := super.QueryRow(ctx, "SELECT count(*) FROM "+tbl).Scan(&n); err != nil || n != 2 {
		t.Fatalf("rows after commit: %d, %v", n, err)
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("lockpool still running 10 s after the last transaction committed (shutdown_timeout 20s)")
	}
	t.Logf("lockpool exited %v after the commit", time.Since(committed).Round(time.Millisecond))
	if p.err != nil {
		t.Fatalf("lockpool exit: %v, want status 0\n%s", p.err, p.stderr.String())
	}
	// Clients left get 57P01 (or see the connection closed).
	_, err = conn.Exec(ctx, "SELECT 1")
	if err == nil {
		t.Fatalf("a query succeeded after lockpool exited")
	}
	t.Logf("after exit: %v", err)
}

// SIGHUP raising a budget from 2 to 4 lets 4 run at once without any client
// reconnecting.
func TestSIGHUPRaisesBudget(t *testing.T) {
	t.Parallel()
	c := pgtest.Require(t)
	p := startSigBinary(t, func(pt int) string { return sigConfig(c, pt, "", "hup", 2) })
	ctx := context.Background()
	conns := make([]*pgx.Conn, 4)
	pids := make([]uint32, 4)
	for i := range conns {
		cl, err := pgx.Connect(ctx, p.dsn("hup", "appdb"))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close(ctx)
		conns[i] = cl
		pids[i] = cl.PgConn().PID()
	}
	super := superConn(t, "postgres")

	// round runs a 1 s sleep in a transaction on all 4 clients at once and
	// returns the most sleeps seen running together on the server.
	round := func() (maxSleeping int, took time.Duration) {
		var wg sync.WaitGroup
		var maxSeen atomic.Int64
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				n, err := countBackends(ctx, super, "usename = 'hup' AND wait_event = 'PgSleep'")
				if err == nil && int64(n) > maxSeen.Load() {
					maxSeen.Store(int64(n))
				}
				select {
				case <-stop:
					return
				case <-time.After(25 * time.Millisecond):
				}
			}
		}()
		errs := make(chan error, len(conns))
		t0 := time.Now()
		for _, cl := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- pgx.BeginFunc(ctx, cl, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "SELECT pg_sleep(1)")
					return err
				})
			}()
		}
		wg.Wait()
		took = time.Since(t0)
		close(stop)
		<-sampled
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("transaction: %v", err)
			}
		}
		return int(maxSeen.Load()), took
	}

	before, tookBefore := round()
	t.Logf("budget 2: at most %d sleeping at once, round took %v", before, tookBefore.Round(time.Millisecond))
	if before != 2 {
		t.Errorf("budget 2: %d transactions ran at once, want exactly 2", before)
	}
	if tookBefore < 1900*time.Millisecond {
		t.Errorf("budget 2: 4 one-second transactions took only %v", tookBefore)
	}

	if err := os.WriteFile(p.cfg, []byte(sigConfig(c, p.port, "", "hup", 4)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "\"configuration reloaded\" in lockpool's log", func() bool {
		return strings.Contains(p.stderr.String(), "configuration reloaded")
	})

	after, tookAfter := round()
	t.Logf("budget 4: at most %d sleeping at once, round took %v", after, tookAfter.Round(time.Millisecond))
	if after != 4 {
		t.Errorf("after SIGHUP to budget 4: %d transactions ran at once, want 4", after)
	}
	if tookAfter > 1900*time.Millisecond {
		t.Errorf("after SIGHUP: 4 one-second transactions took %v", tookAfter)
	}
	for i, cl := range conns {
		if cl.IsClosed() || cl.PgConn().PID() != pids[i] {
			t.Errorf("client %d reconnected or was closed", i)
		}
	}
	select {
	case <-p.exited:
		t.Fatalf("lockpool exited on SIGHUP: %v", p.err)
	default:
	}
}
