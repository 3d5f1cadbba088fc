package integration

// Lock waiters and lock holders cannot take an
// application's whole pool.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/testenv"
)

// lkSampler runs check every interval until stop is called.
func lkSampler(interval time.Duration, check func()) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tk := time.NewTicker(interval)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
				check()
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); <-finished }) }
}

// lkRunTxns runs n short transactions spread over clients and returns how
// many committed. Every transaction checks that its backend holds no
// advisory lock.
func lkRunTxns(ctx context.Context, t *testing.T, clients []*pgx.Conn, n int) int64 {
	var next, committed atomic.Int64
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func(c *pgx.Conn) {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				tx, err := c.Begin(ctx)
				if err != nil {
					t.Errorf("ordinary transaction BEGIN: %v", err)
					return
				}
				var held int64
				if err := tx.QueryRow(ctx, lkOwnAdvisorySQL).Scan(&held); err != nil {
					t.Errorf("ordinary transaction: %v", err)
					_ = tx.Rollback(ctx)
					return
				}
				if held != 0 {
					t.Errorf("an ordinary transaction's backend holds %d advisory locks", held)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Errorf("ordinary transaction COMMIT: %v", err)
					return
				}
				committed.Add(1)
			}
		}(c)
	}
	wg.Wait()
	return committed.Load()
}

const lk4LockSQL = "SELECT pg_advisory_lock($1::int4, $2::int4)"

