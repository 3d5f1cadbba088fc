package integration

// Leases across failovers through lockpool: the entry/exit-table oracle
// under switchovers and crashes of a synchronous pair, and a promotion of
// an asynchronous standby that missed the last lease commits.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
	"github.com/lockpool/lockpool/lease"
)

// startLeaseFailoverLockpool runs lockpool with instance id id over the
// pair's two hosts, with application api (role app, database appdb).
func startLeaseFailoverLockpool(t *testing.T, pair *testenv.Pair, id string) *testenv.Lockpool {
	t.Helper()
	api := testenv.App{Name: "api", User: "app", DB: "appdb", Max: 8, Pinned: 1, Advisory: "pin", State: "pin", Wait: "10s"}
	yaml := testenv.HostsYAML([]*pgtest.Cluster{pair.Primary, pair.Standby}, 40, "instance_id: "+id, failoverServer, api)
	lp, log := testenv.StartYAML(t, yaml)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("lockpool %s log (last 30000 bytes):\n%s", id, foTail(log.String(), 30000))
		}
	})
	return lp
}

func foTail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// foWaitPrimary waits until every lockpool sees c as the primary.
func foWaitPrimary(t *testing.T, c *pgtest.Cluster, lps ...*testenv.Lockpool) {
	t.Helper()
	for _, l := range lps {
		testenv.Eventually(t, 30*time.Second, "lockpool to see "+testenv.Addr(c)+" as the primary", func() bool {
			return testenv.HostRow(l.Hosts(), c).State == "primary"
		})
	}
}

// foStandbyLease reads lease name's token and holder on c (a standby, read
// only); ok is false when it has no row.
func foStandbyLease(t *testing.T, c *pgtest.Cluster, name string) (token int64, holder string, live, ok bool) {
	t.Helper()
	ctx := testenv.Context(t, 10*time.Second)
	conn, err := testenv.Connect(ctx, c, "appdb")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, "SELECT token, holder, expires_at > now() FROM lockpool.leases WHERE name = $1", name).Scan(&token, &holder, &live)
	if err == pgx.ErrNoRows {
		return 0, "", false, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return token, holder, live, true
}

