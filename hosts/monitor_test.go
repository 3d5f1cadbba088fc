package hosts

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.RunMain(m, nil)) }

// startMonitor follows addrs with a short interval; changes are sent on
// the returned channel.
func startMonitor(t *testing.T, addrs ...config.HostAddr) (*Monitor, chan Change) {
	t.Helper()
	changes := make(chan Change, 16)
	m, err := New(Options{
		Hosts:    addrs,
		Interval: 50 * time.Millisecond,
		Timeout:  time.Second,
		Connect:  connectPostgres,
		OnChange: func(ch Change) { changes <- ch },
	})
	if err != nil {
		t.Fatal(err)
	}
	m.Start()
	t.Cleanup(m.Close)
	return m, changes
}

// connectPostgres is the monitor's Connect in these tests: the test
// cluster's superuser, no TLS.
func connectPostgres(ctx context.Context, a config.HostAddr) (*pgconn.PgConn, error) {
	pc, err := pgconn.ParseConfig("sslmode=disable user=postgres dbname=postgres")
	if err != nil {
		return nil, err
	}
	pc.Host, pc.Port = a.Host, uint16(a.Port)
	return pgconn.ConnectConfig(ctx, pc)
}

func addrOf(c *pgtest.Cluster) config.HostAddr { return config.HostAddr{Host: c.Host, Port: c.Port} }