// Waiters cannot exhaust the pool.
func TestLocksWaitersCannotExhaustPool(t *testing.T) {
	t.Parallel()
	const (
		app   = "lk4"
		nw    = 10
		waitT = 25 * time.Second
		hold  = 1200 * time.Millisecond
	)
	l := startLockpool(t, 10, "", lkApp(app, "app", 4, 2, "pin", "25s"))
	su := superConn(t, "appdb")
	sampleSU := superConn(t, "appdb")
	ctx := testenv.Context(t, 120*time.Second)
	key := lkKey2(13, 1)

	holder := l.connect(t, "app", "appdb")
	lkMustExec(t, holder, "SELECT pg_advisory_lock(13, 1)")
	if p := l.srv.Pool().Stats(app).Pinned; p != 1 {
		t.Fatalf("holder: %d pin slots held, want 1", p)
	}

	// Invariants sampled throughout.
	var maxPinned, maxServerWaiters atomic.Int64
	stopSampler := lkSampler(5*time.Millisecond, func() {
		st := l.srv.Pool().Stats(app)
		if int64(st.Pinned) > maxPinned.Load() {
			maxPinned.Store(int64(st.Pinned))
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		rows, err := lkLocks(sctx, sampleSU, key)
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("sampler: %v", err)
			}
			return
		}
		w := int64(0)
		for _, r := range rows {
			if !r.granted {
				w++
			}
		}
		if w > maxServerWaiters.Load() {
			maxServerWaiters.Store(w)
		}
	})
	defer stopSampler()

	type result struct {
		start, got, released, end time.Time
		err                       error
	}
	results := make([]result, nw)
	conns := make([]*pgx.Conn, nw)
	for i := range conns {
		conns[i] = l.connect(t, "app", "appdb")
		// Prepare the cached statements now, so the waiters' statements go
		// straight to Bind.
		if i%2 == 1 {
			if _, err := conns[i].Prepare(ctx, lk4LockSQL, lk4LockSQL); err != nil {
				t.Fatal(err)
			}
		}
	}
	var wg sync.WaitGroup
	for i := 0; i < nw; i++ {
		wg.Add(1)
		results[i].start = time.Now()
		go func(i int) {
			defer wg.Done()
			c := conns[i]
			r := &results[i]
			var err error
			if i%2 == 0 {
				_, err = c.Exec(ctx, "SELECT pg_advisory_lock(13, 1)")
			} else {
				_, err = c.Exec(ctx, lk4LockSQL, int32(13), int32(1))
			}
			r.end = time.Now()
			if err != nil {
				r.err = err
				return
			}
			r.got = r.end
			time.Sleep(hold)
			r.released = time.Now()
			ok, err := lkBool(ctx, c, "SELECT pg_advisory_unlock(13, 1)")
			if err != nil || !ok {
				t.Errorf("waiter %d: unlock = %v, %v", i, ok, err)
			}
		}(i)
		if i == 0 {
			eventually(t, 10*time.Second, "the first waiter to wait in the server", func() bool { return lkWaiting(t, su, key) == 1 })
		} else {
			eventually(t, 10*time.Second, fmt.Sprintf("waiter %d to queue for a pin slot", i), func() bool {
				return l.srv.Pool().Stats(app).PinWaiting == i
			})
		}
	}
	st := l.srv.Pool().Stats(app)
	if st.Pinned != 2 || st.PinWaiting != nw-1 || st.InUse != 2 {
		t.Errorf("with %d waiters: pool stats %+v; want 2 pins, %d pin waiters, 2 connections in use (the others wait holding none)", nw, st, nw-1)
	}
	if n := lkWaiting(t, su, key); n != 1 {
		t.Errorf("%d backends wait for the lock in the server, want 1", n)
	}

	// 1,000 ordinary transactions of the same application commit meanwhile.
	txClients := make([]*pgx.Conn, 4)
	for i := range txClients {
		txClients[i] = l.connect(t, "app", "appdb")
	}
	t0 := time.Now()
	if n := lkRunTxns(ctx, t, txClients, 1000); n != 1000 {
		t.Fatalf("%d of 1000 ordinary transactions committed while waiters waited", n)
	}
	txDone := time.Now()
	t.Logf("1000 ordinary transactions took %v", txDone.Sub(t0))
	if st := l.srv.Pool().Stats(app); st.PinWaiting != nw-1 {
		t.Fatalf("after the ordinary transactions: %d pin waiters, want %d (the transactions took %v; too slow for wait_timeout %v?)", st.PinWaiting, nw-1, txDone.Sub(t0), waitT)
	}

	// Unlock at a time that puts the wait_timeout boundary in the middle of
	// one waiter's hold: waiter k (k >= 1) gets its slot about
	// unlock + (k-1)*hold and times out at start_k + wait_timeout.
	first := results[1].start
	m := int((first.Add(waitT).Add(-hold/2).Sub(txDone))/hold) + 1
	if m < 2 {
		t.Fatalf("not enough time left to see two waiters served (ordinary transactions took %v)", txDone.Sub(t0))
	}
	if m > nw-1 {
		m = nw - 1
	}
	unlockAt := first.Add(waitT).Add(-hold / 2).Add(-time.Duration(m-1) * hold)
	time.Sleep(time.Until(unlockAt))
	if !lkMustBool(t, holder, "SELECT pg_advisory_unlock(13, 1)") {
		t.Fatal("holder's unlock returned false")
	}
	wg.Wait()
	stopSampler()

	// Outcomes: a prefix of the queue got the lock, one after another; the
	// rest got 53300 after wait_timeout.
	var served []int
	lastOK := -1
	for i, r := range results {
		if r.err == nil {
			if lastOK != i-1 {
				t.Errorf("waiter %d got the lock after waiter %d timed out: not served in order", i, i-1)
			}
			lastOK = i
			served = append(served, i)
			continue
		}
		pe := testenv.PgError(r.err)
		if pe == nil || pe.Code != "53300" {
			t.Errorf("waiter %d: %v, want the lock or SQLSTATE 53300", i, r.err)
			continue
		}
		if !strings.HasPrefix(pe.Message, "lockpool:") || pe.Hint == "" {
			t.Errorf("waiter %d: 53300 %q hint %q: want a lockpool: message and a hint", i, pe.Message, pe.Hint)
		}
		if el := r.end.Sub(r.start); el < waitT-100*time.Millisecond || el > waitT+2*time.Second {
			t.Errorf("waiter %d got 53300 after %v, want about wait_timeout %v", i, el, waitT)
		}
	}
	for j := 1; j < len(served); j++ {
		a, b := results[served[j-1]], results[served[j]]
		if b.got.Before(a.released) {
			t.Errorf("waiter %d got the lock at %v, before waiter %d released it at %v", served[j], b.got.Sub(t0), served[j-1], a.released.Sub(t0))
		}
	}
	t.Logf("served %v (expected waiters 0..%d), timed out %d", served, m, nw-len(served))
	if len(served) < 3 {
		t.Errorf("only waiters %v got the lock; want at least 0, 1, 2 one after another", served)
	}
	if d := len(served) - 1 - m; d < -1 || d > 1 {
		t.Errorf("waiters 0..%d got the lock; expected about 0..%d from the timing", len(served)-1, m)
	}
	if mp := maxPinned.Load(); mp > 2 {
		t.Errorf("up to %d pin slots were held at once, max_pinned is 2", mp)
	}
	if mw := maxServerWaiters.Load(); mw > 1 {
		t.Errorf("up to %d backends waited for the lock in the server at once; want at most 1 (the other waiters must wait in lockpool)", mw)
	}
	timeouts := l.metric("lockpool_pin_waits_total", map[string]string{"app": app, "outcome": "timeout"})
	if int(timeouts) != nw-len(served) {
		t.Errorf("lockpool_pin_waits_total{outcome=timeout} = %v, want %d", timeouts, nw-len(served))
	}
	waited := l.metric("lockpool_pin_waits_total", map[string]string{"app": app, "outcome": "waited"})
	if int(waited) != len(served)-1 {
		t.Errorf("lockpool_pin_waits_total{outcome=waited} = %v, want %d", waited, len(served)-1)
	}
	eventually(t, time.Second, "no pins left", func() bool {
		return l.Pinned(app, "") == 0 && l.srv.Pool().Stats(app).Pinned == 0
	})
	if hs := lkHolders(t, su, key); len(hs) != 0 {
		t.Errorf("(13, 1) still held by %v", hs)
	}
}

