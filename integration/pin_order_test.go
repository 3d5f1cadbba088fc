package integration

// Pin slots and server connections are waited for in one order, so that
// clients waiting for one never hold the other in a cycle: a client outside
// a transaction waits for a slot and a connection together holding
// neither, a client inside a transaction (holding its connection) waits
// for a slot only and takes a free one ahead of clients that cannot get a
// connection yet.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/testenv"
)

// poApp is an application where pin slots and connections are both
// scarce: 3 connections, 2 pin slots, a short wait_timeout.
func poApp(name, wait string) appYAML {
	a := defaultApp()
	a.name, a.max, a.pinned, a.advisory, a.state, a.wait = name, 3, 2, "pin", "pin", wait
	return a
}

// poAsync is a statement running in the background on a client.
type poAsync struct {
	done chan struct{}
	err  error
}

// poExecAsync runs sql on c in the background. The test waits for it
// before it ends (t.Cleanup), so the client is not closed under it.
func poExecAsync(t testing.TB, ctx context.Context, c *pgx.Conn, sql string) *poAsync {
	a := &poAsync{done: make(chan struct{})}
	go func() {
		defer close(a.done)
		_, a.err = c.Exec(ctx, sql)
	}()
	t.Cleanup(func() { <-a.done })
	return a
}

// wait returns the statement's error, or fails the test when ctx ends first.
func (a *poAsync) wait(t testing.TB, ctx context.Context, what string) error {
	t.Helper()
	select {
	case <-a.done:
		return a.err
	case <-ctx.Done():
		t.Fatalf("%s: no answer: %v", what, ctx.Err())
		return nil
	}
}

// Three clients inside transactions hold every connection; two clients
// outside a transaction want a pin (a temp table) and must wait for a
// connection. The clients inside their transactions then run pinning
// statements: they must get the free pin slots at once (the waiters
// outside hold none), finish, and let the waiters in. Before the waits
// had one order, the waiters outside held both slots while waiting for a
// connection, and every client got 53300 "no pin slot" after
// wait_timeout with nobody pinned.
func TestPinWaitersOutsideTransactionsDoNotBlockTransactions(t *testing.T) {
	t.Parallel()
	const wait = 3 * time.Second
	app := poApp("pinorder", wait.String())
	l := startLockpool(t, 10, "", app)
	ctx := testenv.Context(t, 60*time.Second)
	pool := l.srv.Pool()

	txs := make([]*pgx.Conn, 3)
	for i := range txs {
		txs[i] = l.connect(t, "app", "appdb")
		stExec(t, txs[i], "BEGIN")
		stExec(t, txs[i], "SELECT 1")
	}
	if st := pool.Stats(app.name); st.InUse != 3 {
		t.Fatalf("three open transactions: pool stats %+v, want 3 connections in use", st)
	}

	outside := make([]*pgx.Conn, 2)
	done := make([]*poAsync, 2)
	tbl := make([]string, 2)
	for i := range outside {
		outside[i] = l.connect(t, "app", "appdb")
		tbl[i] = uniqueName(t, fmt.Sprintf("po_x%d", i))
		done[i] = poExecAsync(t, ctx, outside[i], "CREATE TEMP TABLE "+tbl[i]+" (i int)")
		clientWaiting(t, l, outside[i].PgConn().PID())
	}
	eventually(t, 5*time.Second, "both clients outside a transaction queued in the pool", func() bool {
		st := pool.Stats(app.name)
		return st.Waiting == 2 || st.PinWaiting == 2
	})
	// Waiting for a slot and a connection together, they hold neither.
	if st := pool.Stats(app.name); st.Pinned != 0 || st.InUse != 3 {
		t.Errorf("two clients outside a transaction waiting to pin: pool stats %+v, want no pin slot held and 3 connections in use (the transactions')", st)
	}

	// A temp table inside a transaction (simple protocol), then an
	// advisory lock inside another (extended protocol): each takes a free
	// slot at once, though the clients outside asked first.
	t0 := time.Now()
	stExec(t, txs[0], "CREATE TEMP TABLE po_t0 (i int)")
	if el := time.Since(t0); el > wait/2 {
		t.Errorf("the temp table inside a transaction waited %v for a pin slot (no client was pinned)", el)
	}
	stExec(t, txs[0], "INSERT INTO po_t0 VALUES (20), (22)")
	var sum int
	if err := txs[0].QueryRow(ctx, "SELECT sum(i) FROM po_t0").Scan(&sum); err != nil || sum != 42 {
		t.Fatalf("temp table inside the transaction: sum %d, %v; want 42", sum, err)
	}
	stExec(t, txs[0], "DROP TABLE po_t0")
	stExec(t, txs[0], "COMMIT")

	key := lkKey2(41, 7)
	t1 := time.Now()
	if _, err := txs[1].Exec(ctx, "SELECT pg_advisory_lock($1::int4, $2::int4)", int32(41), int32(7)); err != nil {
		t.Fatalf("advisory lock inside a transaction: %v", err)
	}
	if el := time.Since(t1); el > wait/2 {
		t.Errorf("the advisory lock inside a transaction waited %v for a pin slot", el)
	}
	su := superConn(t, "appdb")
	if hs := lkHolders(t, su, key); len(hs) != 1 {
		t.Errorf("(41, 7) held by %v, want one backend", hs)
	}
	if !lkMustBool(t, txs[1], "SELECT pg_advisory_unlock(41, 7)") {
		t.Error("pg_advisory_unlock(41, 7) = false")
	}
	stExec(t, txs[1], "COMMIT")
	stExec(t, txs[2], "COMMIT")

	// The clients outside got a slot and a connection each and are
	// pinned by their temp tables.
	for i, a := range done {
		if err := a.wait(t, ctx, fmt.Sprintf("client %d outside a transaction", i)); err != nil {
			t.Errorf("client %d outside a transaction: CREATE TEMP TABLE: %v", i, err)
		}
	}
	if t.Failed() {
		return
	}
	l.wantPinned(t, app.name, "temp_table", 2)
	for i, c := range outside {
		stExec(t, c, fmt.Sprintf("INSERT INTO %s VALUES (%d)", tbl[i], 100+i))
		var got int
		if err := c.QueryRow(ctx, "SELECT i FROM "+tbl[i]).Scan(&got); err != nil || got != 100+i {
			t.Errorf("client %d's temp table: %d, %v; want %d", i, got, err, 100+i)
		}
		stExec(t, c, "DROP TABLE "+tbl[i])
	}
	l.wantPinned(t, app.name, "", 0)
	for _, outcome := range []string{"timeout", "canceled"} {
		if n := l.metric("lockpool_pin_waits_total", map[string]string{"app": app.name, "outcome": outcome}); n != 0 {
			t.Errorf("lockpool_pin_waits_total{outcome=%q} = %v, want 0", outcome, n)
		}
	}
	if n := l.metric("lockpool_pool_wait_timeouts_total", map[string]string{"app": app.name}); n != 0 {
		t.Errorf("lockpool_pool_wait_timeouts_total = %v, want 0", n)
	}
	if st := pool.Stats(app.name); st.Pinned != 0 || st.PinWaiting != 0 || st.Waiting != 0 || st.InUse != 0 {
		t.Errorf("at the end: pool stats %+v, want nothing pinned, waiting or in use", st)
	}
}

