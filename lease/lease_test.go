package lease

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

const (
	appUser = "app"
	appPW   = "app pw"
	appDB   = "appdb"
	nocUser = "noc"
	nocPW   = "noc pw"
	nocDB   = "nocdb"
	capDB   = "capdb2"
)

func TestMain(m *testing.M) {
	os.Exit(pgtest.RunMain(m, func(c *pgtest.Cluster) error {
		ctx := context.Background()
		if err := c.CreateRole(ctx, appUser, appPW); err != nil {
			return err
		}
		if err := c.CreateDatabase(ctx, appDB, appUser); err != nil {
			return err
		}
		if err := c.CreateDatabase(ctx, capDB, appUser); err != nil {
			return err
		}
		if err := c.CreateRole(ctx, nocUser, nocPW); err != nil {
			return err
		}
		return c.CreateDatabase(ctx, nocDB, "")
	}))
}

type storeOpt func(*Options)

func newStore(t *testing.T, c *pgtest.Cluster, schema, instance string, more ...storeOpt) (*Store, *prometheus.Registry) {
	t.Helper()
	dropSchema(t, c, appDB, schema)
	reg := prometheus.NewRegistry()
	opts := Options{
		Schema:     schema,
		InstanceID: instance,
		ConnConfig: func(db string) (*pgx.ConnConfig, error) {
			return pgx.ParseConfig(c.DSN(appUser, appPW, db))
		},
		Registerer: reg,
	}
	for _, f := range more {
		f(&opts)
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, reg
}

// dropSchema removes what an earlier run (-count) left behind.
func dropSchema(t *testing.T, c *pgtest.Cluster, db, schema string) {
	t.Helper()
	if schema == "" {
		schema = DefaultSchema
	}
	created.Lock()
	defer created.Unlock()
	key := db + "/" + schema
	if created.m[key] == t {
		return // a second store of the same test
	}
	created.m[key] = t
	if err := c.Exec(context.Background(), db, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		t.Fatal(err)
	}
}

var created = struct {
	sync.Mutex
	m map[string]*testing.T
}{m: map[string]*testing.T{}}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustAcquire(t *testing.T, ss *Session, name string, ttl, wait time.Duration) int64 {
	t.Helper()
	tok, ok, err := ss.Acquire(ctxT(t, 30*time.Second), name, ttl, wait)
	if err != nil || !ok {
		t.Fatalf("Acquire(%q) = %d, %v, %v; want a token", name, tok, ok, err)
	}
	return tok
}

// crash stops a store the way a killed lockpool stops: no release, no renewal.
func (s *Store) crash() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	s.pool.close()
}

func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			switch {
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}