// TestFailoverLeaseMissedCommits: an asynchronous standby stops receiving
// WAL, lease commits go on on the primary through two lockpools (a
// release and a takeover, a new grant, more grants than the token
// sequence logs ahead, a renewal), the primary crashes and the standby is
// promoted at once. Through lockpool, then: every token handed out is
// above every token handed out before the failover, also those the
// standby never saw, and in grant order; the holders whose grants the
// standby missed get false from their next lease_renew, before and after
// another holder took the lease, and their token no longer fences; the
// session whose release the standby missed gets a new, larger token, not
// its old one; the lease whose grant reached the standby (its later
// renewals did not) is still its holder's, with its token, and nobody else
// can take it. Meanwhile the clients of the lease oracle
// (TestFailoverLeaseOracle) loop on their own names through both
// lockpools, grants of theirs are missed too, and their record passes
// the oracle: no two holders at once (a hold the new primary never
// confirmed counts until the crash: its holder learns of the loss at its
// next renew, which never says true), tokens strictly increasing per name
// and above every earlier one after the failover, the table's rows of a
// name never going back to a smaller token, the rows acknowledged before
// the standby stopped receiving still there, and a hold whose grant the
// standby missed, believed across the failover, renews false.
func TestFailoverLeaseMissedCommits(t *testing.T) {
	pair := testenv.StartPair(t, false)
	a := startLeaseFailoverLockpool(t, pair, "fo-missed-a")
	b := startLeaseFailoverLockpool(t, pair, "fo-missed-b")
	ctx := testenv.Context(t, 3*time.Minute)
	old, next := pair.Primary, pair.Standby
	o, stop := startFoLeaseOracle(t, pair, []*testenv.Lockpool{a, b})
	testenv.Eventually(t, 30*time.Second, "10 grants of the oracle's clients", func() bool { return o.acquisitions() >= 10 })

	hKept := a.Connect(t, "app", "appdb")  // holds "kept" throughout
	hMoved := a.Connect(t, "app", "appdb") // holds "moved", releases it after the standby stopped receiving
	hTake := b.Connect(t, "app", "appdb")  // takes "moved" over after that
	hLost := b.Connect(t, "app", "appdb")  // takes "lost" after that
	hBulk := a.Connect(t, "app", "appdb")  // many grants after that
	hNew := b.Connect(t, "app", "appdb")   // a holder that comes after the failover

	var handed []int64 // every token handed out before the failover, in grant order
	grant := func(c *pgx.Conn, name string) int64 {
		t.Helper()
		tok := mustAcquire(t, c, name, 60, 0)
		handed = append(handed, tok)
		return tok
	}
	tKept := grant(hKept, "kept")
	tMoved := grant(hMoved, "moved")
	testenv.Eventually(t, 30*time.Second, "a sticky oracle holder in its work phase", o.beginFailover)
	f := foFailover{kind: "crash, missed commits", began: time.Now()}
	durableBefore := time.Now() // rows acknowledged before this reach the standby
	if err := old.WaitReplayed(ctx, next); err != nil {
		t.Fatal(err)
	}
	if err := next.StopWALReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()

	// The commits the standby misses.
	if !leaseBool(t, hMoved, "lease_release", "moved") {
		t.Fatal("lease_release(moved) = false")
	}
	tTake := grant(hTake, "moved")
	tLost := grant(hLost, "lost")
	const bulk = 40 // more than the 32 values a sequence logs ahead of itself
	for i := range bulk {
		grant(hBulk, fmt.Sprintf("bulk-%d", i))
	}
	if !leaseBool(t, hKept, "lease_renew", "kept") {
		t.Fatal("lease_renew(kept) = false on the old primary")
	}
	testenv.Eventually(t, 20*time.Second, "5 grants of the oracle's clients that the standby misses", func() bool { return o.grantsAfter(stopped) >= 5 })
	// A sticky client that joins now: its first grant is missed, and it
	// holds it through the failover.
	o.join(b, "late", true)
	testenv.Eventually(t, 20*time.Second, "a sticky holder whose grant the standby misses, in its work phase", func() bool { return o.workingSince(stopped) })
	for i := 1; i < len(handed); i++ {
		if handed[i] <= handed[i-1] {
			t.Fatalf("tokens before the failover not increasing: %d then %d", handed[i-1], handed[i])
		}
	}
	maxBefore := slices.Max(handed)

	// The standby has the state of before: moved still held by hMoved's
	// session with its first token, no row of lost or the bulk grants.
	if tok, _, live, ok := foStandbyLease(t, next, "moved"); !ok || tok != tMoved || !live {
		t.Fatalf("moved on the standby: token %d live %v found %v; want %d, live", tok, live, ok, tMoved)
	}
	for _, name := range []string{"lost", "bulk-0", fmt.Sprintf("bulk-%d", bulk-1)} {
		if _, _, _, ok := foStandbyLease(t, next, name); ok {
			t.Fatalf("the standby has a row of %s, granted after its WAL receiver stopped", name)
		}
	}

	// The primary crashes; the standby is promoted right after.
	f.ts.Stopping = time.Now()
	if err := old.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	f.ts.Stopped, f.ts.Promoting = time.Now(), time.Now()
	if err := next.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	f.ts.Promoted = time.Now()
	pair.Primary, pair.Standby = next, old
	foWaitPrimary(t, next, a, b)
	o.endFailover()

	// The holders whose grants were lost: false, before anyone else took
	// their leases.
	if leaseBool(t, hLost, "lease_renew", "lost") {
		t.Error("lease_renew(lost) = true on the new primary, which never saw its grant")
	}
	if leaseBool(t, hTake, "lease_renew", "moved") {
		t.Error("lease_renew(moved) by the takeover holder = true on the new primary, which never saw the takeover")
	}
	// The lease whose grant reached the standby is still its holder's.
	if !leaseBool(t, hKept, "lease_renew", "kept") {
		t.Error("lease_renew(kept) = false on the new primary, which has its grant")
	}
	if r, ok := findLease(listLeases(t, hKept), "kept"); !ok || r.Token != tKept || !r.Mine {
		t.Errorf("lease_list() on the new primary has kept = %+v (found %v), want token %d and mine", r, ok, tKept)
	}

	// New grants after the failover: all above every token of before, in
	// grant order.
	var after []int64
	take := func(c *pgx.Conn, name, who string) {
		t.Helper()
		tok, ok, err := acquireLease(ctx, c, name, 60, 0)
		if err != nil || !ok {
			t.Errorf("lease_acquire(%s) by %s after the failover = %d, %v, %v; want a token", name, who, tok, ok, err)
			return
		}
		if tok <= maxBefore {
			t.Errorf("lease_acquire(%s) by %s after the failover = %d, not above %d, the largest token handed out before it: tokens went backwards", name, who, tok, maxBefore)
		}
		after = append(after, tok)
	}
	take(hNew, "lost", "another holder")
	// The session whose release the new primary never saw: its row there
	// still names it, with its first token. It gets a new token, not that one.
	take(hMoved, "moved", "the session whose release was lost")
	for i := range 5 {
		take(hBulk, fmt.Sprintf("bulk-%d", i), "the holder whose grants were lost")
	}
	take(hNew, "after", "a new holder")
	for i := 1; i < len(after); i++ {
		if after[i] <= after[i-1] {
			t.Errorf("tokens after the failover not increasing: %d then %d", after[i-1], after[i])
		}
	}

	// Never two holders: the lost holders still get false, their tokens
	// no longer fence, and kept cannot be taken.
	if leaseBool(t, hLost, "lease_renew", "lost") {
		t.Error("lease_renew(lost) by its lost holder = true after another holder took it")
	}
	if leaseBool(t, hTake, "lease_renew", "moved") {
		t.Error("lease_renew(moved) by the lost takeover holder = true after the releasing session took it again")
	}
	for _, f := range []struct {
		c     *pgx.Conn
		name  string
		token int64
	}{{hTake, "moved", tTake}, {hLost, "lost", tLost}} {
		tx, err := f.c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tx.Exec(ctx, "SELECT lease_fence($1, $2)", f.name, f.token)
		if testenv.Code(err) != "LP001" {
			t.Errorf("lease_fence(%s, %d) with the lost token on the new primary: %v; want LP001", f.name, f.token, err)
		}
		_ = tx.Rollback(ctx)
	}
	if tok, ok, err := acquireLease(ctx, hNew, "kept", 60, 0); ok || err != nil {
		t.Errorf("lease_acquire(kept) by another holder = %d, %v, %v; want NULL (kept is its holder's)", tok, ok, err)
	}
	if !leaseBool(t, hKept, "lease_renew", "kept") {
		t.Error("lease_renew(kept) = false at the end")
	}

	// The oracle's clients go on on the new primary; then their record is checked.
	testenv.Eventually(t, 30*time.Second, "10 grants of the oracle's clients after the failover", func() bool { return o.grantsAfter(f.ts.Promoted) >= 10 })
	testenv.Eventually(t, 30*time.Second, "the oracle's holds across the failover to end", func() bool { return o.openBefore(f.ts.Promoted) == 0 })
	stop()
	fos := []foFailover{f}
	violations := o.check(t, fos, true)
	violations += o.checkTable(t, next, durableBefore)
	held, kept, lost := o.spans(t, fos)
	if lost == 0 {
		t.Error("no hold of the oracle's clients whose grant the standby missed renewed false on the new primary")
	}
	t.Logf("oracle clients' errors (expected around the failover): %v", o.errs)
	t.Logf("oracle: %s grants_missed_by_the_standby=%d held_across_the_failover=%d (renew true %d, false %d) violations=%d",
		o.summary([]*testenv.Lockpool{a, b}), o.grantsBetween(stopped, f.ts.Stopping), held, kept, lost, violations)

	if len(after) > 0 {
		seq := func(tok int64) int64 { return tok &^ (lease.TokenTimeline(tok) << lease.TokenTimelineShift) }
		t.Logf("before the failover: %d grants, tokens %d..%d (timeline %d, sequence up to %d; kept %d, moved %d then %d, lost %d); after: %d grants, tokens %d..%d (timeline %d, sequence from %d)",
			len(handed), handed[0], maxBefore, lease.TokenTimeline(maxBefore), seq(maxBefore), tKept, tMoved, tTake, tLost,
			len(after), after[0], slices.Max(after), lease.TokenTimeline(after[0]), seq(after[0]))
	}
}

