package integration

// Cancelling a waiting lease_acquire, lease calls inside explicit
// transactions, and lease calls that are not the whole statement.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// A CancelRequest ends a blocking lease_acquire wait with 57014; the
// connection stays usable and the cancelled waiter never gets the lease.
func TestLeaseAcquireCancel(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "instance_id: cancel")
	holder := l.connect(t, "app", "appdb")

	check := func(t *testing.T, name string, waiter *pgx.Conn, cancelIt func(), ctx context.Context) {
		t.Helper()
		mustAcquire(t, holder, name, 60, 0)
		done := waitLease(ctx, waiter, name, 30, 30)
		clientWaiting(t, l, waiter.PgConn().PID())
		waits := l.metric("lockpool_lease_acquire_wait_seconds", nil) // waiting acquires that ended
		cancelled := time.Now()
		cancelIt()
		var r leaseGrant
		select {
		case r = <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the waiting lease_acquire did not end within 5 s of the cancel request")
		}
		if r.ok {
			t.Fatal("cancelled lease_acquire returned a token")
		}
		var pe *pgconn.PgError
		if !errors.As(r.err, &pe) || pe.Code != "57014" {
			t.Fatalf("cancelled lease_acquire: err %v, want SQLSTATE 57014", r.err)
		}
		if d := r.at.Sub(cancelled); d > 2*time.Second {
			t.Fatalf("wait ended %v after the cancel request", d)
		}
		var one int
		if err := waiter.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil {
			t.Fatalf("connection after cancel: %v", err)
		}
		// The cancelled wait is over in lockpool too, not only for the
		// client; then the holder releases, and the cancelled waiter must
		// not end up holding it.
		eventually(t, 5*time.Second, "lockpool to end the cancelled lease_acquire", func() bool {
			return l.metric("lockpool_lease_acquire_wait_seconds", nil) > waits
		})
		if !leaseBool(t, holder, "lease_release", name) {
			t.Fatal("holder's lease_release = false")
		}
		if row, ok := findLease(listLeases(t, waiter), name); ok {
			t.Fatalf("after the cancelled wait, lease_list() shows %+v", row)
		}
	}

	t.Run("CancelRequest", func(t *testing.T) {
		waiter := l.connect(t, "app", "appdb")
		name := fmt.Sprintf("cancel-req-%d", time.Now().UnixNano())
		check(t, name, waiter, func() {
			if err := waiter.PgConn().CancelRequest(context.Background()); err != nil {
				t.Errorf("CancelRequest: %v", err)
			}
		}, context.Background())
	})
	t.Run("ContextCancel", func(t *testing.T) {
		waiter := l.connectCfg(t, "app", "appdb", func(cfg *pgx.ConnConfig) {
			cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
				return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, CancelRequestDelay: 0, DeadlineDelay: 10 * time.Second}
			}
		})
		name := fmt.Sprintf("cancel-ctx-%d", time.Now().UnixNano())
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		check(t, name, waiter, cancel, ctx)
	})
}

// Lease calls inside an explicit transaction work and are not undone by
// ROLLBACK; in an aborted transaction they fail with 25P02.
func TestLeaseInsideTransaction(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "instance_id: txl")
	leaseTable(t, "lease_tx_t", "v text")
	ctx := context.Background()
	c := l.connect(t, "app", "appdb")
	other := l.connect(t, "app", "appdb")
	name := fmt.Sprintf("tx-%d", time.Now().UnixNano())

	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			n := name + "-" + mode.String()
			tx, err := c.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO lease_tx_t VALUES ('x')", mode); err != nil {
				t.Fatal(err)
			}
			var tok int64
			if err := tx.QueryRow(ctx, "SELECT lease_acquire($1, $2)", mode, n, 60).Scan(&tok); err != nil {
				t.Fatalf("lease_acquire in a transaction: %v", err)
			}
			// The transaction is still open and usable.
			var txid int64
			if err := tx.QueryRow(ctx, "SELECT txid_current_if_assigned()", mode).Scan(&txid); err != nil || txid == 0 {
				t.Fatalf("after a lease call the transaction is gone: txid %d, %v", txid, err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			r, ok := findLease(listLeases(t, other), n)
			if !ok || r.Token != tok {
				t.Fatalf("after ROLLBACK the lease is gone: %+v %v", r, ok)
			}
			if t2, ok, err := acquireLease(ctx, other, n, 60, 0); err != nil || ok {
				t.Fatalf("another session acquired a lease taken in a rolled-back transaction: %d %v %v", t2, ok, err)
			}
			if !leaseBool(t, c, "lease_renew", n) {
				t.Fatal("lease_renew after ROLLBACK = false")
			}
			// Release in a transaction, rolled back: still released.
			tx, err = c.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var released bool
			if err := tx.QueryRow(ctx, "SELECT lease_release($1)", mode, n).Scan(&released); err != nil || !released {
				t.Fatalf("lease_release in a transaction = %v, %v", released, err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if t2 := mustAcquire(t, other, n, 60, 0); t2 <= tok {
				t.Fatalf("token %d <= %d", t2, tok)
			}
			// In an aborted transaction: 25P02, and ROLLBACK recovers.
			tx, err = c.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, err = tx.Exec(ctx, "SELECT 1/0", mode)
			pgErr(t, err, "22012")
			_, err = tx.Exec(ctx, "SELECT lease_renew($1)", mode, n)
			pgErr(t, err, "25P02")
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			var one int
			if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
				t.Fatal(err)
			}
		})
	}
	var rows int
	if err := superConn(t, "appdb").QueryRow(ctx, "SELECT count(*) FROM lease_tx_t").Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("rolled-back rows = %d, %v", rows, err)
	}
}

