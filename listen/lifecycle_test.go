package listen

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/lockpool/lockpool/internal/pgtest"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestListenerTerminated: pg_terminate_backend on the listener: every
// subscriber of that database gets Lost once with 57P01, other databases go
// on, and the next Listen opens a new listener connection.
func TestListenerTerminated(t *testing.T) {
	h, reg := newHub(t)
	ctx := testCtx(t)
	su := superuser(t, appDB)
	a, b, c, other := newRecorder("a"), newRecorder("b"), newRecorder("c"), newRecorder("other db")
	mustListen(t, h, appDB, "x", a)
	mustListen(t, h, appDB, "x", b)
	mustListen(t, h, appDB, "y", b)
	mustListen(t, h, appDB, "y", c)
	mustListen(t, h, otherDB, "x", other)
	mustListen(t, h, otherDB, "x", b) // b listens in both databases
	oldPID := listenerPID(t, su, appDB)

	terminate(t, su, oldPID)
	for _, r := range []*recorder{a, b, c} {
		err := r.waitLost(t, ctx)
		if !errors.Is(err, ErrListenerLost) || sqlState(err) != "57P01" {
			t.Errorf("%s: Lost(%v), want ErrListenerLost with 57P01", r.name, err)
		}
	}
	if rows := h.Channels(); !slices.Equal(rows, []ChannelRow{{otherDB, "x", 2}}) {
		t.Errorf("Channels() = %+v, want only otherdb's x with 2 clients", rows)
	}

	// The other database's listener goes on, b included.
	notify(t, sender(t, otherDB), "x", "still")
	other.waitPayload(t, ctx, "x", "still")
	b.waitPayload(t, ctx, "x", "still")

	// A new Listen opens a new connection; the lost subscribers are
	// subscribed to nothing until they listen again.
	mustListen(t, h, appDB, "x", a)
	newPID := listenerPID(t, su, appDB)
	if newPID == oldPID {
		t.Fatalf("listener pid %d again", newPID)
	}
	snd := sender(t, appDB)
	notify(t, snd, "y", "to nobody")
	notify(t, snd, "x", "after")
	a.waitPayload(t, ctx, "x", "after")
	for _, r := range []*recorder{b, c} {
		got, _ := r.snapshot()
		for _, n := range got {
			if n.Payload == "after" || n.Payload == "to nobody" {
				t.Errorf("%s got %q after Lost without listening again", r.name, n.Payload)
			}
		}
	}
	for _, r := range []*recorder{a, b, c, other} {
		want := 1
		if r == other {
			want = 0
		}
		if _, lost := r.snapshot(); len(lost) != want {
			t.Errorf("%s: %d Lost calls, want %d", r.name, len(lost), want)
		}
	}
	if s := h.Stats(); s.Lost != 3 || s.Connections != 2 || s.Clients != 3 {
		t.Errorf("Stats() = %+v, want 3 lost, 2 connections, 3 clients", s)
	}
	if v := metricValue(t, reg, "lockpool_listen_clients_closed_total", "listener_lost"); v != 3 {
		t.Errorf("lockpool_listen_clients_closed_total{reason=listener_lost} = %v, want 3", v)
	}
}

// TestListenWhileListenerDies: a Listen waiting for its LISTEN when the
// connection dies returns the error; active subscribers get Lost.
func TestListenWhileListenerDies(t *testing.T) {
	h, _ := newHub(t)
	g := newGate(h, `LISTEN "late"`)
	ctx := testCtx(t)
	su := superuser(t, appDB)
	a, b := newRecorder("a"), newRecorder("b")
	mustListen(t, h, appDB, "x", a)
	errc := make(chan error, 1)
	go func() { errc <- h.Listen(ctx, appDB, "late", b) }()
	<-g.reached
	pid := listenerPID(t, su, appDB)
	terminate(t, su, pid)
	eventually(t, 10*time.Second, "listener backend gone", func() bool {
		var n int
		_ = su.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int64(pid)).Scan(&n)
		return n == 0
	})
	close(g.release)
	err := <-errc
	if !errors.Is(err, ErrListenerLost) {
		t.Fatalf("Listen: %v, want ErrListenerLost", err)
	}
	if err := a.waitLost(t, ctx); !errors.Is(err, ErrListenerLost) {
		t.Fatalf("Lost(%v)", err)
	}
	if _, lost := b.snapshot(); len(lost) != 0 {
		t.Errorf("b, never active, got Lost %v", lost)
	}
	if rows := h.Channels(); len(rows) != 0 {
		t.Errorf("Channels() = %+v after the loss", rows)
	}
	mustListen(t, h, appDB, "late", b)
}