// The lease oracle across failovers (TestFailoverLeaseOracle, and the
// clients that run through TestFailoverLeaseMissedCommits).
const (
	foLeaseTTL      = 10.0 // seconds: well above a failover's outage, so the keeper keeps live leases
	foLeaseWait     = 1.0  // seconds an acquire waits for a busy lease
	foLeaseClients  = 3    // per lockpool instance; the first is sticky
	foLeaseLogTable = "fo_lease_log"
)

var foLeaseNames = []string{"fo-lease-0", "fo-lease-1", "fo-lease-2", "fo-lease-3"}

// foHold is one grant a client received: it believes it holds the lease
// from start (acquire's reply) to end (the release about to be sent, the
// renew that said false or failed, a failed write after which it gave the
// lease up, or the end of the run).
type foHold struct {
	name, client string
	sticky       bool
	token        int64
	start, end   time.Time
	ended        string      // how the belief ended
	renews       []foRenew   // in order
	working      bool        // a sticky hold between its entry row and its renew
	releaseFalse bool        // lease_release said false
	fenceThenOK  bool        // a write's lease_fence rejected the token, and a renew then said true
	wrote        []time.Time // when its acknowledged writes were sent
	until        time.Time   // the end the oracle judges by (check sets it)
}

// foRenew is one lease_renew of a hold: sent at sent, answered at at.
type foRenew struct {
	sent, at time.Time
	ok       bool
	err      string // "" when it answered
}