// A lease call that is not the whole statement gets 0A000; mentions in
// strings and comments are not calls.
func TestLeaseCallNotWholeStatement(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "instance_id: whole")
	leaseTable(t, "lease_whole_t", "v bigint")
	ctx := context.Background()
	c := l.connect(t, "app", "appdb")
	name := fmt.Sprintf("whole-%d", time.Now().UnixNano())
	bad := []string{
		"SELECT lease_acquire('NAME', 10) + 1",
		"SELECT lease_acquire('NAME', 10), now()",
		"SELECT 1, lease_renew('NAME')",
		"SELECT lease_acquire('NAME', 10) WHERE true",
		"SELECT * FROM lease_list() WHERE mine",
		"SELECT name FROM lease_list()",
		"SELECT count(*) FROM lockpool.lease_list()",
		"INSERT INTO lease_whole_t SELECT lease_acquire('NAME', 10)",
		"WITH x AS (SELECT lease_acquire('NAME', 10)) SELECT * FROM x",
		"SELECT coalesce(lease_acquire('NAME', 10), 0)",
		"SELECT lease_release('NAME') FROM generate_series(1, 2)",
		"SELECT 1; SELECT lease_acquire('NAME', 10)",
		"SELECT lease_acquire('NAME', 10); SELECT 1",
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		for _, q := range bad {
			q = strings.ReplaceAll(q, "NAME", name)
			if mode != pgx.QueryExecModeSimpleProtocol && strings.Count(q, ";") > 0 {
				continue // not one statement in the extended protocol anyway
			}
			_, err := c.Exec(ctx, q, mode)
			if err == nil {
				t.Errorf("%s [%s]: no error, want 0A000", q, mode)
				continue
			}
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "0A000" || !strings.HasPrefix(pe.Message, "lockpool:") {
				t.Errorf("%s [%s]: %v, want 0A000 from lockpool", q, mode, err)
			}
		}
	}
	// Nothing was acquired, and the connection is fine.
	if row, ok := findLease(listLeases(t, c), name); ok {
		t.Fatalf("a rejected statement acquired %+v", row)
	}
	// Mentions that are not calls reach the server as they are.
	var s string
	if err := c.QueryRow(ctx, "SELECT 'lease_acquire(''x'', 1)'").Scan(&s); err != nil || s != "lease_acquire('x', 1)" {
		t.Fatalf("string literal mentioning lease_acquire = %q, %v", s, err)
	}
	if err := c.QueryRow(ctx, "SELECT /* lease_acquire('x', 1) */ 'ok'").Scan(&s); err != nil || s != "ok" {
		t.Fatalf("comment mentioning lease_acquire = %q, %v", s, err)
	}
	// Accepted spellings.
	for _, q := range []string{
		"SELECT lease_acquire('NAME', 10)",
		"select LEASE_ACQUIRE('NAME', 10) as t",
		"SELECT lockpool.lease_acquire('NAME', 10, 0) t;",
		"SELECT \"lease_acquire\"('NAME', 10)",
		"SELECT * FROM lockpool.lease_list() AS l",
		"SELECT lease_renew('NAME')",
	} {
		q = strings.ReplaceAll(q, "NAME", name)
		if _, err := c.Exec(ctx, q); err != nil {
			t.Errorf("%s: %v", q, err)
		}
	}
}

// A client that goes away while its lease_acquire is waiting never ends up
// holding the lease.
func TestLeaseWaiterDisconnects(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "instance_id: wdisc")
	ctx := context.Background()
	name := fmt.Sprintf("wdisc-%d", time.Now().UnixNano())
	holder := l.connect(t, "app", "appdb")
	mustAcquire(t, holder, name, 60, 0)
	waiter := l.connect(t, "app", "appdb")
	done := make(chan error, 1)
	go func() {
		_, _, err := acquireLease(ctx, waiter, name, 60, 20)
		done <- err
	}()
	clientWaiting(t, l, waiter.PgConn().PID())
	_ = waiter.PgConn().Conn().Close()
	<-done
	// lockpool ends the wait when the client goes (well before its 20 s),
	// before the holder releases.
	eventually(t, 5*time.Second, "lockpool to end the disconnected client's lease_acquire", func() bool {
		return l.metric("lockpool_lease_acquire_wait_seconds", nil) >= 1
	})
	if !leaseBool(t, holder, "lease_release", name) {
		t.Fatal("holder's lease_release = false")
	}
	third := l.connect(t, "app", "appdb")
	if row, ok := findLease(listLeases(t, third), name); ok {
		t.Fatalf("the disconnected waiter's acquire went on: lease_list() shows %+v", row)
	}
	mustAcquire(t, third, name, 60, 0)
}

