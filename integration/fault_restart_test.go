package integration

// PostgreSQL restarted under load. Only the
// transactions in flight fail; every client commits again within 3 s of
// PostgreSQL accepting connections; afterwards lockpool's goroutines and
// server connections return to their idle level.
//
// pgbench itself cannot show this: pgbench 15 aborts a client on any error
// other than a serialization failure or deadlock (--max-tries retries only
// those), and never reconnects (-C reconnects per transaction but still
// aborts the client on the failed one). So the load is pgbench's shape
// (pgbench -c 20 -T 20, tpcb-like transactions) run by pgx clients that
// reconnect, and pgbench runs once more after the restart to show it works
// against the recovered pool. LOCKPOOL_LONG=1 uses the numbers
// (50 clients, 60 s).
//
// Not parallel: it restarts the package's shared cluster.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

type restartEvent struct {
	at  time.Time
	err error
}

func TestFaultRestartUnderLoad(t *testing.T) {
	c := pgtest.Require(t)
	const role, db = "fltrestart", "fltrestartdb"
	testenv.EnsureRole(t, c, role)
	testenv.EnsureDatabase(t, c, db, role)
	clients, dur := 20, 20*time.Second
	if testenv.Long() {
		clients, dur = 50, 60*time.Second
	}
	ctx := context.Background()
	{
		own, err := pgx.Connect(ctx, c.DSN(role, appPassword, db))
		if err != nil {
			t.Fatal(err)
		}
		_, err = own.Exec(ctx, `DROP TABLE IF EXISTS acc, hist;
CREATE TABLE acc (id int PRIMARY KEY, bal bigint NOT NULL DEFAULT 0);
INSERT INTO acc SELECT g, 0 FROM generate_series(1, 1000) g;
CREATE TABLE hist (id int, delta int, at timestamptz DEFAULT now())`)
		own.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
	}
	yaml := testenv.UserYAML(c, "", clients+10, "  idle_timeout: 2s\n  connect_timeout: 5s", role, appPassword,
		fmt.Sprintf("    max_connections: %d\n    max_pinned: 1\n    wait_timeout: 5s", clients))
	l, _ := startYAML(t, yaml)
	baseline := l.servingGoroutines(t)

	var (
		mu     sync.Mutex
		events = make([][]restartEvent, clients)
		wg     sync.WaitGroup
	)
	stop := make(chan struct{})
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var conn *pgx.Conn
			defer func() {
				if conn != nil {
					_ = conn.Close(context.Background())
				}
			}()
			record := func(err error) {
				mu.Lock()
				events[i] = append(events[i], restartEvent{time.Now(), err})
				mu.Unlock()
			}
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				if conn == nil || conn.IsClosed() {
					cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					var err error
					conn, err = pgx.Connect(cctx, l.dsn(role, db))
					cancel()
					if err != nil {
						conn = nil
						record(fmt.Errorf("connect: %w", err))
						time.Sleep(20 * time.Millisecond)
						continue
					}
				}
				qctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				id := (i*7919+n)%1000 + 1
				err := pgx.BeginFunc(qctx, conn, func(tx pgx.Tx) error {
					if _, err := tx.Exec(qctx, "UPDATE acc SET bal = bal + 1 WHERE id = $1", id); err != nil {
						return err
					}
					var b int64
					if err := tx.QueryRow(qctx, "SELECT bal FROM acc WHERE id = $1", id).Scan(&b); err != nil {
						return err
					}
					_, err := tx.Exec(qctx, "INSERT INTO hist (id, delta) VALUES ($1, 1)", id)
					return err
				})
				if err != nil {
					rollbackFailedBegin(qctx, conn)
				}
				cancel()
				record(err)
				if err != nil {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}(i)
	}

	time.Sleep(dur / 3)
	tStop := time.Now()
	if err := c.Restart(); err != nil {
		close(stop)
		wg.Wait()
		t.Fatalf("restart: %v", err)
	}
	tUp := time.Now()
	t.Logf("PostgreSQL restarted: down %v", tUp.Sub(tStop).Round(time.Millisecond))
	time.Sleep(dur - dur/3)
	close(stop)
	wg.Wait()

	const recovery = 3 * time.Second
	var before, during, late, commits int
	for i, evs := range events {
		firstOK := time.Time{}
		okAfter := 0
		for _, e := range evs {
			switch {
			case e.err == nil:
				commits++
				if !e.at.Before(tUp) {
					okAfter++
					if firstOK.IsZero() {
						firstOK = e.at
					}
				}
			case e.at.Before(tStop):
				before++
				t.Errorf("client %d: error before the restart: %v", i, e.err)
			case e.at.Before(tUp.Add(recovery)):
				during++
			default:
				late++
				t.Errorf("client %d: error %v after PostgreSQL was up again (%v after)", i, e.err, e.at.Sub(tUp).Round(time.Millisecond))
			}
		}
		if firstOK.IsZero() {
			t.Errorf("client %d never committed after the restart", i)
		} else if d := firstOK.Sub(tUp); d > recovery {
			t.Errorf("client %d committed again only %v after PostgreSQL accepted connections (want <= %v)", i, d.Round(time.Millisecond), recovery)
		}
		if okAfter < 2 {
			t.Errorf("client %d: only %d commits after the restart", i, okAfter)
		}
	}
	t.Logf("%d clients: %d commits, %d errors around the restart, %d before, %d late", clients, commits, during, before, late)
	if during > 4*clients {
		// Each client may lose its in-flight transaction and meet a few
		// refused connects while PostgreSQL is down; a storm means retries
		// are not backing off or something spins.
		t.Logf("note: %d errors during the restart window", during)
	}

	// pgbench works against the recovered pool.
	pgbenchAfterRestart(t, l, role, db)

	// Idle level again: goroutines, and server connections (idle_timeout 2s).
	if n := testenv.SettleGoroutines(baseline+5, 15*time.Second); n > baseline+5 {
		t.Errorf("goroutines: %d after the load, %d at idle before it\n%s", n, baseline, testenv.DumpGoroutines(t))
	}
	su := superConn(t, "postgres")
	eventually(t, 15*time.Second, "server connections to close after idle_timeout", func() bool {
		n, err := testenv.CountServerConns(ctx, su, role)
		return err == nil && n == 0 && l.metric("lockpool_server_connections", map[string]string{"app": role}) == 0
	})
}

// pgbenchAfterRestart runs a short pgbench through lockpool and requires it
// to finish without an aborted client.
func pgbenchAfterRestart(t *testing.T, l *lp, role, db string) {
	t.Helper()
	if _, err := os.Stat("/usr/bin/pgbench"); err != nil {
		t.Logf("pgbench not installed: skipping the pgbench check")
		return
	}
	script := filepath.Join(t.TempDir(), "tx.sql")
	if err := os.WriteFile(script, []byte(`\set id random(1, 1000)
BEGIN;
UPDATE acc SET bal = bal + 1 WHERE id = :id;
SELECT bal FROM acc WHERE id = :id;
INSERT INTO hist (id, delta) VALUES (:id, 1);
END;
`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/usr/bin/pgbench", "-n", "-c", "8", "-T", "3", "-f", script,
		"-h", "127.0.0.1", "-p", strconv.Itoa(l.port), "-U", role, db)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+appPassword, "PGSSLMODE=disable")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.Contains(string(out), "aborted") {
		t.Errorf("pgbench after the restart: %v\n%s", err, out)
	}
}
