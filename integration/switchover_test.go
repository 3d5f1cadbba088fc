package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// switchoverStats are the numbers one switchover under load showed.
type switchoverStats struct {
	resumed     time.Duration // from Promoted to the first acknowledged write committed after the promotion began (0 if before)
	outage      time.Duration // server time from the last commit on the old primary to the first on the new one
	duringStop  int           // writes acknowledged on the old primary that committed while it shut down
	acked, rows int           // acknowledged writes when checked, rows on the new primary
}

// checkSwitchover checks what switchover number n (from old to next,
// timed by ts) of a pair under load must show, once pair.Switch
// returned: no acknowledged write committed on old after it stopped, nor
// on next before its promotion began; writes resume on next within 2 s of
// its promotion; the writers saw no error but ended connections; old is a
// standby and next the primary, directly and in SHOW HOSTS; every
// acknowledged write is on next; lockpool_failovers_total is n.
func checkSwitchover(ctx context.Context, t *testing.T, lp *testenv.Lockpool, load *writeLoad, n int,
	ts pgtest.SwitchoverTimes, old, next *pgtest.Cluster) switchoverStats {
	t.Helper()
	var st switchoverStats
	t.Logf("switchover %d (%s -> %s): stop %v, wait for replay %v, promote %v, rejoin %v",
		n, testenv.Addr(old), testenv.Addr(next),
		ts.Stopped.Sub(ts.Stopping).Round(time.Millisecond), ts.Promoting.Sub(ts.Stopped).Round(time.Millisecond),
		ts.Promoted.Sub(ts.Promoting).Round(time.Millisecond), ts.Rejoined.Sub(ts.Promoted).Round(time.Millisecond))

	// Writes resume on the new primary: the first write that committed
	// after the promotion began (a reply from the old primary may still
	// reach its client after Promoted) is acknowledged soon after it
	// ended (or before, when lockpool saw the promotion first).
	firstResumed := func() (ackWrite, bool) {
		var first ackWrite
		found := false
		for _, a := range load.snapshot() {
			if !a.srv.Before(ts.Promoting) && (!found || a.at.Before(first.at)) {
				first, found = a, true
			}
		}
		return first, found
	}
	testenv.Eventually(t, 10*time.Second, "a write after the promotion", func() bool {
		_, ok := firstResumed()
		return ok
	})
	first, _ := firstResumed()
	st.resumed = max(0, first.at.Sub(ts.Promoted))
	if st.resumed > 2*time.Second {
		t.Errorf("switchover %d: the first write came %v after the promotion, want within 2s", n, st.resumed)
	}
	if first.port != next.Port {
		t.Errorf("switchover %d: the first write after the promotion ran on port %d, want the new primary's %d", n, first.port, next.Port)
	}
	c := load.count()
	testenv.Eventually(t, 10*time.Second, "writes go on after the switchover", func() bool { return load.count() >= c+50 })

	// No commit on the old primary after it stopped, none on the new one
	// before it was promoted. (srv is the server's clock just before the
	// commit, on the clock ts reads too.)
	var lastOld, firstNext time.Time
	bad := 0
	for _, a := range load.snapshot() {
		var why string
		switch {
		case a.port == old.Port && a.srv.After(ts.Stopped):
			why = "on the old primary after it stopped"
		case a.port == old.Port && a.at.After(ts.Rejoined):
			why = "on the old primary, acknowledged after it rejoined as a standby"
		case a.port == next.Port && a.srv.After(ts.Stopping) && a.srv.Before(ts.Promoting):
			why = "on the new primary before its promotion"
		case a.port != old.Port && a.port != next.Port:
			why = "on neither host"
		}
		if why != "" {
			bad++
			if bad <= 5 {
				t.Errorf("switchover %d: write (%d, %d) committed %s: server time %s, port %d (stopped %s, promoting %s)",
					n, a.w, a.n, why, a.srv.Format(time.StampMicro), a.port, ts.Stopped.Format(time.StampMicro), ts.Promoting.Format(time.StampMicro))
			}
			continue
		}
		if a.port == old.Port && a.srv.After(ts.Stopping) {
			st.duringStop++
		}
		if a.port == old.Port && a.srv.After(lastOld) {
			lastOld = a.srv
		}
		if a.port == next.Port && !a.srv.Before(ts.Promoting) && (firstNext.IsZero() || a.srv.Before(firstNext)) {
			firstNext = a.srv
		}
	}
	if bad > 0 {
		t.Errorf("switchover %d: %d acknowledged writes committed where no write may", n, bad)
	}
	if !lastOld.IsZero() && !firstNext.IsZero() {
		st.outage = firstNext.Sub(lastOld)
	}
	// The writers lost connections, nothing else: no statement failed on
	// a host in recovery (25006) or for want of a primary (53300).
	for e, k := range load.errors() {
		if !strings.HasPrefix(e, "FATAL ") && e != "connection error" {
			t.Errorf("after switchover %d: the write load got %q %d times so far, want only ended connections; the first: %s", n, e, k, load.detail(e))
		}
	}

	// The roles, read on the hosts themselves.
	if in, err := old.InRecovery(ctx); err != nil || !in {
		t.Errorf("switchover %d: pg_is_in_recovery() on the old primary %s = %v (%v), want true", n, testenv.Addr(old), in, err)
	}
	if in, err := next.InRecovery(ctx); err != nil || in {
		t.Errorf("switchover %d: pg_is_in_recovery() on the new primary %s = %v (%v), want false", n, testenv.Addr(next), in, err)
	}
	st.acked = load.count()
	st.rows = checkAcked(t, next, load)

	// What lockpool says.
	var hostsSeen string
	testenv.Eventually(t, 5*time.Second, "SHOW HOSTS with the new primary and the old one as its standby", func() bool {
		hs := lp.Hosts()
		o, x := testenv.HostRow(hs, old), testenv.HostRow(hs, next)
		hostsSeen = o.Host + " " + o.Role + "/" + o.State + ", " + x.Host + " " + x.Role + "/" + x.State
		return x.Role == "primary" && x.State == "primary" && o.Role == "standby" && o.State == "standby"
	})
	t.Logf("switchover %d: SHOW HOSTS %s", n, hostsSeen)
	if got := lp.Metric("lockpool_failovers_total", nil); got != float64(n) {
		t.Errorf("after switchover %d: lockpool_failovers_total = %v, want %d", n, got, n)
	}
	if got := lp.Metric("lockpool_host_role", map[string]string{"host": testenv.Addr(next), "role": "primary"}); got != 1 {
		t.Errorf("after switchover %d: lockpool_host_role{host=%s,role=primary} = %v, want 1", n, testenv.Addr(next), got)
	}
	t.Logf("switchover %d: first write acknowledged %v after the promotion began, %v after it ended (port %d); "+
		"%v between the last commit on the old primary and the first on the new; "+
		"%d writes committed while the old primary shut down; %d acknowledged writes, %d rows on the new primary",
		n, first.at.Sub(ts.Promoting).Round(time.Millisecond), st.resumed.Round(time.Millisecond), first.port,
		st.outage.Round(time.Millisecond), st.duringStop, st.acked, st.rows)
	return st
}

