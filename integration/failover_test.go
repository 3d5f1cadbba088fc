package integration

import (
	"context"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// failoverServer are the server: lines of the failover tests: fast checks,
// short timeouts.
const failoverServer = "  health_check_interval: 100ms\n  connect_timeout: 2s\n  tcp_user_timeout: 5s"

// startFailoverLockpool runs lockpool over the pair's two hosts with
// application api (role app, database appdb, hold) and more apps.
func startFailoverLockpool(t *testing.T, pair *testenv.Pair, apps ...testenv.App) (*testenv.Lockpool, *testenv.LogBuffer) {
	t.Helper()
	api := testenv.App{Name: "api", User: "app", DB: "appdb", Max: 8, Pinned: 3, Advisory: "hold", State: "pin", Wait: "10s"}
	yaml := testenv.HostsYAML([]*pgtest.Cluster{pair.Primary, pair.Standby}, 40, "", failoverServer, append([]testenv.App{api}, apps...)...)
	lp, log := testenv.StartYAML(t, yaml)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("lockpool log:\n%s", log.String())
		}
	})
	return lp, log
}

// ackWrite is a write through lockpool that committed (its reply came).
type ackWrite struct {
	w, n int
	at   time.Time // when the client got the reply
	port int       // inet_server_port() of the backend that ran it
	// srv is the server's clock_timestamp() in the INSERT: the commit
	// follows it (autocommit), so the commit happened no earlier.
	srv time.Time
}

// writeLoad runs workers that insert (w, n) rows through lockpool in
// autocommit, reconnecting after any error, until ctx ends. It records the
// writes whose commit was acknowledged.
type writeLoad struct {
	mu   sync.Mutex
	acks []ackWrite
	errs map[string]int // error text → count (connection errors expected at a failover)
	// details holds, for an error text, the first such error in full
	// (with its detail: what lockpool's own error is about).
	details map[string]string
	wg      sync.WaitGroup
}

func startWriteLoad(ctx context.Context, dsn string, workers int) *writeLoad {
	l := &writeLoad{errs: map[string]int{}, details: map[string]string{}}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			var conn *pgx.Conn
			defer func() {
				if conn != nil {
					_ = conn.Close(context.Background())
				}
			}()
			for n := 0; ctx.Err() == nil; n++ {
				if conn == nil {
					c, err := pgx.Connect(ctx, dsn)
					if err != nil {
						l.fail(err)
						continue
					}
					conn = c
				}
				var port int
				var srv time.Time
				err := conn.QueryRow(ctx, "INSERT INTO fo_writes(w, n) VALUES ($1, $2) RETURNING port, clock_timestamp()", w, n).Scan(&port, &srv)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					l.fail(err)
					_ = conn.Close(context.Background())
					conn = nil
					continue
				}
				l.mu.Lock()
				l.acks = append(l.acks, ackWrite{w: w, n: n, at: time.Now(), port: port, srv: srv})
				l.mu.Unlock()
			}
		}()
	}
	return l
}

func (l *writeLoad) fail(err error) {
	l.mu.Lock()
	k := errText(err)
	l.errs[k]++
	if _, ok := l.details[k]; !ok {
		full := err.Error()
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Detail != "" {
			full += " (detail: " + pe.Detail + ")"
		}
		l.details[k] = full
	}
	l.mu.Unlock()
	time.Sleep(20 * time.Millisecond) // pacing of reconnects, not a synchronisation
}

// snapshot is a copy of the acknowledged writes so far.
func (l *writeLoad) snapshot() []ackWrite {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]ackWrite(nil), l.acks...)
}

// errors is a copy of the error counts so far.
func (l *writeLoad) errors() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.errs)
}

// detail is the first error of the load with text e (errText), in full.
func (l *writeLoad) detail(e string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.details[e]
}

// count is the number of acknowledged writes.
func (l *writeLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acks)
}

// firstAfter is the first acknowledged write at or after t.
func (l *writeLoad) firstAfter(t time.Time) (ackWrite, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.acks {
		if !a.at.Before(t) {
			return a, true
		}
	}
	return ackWrite{}, false
}

// createWrites makes fo_writes on the pair's primary for role app.
func createWrites(t *testing.T, pair *testenv.Pair) {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	if err := pair.Exec(ctx, "appdb", "CREATE TABLE fo_writes (id bigserial PRIMARY KEY, w int NOT NULL, n int NOT NULL, port int NOT NULL DEFAULT inet_server_port(), UNIQUE (w, n)); GRANT ALL ON fo_writes, fo_writes_id_seq TO app"); err != nil {
		t.Fatal(err)
	}
}

