package integration

// Leases that hold no connection: budget, mutual exclusion, expiry,
// staleness, release on disconnect, fencing, listing and auto-renew.

import (
	"context"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
)

// Application budget 1: four sessions hold leases, a fifth session's
// INSERT; COMMIT still commits within 3 s, and no backend of the application
// is held by the four.
func TestLeasesHoldNoConnection(t *testing.T) {
	t.Parallel()
	const role = "leasenohold"
	testenv.EnsureRole(t, pgtest.Require(t), role)
	leaseTable(t, "lease_nohold_t", "id serial PRIMARY KEY, v text")
	app := defaultApp()
	app.name, app.user, app.max, app.pinned, app.wait = "nohold", role, 1, 0, "5s"
	l := startLockpool(t, 10, "instance_id: nohold\nleases:\n  schema: lp_nohold", app)
	ctx := context.Background()
	su := superConn(t, "appdb")
	appBackends := fmt.Sprintf("usename = '%s' AND coalesce(application_name, '') <> '%s'", role, leaseApplicationName)

	// The fifth session takes the application's only connection first: the
	// leases must not need it.
	fifth := l.connect(t, role, "appdb")
	if _, err := fifth.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := fifth.Exec(ctx, "INSERT INTO lease_nohold_t (v) VALUES ('during')"); err != nil {
		t.Fatal(err)
	}

	names := []string{"cleanup", "alerts", "mail-checks", "uptime:node-1"}
	holders := make([]*pgx.Conn, len(names))
	tokens := make([]int64, len(names))
	for i := range names {
		holders[i] = l.connect(t, role, "appdb")
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(names))
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, cancel := context.WithTimeout(ctx, 4*time.Second)
			defer cancel()
			tok, ok, err := acquireLease(c, holders[i], n, 60, 0)
			if err == nil && !ok {
				err = fmt.Errorf("lease_acquire(%q) = NULL", n)
			}
			tokens[i], errs[i] = tok, err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("acquiring %q while the application's only connection is in a transaction: %v", names[i], err)
		}
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("acquiring four leases with the pool full took %v", d)
	}
	if _, err := fifth.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}

	// The four holders use the pool for ordinary work too, then sit idle.
	for _, h := range holders {
		var one int
		if err := h.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			t.Fatal(err)
		}
	}

	// Now the fifth session's INSERT; COMMIT, within 3 s, with four leases held.
	start = time.Now()
	tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	tx, err := fifth.Begin(tctx)
	if err != nil {
		t.Fatalf("BEGIN with four leases held: %v", err)
	}
	if _, err := tx.Exec(tctx, "INSERT INTO lease_nohold_t (v) VALUES ('fifth')"); err != nil {
		t.Fatalf("INSERT with four leases held: %v", err)
	}
	// While the fifth session's transaction is open, its backend is the only
	// backend of the application (lease connections excluded).
	var n int
	var state, query string
	if err := su.QueryRow(ctx, "SELECT count(*) OVER (), state, query FROM pg_stat_activity WHERE "+appBackends).Scan(&n, &state, &query); err != nil {
		t.Fatalf("pg_stat_activity: %v", err)
	}
	if n != 1 || state != "idle in transaction" || query != "INSERT INTO lease_nohold_t (v) VALUES ('fifth')" {
		t.Fatalf("application backends = %d, state %q, query %q; want only the fifth session's", n, state, query)
	}
	if err := tx.Commit(tctx); err != nil {
		t.Fatalf("COMMIT with four leases held: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("INSERT; COMMIT took %v", d)
	}
	var got int
	if err := su.QueryRow(ctx, "SELECT count(*) FROM lease_nohold_t WHERE v IN ('during', 'fifth')").Scan(&got); err != nil || got != 2 {
		t.Fatalf("committed rows = %d, %v; want 2", got, err)
	}

	// No backend of the application is held by the four: at most the one
	// idle pooled connection, and nothing active or in a transaction.
	if err := su.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE "+appBackends+" AND state <> 'idle'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d non-idle backends of the application while only the four lease holders are connected", n)
	}
	if err := su.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE "+appBackends).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n > 1 {
		t.Fatalf("%d backends of the application (budget 1)", n)
	}
	// The four still hold their leases.
	rows := listLeases(t, holders[0])
	for i, name := range names {
		r, ok := findLease(rows, name)
		if !ok || r.Token != tokens[i] {
			t.Fatalf("lease_list() has %q = %+v (found %v), want token %d", name, r, ok, tokens[i])
		}
		if !leaseBool(t, holders[i], "lease_renew", name) {
			t.Fatalf("lease_renew(%q) = false", name)
		}
	}
	if v := l.metric("lockpool_server_connections", map[string]string{"app": "nohold"}); v > 1 {
		t.Fatalf("lockpool_server_connections{app=nohold} = %v, want <= 1", v)
	}
}

