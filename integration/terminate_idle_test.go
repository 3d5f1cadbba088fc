package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// TestTerminateIdleBackendAsDirect is the shape of lib/pq's TestPing and
// node-postgres' gh-issues/130 and connection-pool/error-tests.js ("errors
// emitted on checked-out clients"): a client reads pg_backend_pid(), goes
// idle outside a transaction, another connection terminates that backend,
// and the client's next statement must fail. Directly it gets the FATAL
// 57P01; through lockpool in pool_mode session, where the client keeps its
// server connection, it must get the same. In pool_mode transaction the
// backend went back to the pool when the client's transaction ended, so
// terminating it does not reach the client: the client goes on, which is
// the documented difference (README, Key pids: pg_backend_pid() names the
// backend of the current transaction). Both are checked.
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

	// run connects to dsn, terminates the client's backend from su once
	// the client is idle, waits until the backend is gone and returns the
	// client's next statement's error (nil: it went on).
	run := func(t *testing.T, dsn string) error {
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
		if err := su.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
			t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
		}
		eventually(t, 10*time.Second, "the terminated backend to be gone", func() bool {
			n, err := countBackends(ctx, su, "pid = "+itoa(int(pid)))
			return err == nil && n == 0
		})
		_, err = c.Exec(ctx, "SELECT 1")
		return err
	}

	direct := run(t, directDSN(t, role, "postgres"))
	if sqlState(direct) != "57P01" {
		t.Fatalf("directly: %v, want 57P01 (the case tests nothing)", direct)
	}
	if through := run(t, l.dsn(role, "postgres")); sqlState(through) != sqlState(direct) {
		t.Errorf("pool_mode session: %v, directly %v", through, direct)
	}
	if through := run(t, l.dsn(role, "appdb")); through != nil {
		t.Errorf("pool_mode transaction: %v; the client had no backend between transactions and should go on", through)
	}
}