// Waiters cannot exhaust the pool, with drivers that send Parse and Bind of an unnamed
// statement in one batch (libpq PQexecParams, pgx QueryExecModeExec, most
// JDBC/node drivers): the pin wait must not hold a server connection either.
func TestLocksWaitersUnnamedExtendedHoldNoConnection(t *testing.T) {
	t.Parallel()
	const (
		app = "lk4u"
		nw  = 6
	)
	l := startLockpool(t, 10, "", lkApp(app, "app", 4, 2, "pin", "10s"))
	su := superConn(t, "appdb")
	ctx := testenv.Context(t, 120*time.Second)
	key := lkKey2(14, 1)

	holder := l.connect(t, "app", "appdb")
	lkMustExec(t, holder, "SELECT pg_advisory_lock(14, 1)")
	conns := make([]*pgx.Conn, nw)
	for i := range conns {
		conns[i] = l.connect(t, "app", "appdb")
	}
	var wg sync.WaitGroup
	errs := make([]error, nw)
	for i := 0; i < nw; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c := conns[i]
			if _, err := c.Exec(ctx, "SELECT pg_advisory_lock($1::int4, $2::int4)", pgx.QueryExecModeExec, int32(14), int32(1)); err != nil {
				errs[i] = err
				return
			}
			if _, err := c.Exec(ctx, "SELECT pg_advisory_unlock($1::int4, $2::int4)", pgx.QueryExecModeExec, int32(14), int32(1)); err != nil {
				errs[i] = err
			}
		}(i)
		if i == 0 {
			eventually(t, 10*time.Second, "the first waiter to wait in the server", func() bool { return lkWaiting(t, su, key) == 1 })
			continue
		}
		// Not eventually (t.Fatal): the waiters must be let go first.
		deadline := time.Now().Add(5 * time.Second)
		for l.srv.Pool().Stats(app).PinWaiting != i && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if st := l.srv.Pool().Stats(app); st.PinWaiting != i {
			t.Errorf("waiter %d did not queue for a pin slot within 5s: pool stats %+v (waiters holding a connection while they wait for a pin slot exhaust the pool)", i, st)
			lkMustExec(t, holder, "SELECT pg_advisory_unlock(14, 1)")
			wg.Wait()
			return
		}
	}
	st := l.srv.Pool().Stats(app)
	if st.InUse != 2 {
		t.Errorf("with %d unnamed-statement waiters queued for a pin slot: %d server connections in use, want 2 (holder and the one waiter in the server); stats %+v", nw-1, st.InUse, st)
	}
	// Ordinary transactions must still get connections promptly.
	txc := []*pgx.Conn{l.connect(t, "app", "appdb"), l.connect(t, "app", "appdb")}
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	n := lkRunTxns(tctx, t, txc, 200)
	cancel()
	if n != 200 {
		t.Errorf("%d of 200 ordinary transactions committed while unnamed-statement waiters queued", n)
	}
	lkMustExec(t, holder, "SELECT pg_advisory_unlock(14, 1)")
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("waiter %d: %v", i, err)
		}
	}
	eventually(t, time.Second, "no pins left", func() bool { return l.Pinned(app, "") == 0 })
}