// wantSessionEnded checks that err, a client's statement through
// lockpool after the server connection it was using went away, ended
// the client: a FATAL or a lost connection, and the connection closed.
func wantSessionEnded(t *testing.T, what string, conn *pgx.Conn, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want a FATAL or a closed connection", what)
		return
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Severity != "FATAL" {
		t.Errorf("%s: %s, want a FATAL or a closed connection", what, errText(err))
	}
	if !conn.IsClosed() {
		t.Errorf("%s: got %s, but the connection is still open", what, errText(err))
	}
	t.Logf("%s: %v", what, err)
}

// TestSwitchover: under a steady pgx and pgbench load through one
// lockpool over a primary and its synchronous standby, a switchover (the
// primary stopped cleanly, the standby promoted, the old primary restarted
// as the new one's standby) changes where writes go with no restart or
// reload of lockpool: no acknowledged write commits on the old primary
// after it stopped (by the server's clock), writes resume on the new
// primary within 2 s of its promotion, every acknowledged write is on the
// new primary, the old primary is in recovery, and SHOW HOSTS, the
// metrics and the log say what happened. A client idle through lockpool
// runs its next transaction on the new primary without an error; a client
// inside a transaction, and one pinned by a temporary table, on the old
// primary are ended with an error, and the transaction's write is
// nowhere.
func TestSwitchover(t *testing.T) {
	pair := testenv.StartPair(t, true)
	createWrites(t, pair)
	lp, log := startFailoverLockpool(t, pair)
	ctx, cancel := context.WithCancel(testenv.Context(t, 2*time.Minute))
	defer cancel()
	old, next := pair.Primary, pair.Standby

	// Three clients on the old primary: idle, inside a transaction, pinned.
	idle := lp.Connect(t, "app", "appdb")
	var port int
	if err := idle.QueryRow(ctx, "SELECT inet_server_port()").Scan(&port); err != nil {
		t.Fatal(err)
	}
	if port != old.Port {
		t.Fatalf("the idle client's first query ran on port %d, want the primary's %d", port, old.Port)
	}
	inTx := lp.Connect(t, "app", "appdb")
	if _, err := inTx.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := inTx.Exec(ctx, "INSERT INTO fo_writes(w, n) VALUES (-1, 1)"); err != nil {
		t.Fatal(err)
	}
	pinned := lp.Connect(t, "app", "appdb")
	if _, err := pinned.Exec(ctx, "CREATE TEMP TABLE sw_pinned (x int)"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the temp-table client pinned", func() bool { return lp.Pinned("api", "") == 1 })

	load := startWriteLoad(ctx, lp.DSN("app", "appdb"), 4)
	pgbenchDone := pgbenchLoad(ctx, t, lp)
	testenv.Eventually(t, 20*time.Second, "200 acknowledged writes", func() bool { return load.count() >= 200 })

	ts, err := pair.Switch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pair.Primary != next || pair.Standby != old {
		t.Fatal("Pair.Switch did not swap the roles")
	}
	// At once, the idle client's next transaction runs on the new primary.
	err = pgx.BeginFunc(ctx, idle, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, "INSERT INTO fo_writes(w, n) VALUES (-2, 1) RETURNING port").Scan(&port)
	})
	if err != nil {
		t.Errorf("the idle client's transaction after the switchover: %v", err)
	} else if port != next.Port {
		t.Errorf("the idle client's transaction after the switchover ran on port %d, want the new primary's %d", port, next.Port)
	}
	// The client inside a transaction on the old primary: its COMMIT
	// fails and its connection is closed.
	_, err = inTx.Exec(ctx, "COMMIT")
	wantSessionEnded(t, "COMMIT of the transaction open on the old primary", inTx, err)
	// The pinned client: its temporary table was on the old primary; it
	// must not go on on the new one (there it would find no sw_pinned).
	_, err = pinned.Exec(ctx, "INSERT INTO sw_pinned VALUES (1)")
	wantSessionEnded(t, "the next statement of the client pinned on the old primary", pinned, err)

	checkSwitchover(ctx, t, lp, load, 1, ts, old, next)

	cancel()
	load.wg.Wait()
	pgbenchDone()

	rows := checkAcked(t, pair.Primary, load)
	t.Logf("%d acknowledged writes, %d rows on the new primary; errors of the write load: %v", load.count(), rows, load.errors())
	var inTxRows, idleRows int
	check := testenv.Context(t, 10*time.Second)
	conn, err := testenv.Connect(check, pair.Primary, "appdb")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(check)
	if err := conn.QueryRow(check, "SELECT count(*) FILTER (WHERE w = -1), count(*) FILTER (WHERE w = -2) FROM fo_writes").Scan(&inTxRows, &idleRows); err != nil {
		t.Fatal(err)
	}
	if inTxRows != 0 {
		t.Errorf("the write of the transaction cut by the switchover is on the new primary (%d rows), want none", inTxRows)
	}
	if idleRows != 1 {
		t.Errorf("the idle client's write after the switchover: %d rows on the new primary, want 1", idleRows)
	}
	if !strings.Contains(log.String(), "hosts: primary changed") {
		t.Error("no log line for the primary change")
	}
	logReplaced(t, log)
}

