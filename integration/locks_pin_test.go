package integration

// A session-level advisory lock pins its session
// exactly as long as the server says something is held.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/testenv"
)

// A lock outlives its transaction; nobody else's transaction
// ever runs on the holder's backend.
func TestLocksOutliveTransaction(t *testing.T) {
	t.Parallel()
	const app = "lk1"
	l := startLockpool(t, 10, "", lkApp(app, "app", 3, 2, "pin", "20s"))
	su := superConn(t, "appdb")
	ctx := testenv.Context(t, 120*time.Second)
	var h int32
	if err := su.QueryRow(ctx, "SELECT hashtext('report-daily')").Scan(&h); err != nil {
		t.Fatal(err)
	}
	key := lkKey2(7742, h)
	const lockSQL = "SELECT pg_advisory_lock(7742, hashtext('report-daily')); COMMIT;"
	const trySQL = "SELECT pg_try_advisory_lock(7742, hashtext('report-daily'))"
	const unlockSQL = "SELECT pg_advisory_unlock(7742, hashtext('report-daily'))"

	a := l.connect(t, "app", "appdb")
	lkMustExec(t, a, lockSQL)
	if g := l.Pinned(app, ""); g != 1 {
		t.Fatalf("after A's lock: lockpool_pinned_sessions = %v, want 1", g)
	}
	pidA := testenv.BackendPID(t, a)
	if hs := lkHolders(t, su, key); len(hs) != 1 || hs[0] != pidA {
		t.Fatalf("holders of %v = %v, want A's backend %d", key, hs, pidA)
	}
	// pinnedPID is A's backend while A holds the lock (0 otherwise): no
	// other transaction may run there meanwhile.
	var pinnedPID atomic.Uint32
	pinnedPID.Store(pidA)

	// 20 other clients, 500 transactions: their backends never hold an
	// advisory lock, and never are A's backend.
	const nOthers, nTx = 20, 500
	others := make([]*pgx.Conn, nOthers)
	for i := range others {
		others[i] = l.connect(t, "app", "appdb")
	}
	var committed atomic.Int64
	var wg sync.WaitGroup
	var next atomic.Int64
	for i := range others {
		wg.Add(1)
		go func(c *pgx.Conn) {
			defer wg.Done()
			for next.Add(1) <= nTx {
				bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				tx, err := c.Begin(bctx)
				cancel()
				if err != nil {
					t.Errorf("other client BEGIN: %v (pool stats %+v; %s)", err, l.srv.Pool().Stats(app), testenv.DumpGoroutines(t))
					return
				}
				var n int64
				var pid int32
				err = tx.QueryRow(ctx, "SELECT ("+lkOwnAdvisorySQL+"), pg_backend_pid()").Scan(&n, &pid)
				if err != nil {
					t.Errorf("other client: %v", err)
					_ = tx.Rollback(ctx)
					return
				}
				if n != 0 {
					t.Errorf("another client's transaction runs on backend %d that holds %d advisory locks", pid, n)
				}
				if p := pinnedPID.Load(); p != 0 && uint32(pid) == p {
					t.Errorf("another client's transaction runs on A's pinned backend %d", pid)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Errorf("other client COMMIT: %v", err)
					return
				}
				committed.Add(1)
			}
		}(others[i])
	}

	// Meanwhile B probes the lock.
	b := l.connect(t, "app", "appdb")
	if lkMustBool(t, b, trySQL) {
		t.Fatal("B's pg_try_advisory_lock succeeded while A holds the lock")
	}
	if g := l.Pinned(app, ""); g != 1 {
		t.Errorf("after B's failed try-lock: lockpool_pinned_sessions = %v, want 1 (only A)", g)
	}
	if p := l.srv.Pool().Stats(app).Pinned; p != 1 {
		t.Errorf("after B's failed try-lock: %d pin slots held, want 1", p)
	}
	if got := testenv.BackendPID(t, a); got != pidA {
		t.Fatalf("A moved from backend %d to %d while holding a lock", pidA, got)
	}
	pinnedPID.Store(0)
	if !lkMustBool(t, a, unlockSQL) {
		t.Fatal("A's pg_advisory_unlock returned false")
	}
	if g := l.Pinned(app, ""); g != 0 {
		t.Errorf("after A's unlock: lockpool_pinned_sessions = %v, want 0", g)
	}
	if !lkMustBool(t, b, trySQL) {
		t.Fatal("B's pg_try_advisory_lock failed after A unlocked")
	}
	if !lkMustBool(t, b, unlockSQL) {
		t.Fatal("B's unlock returned false")
	}

	// A re-locks (inside an explicit transaction this time) and disconnects.
	lkMustExec(t, a, "BEGIN; SELECT pg_advisory_lock(7742, hashtext('report-daily')); COMMIT;")
	if lkMustBool(t, b, trySQL) {
		t.Fatal("B's pg_try_advisory_lock succeeded after A re-locked")
	}
	pidA = testenv.BackendPID(t, a)
	pinnedPID.Store(pidA)
	if hs := lkHolders(t, su, key); len(hs) != 1 || hs[0] != pidA {
		t.Fatalf("holders of %v = %v after A re-locked, want A's backend %d", key, hs, pidA)
	}
	pinnedPID.Store(0)
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, "the lock to be free after A disconnected", func() bool {
		return len(lkHolders(t, su, key)) == 0
	})
	if !lkMustBool(t, b, trySQL) {
		t.Fatal("B's pg_try_advisory_lock failed after A disconnected")
	}
	if !lkMustBool(t, b, unlockSQL) {
		t.Fatal("B's unlock returned false")
	}
	wg.Wait()
	if n := committed.Load(); n != nTx {
		t.Fatalf("%d of %d other transactions committed", n, nTx)
	}
	if g := l.Pinned(app, ""); g != 0 {
		t.Errorf("at the end: lockpool_pinned_sessions = %v, want 0", g)
	}
}