// Four locks, a pool of four.
func TestLocksFourLocksPoolOfFour(t *testing.T) {
	t.Parallel()
	const app = "lk5"
	l := startLockpool(t, 10, "", lkApp(app, "app", 4, 3, "pin", "1s"))
	ctx := testenv.Context(t, 60*time.Second)
	setup := l.connect(t, "app", "appdb")
	lkMustExec(t, setup, "CREATE TABLE IF NOT EXISTS locks5_jobs (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())")

	// Another client inserts and commits throughout; each must take < 1 s.
	ins := l.connect(t, "app", "appdb")
	var inserts atomic.Int64
	var slowest atomic.Int64
	stopIns := make(chan struct{})
	insDone := make(chan struct{})
	go func() {
		defer close(insDone)
		for {
			select {
			case <-stopIns:
				return
			default:
			}
			t0 := time.Now()
			tx, err := ins.Begin(ctx)
			if err == nil {
				_, err = tx.Exec(ctx, "INSERT INTO locks5_jobs DEFAULT VALUES")
				if err == nil {
					err = tx.Commit(ctx)
				} else {
					_ = tx.Rollback(ctx)
				}
			}
			d := time.Since(t0)
			if err != nil {
				t.Errorf("INSERT; COMMIT failed: %v", err)
				return
			}
			if int64(d) > slowest.Load() {
				slowest.Store(int64(d))
			}
			if d >= time.Second {
				t.Errorf("INSERT; COMMIT took %v, want < 1s", d)
			}
			inserts.Add(1)
			time.Sleep(2 * time.Millisecond)
		}
	}()

	s := make([]*pgx.Conn, 4)
	for i := range s {
		s[i] = l.connect(t, "app", "appdb")
	}
	try := func(i int) (bool, error) {
		return lkBool(ctx, s[i], fmt.Sprintf("SELECT pg_try_advisory_lock(hashtext('locks5-job-%d'))", i))
	}
	for i := 0; i < 3; i++ {
		ok, err := try(i)
		if err != nil || !ok {
			t.Fatalf("session %d: try-lock = %v, %v", i, ok, err)
		}
	}
	if g := l.Pinned(app, ""); g != 3 {
		t.Fatalf("three holders: lockpool_pinned_sessions = %v, want 3", g)
	}
	before := inserts.Load()
	t0 := time.Now()
	ok, err := try(3)
	el := time.Since(t0)
	if err == nil {
		t.Fatalf("the fourth session's try-lock = %v with three pins taken and max_pinned 3; want 53300", ok)
	}
	pe := testenv.PgError(err)
	if pe == nil || pe.Code != "53300" || !strings.HasPrefix(pe.Message, "lockpool:") || pe.Hint == "" {
		t.Fatalf("the fourth session: %v; want 53300 with a lockpool: message and a hint", err)
	}
	if el < 900*time.Millisecond || el > 3*time.Second {
		t.Errorf("the fourth session got 53300 after %v, want about wait_timeout (1s)", el)
	}
	if inserts.Load() == before {
		t.Errorf("no INSERT committed while the fourth session waited for a pin slot")
	}
	// The fourth session still works and the lock is free.
	var n int64
	if err := s[3].QueryRow(ctx, lkOwnAdvisorySQL).Scan(&n); err != nil || n != 0 {
		t.Fatalf("after 53300: %v, %d advisory locks on its backend", err, n)
	}
	mark := inserts.Load()
	eventually(t, 5*time.Second, "the inserter to commit 20 more transactions with three pins held", func() bool { return inserts.Load() >= mark+20 })
	if !lkMustBool(t, s[0], "SELECT pg_advisory_unlock(hashtext('locks5-job-0'))") {
		t.Fatal("session 0's unlock returned false")
	}
	if ok, err := try(3); err != nil || !ok {
		t.Fatalf("the fourth session's try-lock after a slot freed = %v, %v", ok, err)
	}
	for _, i := range []int{1, 2, 3} {
		if !lkMustBool(t, s[i], fmt.Sprintf("SELECT pg_advisory_unlock(hashtext('locks5-job-%d'))", i)) {
			t.Fatalf("session %d's unlock returned false", i)
		}
	}
	close(stopIns)
	<-insDone
	t.Logf("%d inserts committed, slowest %v", inserts.Load(), time.Duration(slowest.Load()))
	if g := l.Pinned(app, ""); g != 0 {
		t.Errorf("lockpool_pinned_sessions = %v at the end, want 0", g)
	}
}