// TestConnectFails: a Listen whose listener connection cannot be opened
// returns the error; the next Listen tries again.
func TestConnectFails(t *testing.T) {
	c := pgtest.Require(t)
	var fail atomic.Bool
	fail.Store(true)
	h, _ := newHub(t, func(cfg *Config) {
		cfg.ConnConfig = func(db string) (*pgx.ConnConfig, error) {
			if fail.Load() {
				return pgx.ParseConfig(c.DSN(appUser, "wrong password", db))
			}
			return pgx.ParseConfig(c.DSN(appUser, appPW, db))
		}
	})
	r := newRecorder("r")
	err := h.Listen(testCtx(t), appDB, "x", r)
	if err == nil || sqlState(err) != "28P01" {
		t.Fatalf("Listen with a wrong password: %v, want 28P01", err)
	}
	if err := h.Listen(testCtx(t), "no such db", "x", r); sqlState(err) != "3D000" && sqlState(err) != "28P01" {
		t.Fatalf("Listen in a missing database: %v", err)
	}
	if s := h.Stats(); s.Clients != 0 || s.Channels != 0 {
		t.Fatalf("Stats() = %+v after failed Listens", s)
	}
	fail.Store(false)
	mustListen(t, h, appDB, "x", r)
	notify(t, sender(t, appDB), "x", "ok")
	r.waitPayload(t, testCtx(t), "x", "ok")
	if _, lost := r.snapshot(); len(lost) != 0 {
		t.Errorf("Lost %v", lost)
	}
}