// checkAcked verifies that every write acknowledged before it started is
// on c (the current primary; the load may go on), and returns how many
// rows c has.
func checkAcked(t *testing.T, c *pgtest.Cluster, l *writeLoad) int {
	t.Helper()
	acks := l.snapshot() // before the read: each of these committed before it
	ctx := testenv.Context(t, 30*time.Second)
	conn, err := testenv.Connect(ctx, c, "appdb")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT w, n FROM fo_writes")
	if err != nil {
		t.Fatal(err)
	}
	have := map[[2]int]bool{}
	for rows.Next() {
		var w, n int
		if err := rows.Scan(&w, &n); err != nil {
			t.Fatal(err)
		}
		have[[2]int{w, n}] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	lost := 0
	for _, a := range acks {
		if !have[[2]int{a.w, a.n}] {
			lost++
			if lost <= 5 {
				t.Errorf("acknowledged write (%d, %d) at %s on port %d is not on the primary", a.w, a.n, a.at.Format(time.StampMilli), a.port)
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d acknowledged writes are lost", lost, len(acks))
	}
	return len(have)
}

// pgbenchLoad runs two pgbench clients against lockpool until ctx ends,
// one new connection per transaction (-C), as background load. pgbench
// ends a client at its first error (a connection lost at a failover), so
// each client is its own pgbench, started again each time it exits before
// ctx ends. The returned function waits for them and logs how often they
// ran and the last summary (their outcome is not judged).
func pgbenchLoad(ctx context.Context, t *testing.T, lp *testenv.Lockpool) func() {
	t.Helper()
	if _, err := os.Stat("/usr/bin/pgbench"); err != nil {
		skipOrFail(t, "pgbench not installed")
	}
	script := filepath.Join(t.TempDir(), "read.sql")
	if err := os.WriteFile(script, []byte("SELECT count(*) FROM fo_writes WHERE w = 0;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		ended int    // runs that ended before ctx (a client's error)
		last  []byte // the output of the last of them
	)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				cmd := exec.CommandContext(ctx, "/usr/bin/pgbench", "-n", "-C", "-c", "1", "-T", "600", "-f", script,
					"-h", "127.0.0.1", "-p", strconv.Itoa(lp.Port), "-U", "app", "appdb")
				cmd.Env = append(cmd.Environ(), "PGPASSWORD="+testenv.Password)
				out, _ := cmd.CombinedOutput()
				if ctx.Err() != nil {
					return // killed at the end: no summary
				}
				mu.Lock()
				ended++
				last = out
				mu.Unlock()
				time.Sleep(20 * time.Millisecond) // pacing of restarts, not a synchronisation
			}
		}()
	}
	return func() {
		wg.Wait()
		if ended == 0 {
			t.Logf("pgbench (background load, 2 clients) ran without an error")
			return
		}
		lines := strings.Split(strings.TrimSpace(string(last)), "\n")
		t.Logf("pgbench (background load, 2 clients) was restarted %d times after an error; the last run's end:\n%s",
			ended, strings.Join(lines[max(0, len(lines)-8):], "\n"))
	}
}

// TestFailoverCrash: under a steady pgx and pgbench load through one
// lockpool over a primary and its synchronous standby, the primary is
// stopped with -m immediate and the standby promoted: writes succeed again
// within a second of the promotion, with no restart or reload of lockpool;
// every acknowledged write is on the new primary; SHOW HOSTS and the
// metrics say what happened.
func TestFailoverCrash(t *testing.T) {
	pair := testenv.StartPair(t, true)
	createWrites(t, pair)
	lp, log := startFailoverLockpool(t, pair)
	ctx, cancel := context.WithCancel(testenv.Context(t, 2*time.Minute))
	defer cancel()

	load := startWriteLoad(ctx, lp.DSN("app", "appdb"), 4)
	pgbenchDone := pgbenchLoad(ctx, t, lp)
	testenv.Eventually(t, 20*time.Second, "200 acknowledged writes", func() bool { return load.count() >= 200 })

	old := pair.Primary
	if err := old.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if err := pair.Standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	testenv.Eventually(t, 10*time.Second, "a write after the promotion", func() bool {
		_, ok := load.firstAfter(promoted)
		return ok
	})
	first, _ := load.firstAfter(promoted)
	took := first.at.Sub(promoted)
	t.Logf("first write %v after the promotion (on port %d)", took.Round(time.Millisecond), first.port)
	if took > time.Second {
		t.Errorf("first write came %v after the promotion, want within 1s", took)
	}
	if first.port != pair.Standby.Port {
		t.Errorf("first write after the promotion ran on port %d, want the new primary's %d", first.port, pair.Standby.Port)
	}
	n := load.count()
	testenv.Eventually(t, 10*time.Second, "writes go on", func() bool { return load.count() >= n+100 })
	cancel()
	load.wg.Wait()
	pgbenchDone()
	pair.Primary, pair.Standby = pair.Standby, old

	rows := checkAcked(t, pair.Primary, load)
	t.Logf("%d acknowledged writes, %d rows on the new primary; errors during the failover: %v", load.count(), rows, load.errs)

	if got := lp.Metric("lockpool_failovers_total", nil); got != 1 {
		t.Errorf("lockpool_failovers_total = %v, want 1", got)
	}
	newAddr := testenv.Addr(pair.Primary)
	if got := lp.Metric("lockpool_host_role", map[string]string{"host": newAddr, "role": "primary"}); got != 1 {
		t.Errorf("lockpool_host_role{host=%s,role=primary} = %v, want 1", newAddr, got)
	}
	if !strings.Contains(log.String(), "hosts: primary changed") {
		t.Error("no log line for the primary change")
	}
}
