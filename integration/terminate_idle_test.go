package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// TestTerminateIdleBackendAsDirect is the shape of lib/pq's TestPing and
// node-postgres' gh-issues/130: a client reads pg_backend_pid(), goes idle
// outside a transaction, another connection terminates that pid, and the
// client's next statement must fail. Directly it gets the FATAL 57P01.
// Through lockpool in pool_mode session, where the client keeps its server
// connection, it must get the same whoever terminates the backend. In
// pool_mode transaction the backend went back to the pool when the
// client's transaction ended: terminated through lockpool, the pid names
// the client that read it (it ends with the same FATAL, and the pooled
// backend lives on); terminated on PostgreSQL directly, only the pooled
// backend ends and the client goes on (the documented difference).
func TestTerminateIdleBackendAsDirect(t *testing.T) {
	t.Parallel()
	const role = "termidle"
	testenv.EnsureRole(t, pgtest.Require(t), role)
	txApp := defaultApp()
	txApp.name, txApp.user, txApp.db = "termtx", role, "appdb"
	sessApp := txApp
	sessApp.name, sessApp.db, sessApp.mode = "termsess", "postgres", "session"
	l := startLockpool(t, 10, "", txApp, sessApp)
	ctx := testenv.Context(t, time.Minute)
	su := superConn(t, "postgres")

	// run connects to dsn, reads the client's pg_backend_pid(), terminates
	// that pid through term once the client is idle (su: PostgreSQL
	// directly, whose backend must then be gone) and returns the client's
	// next statement's error (nil: it went on).
	run := func(t *testing.T, dsn string, term *pgx.Conn, simple bool) error {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		var pid int32
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		var ok bool
		// The pid as $1 (pgx's extended protocol), or as a constant in a
		// simple Query (psql, node-postgres' gh-issues/130).
		sql, args := "SELECT pg_terminate_backend($1)", []any{pid}
		if simple {
			sql, args = fmt.Sprintf("SELECT pg_terminate_backend(%d)", pid), []any{pgx.QueryExecModeSimpleProtocol}
		}
		if err := term.QueryRow(ctx, sql, args...).Scan(&ok); err != nil || !ok {
			t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
		}
		if term == su {
			eventually(t, 10*time.Second, "the terminated backend to be gone", func() bool {
				n, err := countBackends(ctx, su, "pid = "+itoa(int(pid)))
				return err == nil && n == 0
			})
		}
		_, err = c.Exec(ctx, "SELECT 1")
		return err
	}
	connect := func(dsn string) *pgx.Conn {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}

	direct := run(t, directDSN(t, role, "postgres"), su, false)
	if sqlState(direct) != "57P01" {
		t.Fatalf("directly: %v, want 57P01 (the case tests nothing)", direct)
	}
	if through := run(t, l.dsn(role, "postgres"), su, false); sqlState(through) != sqlState(direct) {
		t.Errorf("pool_mode session, terminated on PostgreSQL: %v, directly %v", through, direct)
	}
	if through := run(t, l.dsn(role, "postgres"), connect(l.dsn(role, "postgres")), false); sqlState(through) != sqlState(direct) {
		t.Errorf("pool_mode session, terminated through lockpool: %v, directly %v", through, direct)
	}
	for _, simple := range []bool{false, true} {
		if through := run(t, l.dsn(role, "appdb"), connect(l.dsn(role, "appdb")), simple); sqlState(through) != sqlState(direct) {
			t.Errorf("pool_mode transaction, terminated through lockpool (simple Query %v): %v, directly %v", simple, through, direct)
		}
	}
	if through := run(t, l.dsn(role, "appdb"), su, false); through != nil {
		t.Errorf("pool_mode transaction, terminated on PostgreSQL: %v; the client had no backend between transactions and should go on", through)
	}
}