// TestPingTimeout: a listener that stops answering (the network holds its
// bytes) is dead after PingInterval: Lost with ErrNoAnswer.
func TestPingTimeout(t *testing.T) {
	c := pgtest.Require(t)
	p := newPausable(t, fmt.Sprintf("%s:%d", c.Host, c.Port))
	h, _ := newHub(t, func(cfg *Config) {
		cfg.PingInterval = 500 * time.Millisecond
		cfg.ConnConfig = func(db string) (*pgx.ConnConfig, error) {
			cc, err := pgx.ParseConfig(c.DSN(appUser, appPW, db))
			if err == nil {
				host, port, _ := strings.Cut(p.addr(), ":")
				cc.Host = host
				_, _ = fmt.Sscan(port, &cc.Port)
			}
			return cc, err
		}
	})
	ctx := testCtx(t)
	r := newRecorder("r")
	mustListen(t, h, appDB, "x", r)
	notify(t, sender(t, appDB), "x", "before")
	r.waitPayload(t, ctx, "x", "before")
	p.pause()
	start := time.Now()
	err := r.waitLost(t, ctx)
	if !errors.Is(err, ErrNoAnswer) || !errors.Is(err, ErrListenerLost) {
		t.Fatalf("Lost(%v), want ErrNoAnswer", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("lost after %v with a ping interval of 500ms", d)
	}
	p.resume()
	mustListen(t, h, appDB, "x", r)
}

// TestPingKeepsConnection: an idle listener pings every PingInterval and
// stays.
func TestPingKeepsConnection(t *testing.T) {
	// Not much shorter: a ping not answered within the interval (a loaded
	// test machine) would end the connection.
	h, _ := newHub(t, func(cfg *Config) { cfg.PingInterval = 500 * time.Millisecond })
	cmds := newCommandLog(h)
	ctx := testCtx(t)
	r := newRecorder("r")
	mustListen(t, h, appDB, "x", r)
	from := 0
	for range 3 {
		from = cmds.waitFor(t, ctx, from, "appdb: "+barrierSQL)
	}
	notify(t, sender(t, appDB), "x", "alive")
	r.waitPayload(t, ctx, "x", "alive")
	if _, lost := r.snapshot(); len(lost) != 0 {
		t.Fatalf("Lost %v", lost)
	}
}

// TestServerRestart: a PostgreSQL restart ends the listener with 57P01;
// Listen works again once the server is back.
func TestServerRestart(t *testing.T) {
	c := pgtest.Require(t)
	h, _ := newHub(t)
	ctx := testCtx(t)
	a, b := newRecorder("a"), newRecorder("b")
	mustListen(t, h, appDB, "x", a)
	mustListen(t, h, otherDB, "x", b)
	if err := c.Restart(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*recorder{a, b} {
		if err := r.waitLost(t, ctx); sqlState(err) != "57P01" {
			t.Errorf("%s: Lost(%v), want 57P01", r.name, err)
		}
	}
	mustListen(t, h, appDB, "x", a)
	notify(t, sender(t, appDB), "x", "back")
	a.waitPayload(t, ctx, "x", "back")
	if _, lost := a.snapshot(); len(lost) != 1 {
		t.Errorf("a: %d Lost calls, want 1", len(lost))
	}
}

// TestClose: Close ends every connection without Lost; waiting and later
// calls get ErrClosed.
func TestClose(t *testing.T) {
	h, _ := newHub(t)
	g := newGate(h, `LISTEN "pending"`)
	ctx := testCtx(t)
	su := superuser(t, appDB)
	a, b := newRecorder("a"), newRecorder("b")
	mustListen(t, h, appDB, "x", a)
	mustListen(t, h, otherDB, "x", a)
	errc := make(chan error, 1)
	go func() { errc <- h.Listen(ctx, appDB, "pending", b) }()
	<-g.reached
	closed := make(chan struct{})
	go func() { h.Close(); close(closed) }()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("waiting Listen: %v, want ErrClosed", err)
	}
	close(g.release)
	<-closed
	if _, lost := a.snapshot(); len(lost) != 0 {
		t.Fatalf("Lost %v after Close", lost)
	}
	if err := h.Listen(ctx, appDB, "x", b); !errors.Is(err, ErrClosed) {
		t.Fatalf("Listen after Close: %v", err)
	}
	if err := h.Sync(ctx, appDB); !errors.Is(err, ErrClosed) {
		t.Fatalf("Sync after Close: %v", err)
	}
	h.Unlisten(appDB, "x", a)
	h.UnlistenAll(appDB, a)
	h.Expect(appDB, 1, a, "x", "", true)
	h.Forget(appDB, 1, a)
	if rows := h.Servers(); len(rows) != 0 {
		t.Fatalf("Servers() = %+v after Close", rows)
	}
	eventually(t, 10*time.Second, "listener backends gone", func() bool {
		var n int
		_ = su.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", ApplicationName).Scan(&n)
		return n == 0
	})
	h.Close() // twice is fine
}

// TestListenContext: a Listen whose context ends while it waits returns the
// context's error and leaves no subscription; the listener UNLISTENs.
func TestListenContext(t *testing.T) {
	h, _ := newHub(t)
	g := newGate(h, `LISTEN "slow"`)
	cmds := newCommandLog(h)
	r := newRecorder("r")
	mustListen(t, h, appDB, "x", r)

	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.Listen(done, appDB, "y", r); !errors.Is(err, context.Canceled) {
		t.Fatalf("Listen with a done context: %v", err)
	}

	ctx, cancel := context.WithCancel(testCtx(t))
	errc := make(chan error, 1)
	go func() { errc <- h.Listen(ctx, appDB, "slow", r) }()
	<-g.reached
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Listen: %v, want context.Canceled", err)
	}
	if rows := h.Channels(); !slices.Equal(rows, []ChannelRow{{appDB, "x", 1}}) {
		t.Fatalf("Channels() = %+v, want only x", rows)
	}
	close(g.release)
	cmds.waitFor(t, testCtx(t), 0, `appdb: UNLISTEN "slow"`)
	notify(t, sender(t, appDB), "slow", "nobody")
	notify(t, sender(t, appDB), "x", "marker")
	if got := r.waitPayload(t, testCtx(t), "x", "marker"); len(got) != 1 {
		t.Fatalf("got %s", describe(got))
	}
}

// TestUnlistenWhileListenWaits: Unlisten of a subscription whose Listen
// still waits makes that Listen return ErrUnlistened.
func TestUnlistenWhileListenWaits(t *testing.T) {
	h, _ := newHub(t)
	g := newGate(h, `LISTEN "w"`)
	r := newRecorder("r")
	errc := make(chan error, 1)
	go func() { errc <- h.Listen(testCtx(t), appDB, "w", r) }()
	<-g.reached
	h.UnlistenAll(appDB, r)
	if err := <-errc; !errors.Is(err, ErrUnlistened) {
		t.Fatalf("Listen: %v, want ErrUnlistened", err)
	}
	close(g.release)
	mustListen(t, h, appDB, "w", r)
}