// Shutting lockpool down releases its sessions' leases at once.
func TestLeaseReleasedOnShutdown(t *testing.T) {
	t.Parallel()
	a, b, name := startLeasePair(t, "shut")
	ctx := context.Background()
	holder := a.connect(t, "app", "appdb")
	old := mustAcquire(t, holder, name, 60, 0)
	waiter := b.connect(t, "app", "appdb")
	done := waitLease(ctx, waiter, name, 60, 10)
	clientWaiting(t, b, waiter.PgConn().PID())
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	_ = a.srv.Shutdown(sctx)
	leaseTakeover(t, done, old, 8*time.Second, "Shutdown (ttl 60 s)")
	t.Logf("waiter got the lease %v after Shutdown began", time.Since(start))
}

// Bad arguments get clear errors; pgx batches with lease calls.
func TestLeaseArgumentsAndBatches(t *testing.T) {
	t.Parallel()
	l := startLockpool(t, 10, "instance_id: args")
	ctx := context.Background()
	c := l.connect(t, "app", "appdb")
	name := fmt.Sprintf("args-%d", time.Now().UnixNano())
	for _, tc := range []struct {
		sql  string
		args []any
		code string
	}{
		{"SELECT lease_acquire($1, $2)", []any{name, 0}, "22023"},
		{"SELECT lease_acquire($1, $2)", []any{name, -1}, "22023"},
		{"SELECT lease_acquire($1, $2, $3)", []any{name, 10, -1}, "22023"},
		{"SELECT lease_acquire($1, $2)", []any{nil, 10}, "22004"},
		{"SELECT lease_acquire($1, $2)", []any{"", 10}, "22004"},
		{"SELECT lease_acquire($1, $2)", []any{name, nil}, "22004"},
		{"SELECT lease_acquire('" + name + "')", nil, "42883"},
		{"SELECT lease_renew('" + name + "', 1)", nil, "42883"},
		{"SELECT lease_acquire('" + name + "', 'abc')", nil, "22023"},
	} {
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
			args := append([]any{mode}, tc.args...)
			_, err := c.Exec(ctx, tc.sql, args...)
			if got := sqlState(err); got != tc.code {
				t.Errorf("%s %v [%s]: %v, want SQLSTATE %s", tc.sql, tc.args, mode, err, tc.code)
			}
		}
	}
	var one int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatal(err)
	}

	// A batch of lease calls only (one Sync).
	b := &pgx.Batch{}
	b.Queue("SELECT lease_acquire($1, $2)", name, 30)
	b.Queue("SELECT lease_renew($1)", name)
	b.Queue("SELECT * FROM lease_list()")
	b.Queue("SELECT lease_release($1)", name)
	br := c.SendBatch(ctx, b)
	var tok int64
	var renewed, released bool
	err := br.QueryRow().Scan(&tok)
	if err == nil {
		err = br.QueryRow().Scan(&renewed)
	}
	if err == nil {
		var rows pgx.Rows
		rows, err = br.Query()
		if err == nil {
			for rows.Next() {
			}
			rows.Close()
			err = rows.Err()
		}
	}
	if err == nil {
		err = br.QueryRow().Scan(&released)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Errorf("batch of lease calls: %v", err)
	} else if tok <= 0 || !renewed || !released {
		t.Errorf("batch of lease calls: token %d renewed %v released %v", tok, renewed, released)
	}
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("connection after batch: %v", err)
	}

	// A lease call after an ordinary statement in one batch: either it works
	// or it is refused with 0A000, and the connection stays usable.
	b = &pgx.Batch{}
	b.Queue("SELECT 1")
	b.Queue("SELECT lease_acquire($1, $2)", name, 30)
	err = c.SendBatch(ctx, b).Close()
	if err != nil && sqlState(err) != "0A000" {
		t.Errorf("batch [SELECT 1, lease_acquire]: %v, want success or 0A000", err)
	}
	t.Logf("batch [SELECT 1, lease_acquire]: %v", err)
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("connection after mixed batch: %v", err)
	}
	// The lease call first, an ordinary statement after it.
	b = &pgx.Batch{}
	b.Queue("SELECT lease_renew($1)", name)
	b.Queue("SELECT 2")
	br = c.SendBatch(ctx, b)
	var two int
	err = br.QueryRow().Scan(&renewed)
	if err == nil {
		err = br.QueryRow().Scan(&two)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil && sqlState(err) != "0A000" {
		t.Errorf("batch [lease_renew, SELECT 2]: %v, want success or 0A000", err)
	} else if err == nil && two != 2 {
		t.Errorf("batch [lease_renew, SELECT 2]: second result %d", two)
	}
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("connection after mixed batch: %v", err)
	}
}