// A statement that took a pin slot but then found no server connection
// within wait_timeout (53300) must give the slot back: otherwise idle,
// unpinned sessions keep slots and later lock takers starve.
func TestLocksPinSlotFreedWhenNoConnection(t *testing.T) {
	t.Parallel()
	const app = "lk4s"
	l := startLockpool(t, 10, "", lkApp(app, "app", 3, 2, "pin", "300ms"))
	ctx := testenv.Context(t, 30*time.Second)
	const trySQL = "SELECT pg_try_advisory_lock($1::bigint)"
	cs := []*pgx.Conn{l.connect(t, "app", "appdb"), l.connect(t, "app", "appdb")}
	// The extended client prepares its statement while connections are free.
	if _, err := cs[1].Prepare(ctx, trySQL, trySQL); err != nil {
		t.Fatal(err)
	}
	// Three open transactions take every connection.
	var txs []pgx.Tx
	for i := 0; i < 3; i++ {
		tx, err := l.connect(t, "app", "appdb").Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		txs = append(txs, tx)
	}
	for _, mode := range []struct {
		name string
		args []any
	}{{"simple", []any{pgx.QueryExecModeSimpleProtocol}}, {"extended", nil}} {
		c := cs[0]
		if mode.name == "extended" {
			c = cs[1]
		}
		before := l.srv.Pool().Stats(app).Pinned
		args := append(append([]any{}, mode.args...), int64(4000001))
		_, err := c.Exec(ctx, trySQL, args...)
		if sqlState(err) != "53300" {
			t.Fatalf("%s: try-lock with no free connection: %v, want 53300", mode.name, err)
		}
		if st := l.srv.Pool().Stats(app); st.Pinned != before {
			t.Errorf("%s: after 53300 (no connection) the idle, unpinned session still holds a pin slot: pool stats %+v, lockpool_pinned_sessions %v", mode.name, st, l.Pinned(app, ""))
		}
	}
	for _, tx := range txs {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	d := l.connect(t, "app", "appdb")
	ok, err := lkBool(ctx, d, "SELECT pg_try_advisory_lock(4000002)")
	if err != nil || !ok {
		t.Fatalf("with no session pinned, a try-lock got %v, %v; want true", ok, err)
	}
	lkMustExec(t, d, "SELECT pg_advisory_unlock_all()")
}
