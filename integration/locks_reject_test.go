package integration

// advisory_locks: reject.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/testenv"
)

func TestLocksRejectPolicy(t *testing.T) {
	t.Parallel()
	const app = "lk6"
	l := startLockpool(t, 10, "", lkApp(app, "rejecter", 4, 1, "reject", "5s"))
	su := superConn(t, "appdb")
	ctx := testenv.Context(t, 60*time.Second)
	c := l.connect(t, "rejecter", "appdb")
	lkMustExec(t, c, "CREATE SEQUENCE IF NOT EXISTS locks6_seq")

	checkReject := func(what string, err error) {
		t.Helper()
		pe := testenv.PgError(err)
		if pe == nil || pe.Code != "0A000" {
			t.Errorf("%s: got %v, want SQLSTATE 0A000", what, err)
			return
		}
		if !strings.HasPrefix(pe.Message, "lockpool:") {
			t.Errorf("%s: message %q does not start with lockpool:", what, pe.Message)
		}
		if !strings.Contains(pe.Hint, "pg_advisory_xact_lock") || !strings.Contains(pe.Hint, "lease_acquire") {
			t.Errorf("%s: hint %q does not name pg_advisory_xact_lock and lease_acquire", what, pe.Hint)
		}
	}
	// usable checks that the session works and its transaction is idle.
	usable := func(what string) {
		t.Helper()
		var n int
		if err := c.QueryRow(ctx, "SELECT 1").Scan(&n); err != nil || n != 1 {
			t.Fatalf("%s: the session is not usable afterwards: %v", what, err)
		}
		if st := c.PgConn().TxStatus(); st != 'I' {
			t.Fatalf("%s: client transaction status %q, want idle", what, st)
		}
	}

	want := map[string]int{}
	funcs := []string{"pg_advisory_lock", "pg_advisory_lock_shared", "pg_try_advisory_lock", "pg_try_advisory_lock_shared"}
	modes := []struct {
		name string
		mode pgx.QueryExecMode
	}{
		{"simple", pgx.QueryExecModeSimpleProtocol},
		{"extended", pgx.QueryExecModeCacheStatement},
		{"extended unnamed", pgx.QueryExecModeExec},
	}
	k := int64(6000001)
	for _, fn := range funcs {
		for _, m := range modes {
			k++
			// Outside a transaction: nothing reaches the server (the
			// sequence would advance).
			sql := fmt.Sprintf("SELECT %s($1::bigint) FROM (SELECT nextval('locks6_seq')) s", fn)
			_, err := c.Exec(ctx, sql, m.mode, k)
			checkReject(fmt.Sprintf("%s (%s)", fn, m.name), err)
			want[fn]++
			usable(fmt.Sprintf("%s (%s)", fn, m.name))
			if hs := lkHolders(t, su, lkKey1(k)); len(hs) != 0 {
				t.Errorf("%s (%s): key held by %v after the rejection", fn, m.name, hs)
			}

			// Inside a transaction: the server's transaction is aborted too.
			tx, err := c.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "SELECT 1 FROM pg_class LIMIT 1", m.mode); err != nil {
				t.Fatal(err)
			}
			_, err = tx.Exec(ctx, sql, m.mode, k)
			checkReject(fmt.Sprintf("%s (%s) in BEGIN", fn, m.name), err)
			want[fn]++
			if st := c.PgConn().TxStatus(); st != 'E' {
				t.Errorf("%s (%s) in BEGIN: client transaction status %q after the rejection, want E (failed)", fn, m.name, st)
			}
			_, err = tx.Exec(ctx, "SELECT $1::int", m.mode, 1)
			if s := sqlState(err); s != "25P02" {
				t.Errorf("%s (%s) in BEGIN: the next statement got %v, want 25P02", fn, m.name, err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatalf("%s (%s): ROLLBACK: %v", fn, m.name, err)
			}
			usable(fmt.Sprintf("%s (%s) after ROLLBACK", fn, m.name))
		}
	}
	// Spellings: case, quoting, schema, two keys, multi-statement.
	for _, tc := range []struct{ fn, sql string }{
		{"pg_advisory_lock", "SELECT PG_CATALOG.PG_ADVISORY_LOCK(6000101)"},
		{"pg_advisory_lock", `SELECT "pg_advisory_lock"(6, 102)`},
		{"pg_try_advisory_lock", "SELECT 1; SELECT pg_try_advisory_lock(6000103)"},
		{"pg_advisory_lock_shared", "SELECT x FROM (SELECT 1 AS x) s WHERE pg_advisory_lock_shared(6000104) IS NOT NULL"},
	} {
		_, err := c.Exec(ctx, tc.sql)
		checkReject(tc.sql, err)
		want[tc.fn]++
		usable(tc.sql)
	}
	// A simple multi-statement query inside BEGIN.
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	_, err := c.Exec(ctx, "SELECT 1; SELECT pg_advisory_lock(6000105)")
	checkReject("multi-statement in BEGIN", err)
	want["pg_advisory_lock"]++
	if _, err := c.Exec(ctx, "SELECT 1"); sqlState(err) != "25P02" {
		t.Errorf("after a rejection inside BEGIN (simple, no args): %v, want 25P02", err)
	}
	lkMustExec(t, c, "ROLLBACK")
	usable("ROLLBACK after multi-statement")

	var called bool
	if err := su.QueryRow(ctx, "SELECT is_called FROM locks6_seq").Scan(&called); err != nil {
		t.Fatal(err)
	}
	if called {
		t.Errorf("locks6_seq advanced: a rejected statement reached the server")
	}

	// Transaction-level locks work, in both protocols.
	for _, m := range modes {
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1::bigint)", m.mode, int64(6000201)); err != nil {
			t.Fatalf("xact_lock (%s): %v", m.name, err)
		}
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock_shared($1::bigint)", m.mode, int64(6000202)); err != nil {
			t.Fatalf("xact_lock_shared (%s): %v", m.name, err)
		}
		var a, b bool
		if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1::bigint), pg_try_advisory_xact_lock_shared($2::bigint)", m.mode, int64(6000203), int64(6000204)).Scan(&a, &b); err != nil || !a || !b {
			t.Fatalf("try xact locks (%s): %v %v %v", m.name, a, b, err)
		}
		var n int64
		if err := tx.QueryRow(ctx, lkOwnAdvisorySQL, m.mode).Scan(&n); err != nil || n != 4 {
			t.Fatalf("xact locks (%s): own backend holds %d advisory locks (%v), want 4", m.name, n, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("xact locks (%s): COMMIT: %v", m.name, err)
		}
		for _, k := range []int64{6000201, 6000202, 6000203, 6000204} {
			if hs := lkHolders(t, su, lkKey1(k)); len(hs) != 0 {
				t.Errorf("xact lock %d still held by %v after COMMIT", k, hs)
			}
		}
	}
	// Outside an explicit transaction too (the statement's own transaction).
	lkMustExec(t, c, "SELECT pg_advisory_xact_lock(6000205)")
	// Unlocks are not acquires: they are forwarded and find nothing.
	if lkMustBool(t, c, "SELECT pg_advisory_unlock(6000206)") {
		t.Errorf("pg_advisory_unlock of a key nobody holds returned true")
	}
	lkMustExec(t, c, "SELECT pg_advisory_unlock_all()")
	usable("xact locks")
	if g := l.Pinned(app, ""); g != 0 {
		t.Errorf("lockpool_pinned_sessions = %v under reject, want 0", g)
	}

	for _, fn := range append(funcs, "pg_advisory_xact_lock", "pg_advisory_xact_lock_shared", "pg_try_advisory_xact_lock", "pg_try_advisory_xact_lock_shared", "pg_advisory_unlock", "pg_advisory_unlock_all") {
		got := l.metric("lockpool_advisory_locks_rejected_total", map[string]string{"app": app, "function": fn})
		if int(got) != want[fn] {
			t.Errorf("lockpool_advisory_locks_rejected_total{function=%q} = %v, want %d", fn, got, want[fn])
		}
	}
}