// The unlock after 50 other transactions on the holder's own
// session lands on the holder's backend and unpins.
func TestLocksUnlockAfterOwnTransactions(t *testing.T) {
	t.Parallel()
	const app = "lk2"
	l := startLockpool(t, 10, "", lkApp(app, "app", 3, 1, "pin", "10s"))
	su := superConn(t, "appdb")
	ctx := testenv.Context(t, 60*time.Second)
	const k = 2000001
	key := lkKey1(k)

	a := l.connect(t, "app", "appdb")
	lkMustExec(t, a, fmt.Sprintf("SELECT pg_advisory_lock(%d)", k))
	pidA := testenv.BackendPID(t, a)
	if g := l.Pinned(app, ""); g != 1 {
		t.Fatalf("lockpool_pinned_sessions = %v after the lock, want 1", g)
	}
	// Ordinary traffic from someone else in parallel.
	other := l.connect(t, "app", "appdb")
	for i := 0; i < 50; i++ {
		tx, err := a.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var pid int32
		var n int64
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid(), ("+lkOwnAdvisorySQL+")").Scan(&pid, &n); err != nil {
			t.Fatal(err)
		}
		if uint32(pid) != pidA || n != 1 {
			t.Fatalf("transaction %d of A ran on backend %d holding %d advisory locks; want A's backend %d holding 1", i, pid, n, pidA)
		}
		if _, err := tx.Exec(ctx, "SELECT $1::int", i); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		var on int64
		if err := other.QueryRow(ctx, lkOwnAdvisorySQL).Scan(&on); err != nil || on != 0 {
			t.Fatalf("other client's backend holds %d advisory locks (%v)", on, err)
		}
	}
	if g := l.Pinned(app, ""); g != 1 {
		t.Fatalf("lockpool_pinned_sessions = %v after 50 transactions, want 1", g)
	}
	if !lkMustBool(t, a, fmt.Sprintf("SELECT pg_advisory_unlock(%d)", k)) {
		t.Fatal("pg_advisory_unlock after 50 transactions returned false")
	}
	if g := l.Pinned(app, ""); g != 0 {
		t.Errorf("lockpool_pinned_sessions = %v after the unlock, want 0", g)
	}
	if p := l.srv.Pool().Stats(app).Pinned; p != 0 {
		t.Errorf("%d pin slots held after the unlock, want 0", p)
	}
	if hs := lkHolders(t, su, key); len(hs) != 0 {
		t.Errorf("key still held by %v after the unlock", hs)
	}
}