// foAck is an entry or exit row whose INSERT was acknowledged (at).
type foAck struct {
	k     int64
	name  string
	token int64
	ev    string
	at    time.Time
}

// foLeaseOracle runs the lease oracle's clients and records what they saw. Sticky clients keep a lease in their work phase through a
// failover that began during it (the failover waits for one to be in it),
// so that every failover has holds across it; the others work briefly and
// meet the failovers wherever they fall.
type foLeaseOracle struct {
	k       atomic.Int64 // the last row key handed out
	clients atomic.Int64 // clients started
	run     context.Context
	wg      sync.WaitGroup
	seed    uint64

	mu       sync.Mutex
	holds    []*foHold
	acks     []foAck
	nulls    int
	errs     map[string]int // where and SQLSTATE → count
	working  int            // sticky holds in their work phase
	failing  bool           // a failover is under way
	failDone chan struct{}  // closed when it is over
}

// fail counts an error a client got, by where and SQLSTATE.
func (o *foLeaseOracle) fail(where string, err error) {
	code := testenv.Code(err)
	if code == "" {
		code = "connection error"
	}
	o.mu.Lock()
	o.errs[where+" "+code]++
	o.mu.Unlock()
}

func (o *foLeaseOracle) acquisitions() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.holds)
}

// beginFailover marks a failover under way if a sticky hold is in its work
// phase (which then lasts until endFailover); false if none is.
func (o *foLeaseOracle) beginFailover() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.working == 0 {
		return false
	}
	o.failing, o.failDone = true, make(chan struct{})
	return true
}

func (o *foLeaseOracle) endFailover() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.failing {
		o.failing = false
		close(o.failDone)
	}
}

// foPace waits d, or until ctx ends (false then): a client's work, the
// pacing of its retries, the failovers' schedule; none of them a
// synchronisation.
func foPace(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// client loops until ctx ends: acquire one of the names; if granted, an
// entry row, work, renew, an exit row, release. After an error it gives
// the lease up (and its connection, so that lockpool releases what the
// session holds).
func (o *foLeaseOracle) client(ctx context.Context, dsn, id string, sticky bool, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	var conn *pgx.Conn
	drop := func() {
		if conn != nil {
			_ = conn.Close(context.Background())
			conn = nil
		}
	}
	defer drop()
	for ctx.Err() == nil {
		if conn == nil {
			c, err := pgx.Connect(ctx, dsn)
			if err != nil {
				if ctx.Err() == nil {
					o.fail("connect", err)
					foPace(ctx, 50*time.Millisecond)
				}
				continue
			}
			conn = c
		}
		name := foLeaseNames[rng.IntN(len(foLeaseNames))]
		tok, ok, err := acquireLease(ctx, conn, name, foLeaseTTL, foLeaseWait)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			o.fail("acquire", err)
			if conn.IsClosed() {
				drop()
			}
			foPace(ctx, 50*time.Millisecond)
			continue
		}
		if !ok {
			o.mu.Lock()
			o.nulls++
			o.mu.Unlock()
			continue
		}
		h := &foHold{name: name, client: id, sticky: sticky, token: tok, start: time.Now()}
		o.mu.Lock()
		o.holds = append(o.holds, h)
		o.mu.Unlock()
		if !o.hold(ctx, conn, h, rng) {
			drop()
		}
	}
}

// end ends h's belief now.
func (o *foLeaseOracle) end(h *foHold, how string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if h.end.IsZero() {
		h.end, h.ended = time.Now(), how
	}
	if h.working {
		h.working = false
		o.working--
	}
}

