package integration

// The deterministic part of the terminate test: the backend of a session
// dies after its pg_advisory_lock statement completed but before
// lockpool's pin probe ran. The lock is gone with the backend, so the
// session must not go on as if it held it: it gets an error and is
// disconnected, like a pinned session whose backend dies.
//
// The probe is held up by an ACCESS EXCLUSIVE lock on pg_class (the probe
// reads pg_class), and the backend is terminated while it waits.

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

func TestFaultBackendDiesDuringPinProbe(t *testing.T) {
	c := pgtest.Require(t)
	const role = "fltprobe"
	testenv.EnsureRole(t, c, role)
	l, _ := startYAML(t, testenv.UserYAML(c, "", 10, "", role, appPassword,
		"    database: appdb\n    max_connections: 3\n    max_pinned: 1\n    wait_timeout: 5s"))
	ctx := context.Background()
	su := superConn(t, "appdb")
	blocker := superConn(t, "appdb")
	conn := l.connect(t, role, "appdb")
	const lockSQL = "SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock(4242)) x"
	// Warm the caches: the statement itself must not need pg_class below.
	var pid uint32
	if err := conn.QueryRow(ctx, lockSQL).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
		t.Fatal(err)
	}

	// Warm su's caches too: with pg_class locked, a query that needs a
	// catalog lookup to parse would wait as well.
	const waitingSQL = `SELECT l.pid FROM pg_locks l JOIN pg_locks a ON a.pid = l.pid AND a.locktype = 'advisory' AND a.granted
WHERE l.relation = 1259 AND NOT l.granted`
	var victim uint32
	_ = su.QueryRow(ctx, waitingSQL).Scan(&victim)
	if _, err := su.Exec(ctx, "SELECT pg_terminate_backend($1)", 0); err != nil {
		t.Fatal(err)
	}
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "LOCK TABLE pg_catalog.pg_class IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	type res struct {
		pid uint32
		err error
	}
	got := make(chan res, 1)
	go func() {
		qctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		var p uint32
		err := conn.QueryRow(qctx, lockSQL).Scan(&p)
		got <- res{p, err}
	}()
	// The probe waits on pg_class: find that backend (it holds our lock).
	deadline := time.Now().Add(10 * time.Second)
	for victim == 0 {
		if time.Now().After(deadline) {
			_ = tx.Rollback(ctx)
			t.Fatal("the pin probe never waited on pg_class")
		}
		time.Sleep(20 * time.Millisecond)
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = su.QueryRow(qctx, waitingSQL).Scan(&victim)
		cancel()
	}
	if _, err := su.Exec(ctx, "SELECT pg_terminate_backend($1)", victim); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	r := <-got
	t.Logf("lock statement: pid %d, err %v", r.pid, r.err)
	if r.err == nil {
		// The client was told it holds the lock. Then its session must be
		// over (the lock died with backend victim) ...
		var now uint32
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := conn.QueryRow(qctx, "SELECT pg_backend_pid()").Scan(&now)
		cancel()
		if err == nil {
			var held int
			_ = su.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242").Scan(&held)
			t.Fatalf("lockpool bug: pg_advisory_lock succeeded on backend %d, that backend died before the pin probe, "+
				"and the session went on unpinned on backend %d with no error (advisory locks on key 4242 now: %d); "+
				"the client believes it holds a lock nobody holds", r.pid, now, held)
		}
		t.Logf("next statement after the lost lock: %v (%s)", err, sqlState(err))
		if !conn.IsClosed() {
			t.Errorf("the session was not closed after its lock was lost")
		}
	}
	// Either way no lock and no pin remain.
	eventually(t, 5*time.Second, "no pinned session", func() bool {
		return l.metric("lockpool_pinned_sessions", map[string]string{"app": role}) == 0
	})
	_ = pgx.Identifier{}
}