// lkExpectPinned checks the gauge and the pin slots of app.
func lkExpectPinned(t *testing.T, l *lp, app string, want int, when string) {
	t.Helper()
	if g := l.Pinned(app, ""); g != float64(want) {
		t.Errorf("%s: lockpool_pinned_sessions = %v, want %d", when, g, want)
	}
	if p := l.srv.Pool().Stats(app).Pinned; p != want {
		t.Errorf("%s: %d pin slots held, want %d", when, p, want)
	}
}

// Pins are exact.
func TestLocksPinExactness(t *testing.T) {
	t.Parallel()
	const app = "lk3"
	l := startLockpool(t, 10, "", lkApp(app, "app", 4, 3, "pin", "5s"))
	su := superConn(t, "appdb")

	t.Run("stacked", func(t *testing.T) {
		const k = 3000001
		c := l.connect(t, "app", "appdb")
		pins0 := l.metric("lockpool_pins_total", map[string]string{"app": app})
		lkMustExec(t, c, fmt.Sprintf("SELECT pg_advisory_lock(%d)", k))
		pid := testenv.BackendPID(t, c)
		lkExpectPinned(t, l, app, 1, "lock(k)")
		lkMustExec(t, c, fmt.Sprintf("SELECT pg_advisory_lock(%d)", k))
		lkExpectPinned(t, l, app, 1, "lock(k); lock(k)")
		if !lkMustBool(t, c, fmt.Sprintf("SELECT pg_advisory_unlock(%d)", k)) {
			t.Fatal("first unlock returned false")
		}
		lkExpectPinned(t, l, app, 1, "lock(k); lock(k); unlock(k)")
		if hs := lkHolders(t, su, lkKey1(k)); len(hs) != 1 || hs[0] != pid {
			t.Fatalf("after one of two unlocks: holders %v, want [%d]", hs, pid)
		}
		if got := testenv.BackendPID(t, c); got != pid {
			t.Fatalf("session moved from backend %d to %d while still holding a stacked lock", pid, got)
		}
		if !lkMustBool(t, c, fmt.Sprintf("SELECT pg_advisory_unlock(%d)", k)) {
			t.Fatal("second unlock returned false")
		}
		lkExpectPinned(t, l, app, 0, "second unlock")
		if hs := lkHolders(t, su, lkKey1(k)); len(hs) != 0 {
			t.Fatalf("holders %v after the second unlock", hs)
		}
		if lkMustBool(t, c, fmt.Sprintf("SELECT pg_advisory_unlock(%d)", k)) {
			t.Fatal("a third unlock returned true")
		}
		lkExpectPinned(t, l, app, 0, "third unlock")
		if d := l.metric("lockpool_pins_total", map[string]string{"app": app}) - pins0; d != 1 {
			t.Errorf("lockpool_pins_total grew by %v, want 1", d)
		}
	})

	t.Run("plain unnamed statement after an unnamed lock call", func(t *testing.T) {
		// A plain statement parsed before, sent again on the unnamed
		// statement right after an unnamed lock call: lockpool remembers
		// it needs no look, and its Bind must not take the lock call's
		// findings (which would ask for a pin slot).
		const k = 3000009
		ctx := testenv.Context(t, 15*time.Second)
		c := l.connect(t, "app", "appdb")
		plain := func() {
			t.Helper()
			var v int
			if err := c.QueryRow(ctx, "SELECT $1::int + 1", pgx.QueryExecModeExec, 1).Scan(&v); err != nil || v != 2 {
				t.Fatalf("plain statement: %d, %v", v, err)
			}
		}
		plain()
		if !lkMustBool(t, c, "SELECT pg_try_advisory_lock($1)", pgx.QueryExecModeExec, int64(k)) {
			t.Fatal("try-lock on a free key failed")
		}
		lkExpectPinned(t, l, app, 1, "try-lock (extended, unnamed)")
		if !lkMustBool(t, c, "SELECT pg_advisory_unlock($1)", int64(k)) {
			t.Fatal("unlock returned false")
		}
		lkExpectPinned(t, l, app, 0, "unlock")
		immediate := map[string]string{"app": app, "outcome": "immediate"}
		waits0 := l.metric("lockpool_pin_waits_total", immediate)
		plain()
		if d := l.metric("lockpool_pin_waits_total", immediate) - waits0; d != 0 {
			t.Errorf("the plain statement asked for a pin slot (%v times)", d)
		}
		lkExpectPinned(t, l, app, 0, "plain statement after the lock call")
	})

	t.Run("failed try-lock", func(t *testing.T) {
		const k = 3000002
		holder := l.connect(t, "app", "appdb")
		c := l.connect(t, "app", "appdb")
		if !lkMustBool(t, holder, fmt.Sprintf("SELECT pg_try_advisory_lock(%d)", k)) {
			t.Fatal("holder's try-lock failed")
		}
		lkExpectPinned(t, l, app, 1, "holder's try-lock")
		// Simple, extended (cached statement), extended (unnamed).
		if lkMustBool(t, c, fmt.Sprintf("SELECT pg_try_advisory_lock(%d)", k)) {
			t.Fatal("try-lock succeeded on a held key")
		}
		lkExpectPinned(t, l, app, 1, "failed try-lock (simple)")
		if lkMustBool(t, c, "SELECT pg_try_advisory_lock($1)", int64(k)) {
			t.Fatal("try-lock succeeded on a held key")
		}
		lkExpectPinned(t, l, app, 1, "failed try-lock (extended $1)")
		if lkMustBool(t, c, "SELECT pg_try_advisory_lock($1)", pgx.QueryExecModeExec, int64(k)) {
			t.Fatal("try-lock succeeded on a held key")
		}
		lkExpectPinned(t, l, app, 1, "failed try-lock (extended, unnamed)")
		if lkMustBool(t, c, "SELECT pg_try_advisory_lock_shared($1)", int64(k)) {
			t.Fatal("try-lock-shared succeeded on a key held exclusively")
		}
		lkExpectPinned(t, l, app, 1, "failed try-lock-shared")
		var n int64
		if err := c.QueryRow(testenv.Context(t, 10*time.Second), lkOwnAdvisorySQL).Scan(&n); err != nil || n != 0 {
			t.Fatalf("the failed try-locker's next backend holds %d advisory locks (%v)", n, err)
		}
		if !lkMustBool(t, holder, fmt.Sprintf("SELECT pg_advisory_unlock(%d)", k)) {
			t.Fatal("holder's unlock returned false")
		}
		lkExpectPinned(t, l, app, 0, "holder's unlock")
	})

	t.Run("unlock_all", func(t *testing.T) {
		c := l.connect(t, "app", "appdb")
		lkMustExec(t, c, "SELECT pg_advisory_lock(3000003)")
		if !lkMustBool(t, c, "SELECT pg_try_advisory_lock(3000004)") {
			t.Fatal("try-lock failed")
		}
		lkMustExec(t, c, "SELECT pg_advisory_lock_shared(3000005)")
		lkMustExec(t, c, "SELECT pg_advisory_lock(3, 7)")
		lkMustExec(t, c, "SELECT pg_advisory_lock(3000003)")
		lkExpectPinned(t, l, app, 1, "five locks")
		lkMustExec(t, c, "SELECT pg_advisory_unlock_all()")
		lkExpectPinned(t, l, app, 0, "pg_advisory_unlock_all")
		for _, k := range []lkKey{lkKey1(3000003), lkKey1(3000004), lkKey1(3000005), lkKey2(3, 7)} {
			if hs := lkHolders(t, su, k); len(hs) != 0 {
				t.Errorf("key %v still held by %v after unlock_all", k, hs)
			}
		}
	})

	t.Run("shared", func(t *testing.T) {
		const k = 3000006
		c := l.connect(t, "app", "appdb")
		d := l.connect(t, "app", "appdb")
		e := l.connect(t, "app", "appdb")
		// c and d pinned, e's try-lock holds the third pin slot while it runs.
		lkMustExec(t, c, fmt.Sprintf("SELECT pg_advisory_lock_shared(%d)", k))
		lkMustExec(t, c, fmt.Sprintf("SELECT pg_advisory_lock_shared(%d)", k))
		lkExpectPinned(t, l, app, 1, "c: lock_shared twice")
		if !lkMustBool(t, d, fmt.Sprintf("SELECT pg_try_advisory_lock_shared(%d)", k)) {
			t.Fatal("d: try_lock_shared failed on a shared-held key")
		}
		lkExpectPinned(t, l, app, 2, "d: try_lock_shared")
		if lkMustBool(t, e, fmt.Sprintf("SELECT pg_try_advisory_lock(%d)", k)) {
			t.Fatal("e: exclusive try-lock succeeded on a shared-held key")
		}
		lkExpectPinned(t, l, app, 2, "e: failed exclusive try-lock")
		if hs := lkHolders(t, su, lkKey1(k)); len(hs) != 2 {
			t.Fatalf("holders %v, want c and d", hs)
		}
		if !lkMustBool(t, c, fmt.Sprintf("SELECT pg_advisory_unlock_shared(%d)", k)) {
			t.Fatal("c: first unlock_shared false")
		}
		lkExpectPinned(t, l, app, 2, "c: one of two unlock_shared")
		if !lkMustBool(t, c, fmt.Sprintf("SELECT pg_advisory_unlock_shared(%d)", k)) {
			t.Fatal("c: second unlock_shared false")
		}
		lkExpectPinned(t, l, app, 1, "c: second unlock_shared")
		if !lkMustBool(t, d, fmt.Sprintf("SELECT pg_advisory_unlock_shared(%d)", k)) {
			t.Fatal("d: unlock_shared false")
		}
		lkExpectPinned(t, l, app, 0, "d: unlock_shared")
	})

	t.Run("two-key", func(t *testing.T) {
		c := l.connect(t, "app", "appdb")
		lkMustExec(t, c, "SELECT pg_advisory_lock(3, 5)")
		if !lkMustBool(t, c, "SELECT pg_try_advisory_lock(3, 6)") {
			t.Fatal("try-lock (3, 6) failed")
		}
		lkExpectPinned(t, l, app, 1, "two two-key locks")
		if !lkMustBool(t, c, "SELECT pg_advisory_unlock(3, 5)") {
			t.Fatal("unlock (3, 5) false")
		}
		lkExpectPinned(t, l, app, 1, "one of two two-key unlocks")
		if !lkMustBool(t, c, "SELECT pg_advisory_unlock($1::int4, $2::int4)", int32(3), int32(6)) {
			t.Fatal("unlock (3, 6) false")
		}
		lkExpectPinned(t, l, app, 0, "both two-key unlocks")
		if hs := lkHolders(t, su, lkKey2(3, 5)); len(hs) != 0 {
			t.Errorf("(3,5) held by %v", hs)
		}
	})

	for _, mode := range []struct {
		name string
		args []any
	}{
		{"extended $1", nil},
		{"extended unnamed $1", []any{pgx.QueryExecModeExec}},
		{"simple with args", []any{pgx.QueryExecModeSimpleProtocol}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			k := int64(3000010)
			switch mode.name {
			case "extended unnamed $1":
				k = 3000011
			case "simple with args":
				k = 3000012
			}
			args := func(v ...any) []any { return append(append([]any{}, mode.args...), v...) }
			c := l.connect(t, "app", "appdb")
			lkMustExec(t, c, "SELECT pg_advisory_lock($1)", args(k)...)
			pid := testenv.BackendPID(t, c)
			lkExpectPinned(t, l, app, 1, "lock($1)")
			if hs := lkHolders(t, su, lkKey1(k)); len(hs) != 1 || hs[0] != pid {
				t.Fatalf("holders %v, want [%d]", hs, pid)
			}
			lkMustExec(t, c, "SELECT pg_advisory_lock($1)", args(k)...)
			if !lkMustBool(t, c, "SELECT pg_advisory_unlock($1)", args(k)...) {
				t.Fatal("unlock($1) false")
			}
			lkExpectPinned(t, l, app, 1, "lock($1); lock($1); unlock($1)")
			if !lkMustBool(t, c, "SELECT pg_advisory_unlock($1)", args(k)...) {
				t.Fatal("second unlock($1) false")
			}
			lkExpectPinned(t, l, app, 0, "second unlock($1)")
			// A failed try-lock through parameters leaves nothing pinned.
			holder := l.connect(t, "app", "appdb")
			lkMustExec(t, holder, fmt.Sprintf("SELECT pg_advisory_lock(%d)", k))
			if lkMustBool(t, c, "SELECT pg_try_advisory_lock($1)", args(k)...) {
				t.Fatal("try-lock($1) succeeded on a held key")
			}
			lkExpectPinned(t, l, app, 1, "failed try-lock($1)")
			lkMustExec(t, holder, "SELECT pg_advisory_unlock_all()")
			lkExpectPinned(t, l, app, 0, "holder's unlock_all")
		})
	}

	t.Run("expressions and positions", func(t *testing.T) {
		c := l.connect(t, "app", "appdb")
		cases := []struct{ lock, unlock string }{
			{"SELECT pg_advisory_lock(k) FROM (VALUES (3000020::bigint)) v(k)", "SELECT pg_advisory_unlock(3000020)"},
			{"SELECT CASE WHEN true THEN pg_try_advisory_lock(abs(-3000021)) END", "SELECT pg_advisory_unlock(3000021)"},
			{"WITH x AS (SELECT pg_catalog.PG_ADVISORY_LOCK(3000022)) SELECT 1 FROM x", "SELECT \"pg_advisory_unlock\"(3000022)"},
			{"SELECT 1 FROM pg_advisory_lock(hashtext('locks-3-expr'))", "SELECT pg_advisory_unlock(hashtext('locks-3-expr'))"},
			{"SELECT 1; SELECT pg_advisory_lock(3000023)", "SELECT 2; SELECT pg_advisory_unlock(3000023)"},
			{"DO $$BEGIN PERFORM pg_advisory_lock(3000024); END$$", "DO $$BEGIN PERFORM pg_advisory_unlock(3000024); END$$"},
		}
		for _, tc := range cases {
			lkMustExec(t, c, tc.lock)
			lkExpectPinned(t, l, app, 1, tc.lock)
			lkMustExec(t, c, tc.unlock)
			lkExpectPinned(t, l, app, 0, tc.unlock)
		}
		// Lock and unlock in one statement: nothing is held afterwards.
		lkMustExec(t, c, "SELECT pg_advisory_lock(3000025), pg_advisory_unlock(3000025)")
		lkExpectPinned(t, l, app, 0, "lock and unlock in one statement")
		// A transaction-level lock never pins.
		lkMustExec(t, c, "BEGIN; SELECT pg_advisory_xact_lock(3000026); COMMIT")
		lkExpectPinned(t, l, app, 0, "xact lock")
		var n int64
		if err := c.QueryRow(context.Background(), lkOwnAdvisorySQL).Scan(&n); err != nil || n != 0 {
			t.Fatalf("backend holds %d advisory locks (%v)", n, err)
		}
	})
}