// hold runs one grant from the entry row to the release; false when the
// client should drop its connection.
func (o *foLeaseOracle) hold(ctx context.Context, conn *pgx.Conn, h *foHold, rng *rand.Rand) bool {
	if err := o.write(ctx, conn, h, "entry"); err != nil {
		return o.writeFailed(ctx, conn, h, "entry", err)
	}
	work := 10*time.Millisecond + time.Duration(rng.IntN(290))*time.Millisecond
	if h.sticky {
		work = time.Second + time.Duration(rng.IntN(2000))*time.Millisecond
		o.mu.Lock()
		h.working = true
		o.working++
		o.mu.Unlock()
	}
	if !foPace(ctx, work) { // the work
		o.end(h, "stopped")
		return false
	}
	if h.sticky {
		// A failover that began during the work: the work lasts until it is over.
		o.mu.Lock()
		for o.failing {
			done := o.failDone
			o.mu.Unlock()
			select {
			case <-done:
			case <-ctx.Done():
				o.end(h, "stopped")
				return false
			}
			o.mu.Lock()
		}
		if h.working {
			h.working = false
			o.working--
		}
		o.mu.Unlock()
	}
	ok, err := o.renew(ctx, conn, h)
	switch {
	case err != nil && ctx.Err() != nil:
		o.end(h, "stopped")
		return false
	case err != nil:
		o.fail("renew", err)
		o.end(h, "renew failed")
		return false
	case !ok:
		o.end(h, "renew false")
		return true
	}
	if err := o.write(ctx, conn, h, "exit"); err != nil {
		return o.writeFailed(ctx, conn, h, "exit", err)
	}
	o.end(h, "released") // before the release is sent
	released, err := foLeaseRelease(ctx, conn, h.name)
	if err != nil {
		if ctx.Err() == nil {
			o.fail("release", err)
		}
		return false
	}
	if !released {
		o.mu.Lock()
		h.releaseFalse = true
		o.mu.Unlock()
	}
	return true
}

func foLeaseRelease(ctx context.Context, c *pgx.Conn, name string) (bool, error) {
	var ok bool
	err := c.QueryRow(ctx, "SELECT lease_release($1)", name).Scan(&ok)
	return ok, err
}

// renew calls lease_renew for h and records it.
func (o *foLeaseOracle) renew(ctx context.Context, conn *pgx.Conn, h *foHold) (bool, error) {
	r := foRenew{sent: time.Now()}
	err := conn.QueryRow(ctx, "SELECT lease_renew($1)", h.name).Scan(&r.ok)
	r.at = time.Now()
	if err != nil {
		r.ok, r.err = false, errText(err)
	}
	o.mu.Lock()
	h.renews = append(h.renews, r)
	o.mu.Unlock()
	return r.ok, err
}

// write inserts h's entry or exit row through lockpool, fenced by its
// token, and records it when acknowledged.
func (o *foLeaseOracle) write(ctx context.Context, conn *pgx.Conn, h *foHold, ev string) error {
	k := o.k.Add(1)
	sent := time.Now()
	_, err := conn.Exec(ctx, "INSERT INTO "+foLeaseLogTable+" (k, name, token, client, ev, at) VALUES ($1, $2, lease_fence($2, $3), $4, $5, $6)",
		k, h.name, h.token, h.client, ev, sent)
	if err == nil {
		o.mu.Lock()
		o.acks = append(o.acks, foAck{k: k, name: h.name, token: h.token, ev: ev, at: time.Now()})
		h.wrote = append(h.wrote, sent)
		o.mu.Unlock()
	}
	return err
}

// writeFailed ends h after its entry or exit write failed. A fence that
// rejected the token while the client believed it: the renew that follows
// must say false (the rule: a lease is still the holder's, or its next
// renew says it is lost).
func (o *foLeaseOracle) writeFailed(ctx context.Context, conn *pgx.Conn, h *foHold, ev string, err error) bool {
	if ctx.Err() != nil {
		o.end(h, "stopped")
		return false
	}
	if testenv.Code(err) == "LP001" {
		o.fail(ev+" write", err)
		ok, rerr := o.renew(ctx, conn, h)
		if rerr == nil && ok {
			o.mu.Lock()
			h.fenceThenOK = true
			o.mu.Unlock()
		}
		o.end(h, "fence rejected, then renew")
		return false
	}
	o.fail(ev+" write", err)
	o.end(h, ev+" write failed")
	return false
}

// foFailover is one failover of a run.
type foFailover struct {
	kind  string // switchover | crash | crash, missed commits
	began time.Time
	ts    pgtest.SwitchoverTimes
}

// startFoLeaseOracle creates the entry/exit table on the pair's primary
// and starts the oracle's clients, foLeaseClients on each lockpool of
// lps, the first of each sticky. They stop when the returned function is
// called or the test ends, whichever comes first.
func startFoLeaseOracle(t *testing.T, pair *testenv.Pair, lps []*testenv.Lockpool) (*foLeaseOracle, func()) {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	if err := pair.Exec(ctx, "appdb", "CREATE TABLE "+foLeaseLogTable+` (id bigserial PRIMARY KEY, k bigint UNIQUE NOT NULL,
		name text NOT NULL, token bigint NOT NULL, client text NOT NULL, ev text NOT NULL, at timestamptz NOT NULL,
		port int NOT NULL DEFAULT inet_server_port()); GRANT ALL ON `+foLeaseLogTable+", "+foLeaseLogTable+"_id_seq TO app"); err != nil {
		t.Fatal(err)
	}
	run, cancel := context.WithCancel(context.Background())
	o := &foLeaseOracle{errs: map[string]int{}, run: run, seed: uint64(time.Now().UnixNano())}
	stop := func() { cancel(); o.wg.Wait() }
	t.Cleanup(stop) // before the lockpools stop
	t.Logf("oracle clients' seed %d", o.seed)
	for i, l := range lps {
		for j := range foLeaseClients {
			o.join(l, fmt.Sprintf("%c%d", 'a'+i, j), j == 0)
		}
	}
	return o, stop
}