// logReplaced logs how many statements lockpool gave another server
// connection because the server closed theirs before they were sent on it
// (a shutdown racing the pool's liveness check); they cost no error.
func logReplaced(t *testing.T, log *testenv.LogBuffer) {
	t.Helper()
	t.Logf("%d server connections closed by the server before a statement was sent on them were replaced",
		strings.Count(log.String(), "server connection closed before the client's statement; taking another"))
}

// TestSwitchoverBackAndForth: three switchovers in a row (A to B, B to A,
// A to B) under the same steady pgx and pgbench load through one lockpool:
// after each one, no acknowledged write committed on the demoted host
// after it stopped, writes resume on the new primary within 2 s of its
// promotion, every acknowledged write is on it, and SHOW HOSTS follows;
// lockpool_failovers_total counts the three.
func TestSwitchoverBackAndForth(t *testing.T) {
	pair := testenv.StartPair(t, true)
	createWrites(t, pair)
	lp, log := startFailoverLockpool(t, pair)
	ctx, cancel := context.WithCancel(testenv.Context(t, 2*time.Minute))
	defer cancel()
	a, b := pair.Primary, pair.Standby

	load := startWriteLoad(ctx, lp.DSN("app", "appdb"), 4)
	pgbenchDone := pgbenchLoad(ctx, t, lp)
	testenv.Eventually(t, 20*time.Second, "200 acknowledged writes", func() bool { return load.count() >= 200 })

	var worst time.Duration
	for i, want := range []*pgtest.Cluster{b, a, b} {
		old, next := pair.Primary, pair.Standby
		if next != want {
			t.Fatalf("switchover %d would promote %s, want %s", i+1, testenv.Addr(next), testenv.Addr(want))
		}
		ts, err := pair.Switch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st := checkSwitchover(ctx, t, lp, load, i+1, ts, old, next)
		worst = max(worst, st.resumed)
		c := load.count()
		testenv.Eventually(t, 10*time.Second, "100 more writes before the next switchover", func() bool { return load.count() >= c+100 })
	}
	cancel()
	load.wg.Wait()
	pgbenchDone()

	rows := checkAcked(t, pair.Primary, load)
	t.Logf("%d acknowledged writes, %d rows on the last primary; the slowest resumption took %v; errors of the write load: %v",
		load.count(), rows, worst.Round(time.Millisecond), load.errors())
	if got := lp.Metric("lockpool_failovers_total", nil); got != 3 {
		t.Errorf("lockpool_failovers_total = %v, want 3", got)
	}
	if n := strings.Count(log.String(), "hosts: primary changed"); n != 3 {
		t.Errorf("%d log lines for a primary change, want 3", n)
	}
	logReplaced(t, log)
}
