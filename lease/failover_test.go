package lease

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockpool/lockpool/internal/pgtest"
)

// failoverPair starts a primary of the test's own (the package's cluster
// keeps serving the other tests) with the lease role and database, and a
// streaming (asynchronous) standby of it.
func failoverPair(t *testing.T) (primary, standby *pgtest.Cluster) {
	t.Helper()
	pgtest.Require(t) // skips (or fails under $CI) without PostgreSQL
	ctx := ctxT(t, 2*time.Minute)
	p, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Destroy() })
	if err := p.CreateRole(ctx, appUser, appPW); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateDatabase(ctx, appDB, appUser); err != nil {
		t.Fatal(err)
	}
	s, err := p.StartStandby(ctx, pgtest.StandbyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Destroy() })
	return p, s
}

// followingStore is a Store whose connections go to the cluster cur points
// at when they are opened (as lockpool's own connections follow the
// primary).
func followingStore(t *testing.T, cur *atomic.Pointer[pgtest.Cluster], schema, instance string) (*Store, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	s, err := New(Options{
		Schema:     schema,
		InstanceID: instance,
		ConnConfig: func(db string) (*pgx.ConnConfig, error) {
			return pgx.ParseConfig(cur.Load().DSN(appUser, appPW, db))
		},
		Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, reg
}

// failOver crashes the primary and promotes the standby, then points cur
// at it.
func failOver(t *testing.T, cur *atomic.Pointer[pgtest.Cluster], primary, standby *pgtest.Cluster) {
	t.Helper()
	if err := primary.StopImmediate(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctxT(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	cur.Store(standby)
}

// standbyRows counts the lease rows whose name starts with prefix on the
// standby (readable while it is in recovery).
func standbyRows(t *testing.T, standby *pgtest.Cluster, schema, prefix string) int {
	t.Helper()
	conn := connect(t, standby.SuperuserDSN(appDB))
	var n int
	if err := conn.QueryRow(ctxT(t, 10*time.Second), fmt.Sprintf("SELECT count(*) FROM %s WHERE starts_with(name, $1)", pgx.Identifier{schema, "leases"}.Sanitize()), prefix).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFailoverTokensGrow: tokens handed out by a promoted standby are above
// every token the old primary handed out, also those whose commits never
// reached the standby (its WAL receiver was stopped; the primary then
// crashed). With tokens from the sequence alone, the new primary's
// sequence is behind (it saw the sequence's WAL record of 32 values ahead,
// not the grants after it) and hands out tokens again.
func TestFailoverTokensGrow(t *testing.T) {
	primary, standby := failoverPair(t)
	ctx := ctxT(t, 2*time.Minute)
	const schema = "lp_fo_tokens"
	var cur atomic.Pointer[pgtest.Cluster]
	cur.Store(primary)
	s, _ := followingStore(t, &cur, schema, "fo-tokens")
	a := s.NewSession(appDB, 1)

	var handed []int64 // every token handed out before the failover
	for i := range 3 {
		handed = append(handed, mustAcquire(t, a, fmt.Sprintf("before-%d", i), time.Minute, 0))
	}
	if err := primary.WaitReplayed(ctx, standby); err != nil {
		t.Fatal(err)
	}
	if err := standby.StopWALReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	// More grants than the sequence logs ahead of itself (32 values), and
	// a takeover: all lost with the primary.
	b := s.NewSession(appDB, 2)
	for i := range 50 {
		handed = append(handed, mustAcquire(t, b, fmt.Sprintf("lost-%d", i), time.Minute, 0))
	}
	if ok, err := a.Release(ctx, "before-0"); !ok || err != nil {
		t.Fatalf("release before-0: %v, %v", ok, err)
	}
	handed = append(handed, mustAcquire(t, b, "before-0", time.Minute, 0))
	if n := standbyRows(t, standby, schema, "lost-"); n != 0 {
		t.Fatalf("the standby has %d rows granted after its WAL receiver stopped", n)
	}
	maxBefore := slices.Max(handed)
	for i := 1; i < len(handed); i++ {
		if handed[i] <= handed[i-1] {
			t.Fatalf("tokens before the failover not increasing: %d then %d", handed[i-1], handed[i])
		}
	}

	failOver(t, &cur, primary, standby)

	// New grants on the new primary: a name whose grant was lost, a new
	// name, a takeover of a lease released there, and a lease whose
	// release was lost (before-0 is still a's on the new primary).
	c := s.NewSession(appDB, 3)
	var after []int64
	after = append(after, mustAcquire(t, c, "lost-0", time.Minute, 0))
	after = append(after, mustAcquire(t, c, "after-0", time.Minute, 0))
	if ok, err := a.Release(ctx, "before-1"); !ok || err != nil {
		t.Fatalf("release before-1 on the new primary: %v, %v", ok, err)
	}
	after = append(after, mustAcquire(t, c, "before-1", time.Minute, 0))
	if tok, ok, err := c.Acquire(ctx, "before-0", time.Minute, 0); ok || err != nil {
		t.Fatalf("before-0 (a's on the new primary) granted to another session: %d, %v, %v", tok, ok, err)
	}
	for i, tok := range after {
		if tok <= maxBefore {
			t.Errorf("token %d (#%d after the failover) is not above %d, the largest handed out before it: tokens went backwards", tok, i, maxBefore)
		}
		if i > 0 && tok <= after[i-1] {
			t.Errorf("tokens after the failover not increasing: %d then %d", after[i-1], tok)
		}
	}
	if tl := TokenTimeline(after[0]); tl != TokenTimeline(maxBefore)+1 {
		t.Errorf("token %#x after the failover has timeline %d, the old primary's %#x had %d", after[0], tl, maxBefore, TokenTimeline(maxBefore))
	}
	t.Logf("largest token before the failover %d (%#x), first after %d (%#x)", maxBefore, maxBefore, after[0], after[0])
}

// TestFailoverLeaseKeptOrLost: after a failover a lease is either still its
// holder's on the new primary (its grant reached the standby: renewals
// succeed, the token is the same) or lost (its grant did not: lease_renew
// and the keeper's renewal find no row, the session forgets the lease and
// is told, nothing re-creates the row, and another holder takes it with a
// larger token that fences the old one out).
func TestFailoverLeaseKeptOrLost(t *testing.T) {
	primary, standby := failoverPair(t)
	ctx := ctxT(t, 2*time.Minute)
	const schema = "lp_fo_renew"
	var cur atomic.Pointer[pgtest.Cluster]
	cur.Store(primary)
	s, reg := followingStore(t, &cur, schema, "fo-holder")
	holder := s.NewSession(appDB, 1)

	kept := mustAcquire(t, holder, "kept", time.Minute, 0)
	if err := primary.WaitReplayed(ctx, standby); err != nil {
		t.Fatal(err)
	}
	if err := standby.StopWALReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	lost := mustAcquire(t, holder, "lost", time.Minute, 0)
	// The keeper renews this one every 0.5 s: it finds it lost by itself.
	lostByKeeper := mustAcquire(t, holder, "lost-keeper", 2*time.Second, 0)
	if ok, err := holder.Renew(ctx, "kept"); !ok || err != nil { // a renewal the standby misses too
		t.Fatalf("renew kept on the old primary: %v, %v", ok, err)
	}
	if n := standbyRows(t, standby, schema, "lost"); n != 0 {
		t.Fatalf("the standby has %d rows granted after its WAL receiver stopped", n)
	}

	failOver(t, &cur, primary, standby)

	// Kept: same holder, same token, renewable; a re-acquire keeps the token.
	if ok, err := holder.Renew(ctx, "kept"); !ok || err != nil {
		t.Fatalf("renew kept on the new primary = %v, %v; want true", ok, err)
	}
	if tok := mustAcquire(t, holder, "kept", time.Minute, 0); tok != kept {
		t.Fatalf("re-acquire of kept on the new primary: token %d, was %d", tok, kept)
	}

	// Lost: renew says false, the session forgets it.
	if ok, err := holder.Renew(ctx, "lost"); ok || err != nil {
		t.Fatalf("renew lost on the new primary = %v, %v; want false", ok, err)
	}
	if _, ok := holder.Held()["lost"]; ok {
		t.Fatal("the session still believes it holds lost")
	}
	// The keeper marks lost-keeper lost (and counts it).
	deadline := time.Now().Add(20 * time.Second)
	for metricValue(t, reg, "lockpool_lease_operations_total", map[string]string{"op": "keeper_renew", "result": "lost"}) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the keeper did not find lost-keeper lost; held %v", holder.Held())
		}
		time.Sleep(20 * time.Millisecond) // polling the keeper's counter
	}
	if _, ok := holder.Held()["lost-keeper"]; ok {
		t.Fatal("the session still believes it holds lost-keeper")
	}
	if w := holder.TakeWarnings(); len(w) != 1 || !strings.Contains(w[0], `lease "lost-keeper" was lost`) || !strings.Contains(w[0], fmt.Sprint(lostByKeeper)) {
		t.Fatalf("warnings %q; want one for lost-keeper", w)
	}
	// Nothing re-created either row for the holder.
	rows, err := holder.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Name != "kept" || rows[0].Token != kept || rows[0].Holder != holder.Holder() || !rows[0].Mine {
		t.Fatalf("lease_list on the new primary = %+v; want only kept, %d, held by %s", rows, kept, holder.Holder())
	}

	// Another holder (another instance) takes lost with a larger token; the
	// old token is fenced out.
	other, _ := followingStore(t, &cur, schema, "fo-other")
	thief := other.NewSession(appDB, 1)
	tok := mustAcquire(t, thief, "lost", time.Minute, 0)
	if tok <= lost || tok <= lostByKeeper || tok <= kept {
		t.Fatalf("new holder of lost got token %d; the old primary had handed out %d, %d and %d", tok, kept, lost, lostByKeeper)
	}
	fc := connect(t, standby.DSN(appUser, appPW, appDB))
	var pe *pgconn.PgError
	if _, err := fc.Exec(ctx, "SELECT "+s.FenceFunction()+"('lost', $1)", lost); !errors.As(err, &pe) || pe.Code != FenceSQLState {
		t.Fatalf("lease_fence with the lost token %d: %v; want %s", lost, err, FenceSQLState)
	}
	if _, err := fc.Exec(ctx, "SELECT "+s.FenceFunction()+"('lost', $1)", tok); err != nil {
		t.Fatalf("lease_fence with the new token: %v", err)
	}
	if ok, err := holder.Release(ctx, "lost"); ok || err != nil {
		t.Fatalf("the old holder released lost: %v, %v", ok, err)
	}
}

// TestFailoverLostReleaseNewToken: a session released a lease and another
// session took it over, both after the standby's WAL receiver stopped; the
// primary crashed and the standby was promoted. On the new primary the
// row still names the releasing session with its first token, live. That
// session's next acquire gets a new token, above the takeover's (handed
// out before the failover), not its first token back; the takeover holder
// renews false.
func TestFailoverLostReleaseNewToken(t *testing.T) {
	primary, standby := failoverPair(t)
	ctx := ctxT(t, 2*time.Minute)
	const schema = "lp_fo_release"
	var cur atomic.Pointer[pgtest.Cluster]
	cur.Store(primary)
	s, _ := followingStore(t, &cur, schema, "fo-release")
	a := s.NewSession(appDB, 1)
	b := s.NewSession(appDB, 2)

	first := mustAcquire(t, a, "res", time.Minute, 0)
	if err := primary.WaitReplayed(ctx, standby); err != nil {
		t.Fatal(err)
	}
	if err := standby.StopWALReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := a.Release(ctx, "res"); !ok || err != nil {
		t.Fatalf("release: %v, %v", ok, err)
	}
	takeover := mustAcquire(t, b, "res", time.Minute, 0)
	if takeover <= first {
		t.Fatalf("takeover token %d not above %d", takeover, first)
	}

	failOver(t, &cur, primary, standby)

	if ok, err := b.Renew(ctx, "res"); ok || err != nil {
		t.Fatalf("the takeover holder's renew on the new primary = %v, %v; want false", ok, err)
	}
	again := mustAcquire(t, a, "res", time.Minute, 0)
	if again <= takeover {
		t.Fatalf("the releasing session's acquire on the new primary = %d, not above the takeover's %d (its first token was %d): tokens went backwards", again, takeover, first)
	}
	if ok, err := b.Renew(ctx, "res"); ok || err != nil {
		t.Fatalf("the takeover holder's renew after the new grant = %v, %v; want false", ok, err)
	}
}

// TestReacquireUnknownRowNewToken: a live row that names the session but
// not with a token it believes it holds (a grant whose reply it never
// got) is not handed back: the session's acquire gets a new token. A
// re-acquire of a lease it does hold keeps the token.
func TestReacquireUnknownRowNewToken(t *testing.T) {
	c := pgtest.Require(t)
	s, _ := newStore(t, c, "lp_unknown_row", "unknown")
	ctx := ctxT(t, time.Minute)
	a := s.NewSession(appDB, 1)
	if _, err := s.db(ctx, appDB); err != nil {
		t.Fatal(err)
	}
	// A grant the session never heard of.
	lost, err := s.tryAcquire(ctx, appDB, "res", a.Holder(), nil, time.Minute)
	if err != nil || !lost.got {
		t.Fatalf("grant: %+v, %v", lost, err)
	}
	tok := mustAcquire(t, a, "res", time.Minute, 0)
	if tok <= lost.token {
		t.Fatalf("acquire = %d, not above the unknown grant's %d", tok, lost.token)
	}
	if again := mustAcquire(t, a, "res", time.Minute, 0); again != tok {
		t.Fatalf("re-acquire of a held lease changed its token %d -> %d", tok, again)
	}
}