// join starts one more client of the oracle, through l.
func (o *foLeaseOracle) join(l *testenv.Lockpool, id string, sticky bool) {
	seed := o.seed + uint64(o.clients.Add(1)) // distinct per client
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		o.client(o.run, l.DSN("app", "appdb"), id, sticky, seed)
	}()
}

// workingSince reports whether a sticky hold granted after t is in its
// work phase.
func (o *foLeaseOracle) workingSince(t time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, h := range o.holds {
		if h.working && h.start.After(t) {
			return true
		}
	}
	return false
}

// grantsBetween is the number of grants received between from and to.
func (o *foLeaseOracle) grantsBetween(from, to time.Time) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, h := range o.holds {
		if h.start.After(from) && h.start.Before(to) {
			n++
		}
	}
	return n
}

// openBefore is the number of holds granted before t that are still
// believed.
func (o *foLeaseOracle) openBefore(t time.Time) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, h := range o.holds {
		if h.start.Before(t) && h.end.IsZero() {
			n++
		}
	}
	return n
}

// grantsAfter is the number of grants received after t.
func (o *foLeaseOracle) grantsAfter(t time.Time) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, h := range o.holds {
		if h.start.After(t) {
			n++
		}
	}
	return n
}

// summary is the oracle's figures, for the log.
func (o *foLeaseOracle) summary(lps []*testenv.Lockpool) string {
	var keeperLost float64
	for _, l := range lps {
		keeperLost += l.Metric("lockpool_lease_operations_total", map[string]string{"op": "keeper_renew", "result": "lost"})
	}
	renewLost, releaseFalse := 0, 0
	for _, h := range o.holds {
		for _, r := range h.renews {
			if r.err == "" && !r.ok {
				renewLost++
			}
		}
		if h.releaseFalse {
			releaseFalse++
		}
	}
	return fmt.Sprintf("acquisitions=%d null=%d acked_rows=%d renew_lost=%d keeper_lost=%.0f release_false=%d",
		len(o.holds), o.nulls, len(o.acks), renewLost, keeperLost, releaseFalse)
}

// TestFailoverLeaseOracle: two lockpool instances over a primary and its
// synchronous standby, three clients on each looping over four lease
// names (acquire with a 10 s ttl; if granted: an entry row fenced by the
// token into a table on the primary through lockpool, work, lease_renew,
// an exit row, release), while the primary changes: two switchovers and a
// crash (a soak under LOCKPOOL_FAILOVER_SOAK alternates them every 30 s).
// It proves: no two clients believe they hold one lease at the same time
// (a holder believes from acquire's reply to its release, or to the renew
// that said false or failed); each name's tokens strictly increase in
// grant order, and every token granted after a failover is above every
// token granted before it, on a higher timeline; every failover has holds
// across it whose renew on the new primary said true or false (the rule:
// still its own, or lost), never failed; a fence never rejected a token
// whose renew then said true; every acknowledged row is on the final
// primary, and the table's rows of a name never go back to a smaller
// token; leases are granted again after every failover.
func TestFailoverLeaseOracle(t *testing.T) {
	plan := testenv.PlanFailovers(t, 3, 8*time.Second)
	if plan.Soak {
		t.Parallel()
	}
	began := time.Now()
	pair := testenv.StartPair(t, true)
	lps := []*testenv.Lockpool{
		startLeaseFailoverLockpool(t, pair, "fo-oracle-a"),
		startLeaseFailoverLockpool(t, pair, "fo-oracle-b"),
	}
	o, stop := startFoLeaseOracle(t, pair, lps)
	testenv.Eventually(t, 30*time.Second, "10 grants", func() bool { return o.acquisitions() >= 10 })

	var fos []foFailover
	base := time.Now()
	for i := range plan.Failovers {
		foPace(context.Background(), time.Until(base.Add(time.Duration(i)*plan.Every)))
		testenv.Eventually(t, 30*time.Second, "a sticky holder in its work phase", o.beginFailover)
		f := foFailover{kind: "switchover", began: time.Now()}
		if i%2 == 1 {
			f.kind = "crash"
		}
		ctx := testenv.Context(t, 2*time.Minute)
		var err error
		if f.kind == "switchover" {
			f.ts, err = pair.Switch(ctx)
		} else {
			f.ts, err = pair.Crash(ctx)
		}
		if err != nil {
			o.endFailover()
			t.Fatalf("failover %d (%s): %v", i, f.kind, err)
		}
		foWaitPrimary(t, pair.Primary, lps...)
		o.endFailover()
		fos = append(fos, f)
		t.Logf("failover %d (%s) to %s: stopped %v after it began, promoted %v, rejoined %v, lockpools follow %v",
			i, f.kind, testenv.Addr(pair.Primary), f.ts.Stopped.Sub(f.began).Round(time.Millisecond),
			f.ts.Promoted.Sub(f.began).Round(time.Millisecond), f.ts.Rejoined.Sub(f.began).Round(time.Millisecond),
			time.Since(f.began).Round(time.Millisecond))
	}
	last := time.Now()
	testenv.Eventually(t, 30*time.Second, "10 grants after the last failover", func() bool { return o.grantsAfter(last) >= 10 })
	testenv.Eventually(t, 30*time.Second, "the holds across the last failover to end", func() bool { return o.openBefore(last) == 0 })
	stop()

	violations := o.check(t, fos, false)
	violations += o.checkTable(t, pair.Primary, time.Time{})
	held, kept, lost := o.spans(t, fos)
	kinds := map[string]int{}
	for _, f := range fos {
		kinds[f.kind]++
	}
	t.Logf("client errors (expected around failovers): %v", o.errs)
	t.Logf("soak summary: failovers=%d (switchovers=%d crashes=%d) %s held_across_failovers=%d (renew true %d, false %d) violations=%d duration=%v",
		len(fos), kinds["switchover"], kinds["crash"], o.summary(lps), held, kept, lost, violations, time.Since(began).Round(time.Second))
}