func TestAcquireRenewReleaseList(t *testing.T) {
	c := pgtest.Require(t)
	s, reg := newStore(t, c, "lp_basic", "inst1")
	ctx := ctxT(t, time.Minute)
	a := s.NewSession(appDB, 1)
	b := s.NewSession(appDB, 2)
	if !strings.HasPrefix(a.Holder(), "inst1:1:") || a.Holder() == b.Holder() {
		t.Fatalf("holders %q %q", a.Holder(), b.Holder())
	}

	t1 := mustAcquire(t, a, "x", 5*time.Second, 0)
	if tok, ok, err := b.Acquire(ctx, "x", 5*time.Second, 0); ok || err != nil || tok != 0 {
		t.Fatalf("b.Acquire held lease = %d, %v, %v", tok, ok, err)
	}
	if t2 := mustAcquire(t, a, "x", 10*time.Second, 0); t2 != t1 {
		t.Fatalf("re-acquire changed token %d -> %d", t1, t2)
	}
	rows, err := a.List(ctx)
	if err != nil || len(rows) != 1 {
		t.Fatalf("List = %v, %v", rows, err)
	}
	r := rows[0]
	if r.Name != "x" || r.Holder != a.Holder() || r.Token != t1 || !r.Mine {
		t.Fatalf("row %+v", r)
	}
	// expires_at comes from the server: ~10 s after taken.
	if d := r.ExpiresAt.Sub(r.TakenAt); d < 9*time.Second || d > 11*time.Second {
		t.Fatalf("expires_at - taken_at = %v", d)
	}
	if rows, _ := b.List(ctx); len(rows) != 1 || rows[0].Mine {
		t.Fatalf("b.List = %+v", rows)
	}
	// Held reads the same lease from memory, for SHOW LEASES.
	if h := s.Held(); len(h) != 1 || h[0] != (HeldLease{Database: appDB, Name: "x", Token: t1, Holder: a.Holder(), SessionID: 1, TTL: 10 * time.Second}) {
		t.Fatalf("Held = %+v", h)
	}
	if ok, err := a.Renew(ctx, "x"); !ok || err != nil {
		t.Fatalf("a.Renew = %v, %v", ok, err)
	}
	if ok, err := b.Renew(ctx, "x"); ok || err != nil {
		t.Fatalf("b.Renew = %v, %v", ok, err)
	}
	if ok, err := b.Release(ctx, "x"); ok || err != nil {
		t.Fatalf("b.Release = %v, %v", ok, err)
	}
	if got := metricValue(t, reg, "lockpool_leases_held", nil); got != 1 {
		t.Fatalf("leases_held = %v", got)
	}
	if ok, err := a.Release(ctx, "x"); !ok || err != nil {
		t.Fatalf("a.Release = %v, %v", ok, err)
	}
	if ok, err := a.Release(ctx, "x"); ok || err != nil {
		t.Fatalf("second a.Release = %v, %v", ok, err)
	}
	if ok, _ := a.Renew(ctx, "x"); ok {
		t.Fatal("renew after release succeeded")
	}
	if rows, _ := a.List(ctx); len(rows) != 0 {
		t.Fatalf("List after release = %+v", rows)
	}
	t3 := mustAcquire(t, b, "x", 5*time.Second, 0)
	if t3 <= t1 {
		t.Fatalf("new holder's token %d not > %d", t3, t1)
	}
	if got := metricValue(t, reg, "lockpool_lease_operations_total", map[string]string{"op": "acquire", "result": "ok"}); got != 3 {
		t.Fatalf("acquire ok = %v", got)
	}
	if got := metricValue(t, reg, "lockpool_lease_operations_total", map[string]string{"op": "acquire", "result": "not_held"}); got != 1 {
		t.Fatalf("acquire not_held = %v", got)
	}

	// Bad arguments are 22023.
	var le *Error
	if _, _, err := a.Acquire(ctx, "", time.Second, 0); !errors.As(err, &le) || le.Code != "22023" {
		t.Fatalf("empty name: %v", err)
	}
	if _, _, err := a.Acquire(ctx, "y", 0, 0); !errors.As(err, &le) || le.Code != "22023" {
		t.Fatalf("zero ttl: %v", err)
	}

	// Close releases.
	b.Close(ctx)
	if rows, _ := a.List(ctx); len(rows) != 0 {
		t.Fatalf("List after Close = %+v", rows)
	}
	if got := metricValue(t, reg, "lockpool_leases_held", nil); got != 0 {
		t.Fatalf("leases_held after close = %v", got)
	}
	if _, _, err := b.Acquire(ctx, "z", time.Second, 0); !errors.Is(err, ErrSessionClosed) {
		t.Fatalf("acquire on closed session: %v", err)
	}
}