// Mutual exclusion across two lockpool instances on one PostgreSQL.
func TestLeaseMutualExclusionTwoInstances(t *testing.T) {
	t.Parallel()
	// The issue asks for 50 x 100. That takes ~25 s without the race
	// detector on 2 CPUs; with it, 50 x 40 already took 40-60 s on a loaded
	// machine, so under -race the run is cut to 50 x 25 (and 50 x 20 with
	// -short).
	const sessions = 50
	attempts := 100
	if leaseRaceEnabled {
		attempts = 25
	}
	if testing.Short() {
		attempts = 20
	}
	leaseTable(t, "lease_mx_log", "id bigserial PRIMARY KEY, sess int NOT NULL, inst text NOT NULL, tok bigint NOT NULL, ev text NOT NULL")
	app := defaultApp()
	app.max = 10
	a := startLockpool(t, 20, "instance_id: mx-a\nleases:\n  max_connections: 4", app)
	b := startLockpool(t, 20, "instance_id: mx-b\nleases:\n  max_connections: 4", app)
	name := "mx-" + fmt.Sprint(time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	conns := make([]*pgx.Conn, sessions)
	for i := range conns {
		if i%2 == 0 {
			conns[i] = a.connect(t, "app", "appdb")
		} else {
			conns[i] = b.connect(t, "app", "appdb")
		}
	}
	var inside, overlaps, nulls atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, sessions)
	start := time.Now()
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inst := "a"
			if i%2 == 1 {
				inst = "b"
			}
			for k := 0; k < attempts; k++ {
				tok, ok, err := acquireLease(ctx, c, name, 30, 60)
				if err != nil {
					errc <- fmt.Errorf("session %d attempt %d: lease_acquire: %w", i, k, err)
					return
				}
				if !ok {
					nulls.Add(1)
					continue
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				if _, err := c.Exec(ctx, "INSERT INTO lease_mx_log (sess, inst, tok, ev) VALUES ($1, $2, $3, 'enter')", i, inst, tok); err != nil {
					errc <- err
					return
				}
				if _, err := c.Exec(ctx, "INSERT INTO lease_mx_log (sess, inst, tok, ev) VALUES ($1, $2, $3, 'exit')", i, inst, tok); err != nil {
					errc <- err
					return
				}
				inside.Add(-1)
				var released bool
				if err := c.QueryRow(ctx, "SELECT lease_release($1)", name).Scan(&released); err != nil {
					errc <- fmt.Errorf("session %d: lease_release: %w", i, err)
					return
				}
				if !released {
					errc <- fmt.Errorf("session %d attempt %d: lease_release(%q) with token %d = false", i, k, name, tok)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	t.Logf("%d sessions x %d attempts across two instances in %v (%d NULL results after waiting)", sessions, attempts, time.Since(start), nulls.Load())
	if overlaps.Load() != 0 {
		t.Errorf("%d grants overlapped another holder's critical section (in-process check)", overlaps.Load())
	}
	if t.Failed() {
		return
	}

	// The log, in the order the server saw it: enter/exit pairs of one
	// session and token, never interleaved, tokens strictly increasing.
	rows, err := superConn(t, "appdb").Query(ctx, "SELECT sess, inst, tok, ev FROM lease_mx_log ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	type ev struct {
		sess     int
		inst, ev string
		tok      int64
	}
	var log []ev
	for rows.Next() {
		var e ev
		if err := rows.Scan(&e.sess, &e.inst, &e.tok, &e.ev); err != nil {
			t.Fatal(err)
		}
		log = append(log, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	grants := int64(sessions*attempts) - nulls.Load()
	if int64(len(log)) != 2*grants {
		t.Fatalf("log has %d events, want %d", len(log), 2*grants)
	}
	var last int64 = -1
	perInst := map[string]int{}
	for i := 0; i+1 < len(log); i += 2 {
		e, x := log[i], log[i+1]
		if e.ev != "enter" || x.ev != "exit" || e.sess != x.sess || e.tok != x.tok {
			t.Fatalf("events %d,%d interleave: %+v then %+v (two holders at once)", i, i+1, e, x)
		}
		if e.tok <= last {
			t.Fatalf("grant %d got token %d after token %d: tokens not strictly increasing in grant order", i/2, e.tok, last)
		}
		last = e.tok
		perInst[e.inst]++
	}
	if perInst["a"] == 0 || perInst["b"] == 0 {
		t.Fatalf("grants per instance = %v: both instances must take part", perInst)
	}
}

// Expiry takeover: SIGKILL the holder's lockpool; a waiter on the other
// instance gets the lease within ttl + 1 s with a larger token.
func TestLeaseExpiryTakeoverAfterKill(t *testing.T) {
	t.Parallel()
	proc := startLockpoolProcess(t, "killed")
	b := startLockpool(t, 10, "instance_id: survivor")
	ctx := context.Background()
	name := "takeover-" + fmt.Sprint(time.Now().UnixNano())

	holder, err := pgx.Connect(ctx, proc.DSN("app", "appdb"))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	old := mustAcquire(t, holder, name, 3, 0)

	su := superConn(t, "appdb")
	var firstExpiry time.Time
	if err := su.QueryRow(ctx, "SELECT expires_at FROM lockpool.leases WHERE name = $1", name).Scan(&firstExpiry); err != nil {
		t.Fatal(err)
	}

	waiter := b.connect(t, "app", "appdb")
	done := waitLease(ctx, waiter, name, 30, 10)
	clientWaiting(t, b, waiter.PgConn().PID())
	// The lease is renewed by the holder's instance while it lives: its
	// first expiry passes with the lease still live.
	leaseRow(t, su, name, 10*time.Second, "the lease to outlive its first expiry, renewed",
		"clock_timestamp() > $2 AND expires_at > clock_timestamp()", firstExpiry)
	select {
	case r := <-done:
		t.Fatalf("waiter got %+v while the holder's instance was alive (ttl 3 s, renewed)", r)
	default:
	}
	proc.Kill()
	killed := time.Now()
	r := leaseTakeover(t, done, old, 6*time.Second, "SIGKILL")
	if d := r.at.Sub(killed); d > 4*time.Second {
		t.Fatalf("waiter got the lease %v after SIGKILL, want within ttl + 1 s = 4 s", d)
	} else {
		t.Logf("waiter got the lease %v after SIGKILL", d)
	}
}

// A stale holder can neither renew nor release the new holder's lease.
func TestLeaseStaleHolderCannotRenewOrRelease(t *testing.T) {
	t.Parallel()
	a, b, name := startLeasePair(t, "stale")
	ctx := context.Background()
	stale := a.connectNotices(t, "app", "appdb")
	old := mustAcquire(t, stale, name, 2, 0)

	// Partition the stale holder from its lease: a row lock held elsewhere
	// makes every renewal by its instance fail, until the ttl has passed.
	su := superConn(t, "appdb")
	tx, err := su.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM lockpool.leases WHERE name = $1 FOR UPDATE", name); err != nil {
		t.Fatal(err)
	}
	leaseRow(t, superConn(t, "appdb"), name, 10*time.Second, "the partitioned lease to expire", "expires_at < clock_timestamp()")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	nb := b.connect(t, "app", "appdb")
	tok, ok, err := acquireLease(ctx, nb, name, 30, 5)
	if err != nil || !ok {
		t.Fatalf("new holder: lease_acquire = %d, %v, %v", tok, ok, err)
	}
	if tok <= old {
		t.Fatalf("new token %d <= stale token %d", tok, old)
	}
	// The stale holder's instance notices the loss (its keeper renews every
	// ttl/4 = 0.5 s): the session gets a WARNING with its next result, even
	// an ordinary query's.
	eventually(t, 5*time.Second, "the stale holder's keeper to count the lease lost", func() bool {
		return a.metric("lockpool_lease_operations_total", map[string]string{"op": "keeper_renew", "result": "lost"}) >= 1
	})
	var one int
	if err := stale.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatal(err)
	}
	warned := func() bool {
		for _, n := range stale.Notices() {
			if n.Severity == "WARNING" {
				return true
			}
		}
		return false
	}
	if !warned() {
		t.Errorf("no WARNING with the stale holder's next result (SELECT 1) after its lease was lost; notices %v", stale.Notices())
	}
	if leaseBool(t, stale, "lease_renew", name) {
		t.Fatal("stale holder: lease_renew = true")
	}
	if !warned() {
		t.Errorf("no WARNING even with the stale holder's next lease call")
	}
	if leaseBool(t, stale, "lease_release", name) {
		t.Fatal("stale holder: lease_release = true")
	}
	// The new holder still holds it, with its token.
	r, found := findLease(listLeases(t, nb), name)
	if !found || r.Token != tok || !r.Mine {
		t.Fatalf("after the stale holder's calls: lease_list() row %+v (found %v), want token %d mine", r, found, tok)
	}
	if !leaseBool(t, nb, "lease_renew", name) {
		t.Fatal("new holder: lease_renew = false")
	}
	if lost := a.metric("lockpool_lease_operations_total", map[string]string{"op": "keeper_renew", "result": "lost"}); lost < 1 {
		t.Errorf("lockpool_lease_operations_total{op=keeper_renew,result=lost} = %v, want >= 1", lost)
	}
}

// Closing the holder's connection releases its lease; a waiter on the
// other instance gets it within 1 s.
func TestLeaseReleasedOnDisconnect(t *testing.T) {
	t.Parallel()
	a, b, _ := startLeasePair(t, "disc")
	for _, how := range []string{"terminate", "tcp-close"} {
		t.Run(how, func(t *testing.T) {
			ctx := context.Background()
			name := "disc-" + how + "-" + fmt.Sprint(time.Now().UnixNano())
			holder := a.connect(t, "app", "appdb")
			old := mustAcquire(t, holder, name, 60, 0)
			waiter := b.connect(t, "app", "appdb")
			done := waitLease(ctx, waiter, name, 30, 10)
			clientWaiting(t, b, waiter.PgConn().PID())
			closed := time.Now()
			if how == "terminate" {
				_ = holder.Close(ctx)
			} else {
				_ = holder.PgConn().Conn().Close()
			}
			r := leaseTakeover(t, done, old, 3*time.Second, "the holder closing")
			if d := r.at.Sub(closed); d > time.Second {
				t.Fatalf("waiter got the lease %v after the holder closed, want within 1 s", d)
			}
		})
	}
}

// lease_fence: the current token succeeds and holds takeover off until
// COMMIT; a stale token raises LP001.
func TestLeaseFence(t *testing.T) {
	t.Parallel()
	a, b, name := startLeasePair(t, "fence")
	leaseTable(t, "lease_fence_t", "tok bigint, at timestamptz DEFAULT clock_timestamp()")
	ctx := context.Background()
	holder := a.connect(t, "app", "appdb")
	tok := mustAcquire(t, holder, name, 2, 0)

	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got int64
	if err := tx.QueryRow(ctx, "SELECT lease_fence($1, $2)", name, tok).Scan(&got); err != nil {
		t.Fatalf("lease_fence with the current token: %v", err)
	}
	if got != tok {
		t.Fatalf("lease_fence returned %d, want %d", got, tok)
	}
	// Also the lockpool.-qualified, simple-protocol spelling.
	if _, err := tx.Exec(ctx, fmt.Sprintf("SELECT lockpool.lease_fence('%s', %d)", name, tok)); err != nil {
		t.Fatalf("lockpool.lease_fence: %v", err)
	}

	// A waiter on the other instance: must not get the lease while the
	// fenced transaction is open, even after the ttl (2 s) has passed.
	waiter := b.connect(t, "app", "appdb")
	done := waitLease(ctx, waiter, name, 30, 10)
	clientWaiting(t, b, waiter.PgConn().PID())
	leaseRow(t, superConn(t, "appdb"), name, 10*time.Second, "the fenced lease's ttl to pass", "expires_at < clock_timestamp()")
	// A non-waiting acquire on a third session also fails.
	third := b.connect(t, "app", "appdb")
	if tk, ok, err := acquireLease(ctx, third, name, 30, 0); err != nil || ok {
		t.Fatalf("lease_acquire during a fenced transaction = %d, %v, %v; want NULL", tk, ok, err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO lease_fence_t (tok) VALUES ($1)", tok); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		t.Fatalf("waiter got %+v before the fenced transaction committed", r)
	default:
	}
	committed := time.Now()
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("COMMIT of the fenced transaction: %v", err)
	}
	r := leaseTakeover(t, done, tok, 5*time.Second, "COMMIT")
	if r.at.Before(committed) {
		t.Fatal("waiter got the lease before COMMIT")
	}
	newTok := r.tok
	t.Logf("takeover %v after COMMIT", r.at.Sub(committed))

	// The old holder's token is stale now: LP001, and the transaction is
	// aborted (nothing it wrote commits).
	tx, err = holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO lease_fence_t (tok) VALUES ($1)", -tok); err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, "SELECT lease_fence($1, $2)", name, tok)
	pe := pgErr(t, err, "LP001")
	if pe.Message == "" {
		t.Fatal("LP001 without a message")
	}
	t.Logf("stale fence: %s (hint %q)", pe.Message, pe.Hint)
	if err := tx.Commit(ctx); err == nil {
		// pgx reports ErrTxCommitRollback for COMMIT of an aborted tx.
		t.Log("COMMIT of aborted transaction returned no error")
	}
	var n int
	if err := holder.QueryRow(ctx, "SELECT count(*) FROM lease_fence_t WHERE tok = $1", -tok).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows written under a stale fence = %d, %v", n, err)
	}
	// The new holder's token fences fine.
	if err := waiter.QueryRow(ctx, "SELECT lease_fence($1, $2)", name, newTok).Scan(&got); err != nil || got != newTok {
		t.Fatalf("new holder's lease_fence = %d, %v", got, err)
	}
}

// lease_list() columns, and a 40-session auto-renew run of 30 s with ttl
// 2 s that loses no lease.
func TestLeaseListColumns(t *testing.T) {
	t.Parallel()
	a, b, name := startLeasePair(t, "list")
	ctx := context.Background()
	mine := a.connect(t, "app", "appdb")
	other := b.connect(t, "app", "appdb")
	tok := mustAcquire(t, mine, name, 20, 0)
	var serverNow time.Time
	if err := superConn(t, "appdb").QueryRow(ctx, "SELECT now()").Scan(&serverNow); err != nil {
		t.Fatal(err)
	}
	r, ok := findLease(listLeases(t, mine), name)
	if !ok {
		t.Fatalf("lease_list() lacks %q", name)
	}
	holderRE := regexp.MustCompile(`^list-a:[^:]+:[^:]+$`)
	if !holderRE.MatchString(r.Holder) {
		t.Fatalf("holder %q does not look like instance:session:random with instance list-a", r.Holder)
	}
	if r.Token != tok || !r.Mine {
		t.Fatalf("row %+v, want token %d mine", r, tok)
	}
	if d := r.ExpiresAt.Sub(serverNow.Add(20 * time.Second)); d < -3*time.Second || d > 3*time.Second {
		t.Fatalf("expires_at %v, server now() %v + ttl 20 s: off by %v", r.ExpiresAt, serverNow, d)
	}
	if d := serverNow.Sub(r.TakenAt); d < -3*time.Second || d > 3*time.Second {
		t.Fatalf("taken_at %v, server now() %v: off by %v", r.TakenAt, serverNow, d)
	}
	ro, ok := findLease(listLeases(t, other), name)
	if !ok || ro.Mine || ro.Holder != r.Holder || ro.Token != tok {
		t.Fatalf("other instance's lease_list() row %+v (found %v), want holder %q token %d not mine", ro, ok, r.Holder, tok)
	}
	// The same session from a second connection on the same instance is not the holder.
	ro, ok = findLease(listLeases(t, a.connect(t, "app", "appdb")), name)
	if !ok || ro.Mine {
		t.Fatalf("another session's view %+v (found %v): mine must be false", ro, ok)
	}
	// Re-acquire by the holder keeps the token.
	if again := mustAcquire(t, mine, name, 20, 0); again != tok {
		t.Fatalf("re-acquire by the holder: token %d, want %d", again, tok)
	}
	// Two holders never share a holder string.
	tok2 := mustAcquire(t, other, name+"-2", 20, 0)
	r2, _ := findLease(listLeases(t, other), name+"-2")
	if r2.Holder == r.Holder || r2.Token != tok2 || !r2.Mine {
		t.Fatalf("second holder row %+v", r2)
	}
}

func TestLeaseAutoRenew40Sessions(t *testing.T) {
	t.Parallel()
	const (
		sessions = 40
		runFor   = 30 * time.Second
	)
	app := defaultApp()
	app.max = 4
	a := startLockpool(t, 10, "instance_id: renew40", app)
	ctx := context.Background()
	prefix := fmt.Sprintf("renew40-%d-", time.Now().UnixNano())
	conns := make([]*noticeConn, sessions)
	tokens := make([]int64, sessions)
	for i := range conns {
		conns[i] = a.connectNotices(t, "app", "appdb")
		tokens[i] = mustAcquire(t, conns[i], fmt.Sprintf("%s%d", prefix, i), 2, 0)
	}
	su := superConn(t, "appdb")
	deadline := time.Now().Add(runFor)
	samples := 0
	for time.Now().Before(deadline) {
		var live, moved int
		if err := su.QueryRow(ctx, `SELECT count(*) FILTER (WHERE expires_at > now()), count(*) FILTER (WHERE transitions <> 1)
			FROM lockpool.leases WHERE name LIKE $1`, prefix+"%").Scan(&live, &moved); err != nil {
			t.Fatal(err)
		}
		if live != sessions || moved != 0 {
			t.Fatalf("after %v: %d of %d leases live, %d changed hands", runFor-time.Until(deadline), live, sessions, moved)
		}
		samples++
		time.Sleep(250 * time.Millisecond)
	}
	for i, c := range conns {
		name := fmt.Sprintf("%s%d", prefix, i)
		if !leaseBool(t, c, "lease_renew", name) {
			t.Errorf("session %d: lease_renew(%q) = false after %v", i, name, runFor)
		}
		for _, n := range c.Notices() {
			t.Errorf("session %d: notice %s %s: %s", i, n.Severity, n.Code, n.Message)
		}
	}
	rows := listLeases(t, conns[0])
	for i := range conns {
		r, ok := findLease(rows, fmt.Sprintf("%s%d", prefix, i))
		if !ok || r.Token != tokens[i] {
			t.Errorf("lease %d: %+v (found %v), want token %d", i, r, ok, tokens[i])
		}
	}
	if lost := a.metric("lockpool_lease_operations_total", map[string]string{"op": "keeper_renew", "result": "lost"}); lost != 0 {
		t.Errorf("keeper_renew lost = %v", lost)
	}
	t.Logf("%d samples, all %d leases live throughout", samples, sessions)
}