// violation reports one broken rule (the first 20 in full) and counts it.
func (o *foLeaseOracle) violation(t *testing.T, n *int, format string, args ...any) {
	t.Helper()
	*n++
	if *n <= 20 {
		t.Errorf(format, args...)
	}
}

func (h *foHold) String() string {
	lost := ""
	if !h.until.IsZero() && h.until.Before(h.end) {
		lost = fmt.Sprintf(", lost with the old primary at %s", h.until.Format("15:04:05.000"))
	}
	return fmt.Sprintf("%s token %d (client %s) believed %s..%s (%s%s)", h.name, h.token, h.client,
		h.start.Format("15:04:05.000"), h.end.Format("15:04:05.000"), h.ended, lost)
}

// confirmed reports whether the primary confirmed h after t: a renew
// sent after t said true, or a fenced write sent after t was acknowledged.
func (h *foHold) confirmed(t time.Time) bool {
	for _, r := range h.renews {
		if !r.sent.Before(t) && r.ok {
			return true
		}
	}
	for _, w := range h.wrote {
		if !w.Before(t) {
			return true
		}
	}
	return false
}

// check applies the oracle to the clients' record; it returns the number
// of violations. With lossy (a failover to a standby that missed commits)
// a hold believed across a failover that the new primary never confirmed
// (no renew said true, no fenced write went through there) counts as
// believed only until the old primary stopped: the rule lets its holder
// learn of the loss at its next renew, and what holds is that it never
// hears true from the new primary while another holder has the lease.
func (o *foLeaseOracle) check(t *testing.T, fos []foFailover, lossy bool) int {
	t.Helper()
	v := 0
	byName := map[string][]*foHold{}
	for _, h := range o.holds {
		if h.end.IsZero() {
			h.end, h.ended = time.Now(), "unfinished"
		}
		h.until = h.end
		if lossy {
			for _, f := range fos {
				if h.start.Before(f.ts.Stopping) && h.end.After(f.ts.Stopping) && !h.confirmed(f.ts.Promoted) && f.ts.Stopping.Before(h.until) {
					h.until = f.ts.Stopping
				}
			}
		}
		byName[h.name] = append(byName[h.name], h)
		if h.fenceThenOK {
			o.violation(t, &v, "a fence rejected %s, then its renew said true", h)
		}
	}
	for name, hs := range byName {
		sort.Slice(hs, func(i, j int) bool { return hs[i].start.Before(hs[j].start) })
		var last *foHold // the hold believed longest so far
		for i, h := range hs {
			if last != nil && h.start.Before(last.until) {
				o.violation(t, &v, "two holders of %s at once: %s, and %s", name, last, h)
			}
			if i > 0 && h.token <= hs[i-1].token {
				o.violation(t, &v, "tokens of %s not increasing in grant order: %s, then %s", name, hs[i-1], h)
			}
			if last == nil || h.until.After(last.until) {
				last = h
			}
		}
	}
	for i, f := range fos {
		var before, after []int64
		next := time.Now()
		if i+1 < len(fos) {
			next = fos[i+1].began
		}
		grants := 0
		for _, h := range o.holds {
			switch {
			case h.start.Before(f.ts.Stopping):
				before = append(before, h.token)
			case h.start.After(f.ts.Promoted):
				after = append(after, h.token)
				if h.start.Before(next) {
					grants++
				}
			}
		}
		if grants == 0 {
			t.Errorf("failover %d (%s): no lease granted after it", i, f.kind)
		}
		if len(before) == 0 || len(after) == 0 {
			continue
		}
		maxBefore, minAfter := slices.Max(before), slices.Min(after)
		if minAfter <= maxBefore {
			o.violation(t, &v, "failover %d (%s): token %d granted after it is not above %d granted before it", i, f.kind, minAfter, maxBefore)
		}
		if lease.TokenTimeline(minAfter) <= lease.TokenTimeline(maxBefore) {
			o.violation(t, &v, "failover %d (%s): tokens after it (%d, timeline %d) carry no higher timeline than before it (%d, timeline %d)",
				i, f.kind, minAfter, lease.TokenTimeline(minAfter), maxBefore, lease.TokenTimeline(maxBefore))
		}
	}
	return v
}

