package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// Signals, on the real binary: SIGTERM drains, SIGHUP reloads.

// signalsConfig is the binary's configuration for port: application "sig"
// of user on appdb with budget, and the top-level lines extra.
func signalsConfig(c *pgtest.Cluster, port int, extra, user string, budget int) string {
	return testenv.AppsYAML(c, 10, fmt.Sprintf("listen: 127.0.0.1:%d\n%s", port, extra),
		testenv.App{Name: "sig", User: user, DB: "appdb", Max: budget, Pinned: 1, Advisory: "pin", State: "pin", Wait: "30s"})
}

// SIGTERM with a transaction in flight: it commits, then lockpool exits 0.
func TestSIGTERMLetsTransactionCommit(t *testing.T) {
	t.Parallel()
	c := pgtest.Require(t)
	p := testenv.StartLockpoolProcess(t, func(port int) string {
		return signalsConfig(c, port, "shutdown_timeout: 20s", "app", 4)
	})
	ctx := context.Background()
	tbl := uniqueName(t, "t")
	super := superConn(t, "appdb")
	if _, err := super.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (id int); GRANT ALL ON %[1]s TO PUBLIC", tbl)); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, p.DSN("app", "appdb"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// An idle client with no transaction: it must not hold up the exit.
	idle, err := pgx.Connect(ctx, p.DSN("app", "appdb"))
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
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// lockpool stops accepting.
	eventually(t, 5*time.Second, "lockpool to stop accepting new clients", func() bool {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		nc, err := pgx.Connect(cctx, p.DSN("app", "appdb"))
		if err == nil {
			_ = nc.Close(ctx)
			return false
		}
		return true
	})
	select {
	case <-p.Done():
		t.Fatalf("lockpool exited with a transaction in flight: %v", p.Err())
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
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("lockpool still running 10 s after the last transaction committed (shutdown_timeout 20s)")
	}
	t.Logf("lockpool exited %v after the commit", time.Since(committed).Round(time.Millisecond))
	if p.Err() != nil {
		t.Fatalf("lockpool exit: %v, want status 0\n%s", p.Err(), p.Log.String())
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
	p := testenv.StartLockpoolProcess(t, func(pt int) string { return signalsConfig(c, pt, "", "hup", 2) })
	ctx := context.Background()
	conns := make([]*pgx.Conn, 4)
	pids := make([]uint32, 4)
	for i := range conns {
		cl, err := pgx.Connect(ctx, p.DSN("hup", "appdb"))
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

	if err := os.WriteFile(p.ConfigPath, []byte(signalsConfig(c, p.Port, "", "hup", 4)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "\"configuration reloaded\" in lockpool's log", func() bool {
		return strings.Contains(p.Log.String(), "configuration reloaded")
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
	case <-p.Done():
		t.Fatalf("lockpool exited on SIGHUP: %v", p.Err())
	default:
	}
}