func TestListenErrors(t *testing.T) {
	h, _ := newHub(t)
	ctx := testCtx(t)
	r := newRecorder("r")
	mustListen(t, h, appDB, "fine", r)
	cases := []struct {
		name, channel string
		check         func(error) bool
	}{
		{"too long", strings.Repeat("x", MaxChannelLen+1), func(err error) bool { return errors.Is(err, ErrChannelName) }},
		{"NUL", "a\x00b", func(err error) bool { return errors.Is(err, ErrChannelName) }},
		// PostgreSQL refuses it (zero-length delimited identifier); the
		// connection stays.
		{"empty", "", func(err error) bool { return sqlState(err) == "42601" }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := h.Listen(ctx, appDB, tc.channel, r); !tc.check(err) {
				t.Fatalf("Listen(%q): %v", short(tc.channel), err)
			}
		})
	}
	if rows := h.Channels(); !slices.Equal(rows, []ChannelRow{{appDB, "fine", 1}}) {
		t.Fatalf("Channels() = %+v", rows)
	}
	notify(t, sender(t, appDB), "fine", "still")
	r.waitPayload(t, ctx, "fine", "still")
	if _, lost := r.snapshot(); len(lost) != 0 {
		t.Fatalf("Lost %v", lost)
	}
}

// TestSync: when Sync returns, every notification committed before it was
// called has been delivered.
func TestSync(t *testing.T) {
	h, _ := newHub(t)
	ctx := testCtx(t)
	if err := h.Sync(ctx, "never used"); err != nil {
		t.Fatalf("Sync without a connection: %v", err)
	}
	snd := sender(t, appDB)
	r := newRecorder("r")
	mustListen(t, h, appDB, "s", r)
	for i := range 50 {
		p := fmt.Sprint(i)
		notify(t, snd, "s", p)
		if err := h.Sync(ctx, appDB); err != nil {
			t.Fatal(err)
		}
		got, _ := r.snapshot()
		if len(got) != i+1 || got[i].Payload != p {
			t.Fatalf("after Sync: got %s, want %d notifications ending in %q", describe(got), i+1, p)
		}
	}
}

// TestConsole checks Channels, Servers, Stats and the metrics.
func TestConsole(t *testing.T) {
	h, reg := newHub(t)
	ctx := testCtx(t)
	su := superuser(t, appDB)
	a, b, c := newRecorder("a"), newRecorder("b"), newRecorder("c")
	start := time.Now()
	mustListen(t, h, appDB, "x", a)
	mustListen(t, h, appDB, "y", a)
	mustListen(t, h, appDB, "x", b)
	mustListen(t, h, otherDB, "z", c)
	wantCh := []ChannelRow{{appDB, "x", 2}, {appDB, "y", 1}, {otherDB, "z", 1}}
	if rows := h.Channels(); !slices.Equal(rows, wantCh) {
		t.Errorf("Channels() = %+v, want %+v", rows, wantCh)
	}
	servers := h.Servers()
	if len(servers) != 2 {
		t.Fatalf("Servers() = %+v", servers)
	}
	for i, want := range []struct {
		db       string
		channels int
	}{{appDB, 2}, {otherDB, 1}} {
		s := servers[i]
		if s.Database != want.db || s.State != "listening" || s.Channels != want.channels || s.Since.Before(start) || s.Since.After(time.Now()) {
			t.Errorf("Servers()[%d] = %+v, want %s listening on %d channels", i, s, want.db, want.channels)
		}
	}
	if pid := listenerPID(t, su, appDB); servers[0].PID != pid {
		t.Errorf("appdb listener pid %d, pg_stat_activity says %d", servers[0].PID, pid)
	}
	notify(t, sender(t, appDB), "x", "one")
	a.waitPayload(t, ctx, "x", "one")
	b.waitPayload(t, ctx, "x", "one")
	if s := h.Stats(); s != (Stats{Clients: 3, Channels: 3, Connections: 2, Delivered: 2, Lost: 0}) {
		t.Errorf("Stats() = %+v", s)
	}
	h.CountClosed(ReasonMaxPending)
	for _, m := range []struct {
		name, reason string
		want         float64
	}{
		{"lockpool_listen_clients", "", 3},
		{"lockpool_listen_channels", "", 3},
		{"lockpool_listen_connections", "", 2},
		{"lockpool_notifications_delivered_total", "", 2},
		{"lockpool_listen_clients_closed_total", ReasonListenerLost, 0},
		{"lockpool_listen_clients_closed_total", ReasonMaxPending, 1},
	} {
		if v := metricValue(t, reg, m.name, m.reason); v != m.want {
			t.Errorf("%s{%s} = %v, want %v", m.name, m.reason, v, m.want)
		}
	}
	// No channel names (or anything but reason) in labels.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() != "reason" {
					t.Errorf("%s has label %s=%q", mf.GetName(), l.GetName(), l.GetValue())
				}
			}
		}
	}
}

// metricValue returns the value of the gauge or counter name (with label
// reason, when given) on reg; -1 when there is none.
func metricValue(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if reason != "" && !hasLabel(m, "reason", reason) {
				continue
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}
