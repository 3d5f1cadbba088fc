package integration

// Leases across failovers through lockpool: the entry/exit-table oracle
// under switchovers and crashes of a synchronous pair, and a promotion of
// an asynchronous standby that missed the last lease commits.

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/lockpool/lockpool/internal/testenv"
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
			t.Logf("lockpool %s log (last 30000 bytes):\n%s", id, tailString(log.String(), 30000))
		}
	})
	return lp
}

func tailString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// waitPrimary waits until every lockpool sees c as the primary.
func waitPrimary(t *testing.T, c *pgtest.Cluster, lps ...*testenv.Lockpool) {
	t.Helper()
	for _, l := range lps {
		testenv.Eventually(t, 30*time.Second, "lockpool to see "+testenv.Addr(c)+" as the primary", func() bool {
			return testenv.HostRow(l.Hosts(), c).State == "primary"
		})
	}
}

// standbyLease reads lease name's token and holder on c (a standby, read
// only); ok is false when it has no row.
func standbyLease(t *testing.T, c *pgtest.Cluster, name string) (token int64, holder string, live, ok bool) {
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
// its old one; the lease whose grant and renewals reached the standby
// (only the last renewal did not) is still its holder's, with its token,
// and nobody else can take it.
func TestFailoverLeaseMissedCommits(t *testing.T) {
	pair := testenv.StartPair(t, false)
	a := startLeaseFailoverLockpool(t, pair, "fo-missed-a")
	b := startLeaseFailoverLockpool(t, pair, "fo-missed-b")
	ctx := testenv.Context(t, 3*time.Minute)
	old, next := pair.Primary, pair.Standby

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
	if err := old.WaitReplayed(ctx, next); err != nil {
		t.Fatal(err)
	}
	if err := next.StopWALReceiver(ctx); err != nil {
		t.Fatal(err)
	}

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
	for i := 1; i < len(handed); i++ {
		if handed[i] <= handed[i-1] {
			t.Fatalf("tokens before the failover not increasing: %d then %d", handed[i-1], handed[i])
		}
	}
	maxBefore := slices.Max(handed)

	// The standby has the state of before: moved still held by hMoved's
	// session with its first token, no row of lost or the bulk grants.
	if tok, _, live, ok := standbyLease(t, next, "moved"); !ok || tok != tMoved || !live {
		t.Fatalf("moved on the standby: token %d live %v found %v; want %d, live", tok, live, ok, tMoved)
	}
	for _, name := range []string{"lost", "bulk-0", fmt.Sprintf("bulk-%d", bulk-1)} {
		if _, _, _, ok := standbyLease(t, next, name); ok {
			t.Fatalf("the standby has a row of %s, granted after its WAL receiver stopped", name)
		}
	}

	// The primary crashes; the standby is promoted right after.
	if err := old.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if err := next.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	pair.Primary, pair.Standby = next, old
	waitPrimary(t, next, a, b)

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
	if len(after) > 0 {
		t.Logf("before the failover: %d grants, tokens %d..%d (kept %d, moved %d then %d, lost %d); after: %d grants, tokens %d..%d",
			len(handed), handed[0], maxBefore, tKept, tMoved, tTake, tLost, len(after), after[0], slices.Max(after))
	}
}