// A CancelRequest ends a wait for a pin slot and a connection at once with
// 57014, whether a slot or a connection was missing; the wait is gone from
// the pool, nothing is held for it, and the client's next statement runs.
func TestCancelEndsPinAndConnectionWait(t *testing.T) {
	t.Parallel()
	app := poApp("pinordercancel", "30s")
	app.max, app.pinned = 2, 1
	l := startLockpool(t, 10, "", app)
	ctx := testenv.Context(t, 60*time.Second)
	pool := l.srv.Pool()
	w := l.connect(t, "app", "appdb")
	tbl := uniqueName(t, "po_cancel")

	// cancelWait starts w's temp table, waits until the pool has it
	// waiting, cancels it and checks the 57014.
	cancelWait := func(what string) {
		t.Helper()
		a := poExecAsync(t, ctx, w, "CREATE TEMP TABLE "+tbl+" (i int)")
		eventually(t, 5*time.Second, what+": the client waiting for a pin slot", func() bool {
			return pool.Stats(app.name).PinWaiting == 1
		})
		t0 := time.Now()
		if err := w.PgConn().CancelRequest(ctx); err != nil {
			t.Fatalf("%s: CancelRequest: %v", what, err)
		}
		pgErr(t, a.wait(t, ctx, what), "57014")
		if el := time.Since(t0); el > 2*time.Second {
			t.Errorf("%s: the cancelled wait ended after %v", what, el)
		}
	}

	// No slot: another client is pinned by its own temp table.
	p := l.connect(t, "app", "appdb")
	stExec(t, p, "CREATE TEMP TABLE "+tbl+"_p (i int)")
	l.wantPinned(t, app.name, "temp_table", 1)
	cancelWait("no pin slot free")
	if st := pool.Stats(app.name); st.PinWaiting != 0 || st.Waiting != 0 || st.Pinned != 1 || st.InUse != 1 {
		t.Errorf("after the cancel (no slot): pool stats %+v, want only the pinned client's slot and connection", st)
	}
	var one int
	if err := w.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("after the cancel: SELECT 1 = %d, %v", one, err)
	}
	stExec(t, p, "DROP TABLE "+tbl+"_p")
	l.wantPinned(t, app.name, "", 0)

	// No connection: two transactions hold both.
	txs := []*pgx.Conn{p, l.connect(t, "app", "appdb")}
	for _, c := range txs {
		stExec(t, c, "BEGIN")
		stExec(t, c, "SELECT 1")
	}
	cancelWait("no connection free")
	if st := pool.Stats(app.name); st.PinWaiting != 0 || st.Waiting != 0 || st.Pinned != 0 || st.InUse != 2 {
		t.Errorf("after the cancel (no connection): pool stats %+v, want the two transactions' connections and nothing else", st)
	}
	stExec(t, txs[0], "COMMIT")
	stExec(t, w, "CREATE TEMP TABLE "+tbl+" (i int)")
	l.wantPinned(t, app.name, "temp_table", 1)
	stExec(t, w, "DROP TABLE "+tbl)
	stExec(t, txs[1], "COMMIT")
	l.wantPinned(t, app.name, "", 0)
	if n := l.metric("lockpool_pin_waits_total", map[string]string{"app": app.name, "outcome": "canceled"}); n != 2 {
		t.Errorf("lockpool_pin_waits_total{outcome=\"canceled\"} = %v, want 2", n)
	}
}