// deadAddr is an address where nothing listens.
func deadAddr(t *testing.T) config.HostAddr {
	t.Helper()
	c, err := pgtest.Start(context.Background())
	if err != nil {
		t.Skip(err)
	}
	a := addrOf(c)
	if err := c.Destroy(); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestPrimaryAndDownHost: of a primary and a host that does not answer,
// the primary is routed to for targets primary, prefer-standby and any;
// target standby waits and then gets 53300 naming the hosts' states.
func TestPrimaryAndDownHost(t *testing.T) {
	c := pgtest.Require(t)
	dead := deadAddr(t)
	m, changes := startMonitor(t, dead, addrOf(c))
	select {
	case ch := <-changes:
		if ch.New == nil || ch.New.Addr() != addrOf(c) || ch.Old != nil {
			t.Fatalf("first change = %+v, want the primary found", ch)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no primary found")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, kind := range []string{config.TargetPrimary, config.TargetPreferStandby, config.TargetAny} {
		ep, err := m.Route(ctx, Target{Kind: kind, MaxLag: time.Second})
		if err != nil || ep.Addr() != addrOf(c) {
			t.Fatalf("Route(%s) = %v, %v; want the primary", kind, ep.Addr(), err)
		}
		if !m.Usable(ep, Target{Kind: kind, MaxLag: time.Second}) {
			t.Fatalf("the primary's endpoint is not usable for %s", kind)
		}
	}
	sctx, scancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer scancel()
	_, err := m.Route(sctx, Target{Kind: config.TargetStandby, MaxLag: time.Second})
	var pe *pgerr.Error
	if !errors.As(err, &pe) || pe.Code != "53300" || !strings.Contains(pe.Detail, dead.String()+" down") {
		t.Fatalf("Route(standby) = %v (detail %q), want 53300 naming %s down", err, pe.Detail, dead)
	}
	if st := m.Hosts()[0].Status(); st.Up || st.Err == "" {
		t.Fatalf("dead host status = %+v, want down with an error", st)
	}
}

// TestSplitBrain: two hosts that both are primaries are refused (no
// primary, both generations bumped); once one stops answering the other is
// the primary again, and connections of the split stay unusable.
func TestSplitBrain(t *testing.T) {
	a := pgtest.Require(t)
	b, err := pgtest.Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Destroy()
	m, changes := startMonitor(t, addrOf(a), addrOf(b))
	var before Endpoint
	deadline := time.After(10 * time.Second)
	for split := false; !split; {
		select {
		case ch := <-changes:
			if ch.New != nil && before.Host == nil {
				before = Endpoint{Host: ch.New, Gen: ch.New.Status().Gen}
			}
			split = ch.SplitBrain
		case <-deadline:
			t.Fatal("no split brain seen")
		}
	}
	if _, ok := m.KnownPrimary(); ok {
		t.Fatal("a primary is known during a split brain")
	}
	for _, h := range m.Hosts() {
		if st := h.Status(); !st.Refused || st.State(0) != "refused" {
			t.Fatalf("%s: %+v, want refused", h.Addr(), st)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = m.Route(ctx, Target{Kind: config.TargetPrimary})
	var pe *pgerr.Error
	if !errors.As(err, &pe) || pe.Code != "53300" || !strings.Contains(pe.Message, "split brain") {
		t.Fatalf("Route during split brain = %v, want 53300 split brain", err)
	}
	if before.Host != nil && m.Usable(before, Target{Kind: config.TargetPrimary}) {
		t.Fatal("a connection dialed before the split brain is still usable")
	}
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	p, err := m.Primary(ctx2)
	if err != nil || p != addrOf(a) {
		t.Fatalf("Primary after the other stopped = %v, %v; want %v", p, err, addrOf(a))
	}
	if before.Host != nil && m.Usable(before, Target{Kind: config.TargetPrimary}) {
		t.Fatal("a connection of the split brain became usable again")
	}
}

// staleMonitor is a monitor of two hosts that is not started: the test
// applies check results itself. a was found the primary and b a standby.
func staleMonitor(t *testing.T) (m *Monitor, a, b *Host) {
	t.Helper()
	m, err := New(Options{Hosts: []config.HostAddr{{Host: "127.0.0.1", Port: 1}, {Host: "127.0.0.1", Port: 2}}, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	a, b = m.Hosts()[0], m.Hosts()[1]
	m.apply(a, result{})
	m.apply(b, result{inRecovery: true})
	if p, ok := m.KnownPrimary(); !ok || p != a.Addr() {
		t.Fatalf("primary = %v, %v; want %v", p, ok, a.Addr())
	}
	for _, k := range m.kicks {
		select {
		case <-k:
		default:
		}
	}
	return m, a, b
}

// TestStaleClaimCheckedAgain: a switchover stops the primary and then
// promotes the standby, within one check interval. When the promoted
// standby's check comes first, the old primary's claim is older than the
// new one's: the old primary is checked again at once, before anything is
// called a split brain. Meanwhile there is no primary and the old primary's
// connections start no transaction. Its check fails (it stopped): the new
// primary is followed, and no split brain was ever reported.
func TestStaleClaimCheckedAgain(t *testing.T) {
	m, a, b := staleMonitor(t)
	old := Endpoint{Host: a, Gen: a.Status().Gen}
	m.apply(b, result{}) // b promoted; a's last check is older than b's claim
	_, _, split, _ := m.Snapshot()
	if split || a.Status().Refused || b.Status().Refused {
		t.Fatalf("split brain called on a stale claim: split %v, a %+v, b %+v", split, a.Status(), b.Status())
	}
	if p, ok := m.KnownPrimary(); ok {
		t.Fatalf("primary %v while a's claim is being checked again", p)
	}
	if m.Usable(old, Target{Kind: config.TargetPrimary}) {
		t.Fatal("the old primary's connections are still usable while another host claims the role")
	}
	select {
	case <-m.kicks[0]:
	default:
		t.Fatal("the stale claimant was not asked to be checked again")
	}
	m.apply(a, result{err: errors.New("connection refused")}) // it stopped
	p, ok := m.KnownPrimary()
	_, _, split, failovers := m.Snapshot()
	if !ok || p != b.Addr() || split || failovers != 1 {
		t.Fatalf("after a's check failed: primary %v %v, split brain %v, failovers %d; want %v, false, 1", p, ok, split, failovers, b.Addr())
	}
	for _, ch := range m.events {
		if ch.SplitBrain {
			t.Fatalf("a change reported a split brain: %+v", ch)
		}
	}
}

// TestStaleClaimConfirmed: when the old primary's new check still finds it
// a primary, after the other host's claim began, it is a split brain.
func TestStaleClaimConfirmed(t *testing.T) {
	m, a, b := staleMonitor(t)
	m.apply(b, result{})
	m.apply(a, result{}) // checked again: still a primary
	_, _, split, _ := m.Snapshot()
	if !split || !a.Status().Refused || !b.Status().Refused {
		t.Fatalf("split brain %v, a %+v, b %+v; want a split brain with both refused", split, a.Status(), b.Status())
	}
	if _, ok := m.KnownPrimary(); ok {
		t.Fatal("a primary during a split brain")
	}
}

// TestLagSQL: the replay lag the checks compute, for the positions a host
// may report: 0 for a primary and for a standby that replayed all it
// received, also when what it reports as received is behind what it
// replayed (a restarted standby streams from the start of a WAL segment
// and reports that until more WAL comes); else the time since its last
// replayed commit.
func TestLagSQL(t *testing.T) {
	c := pgtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, c.SuperuserDSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	const tenAgo = "now() - interval '10 seconds'"
	for _, tc := range []struct {
		name                                       string
		inRecovery, received, replayed, replayedAt string
		want                                       float64 // seconds
	}{
		{"primary", "false", "NULL::pg_lsn", "NULL::pg_lsn", "NULL::timestamptz", 0},
		{"caught up", "true", "'0/30197E0'", "'0/30197E0'", tenAgo, 0},
		{"restarted, received behind replayed", "true", "'0/3000000'", "'0/30197E0'", tenAgo, 0},
		{"behind", "true", "'0/4000000'", "'0/30197E0'", tenAgo, 10},
		{"nothing received since the start", "true", "NULL", "'0/30197E0'", tenAgo, 10},
		{"behind, no commit replayed", "true", "'0/4000000'", "'0/30197E0'", "NULL::timestamptz", 0},
	} {
		sql := "SELECT (" + lagSQL(tc.inRecovery, tc.received+"::pg_lsn", tc.replayed+"::pg_lsn", tc.replayedAt) + ")::float8::text"
		rr := conn.ExecParams(ctx, sql, nil, nil, nil, nil).Read()
		if rr.Err != nil || len(rr.Rows) != 1 {
			t.Fatalf("%s: %v (%d rows)\n%s", tc.name, rr.Err, len(rr.Rows), sql)
		}
		var got float64
		if _, err := fmt.Sscan(string(rr.Rows[0][0]), &got); err != nil {
			t.Fatalf("%s: %q: %v", tc.name, rr.Rows[0][0], err)
		}
		if math.Abs(got-tc.want) > 1 {
			t.Errorf("%s: lag %v s, want %v", tc.name, got, tc.want)
		}
	}
}

// freezer relays TCP connections to a target until frozen; then it relays
// nothing more, on open connections or new ones, and closes none: a host
// that stops answering without a reset, as in a network partition.
type freezer struct {
	ln     net.Listener
	frozen atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln}
	t.Cleanup(func() {
		_ = ln.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns = append(f.conns, c)
			f.mu.Unlock()
			if f.frozen.Load() {
				continue // accepted, never answered
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, s)
			f.mu.Unlock()
			go f.pipe(s, c)
			go f.pipe(c, s)
		}
	}()
	return f
}

// pipe copies from src to dst until src ends or the freezer is frozen
// (then it reads on and drops what it reads).
func (f *freezer) pipe(dst, src net.Conn) {
	b := make([]byte, 32<<10)
	for {
		n, err := src.Read(b)
		if n > 0 && !f.frozen.Load() {
			if _, werr := dst.Write(b[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (f *freezer) addr() config.HostAddr {
	a := f.ln.Addr().(*net.TCPAddr)
	return config.HostAddr{Host: a.IP.String(), Port: a.Port}
}

// TestSilentHostDownAfterTimeout: a host that stops answering without a
// reset (its check hangs, and so does a new connection's login) is down
// once one check did not answer within the timeout (connect_timeout), not
// after a second check on a fresh connection timed out too.
func TestSilentHostDownAfterTimeout(t *testing.T) {
	c := pgtest.Require(t)
	f := newFreezer(t, net.JoinHostPort(c.Host, strconv.Itoa(c.Port)))
	const timeout = 2 * time.Second
	m, err := New(Options{
		Hosts:    []config.HostAddr{f.addr()},
		Interval: 50 * time.Millisecond,
		Timeout:  timeout,
		Connect:  connectPostgres,
	})
	if err != nil {
		t.Fatal(err)
	}
	m.Start()
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := m.Primary(ctx); err != nil {
		t.Fatal(err)
	}
	f.frozen.Store(true)
	frozen := time.Now()
	for m.Hosts()[0].Status().Up {
		if ctx.Err() != nil {
			t.Fatal("the frozen host is still up")
		}
		time.Sleep(10 * time.Millisecond) // polling the monitor's state
	}
	took := time.Since(frozen)
	t.Logf("down %v after the host stopped answering (timeout %v): %s", took.Round(time.Millisecond), timeout, m.Hosts()[0].Status().Err)
	if took > timeout+timeout/2 {
		t.Errorf("down %v after the host stopped answering, want within the timeout %v and a check interval", took.Round(time.Millisecond), timeout)
	}
}

// TestRouteWaitChecksSooner: a client waiting for a primary has the hosts
// checked every kickGap, not every Interval, so a host that becomes the
// primary serves it at once (here the interval is an hour: only the
// waiting client's checks can find it).
func TestRouteWaitChecksSooner(t *testing.T) {
	c := pgtest.Require(t)
	var up atomic.Bool
	firstDown := make(chan struct{})
	var once sync.Once
	m, err := New(Options{
		Hosts:    []config.HostAddr{addrOf(c)},
		Interval: time.Hour,
		Timeout:  time.Second,
		Connect: func(ctx context.Context, a config.HostAddr) (*pgconn.PgConn, error) {
			if !up.Load() {
				once.Do(func() { close(firstDown) })
				return nil, context.DeadlineExceeded // a timeout: no retry on a fresh connection
			}
			return connectPostgres(ctx, a)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	m.Start()
	defer m.Close()
	<-firstDown // the start's check found no host; the next one is an hour away
	up.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ep, err := m.Route(ctx, Target{Kind: config.TargetPrimary})
	if err != nil {
		t.Fatalf("Route(primary): %v; want the host that came up, found by the waiting client's checks", err)
	}
	if ep.Addr() != addrOf(c) {
		t.Fatalf("Route(primary) = %v, want %v", ep.Addr(), addrOf(c))
	}
}