// spans counts the holds believed across each failover and what their
// first renew on the new primary said; each failover needs at least one
// that said true or false, and none may have failed.
func (o *foLeaseOracle) spans(t *testing.T, fos []foFailover) (held, kept, lost int) {
	t.Helper()
	for i, f := range fos {
		n := 0
		for _, h := range o.holds {
			if !h.start.Before(f.ts.Stopping) || !h.end.After(f.ts.Promoted) {
				continue
			}
			k := slices.IndexFunc(h.renews, func(r foRenew) bool { return !r.sent.Before(f.ts.Promoted) })
			if k < 0 {
				continue // it ended otherwise (the run ended)
			}
			switch r := h.renews[k]; {
			case r.err != "":
				t.Errorf("failover %d (%s): the renew of %s held across it failed at %s: %s", i, f.kind, h, r.at.Format("15:04:05.000"), r.err)
			case r.ok:
				kept++
				n++
			default:
				lost++
				n++
			}
		}
		if n == 0 {
			t.Errorf("failover %d (%s): no lease held across it was renewed on the new primary", i, f.kind)
		}
		held += n
	}
	return held, kept, lost
}

// checkTable checks the entry/exit table on the final primary: every
// acknowledged row is there (with durableBefore set: every row
// acknowledged before it), each row's token was granted for its name, and
// a name's rows (in insertion order) never go back to a smaller token. It
// returns the number of violations.
func (o *foLeaseOracle) checkTable(t *testing.T, primary *pgtest.Cluster, durableBefore time.Time) int {
	t.Helper()
	v := 0
	ctx := testenv.Context(t, 30*time.Second)
	conn, err := testenv.Connect(ctx, primary, "appdb")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT k, name, token, ev FROM "+foLeaseLogTable+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	granted := map[string]map[int64]bool{}
	for _, h := range o.holds {
		if granted[h.name] == nil {
			granted[h.name] = map[int64]bool{}
		}
		granted[h.name][h.token] = true
	}
	have := map[int64]bool{}
	last := map[string]int64{}
	n := 0
	for rows.Next() {
		var a foAck
		if err := rows.Scan(&a.k, &a.name, &a.token, &a.ev); err != nil {
			t.Fatal(err)
		}
		n++
		have[a.k] = true
		if !granted[a.name][a.token] {
			o.violation(t, &v, "table row %d: %s %s with token %d, never granted for it", a.k, a.ev, a.name, a.token)
		}
		if a.token < last[a.name] {
			o.violation(t, &v, "table row %d: %s %s with token %d after a row with token %d", a.k, a.ev, a.name, a.token, last[a.name])
		}
		last[a.name] = max(last[a.name], a.token)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, a := range o.acks {
		if !have[a.k] && (durableBefore.IsZero() || a.at.Before(durableBefore)) {
			missing = append(missing, fmt.Sprintf("%d (%s %s %d)", a.k, a.ev, a.name, a.token))
		}
	}
	if len(missing) > 0 {
		v += len(missing)
		t.Errorf("%d of %d acknowledged rows are not on the primary: %s", len(missing), len(o.acks), strings.Join(missing[:min(len(missing), 10)], ", "))
	}
	t.Logf("table: %d rows on the final primary, %d acknowledged", n, len(o.acks))
	return v
}