func TestConcurrentMigration(t *testing.T) {
	c := pgtest.Require(t)
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for i := range 6 {
		s, _ := newStore(t, c, "lp_mig", fmt.Sprintf("m%d", i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			ss := s.NewSession(appDB, uint64(i))
			_, _, err := ss.Acquire(context.Background(), fmt.Sprintf("n%d", i), time.Second, 0)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// Two stores (two lockpool instances) contend for one name; each holder runs
// a critical section recorded in a table.
func TestMutualExclusionTwoStores(t *testing.T) {
	c := pgtest.Require(t)
	s1, _ := newStore(t, c, "lp_mutex", "i1")
	s2, _ := newStore(t, c, "lp_mutex", "i2")
	setup := connect(t, c.DSN(appUser, appPW, appDB))
	ctx := ctxT(t, 3*time.Minute)
	if _, err := setup.Exec(ctx, `DROP TABLE IF EXISTS cs_log; CREATE TABLE cs_log(token bigint PRIMARY KEY, entered timestamptz NOT NULL, exited timestamptz)`); err != nil {
		t.Fatal(err)
	}

	const sessions, attempts = 20, 30
	var inside atomic.Int32
	var grantMu sync.Mutex
	var grants []int64
	var wg sync.WaitGroup
	errc := make(chan error, sessions)
	for i := range sessions {
		s := s1
		if i%2 == 1 {
			s = s2
		}
		conn := connect(t, c.DSN(appUser, appPW, appDB))
		wg.Add(1)
		go func() {
			defer wg.Done()
			ss := s.NewSession(appDB, uint64(i))
			defer ss.Close(context.Background())
			for range attempts {
				tok, ok, err := ss.Acquire(ctx, "mutex", 5*time.Second, 20*time.Second)
				if err != nil {
					errc <- err
					return
				}
				if !ok {
					continue
				}
				if n := inside.Add(1); n != 1 {
					errc <- fmt.Errorf("%d holders inside the critical section", n)
				}
				grantMu.Lock()
				grants = append(grants, tok)
				grantMu.Unlock()
				if _, err := conn.Exec(ctx, `INSERT INTO cs_log VALUES ($1, clock_timestamp())`, tok); err != nil {
					errc <- err
				}
				if _, err := conn.Exec(ctx, `UPDATE cs_log SET exited = clock_timestamp() WHERE token = $1`, tok); err != nil {
					errc <- err
				}
				inside.Add(-1)
				if ok, err := ss.Release(ctx, "mutex"); !ok || err != nil {
					errc <- fmt.Errorf("release: %v, %v", ok, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if len(grants) < sessions*attempts/2 {
		t.Fatalf("only %d grants of %d attempts", len(grants), sessions*attempts)
	}
	if !sort.SliceIsSorted(grants, func(i, j int) bool { return grants[i] < grants[j] }) {
		t.Fatalf("tokens not increasing in grant order: %v", grants)
	}
	rows, err := setup.Query(ctx, `SELECT token, entered, exited FROM cs_log ORDER BY entered`)
	if err != nil {
		t.Fatal(err)
	}
	var prevTok int64
	var prevExit time.Time
	n := 0
	for rows.Next() {
		var tok int64
		var in, out time.Time
		if err := rows.Scan(&tok, &in, &out); err != nil {
			t.Fatal(err)
		}
		if tok <= prevTok {
			t.Fatalf("token %d entered after token %d", tok, prevTok)
		}
		if in.Before(prevExit) {
			t.Fatalf("token %d entered at %v before %d exited at %v", tok, in, prevTok, prevExit)
		}
		prevTok, prevExit = tok, out
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != len(grants) {
		t.Fatalf("%d rows for %d grants", n, len(grants))
	}
	t.Logf("%d grants", n)
}

func TestExpiryTakeover(t *testing.T) {
	c := pgtest.Require(t)
	s1, _ := newStore(t, c, "lp_expiry", "dead")
	s2, _ := newStore(t, c, "lp_expiry", "live")
	ctx := ctxT(t, time.Minute)
	a := s1.NewSession(appDB, 1)
	ttl := 2 * time.Second
	t1 := mustAcquire(t, a, "job", ttl, 0)
	acquiredAt := time.Now()
	s1.crash()

	b := s2.NewSession(appDB, 1)
	t2, ok, err := b.Acquire(ctx, "job", 5*time.Second, 10*time.Second)
	if err != nil || !ok {
		t.Fatalf("waiter: %v, %v", ok, err)
	}
	if el := time.Since(acquiredAt); el > ttl+time.Second || el < ttl-200*time.Millisecond {
		t.Fatalf("takeover after %v, ttl %v", el, ttl)
	}
	if t2 <= t1 {
		t.Fatalf("takeover token %d not > %d", t2, t1)
	}
}

// stall stops the keeper from renewing name for ss (as if its instance hung).
func stall(ss *Session, name string) {
	ss.lock()
	defer ss.unlock()
	if h := ss.held[name]; h != nil {
		ss.s.keeper.remove(h.k)
	}
}

func TestStaleHolder(t *testing.T) {
	c := pgtest.Require(t)
	s1, reg1 := newStore(t, c, "lp_stale", "i1")
	s2, _ := newStore(t, c, "lp_stale", "i2")
	ctx := ctxT(t, time.Minute)
	old := s1.NewSession(appDB, 1)
	t1 := mustAcquire(t, old, "res", time.Second, 0)
	stall(old, "res")
	time.Sleep(1200 * time.Millisecond) // the stalled lease's ttl (1 s) running out is the case under test
	nu := s2.NewSession(appDB, 1)
	t2 := mustAcquire(t, nu, "res", 10*time.Second, 0)
	if t2 <= t1 {
		t.Fatalf("token %d not > %d", t2, t1)
	}
	if ok, err := old.Release(ctx, "res"); ok || err != nil {
		t.Fatalf("stale release = %v, %v", ok, err)
	}
	// Release dropped it locally; make the stale session believe it holds it
	// again to prove the server refuses the renewal too.
	if err := old.recordHeld("res", t1, time.Second, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	stall(old, "res")
	if ok, err := old.Renew(ctx, "res"); ok || err != nil {
		t.Fatalf("stale renew = %v, %v", ok, err)
	}
	if got := metricValue(t, reg1, "lockpool_lease_operations_total", map[string]string{"op": "renew", "result": "lost"}); got != 1 {
		t.Fatalf("renew lost = %v", got)
	}
	rows, err := nu.List(ctx)
	if err != nil || len(rows) != 1 || rows[0].Token != t2 || !rows[0].Mine || rows[0].Holder != nu.Holder() {
		t.Fatalf("List = %+v, %v", rows, err)
	}
	if ok, _ := nu.Renew(ctx, "res"); !ok {
		t.Fatal("new holder cannot renew")
	}
}

func TestCloseWakesWaiterByNotify(t *testing.T) {
	c := pgtest.Require(t)
	s1, _ := newStore(t, c, "lp_notify", "i1")
	s2, reg2 := newStore(t, c, "lp_notify", "i2")
	s2.pollCap = time.Hour // no safety polling: only NOTIFY (or expiry) may wake
	ctx := ctxT(t, time.Minute)
	a := s1.NewSession(appDB, 1)
	t1 := mustAcquire(t, a, "w", 30*time.Second, 0)

	b := s2.NewSession(appDB, 1)
	type res struct {
		tok int64
		ok  bool
		err error
		at  time.Time
	}
	done := make(chan res, 1)
	go func() {
		tok, ok, err := b.Acquire(ctx, "w", 5*time.Second, 10*time.Second)
		done <- res{tok, ok, err, time.Now()}
	}()
	select {
	case r := <-done:
		t.Fatalf("waiter returned early: %+v", r)
	case <-time.After(1500 * time.Millisecond):
	}
	closed := time.Now()
	a.Close(ctx)
	r := <-done
	if r.err != nil || !r.ok || r.tok <= t1 {
		t.Fatalf("waiter = %+v (old token %d)", r, t1)
	}
	if el := r.at.Sub(closed); el > time.Second {
		t.Fatalf("waiter got the lease %v after Close", el)
	}
	if got := metricValue(t, reg2, "lockpool_lease_acquire_wait_seconds", nil); got != 1 {
		t.Fatalf("wait histogram count = %v", got)
	}
}

func TestCancelEndsWait(t *testing.T) {
	c := pgtest.Require(t)
	s, _ := newStore(t, c, "lp_cancel", "i1")
	a := s.NewSession(appDB, 1)
	mustAcquire(t, a, "c", 30*time.Second, 0)
	b := s.NewSession(appDB, 2)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	_, ok, err := b.Acquire(ctx, "c", time.Second, 10*time.Second)
	if ok || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait = %v, %v", ok, err)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("cancel took %v", el)
	}
	// Without waiting: immediately false.
	if _, ok, err := b.Acquire(context.Background(), "c", time.Second, 0); ok || err != nil {
		t.Fatalf("no-wait = %v, %v", ok, err)
	}
	// A short wait times out.
	start = time.Now()
	if _, ok, err := b.Acquire(context.Background(), "c", time.Second, 300*time.Millisecond); ok || err != nil {
		t.Fatalf("timed wait = %v, %v", ok, err)
	}
	if el := time.Since(start); el < 300*time.Millisecond || el > 2*time.Second {
		t.Fatalf("timed wait took %v", el)
	}
}

func TestFence(t *testing.T) {
	c := pgtest.Require(t)
	s1, _ := newStore(t, c, "", "i1") // default schema "lockpool"
	s2, _ := newStore(t, c, "", "i2")
	if got := s1.FenceFunction(); got != `"lockpool"."lease_fence"` {
		t.Fatalf("FenceFunction = %s", got)
	}
	ctx := ctxT(t, time.Minute)
	a := s1.NewSession(appDB, 1)
	ttl := time.Second
	tokA := mustAcquire(t, a, "f", ttl, 0)

	fc := connect(t, c.DSN(appUser, appPW, appDB))
	tx, err := fc.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got int64
	if err := tx.QueryRow(ctx, "SELECT "+s1.FenceFunction()+"($1, $2)", "f", tokA).Scan(&got); err != nil || got != tokA {
		t.Fatalf("fence = %d, %v", got, err)
	}

	// A takeover attempt (the row lock the acquire's ON CONFLICT DO UPDATE
	// takes) blocks until the fencing transaction ends.
	raw := connect(t, c.SuperuserDSN(appDB))
	rawDone := make(chan time.Time, 1)
	go func() {
		_, err := raw.Exec(ctx, "SELECT 1 FROM lockpool.leases WHERE name = 'f' FOR NO KEY UPDATE")
		if err != nil {
			t.Error(err)
		}
		rawDone <- time.Now()
	}()
	// And a waiting acquire on another instance does not get the lease,
	// although its ttl runs out while the fence holds.
	b := s2.NewSession(appDB, 1)
	type res struct {
		tok int64
		ok  bool
		err error
		at  time.Time
	}
	bDone := make(chan res, 1)
	go func() {
		tok, ok, err := b.Acquire(ctx, "f", 5*time.Second, 20*time.Second)
		bDone <- res{tok, ok, err, time.Now()}
	}()
	time.Sleep(ttl + 1500*time.Millisecond) // the ttl running out under the fence, and the waiter's tries after it, are the case under test
	select {
	case <-rawDone:
		t.Fatal("takeover lock not blocked by lease_fence")
	case r := <-bDone:
		t.Fatalf("acquire got through the fence: %+v", r)
	default:
	}
	committed := time.Now()
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if at := <-rawDone; at.Before(committed) {
		t.Fatal("raw lock returned before commit")
	}
	r := <-bDone
	if r.err != nil || !r.ok || r.tok <= tokA {
		t.Fatalf("after commit: %+v", r)
	}
	if el := r.at.Sub(committed); el > time.Second {
		t.Fatalf("takeover %v after commit", el)
	}

	// The stale token is refused with the documented SQLSTATE.
	_, err = fc.Exec(ctx, "SELECT lockpool.lease_fence('f', $1)", tokA)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != FenceSQLState || !strings.Contains(pe.Message, fmt.Sprintf(`lockpool: lease "f" is not held by token %d`, tokA)) || pe.Hint == "" {
		t.Fatalf("stale fence: %v", err)
	}
	// The current token works; NULL and unknown names are refused.
	if _, err := fc.Exec(ctx, "SELECT lockpool.lease_fence('f', $1)", r.tok); err != nil {
		t.Fatal(err)
	}
	if _, err := fc.Exec(ctx, "SELECT lockpool.lease_fence('f', NULL)"); !errors.As(err, &pe) || pe.Code != FenceSQLState {
		t.Fatalf("NULL token: %v", err)
	}
	if _, err := fc.Exec(ctx, "SELECT lockpool.lease_fence('nope', 1)"); !errors.As(err, &pe) || pe.Code != FenceSQLState {
		t.Fatalf("unknown lease: %v", err)
	}
	// The fenced holder learns it lost the lease.
	deadline := time.Now().Add(3 * time.Second)
	for {
		w := a.TakeWarnings()
		if len(w) == 1 && strings.Contains(w[0], `lockpool: lease "f" was lost`) {
			break
		}
		if len(w) > 0 || time.Now().After(deadline) {
			t.Fatalf("warnings = %q", w)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ok, _ := a.Renew(ctx, "f"); ok {
		t.Fatal("lost lease renewed")
	}
}

func TestKeeperKeepsLeasesAlive(t *testing.T) {
	c := pgtest.Require(t)
	s1, reg := newStore(t, c, "lp_keeper", "i1")
	s2, _ := newStore(t, c, "lp_keeper", "i2")
	ctx := ctxT(t, time.Minute)
	sessions := []*Session{s1.NewSession(appDB, 1), s1.NewSession(appDB, 2)}
	tokens := map[string]int64{}
	for i := range 10 {
		name := fmt.Sprintf("k%d", i)
		tokens[name] = mustAcquire(t, sessions[i%2], name, 2*time.Second, 0)
	}
	other := s2.NewSession(appDB, 1)
	end := time.Now().Add(8 * time.Second)
	for time.Now().Before(end) {
		for name := range tokens {
			if _, ok, err := other.Acquire(ctx, name, time.Second, 0); ok || err != nil {
				t.Fatalf("other got %s: %v, %v", name, ok, err)
			}
		}
		time.Sleep(500 * time.Millisecond) // the other instance tries every 0.5 s for 8 s (4 ttls): the duration under test
	}
	rows, err := sessions[0].List(ctx)
	if err != nil || len(rows) != 10 {
		t.Fatalf("List = %v, %v", rows, err)
	}
	for _, r := range rows {
		if tokens[r.Name] != r.Token {
			t.Fatalf("row %+v, token was %d", r, tokens[r.Name])
		}
	}
	for _, ss := range sessions {
		if w := ss.TakeWarnings(); len(w) != 0 {
			t.Fatalf("warnings %q", w)
		}
		for name := range ss.Held() {
			if ok, err := ss.Renew(ctx, name); !ok || err != nil {
				t.Fatalf("renew %s: %v %v", name, ok, err)
			}
		}
	}
	if got := metricValue(t, reg, "lockpool_lease_operations_total", map[string]string{"op": "keeper_renew", "result": "lost"}); got != 0 {
		t.Fatalf("keeper lost = %v", got)
	}
	// ~10 leases × 8 s / 0.5 s.
	if got := metricValue(t, reg, "lockpool_lease_operations_total", map[string]string{"op": "keeper_renew", "result": "ok"}); got < 120 {
		t.Fatalf("keeper renewals = %v", got)
	}
}

func TestKeeperMarksLost(t *testing.T) {
	c := pgtest.Require(t)
	s, reg := newStore(t, c, "lp_lost", "i1")
	ctx := ctxT(t, time.Minute)
	a := s.NewSession(appDB, 1)
	mustAcquire(t, a, "gone", 2*time.Second, 0)
	su := connect(t, c.SuperuserDSN(appDB))
	if _, err := su.Exec(ctx, "UPDATE lp_lost.leases SET holder = 'thief', token = token + 1000 WHERE name = 'gone'"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for metricValue(t, reg, "lockpool_lease_operations_total", map[string]string{"op": "keeper_renew", "result": "lost"}) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("keeper did not notice the loss")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if w := a.TakeWarnings(); len(w) != 1 || !strings.HasPrefix(w[0], `lockpool: lease "gone" was lost: `) {
		t.Fatalf("warnings %q", w)
	}
	if w := a.TakeWarnings(); len(w) != 0 {
		t.Fatalf("warnings not taken: %q", w)
	}
	if ok, err := a.Renew(ctx, "gone"); ok || err != nil {
		t.Fatalf("renew lost = %v, %v", ok, err)
	}
	if got := metricValue(t, reg, "lockpool_leases_held", nil); got != 0 {
		t.Fatalf("held = %v", got)
	}
}

func TestNoCreatePrivilege(t *testing.T) {
	c := pgtest.Require(t)
	ctx := ctxT(t, time.Minute)
	dropSchema(t, c, nocDB, DefaultSchema)
	s, err := New(Options{
		InstanceID: "noc",
		ConnConfig: func(db string) (*pgx.ConnConfig, error) { return pgx.ParseConfig(c.DSN(nocUser, nocPW, db)) },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ss := s.NewSession(nocDB, 1)
	_, _, err = ss.Acquire(ctx, "x", time.Second, 0)
	var le *Error
	if !errors.As(err, &le) || le.Code != "42501" {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{`role "noc" cannot create the lease schema "lockpool"`, "CREATE SCHEMA IF NOT EXISTS", "CREATE TABLE IF NOT EXISTS", "lease_fence", `GRANT USAGE ON SCHEMA "lockpool" TO "noc"`} {
		if !strings.Contains(le.Message, want) {
			t.Fatalf("message lacks %q:\n%s", want, le.Message)
		}
	}
	t.Logf("error:\n%s\nhint: %s", le.Message, le.Hint)

	// The administrator runs the migration: then the role needs the grants.
	if err := c.Exec(ctx, nocDB, MigrationSQL("lockpool")); err != nil {
		t.Fatal(err)
	}
	_, _, err = ss.Acquire(ctx, "x", time.Second, 0)
	if !errors.As(err, &le) || le.Code != "42501" || !strings.Contains(le.Message, "GRANT SELECT, INSERT, UPDATE, DELETE") {
		t.Fatalf("err after migration = %v", err)
	}
	if err := c.Exec(ctx, nocDB, GrantSQL("lockpool", nocUser)); err != nil {
		t.Fatal(err)
	}
	tok := mustAcquire(t, ss, "x", time.Second, 0)
	// The fence is SECURITY DEFINER: the role needs nothing else.
	conn := connect(t, c.DSN(nocUser, nocPW, nocDB))
	if _, err := conn.Exec(ctx, "BEGIN; SELECT lockpool.lease_fence('x', "+fmt.Sprint(tok)+"); COMMIT"); err != nil {
		t.Fatal(err)
	}
}

func TestConnectionCap(t *testing.T) {
	c := pgtest.Require(t)
	s, _ := newStore(t, c, "lp_cap", "cap", func(o *Options) {
		o.MaxConnections = 1
		o.ConnConfig = func(db string) (*pgx.ConnConfig, error) {
			cfg, err := pgx.ParseConfig(c.DSN(appUser, appPW, db))
			if err == nil {
				cfg.RuntimeParams["application_name"] = "lockpool-cap-test"
			}
			return cfg, err
		}
	})
	ctx := ctxT(t, time.Minute)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db := appDB
			if i%2 == 1 {
				db = capDB
			}
			ss := s.NewSession(db, uint64(i))
			if _, ok, err := ss.Acquire(ctx, fmt.Sprint("n", i), time.Second, 0); !ok || err != nil {
				t.Errorf("acquire: %v %v", ok, err)
			}
			ss.Close(ctx)
		}()
	}
	wg.Wait()
	// A connection the store closed to open one to the other database
	// leaves pg_stat_activity when its backend has exited, a moment after
	// the close; one the store keeps stays there.
	su := connect(t, c.SuperuserDSN("postgres"))
	var n int
	for deadline := time.Now().Add(5 * time.Second); ; {
		if err := su.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lockpool-cap-test'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n <= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lease connections open, cap 1", n)
		}
		time.Sleep(20 * time.Millisecond) // polling pg_stat_activity: the backend's exit sends no signal
	}
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	c := pgtest.Require(t)
	before := goleak.IgnoreCurrent()
	reg := prometheus.NewRegistry()
	s, err := New(Options{
		Schema:     "lp_leak",
		InstanceID: "leak",
		ConnConfig: func(db string) (*pgx.ConnConfig, error) { return pgx.ParseConfig(c.DSN(appUser, appPW, db)) },
		Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, time.Minute)
	a := s.NewSession(appDB, 1)
	b := s.NewSession(appDB, 2)
	mustAcquire(t, a, "l", 10*time.Second, 0)
	if _, ok, err := b.Acquire(ctx, "l", time.Second, 200*time.Millisecond); ok || err != nil { // starts the LISTEN goroutine
		t.Fatalf("b = %v, %v", ok, err)
	}
	s.Close() // releases a's lease
	check := connect(t, c.SuperuserDSN(appDB))
	var n int
	if err := check.QueryRow(ctx, "SELECT count(*) FROM lp_leak.leases WHERE expires_at > now()").Scan(&n); err != nil || n != 0 {
		t.Fatalf("live leases after Store.Close = %d, %v", n, err)
	}
	if _, _, err := a.Acquire(ctx, "m", time.Second, 0); err == nil {
		t.Fatal("acquire after Close succeeded")
	}
	goleak.VerifyNone(t, before)
}
