package integration

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// TestActivityViewAsDirect: pg_stat_activity read through lockpool shows
// what it shows on a direct connection with the same clients: one row per
// client (an idle client with the pid its driver was given, the reader
// with pg_backend_pid()), no row for lockpool's pooled connections, state
// and query hidden from another user as PostgreSQL hides them, and a
// prepared statement reads the view as it is when it runs. Terminating
// the idle rows' pids from a statement over the view (node-postgres'
// connection-pool/error test) ends those clients with 57P01.
func TestActivityViewAsDirect(t *testing.T) {
	t.Parallel()
	const role, other, db = "actview", "actother", "actview"
	c := pgtest.Require(t)
	testenv.EnsureRole(t, c, role)
	testenv.EnsureRole(t, c, other)
	testenv.EnsureDatabase(t, c, db, role)
	app := defaultApp()
	app.name, app.user, app.db = "actview", role, db
	otherApp := app
	otherApp.name, otherApp.user = "actother", other
	l := startLockpool(t, 10, "", app, otherApp)
	ctx := testenv.Context(t, time.Minute)
	su := superConn(t, "postgres")

	type target struct{ name, dsn, otherDSN string }
	targets := []target{
		{"direct", directDSN(t, role, db), directDSN(t, other, db)},
		{"lockpool", l.dsn(role, db), l.dsn(other, db)},
	}
	const view = "SELECT pid, pid = pg_backend_pid(), coalesce(state, '-'), coalesce(backend_type, '-'), " +
		"query = '<insufficient privilege>', client_addr IS NULL, backend_start IS NULL FROM pg_stat_activity " +
		"WHERE usename = $1 AND datname = $2"

	// observe runs view on reader and names each row's pid: "me" (the
	// reader's backend), "idle1".. (the idle clients), or "?".
	observe := func(t *testing.T, reader *pgx.Conn, mode pgx.QueryExecMode, idle []*pgx.Conn) []string {
		t.Helper()
		rows, err := reader.Query(ctx, view, mode, role, db)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for rows.Next() {
			var pid uint32
			var me, hidden, noAddr, noStart bool
			var state, typ string
			if err := rows.Scan(&pid, &me, &state, &typ, &hidden, &noAddr, &noStart); err != nil {
				t.Fatal(err)
			}
			who := "?"
			for i, c := range idle {
				if c.PgConn().PID() == pid {
					who = fmt.Sprintf("idle%d", i+1)
				}
			}
			if me {
				who = "me"
			}
			out = append(out, fmt.Sprintf("%s state=%s type=%s hidden=%v no_addr=%v no_start=%v", who, state, typ, hidden, noAddr, noStart))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		slices.Sort(out)
		return out
	}
	type seen struct{ own, prepared, others, terminated []string }
	results := map[string]seen{}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			var r seen
			var idle []*pgx.Conn
			for range 3 {
				c := mustConnect(ctx, t, tg.dsn)
				if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
					t.Fatal(err)
				}
				idle = append(idle, c)
			}
			reader := mustConnect(ctx, t, tg.dsn)
			if tg.name == "lockpool" {
				// Pooled connections of the role exist beside the reader's:
				// the view must not show them.
				n, err := countBackends(ctx, su, fmt.Sprintf("usename = '%s' AND datname = '%s' AND state = 'idle'", role, db))
				if err != nil || n == 0 {
					t.Fatalf("lockpool holds %d idle connections of %s (%v): the case tests nothing", n, role, err)
				}
			}
			r.own = observe(t, reader, pgx.QueryExecModeSimpleProtocol, idle)
			// Prepared once, run after one more client went idle: the view
			// is read when the statement runs.
			first := observe(t, reader, pgx.QueryExecModeCacheStatement, idle)
			if !slices.Equal(first, r.own) {
				t.Errorf("prepared: %q, simple: %q", first, r.own)
			}
			late := mustConnect(ctx, t, tg.dsn)
			if _, err := late.Exec(ctx, "SELECT 1"); err != nil {
				t.Fatal(err)
			}
			r.prepared = observe(t, reader, pgx.QueryExecModeCacheStatement, append(idle, late))
			r.others = observe(t, mustConnect(ctx, t, tg.otherDSN), pgx.QueryExecModeExec, idle)

			// node-postgres' connection-pool/error test, narrowed to this
			// test's role.
			rows, err := reader.Query(ctx, "SELECT pid, (SELECT pg_terminate_backend(pid)) AS killed FROM pg_stat_activity WHERE state = $1 AND usename = $2", "idle", role)
			if err != nil {
				t.Fatal(err)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			for i, c := range append(idle, late) {
				var err error
				// A terminated backend's FATAL may come a moment later.
				eventually(t, 5*time.Second, fmt.Sprintf("idle client %d to be terminated", i+1), func() bool {
					_, err = c.Exec(ctx, "SELECT 1")
					return err != nil
				})
				r.terminated = append(r.terminated, fmt.Sprintf("idle%d: %s", i+1, sqlStateOrOK(err)))
			}
			results[tg.name] = r
		})
	}
	d, p := results["direct"], results["lockpool"]
	for _, cmp := range []struct {
		what     string
		dir, thr []string
	}{
		{"the role's own view", d.own, p.own},
		{"a prepared statement after a fourth client", d.prepared, p.prepared},
		{"another role's view", d.others, p.others},
		{"the idle clients after terminating the idle rows", d.terminated, p.terminated},
	} {
		if !slices.Equal(cmp.dir, cmp.thr) {
			t.Errorf("%s:\ndirect:   %s\nlockpool: %s", cmp.what, strings.Join(cmp.dir, "; "), strings.Join(cmp.thr, "; "))
		} else {
			t.Logf("%s: %s", cmp.what, strings.Join(cmp.dir, "; "))
		}
	}
}

// sqlStateOrOK is err's SQLSTATE, "ok" for none.
func sqlStateOrOK(err error) string {
	if err == nil {
		return "ok"
	}
	if s := sqlState(err); s != "" {
		return s
	}
	return err.Error()
}
