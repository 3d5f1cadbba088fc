package integration

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
)

// /health/ready turns 503 within 2 s of PostgreSQL
// stopping and 200 again after it restarts; new transactions through
// lockpool succeed after the restart with no restart of lockpool.
//
// Not parallel: it stops the package's shared cluster. Go runs all top-level
// tests that do not call t.Parallel one after another, and only then the
// parallel ones, so nothing else runs while PostgreSQL is down.
func TestHealthReadyAcrossPostgresRestart(t *testing.T) {
	c := pgtest.Require(t)
	l := startLockpool(t, 10, "")
	ctx := context.Background()
	tbl := uniqueName(t, "t")
	status := func() int {
		cl := http.Client{Timeout: 3 * time.Second}
		resp, err := cl.Get(l.admin.URL + "/health/ready")
		if err != nil {
			t.Fatalf("GET /health/ready: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code, body := l.get("/up"); code != 200 {
		t.Fatalf("/up = %d %q", code, body)
	}
	if code := status(); code != 200 {
		t.Fatalf("/health/ready = %d before the stop, want 200", code)
	}
	// A client connected before the restart, with an idle server connection
	// in the pool.
	old := l.connect(t, "app", "appdb")
	if _, err := old.Exec(ctx, fmt.Sprintf("DROP TABLE IF EXISTS %s; CREATE TABLE %s (id int)", tbl, tbl)); err != nil {
		t.Fatal(err)
	}
	// Another one that stays quiet while PostgreSQL is down.
	quiet := l.connect(t, "app", "appdb")
	if _, err := quiet.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}

	restarted := false
	t.Cleanup(func() {
		if !restarted {
			_ = c.StartAgain()
		}
	})
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	for status() != http.StatusServiceUnavailable {
		if time.Since(stopped) > 2*time.Second {
			t.Fatalf("/health/ready still not 503 %v after PostgreSQL stopped", time.Since(stopped))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("/health/ready 503 %v after the stop", time.Since(stopped).Round(time.Millisecond))
	// /up is about the process, not PostgreSQL.
	if code, _ := l.get("/up"); code != 200 {
		t.Errorf("/up = %d while PostgreSQL is down, want 200", code)
	}
	// While PostgreSQL is down a client gets an error, not a hang.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err := old.Exec(cctx, "SELECT 1")
	cancel()
	if err == nil {
		t.Errorf("a query succeeded while PostgreSQL was down")
	} else {
		t.Logf("query while down: %v", err)
	}
	// Still 503 after the client's failure (/health/ready asks PostgreSQL
	// on every request: nothing to wait for).
	if code := status(); code != http.StatusServiceUnavailable {
		t.Errorf("/health/ready = %d while PostgreSQL is still down", code)
	}

	if err := c.StartAgain(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	started := time.Now()
	for status() != 200 {
		if time.Since(started) > 5*time.Second {
			t.Fatalf("/health/ready not 200 %v after PostgreSQL restarted", time.Since(started))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("/health/ready 200 %v after the restart", time.Since(started).Round(time.Millisecond))

	// New transactions through the same lockpool: a new client, a client
	// that stayed connected and quiet across the restart, and the client
	// that got an error while PostgreSQL was down (if it is still
	// connected, its next transaction must work too).
	fresh := l.connect(t, "app", "appdb")
	for i, cl := range []*pgx.Conn{fresh, quiet, old} {
		if cl.IsClosed() && cl == old {
			t.Logf("client %d was disconnected by the restart", i)
			continue
		}
		tx, err := cl.Begin(ctx)
		if err != nil {
			t.Fatalf("client %d: BEGIN after restart: %v", i, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+tbl+" VALUES ($1)", i); err != nil {
			t.Fatalf("client %d: INSERT after restart: %v", i, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("client %d: COMMIT after restart: %v", i, err)
		}
	}
	// Many transactions in parallel: no stale server connection left.
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		go func() {
			cl, err := pgx.Connect(ctx, l.dsn("app", "appdb"))
			if err != nil {
				errs <- err
				return
			}
			defer cl.Close(ctx)
			for j := 0; j < 10; j++ {
				if _, err := cl.Exec(ctx, "INSERT INTO "+tbl+" VALUES (100)"); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for i := 0; i < 8; i++ {
		if err := <-errs; err != nil {
			t.Errorf("after restart: %v", err)
		}
	}
}

// A broken idle server connection is discarded, not
// handed to the next transaction. The backend is killed while idle in the
// pool; the client's next statements must run on a fresh connection.
func TestBrokenIdleServerConnDiscarded(t *testing.T) {
	t.Parallel()
	app := defaultApp()
	app.name, app.max, app.pinned = "brk", 1, 0
	l := startLockpool(t, 10, "", app)
	ctx := context.Background()
	appName := uniqueName(t, "an")
	cl := l.connectCfg(t, "app", "appdb", func(cfg *pgx.ConnConfig) { cfg.RuntimeParams["application_name"] = appName })
	super := superConn(t, "postgres")
	// The second round kills the backend right after its release: the FATAL
	// and the EOF are already in the socket when the client's next statement
	// comes, so lockpool can tell, however short the idle time was.
	for round, idle := range []time.Duration{1200 * time.Millisecond, 0, 300 * time.Millisecond} {
		var pid int
		if err := cl.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		var ok bool
		if err := super.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", pid).Scan(&ok); err != nil || !ok {
			t.Fatalf("terminate %d: %v %v", pid, ok, err)
		}
		time.Sleep(idle)
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
			var npid int
			if err := cl.QueryRow(ctx, "SELECT pg_backend_pid()", mode).Scan(&npid); err != nil {
				t.Fatalf("round %d: first statement %v after the idle server connection died: %v", round, idle, err)
			}
			if npid == pid {
				t.Fatalf("round %d: still on terminated backend %d", round, pid)
			}
		}
		if cl.IsClosed() {
			t.Fatalf("client disconnected")
		}
	}
}
