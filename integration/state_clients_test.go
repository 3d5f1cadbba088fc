package integration

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lib/pq"
	"github.com/lockpool/lockpool/internal/pgtest"
)

// Real client libraries that use named
// prepared statements, through lockpool in transaction mode.

// TestPgxPoolDefaultMode: pgxpool in its default exec mode, 100 goroutines,
// application budget 4, 100,000 queries over 20 distinct statements, zero
// errors.
func TestPgxPoolDefaultMode(t *testing.T) {
	t.Parallel()
	app := defaultApp()
	app.name, app.max, app.pinned, app.wait = "pgxdefault", 4, 1, "60s"
	l := startLockpool(t, 10, "", app)
	total := 100_000
	if testing.Short() {
		total = 10_000
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	w := pgxWorkload{goroutines: 100, total: total, distinct: 20, maxConns: 100}
	res, err := w.run(ctx, l.url("app", "appdb"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pgxpool default mode through lockpool: %d queries, %d errors in %v (%.0f q/s)",
		res.queries, res.errors, res.elapsed.Round(time.Millisecond), float64(res.queries)/res.elapsed.Seconds())
	if res.stalled {
		t.Errorf("no query finished for 30 s: the run stalled")
	}
	if res.errors != 0 {
		t.Fatalf("%d of %d queries failed; first: %v", res.errors, res.queries, res.firstErr)
	}
	if res.queries != int64(total) {
		t.Fatalf("ran %d queries, want %d (ctx: %v)", res.queries, total, ctx.Err())
	}
}

// TestPgBouncerPgxDefaultMode runs the same program (smaller) against
// PgBouncer in transaction mode and records how it fails, for the README's
// comparison table. PgBouncer's failure is the expected outcome, not a
// test failure.
func TestPgBouncerPgxDefaultMode(t *testing.T) {
	t.Parallel()
	c := pgtest.Require(t)
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"} {
			if _, e := os.Stat(p); e == nil {
				bin, err = p, nil
				break
			}
		}
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("pgbouncer not installed (CI is set; .ci/run installs it)")
		}
		t.Skip("pgbouncer not installed (apt-get install pgbouncer)")
	}
	version := "?"
	if out, err := exec.Command(bin, "--version").Output(); err == nil {
		version = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	}
	port := freePort(t)
	dir, cred := stPgBouncerDir(t)
	ini := fmt.Sprintf(`[databases]
appdb = host=%s port=%d dbname=appdb

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = 4
max_client_conn = 500
logfile = %s
pidfile =
server_login_retry = 1
`, c.Host, c.Port, port, filepath.Join(dir, "userlist.txt"), filepath.Join(dir, "pgbouncer.log"))
	stWriteOwned(t, filepath.Join(dir, "pgbouncer.ini"), ini, cred)
	stWriteOwned(t, filepath.Join(dir, "userlist.txt"), fmt.Sprintf("%q %q\n", "app", appPassword), cred)

	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.Dir = dir
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if cred != nil {
		cmd.SysProcAttr.Credential = cred
		cmd.Env = append(os.Environ(), "HOME="+dir, "USER=postgres", "LOGNAME=postgres")
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pgbouncer: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	eventually(t, 10*time.Second, "pgbouncer listening", func() bool {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			t.Fatalf("pgbouncer exited: %s\n%s", out.String(), log)
		default:
		}
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := pgxWorkload{goroutines: 100, total: 1000, distinct: 20, maxConns: 100}
	url := fmt.Sprintf("postgres://app:%s@127.0.0.1:%d/appdb?sslmode=disable", appPassword, port)
	res, err := w.run(ctx, url)
	if err != nil {
		t.Logf("RESULT %s, pgx v5 default exec mode, pool_mode=transaction: could not start: %v", version, err)
		return
	}
	if res.errors == 0 {
		t.Logf("RESULT %s, pgx v5 default exec mode, pool_mode=transaction: %d queries, no errors", version, res.queries)
		return
	}
	t.Logf("RESULT %s, pgx v5 default exec mode, pool_mode=transaction: %d of %d queries failed (stalled: %v); first error: %v",
		version, res.errors, res.queries, res.stalled, res.firstErr)
}

// stPgBouncerDir makes a private directory for pgbouncer's files, owned by
// the postgres system user when we are root (pgbouncer refuses to run as
// root), and the credential to run it with.
func stPgBouncerDir(t *testing.T) (string, *syscall.Credential) {
	t.Helper()
	dir, err := os.MkdirTemp("", "lockpool-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if os.Geteuid() != 0 {
		return dir, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("running as root and no postgres user to run pgbouncer as: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	return dir, &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

func stWriteOwned(t *testing.T, path, content string, cred *syscall.Credential) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		if err := os.Chown(path, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNodeNamedQueries: node-postgres named queries ({name, text, values})
// at concurrency 20 on a budget of 2 (integration/node/named.js).
func TestNodeNamedQueries(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	app := defaultApp()
	app.name, app.max, app.pinned, app.wait = "nodenamed", 2, 1, "60s"
	l := startLockpool(t, 10, "", app)
	cmd := nodeCommand(ctx, t, "named.js", "DATABASE_URL="+l.url("app", "appdb"), "CONCURRENCY=20", "QUERIES=200", "STATEMENTS=10")
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	t.Logf("node named.js: %s", strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("node named.js failed: %v", err)
	}
}

// TestLibPQPreparedStatements: lib/pq prepared statements (db.Prepare,
// Stmt.Query, also inside transactions and on a dedicated *sql.Conn) at
// concurrency 20 on a budget of 2, zero errors, correct results.
func TestLibPQPreparedStatements(t *testing.T) {
	t.Parallel()
	app := defaultApp()
	app.name, app.max, app.pinned, app.wait = "libpqprep", 2, 1, "60s"
	l := startLockpool(t, 10, "", app)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	connector, err := pq.NewConnector(l.dsn("app", "appdb"))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(connector)
	defer db.Close()
	const conc, distinct, perWorker = 20, 10, 150
	// Each worker holds a dedicated *sql.Conn and borrows one more from the
	// pool for shared statements and transactions: 2 per worker, so the
	// client pool can never deadlock on itself.
	db.SetMaxOpenConns(2 * conc)
	db.SetMaxIdleConns(2 * conc)

	stmts := make([]*sql.Stmt, distinct)
	for k := range stmts {
		s, err := db.PrepareContext(ctx, fmt.Sprintf("SELECT $1::int + %d, $2::text", k))
		if err != nil {
			t.Fatalf("prepare %d: %v", k, err)
		}
		defer s.Close()
		stmts[k] = s
	}
	series, err := db.PrepareContext(ctx, "SELECT g FROM generate_series(1, $1::int) AS g")
	if err != nil {
		t.Fatal(err)
	}
	defer series.Close()

	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for g := 0; g < conc; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			fail := func(err error) {
				mu.Lock()
				errs = append(errs, fmt.Errorf("worker %d: %w", g, err))
				mu.Unlock()
			}
			// A dedicated connection with its own statements, reused across
			// many transactions (lib/pq names them per connection: every
			// worker uses the same statement names for different texts).
			conn, err := db.Conn(ctx)
			if err != nil {
				fail(err)
				return
			}
			defer conn.Close()
			own, err := conn.PrepareContext(ctx, fmt.Sprintf("SELECT $1::int * %d", g+2))
			if err != nil {
				fail(fmt.Errorf("conn prepare: %w", err))
				return
			}
			defer own.Close()
			for i := 0; i < perWorker; i++ {
				k := (g + i) % distinct
				x := g*10000 + i
				switch i % 5 {
				case 0, 1: // shared statement, any pooled connection
					var v int
					var s string
					rows, err := stmts[k].QueryContext(ctx, x, "t"+strconv.Itoa(k))
					if err != nil {
						fail(fmt.Errorf("query %d: %w", i, err))
						return
					}
					n := 0
					for rows.Next() {
						n++
						if err := rows.Scan(&v, &s); err != nil {
							fail(err)
						}
					}
					if err := rows.Err(); err != nil {
						fail(fmt.Errorf("query %d rows: %w", i, err))
						return
					}
					rows.Close()
					if n != 1 || v != x+k || s != "t"+strconv.Itoa(k) {
						fail(fmt.Errorf("query %d: got %d rows, (%d, %q), want (%d, %q)", i, n, v, s, x+k, "t"+strconv.Itoa(k)))
						return
					}
				case 2: // the connection's own statement
					var v int
					if err := own.QueryRowContext(ctx, x).Scan(&v); err != nil || v != x*(g+2) {
						fail(fmt.Errorf("own statement %d: got %d, %v; want %d", i, v, err, x*(g+2)))
						return
					}
				case 3: // prepared statements inside a transaction
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						fail(err)
						return
					}
					var v int
					var s string
					if err := tx.StmtContext(ctx, stmts[k]).QueryRowContext(ctx, x, "tx").Scan(&v, &s); err != nil || v != x+k || s != "tx" {
						_ = tx.Rollback()
						fail(fmt.Errorf("in tx %d: got (%d, %q), %v; want %d", i, v, s, err, x+k))
						return
					}
					rows, err := tx.StmtContext(ctx, series).QueryContext(ctx, 5+i%7)
					if err != nil {
						_ = tx.Rollback()
						fail(err)
						return
					}
					sum, want := 0, 0
					for j := 1; j <= 5+i%7; j++ {
						want += j
					}
					for rows.Next() {
						var g int
						if err := rows.Scan(&g); err != nil {
							fail(err)
						}
						sum += g
					}
					rows.Close()
					if err := rows.Err(); err != nil || sum != want {
						_ = tx.Rollback()
						fail(fmt.Errorf("series in tx %d: sum %d, %v; want %d", i, sum, err, want))
						return
					}
					if err := tx.Commit(); err != nil {
						fail(fmt.Errorf("commit %d: %w", i, err))
						return
					}
				case 4: // a statement prepared, used and closed every time
					s, err := conn.PrepareContext(ctx, fmt.Sprintf("SELECT $1::int - %d", k))
					if err != nil {
						fail(fmt.Errorf("prepare %d: %w", i, err))
						return
					}
					var v int
					err = s.QueryRowContext(ctx, x).Scan(&v)
					_ = s.Close()
					if err != nil || v != x-k {
						fail(fmt.Errorf("transient statement %d: got %d, %v; want %d", i, v, err, x-k))
						return
					}
				}
			}
		}(g)
	}
	wg.Wait()
	if len(errs) > 0 {
		for i, err := range errs {
			if i == 5 {
				break
			}
			t.Error(err)
		}
		t.Fatalf("%d lib/pq workers failed", len(errs))
	}
}

// TestStatePreparedLRU: max_prepared_statements bounds the server statements
// lockpool keeps per server connection; evicted statements are prepared
// again transparently when a client uses them.
func TestStatePreparedLRU(t *testing.T) {
	t.Parallel()
	app := defaultApp()
	app.name, app.max, app.pinned = "stlru", 2, 1
	app.extra = "    max_prepared_statements: 5\n"
	l := startLockpool(t, 10, "", app)
	ctx := context.Background()
	c := l.connect(t, "app", "appdb")
	for round := 0; round < 3; round++ {
		for k := 0; k < 20; k++ {
			var v int
			if err := c.QueryRow(ctx, fmt.Sprintf("SELECT $1::int + %d", k), round).Scan(&v); err != nil || v != round+k {
				t.Fatalf("round %d statement %d: %d, %v; want %d", round, k, v, err, round+k)
			}
		}
		var n int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE NOT from_sql AND name LIKE 'lp\_%'`,
			pgx.QueryExecModeSimpleProtocol).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 5 {
			t.Errorf("round %d: the server connection holds %d lockpool statements, max_prepared_statements is 5", round, n)
		}
	}
}
