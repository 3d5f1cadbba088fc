package pool

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
)

// The order of waits for pin slots and connections: AcquireWithPin (a
// caller holding nothing) waits for both holding neither and is granted
// both at once; AcquirePin (a caller holding a connection) waits for a
// slot only and takes a free one ahead of AcquireWithPin callers that
// cannot get a connection yet.

// acquireWithPinAsync runs AcquireWithPin in the background.
func acquireWithPinAsync(m *Manager, ctx context.Context, app, db string) chan result {
	ch := make(chan result, 1)
	go func() {
		c, err := m.AcquireWithPin(ctx, app, db, nil)
		ch <- result{c, err}
	}()
	return ch
}

// pinAsync runs AcquirePin in the background.
func pinAsync(m *Manager, ctx context.Context, app string) chan error {
	ch := make(chan error, 1)
	go func() { ch <- m.AcquirePin(ctx, app) }()
	return ch
}

// notYet fails the test if ch has a result already.
func notYet[T any](t *testing.T, what string, ch chan T) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s returned early: %+v", what, r)
	default:
	}
}

// Three holders have every connection; two callers outside a transaction
// want a slot and a connection. The holders take pin slots (as sessions
// inside transactions do) at once, since the waiters hold none, and when
// they finish the waiters get both, oldest first.
func TestAcquireWithPinWaitsHoldingNothing(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, _ := start(t, setup{server: srv(10), apps: []AppConfig{app("a", 3, 2, 5*time.Second)}, reg: reg})
	ctx := context.Background()
	held := []*Conn{mustAcquire(t, m, "a", "db"), mustAcquire(t, m, "a", "db"), mustAcquire(t, m, "a", "db")}

	x1 := acquireWithPinAsync(m, ctx, "a", "db")
	waitFor(t, "first pin-and-connection waiter", func() bool { return m.Stats("a").PinWaiting == 1 })
	x2 := acquireWithPinAsync(m, ctx, "a", "db")
	waitFor(t, "second pin-and-connection waiter", func() bool { return m.Stats("a").PinWaiting == 2 })
	// A slot is free for them: they count as waiting for a connection too.
	expectStats(t, m, "a", Stats{Open: 3, InUse: 3, Waiting: 2, PinWaiting: 2})

	for i, want := range []chan result{x1, x2} {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		if err := m.AcquirePin(pctx, "a"); err != nil {
			t.Fatalf("holder %d: AcquirePin with both slots free to callers holding a connection: %v", i, err)
		}
		cancel()
		// Waiter 0, once served, holds the other slot: then none is free
		// and the waiter left waits for a slot, not for a connection.
		waiting := 2
		if i == 1 {
			waiting = 0
		}
		expectStats(t, m, "a", Stats{Open: 3, InUse: 3, Waiting: waiting, PinWaiting: 2 - i, Pinned: i + 1})
		// The holder's pin ends with its transaction: its slot and its
		// connection go to the oldest waiter.
		m.ReleasePin("a")
		m.Release(held[i])
		r := recv(t, want)
		if r.err != nil || r.c != held[i] {
			t.Fatalf("waiter %d got %v, %v; want holder %d's connection", i, r.c, r.err, i)
		}
		held[i] = r.c
	}
	expectStats(t, m, "a", Stats{Open: 3, InUse: 3, Pinned: 2})
	for _, c := range held {
		m.Release(c)
	}
	m.ReleasePin("a")
	m.ReleasePin("a")
	expectStats(t, m, "a", Stats{Open: 3, Idle: 3})
	for outcome, want := range map[string]float64{"immediate": 2, "waited": 2, "timeout": 0, "canceled": 0} {
		if got := counterValue(t, reg, "lockpool_pin_waits_total", map[string]string{"app": "a", "outcome": outcome}); got != want {
			t.Errorf("pin_waits_total{outcome=%s} = %v, want %v", outcome, got, want)
		}
	}
	// Both waited for a connection with a slot free, from the start.
	if h := gatherHistogram(t, reg, "lockpool_pool_wait_seconds", "a"); h.GetSampleCount() != 5 || h.GetSampleSum() <= 0 {
		t.Errorf("pool_wait_seconds: count %d sum %v; want 5 observations (3 Acquires, 2 AcquireWithPins) and a positive sum", h.GetSampleCount(), h.GetSampleSum())
	}
}

// A free slot goes to a caller holding a connection (AcquirePin) before an
// older AcquireWithPin caller that cannot get a connection; that one gets
// both once a slot and a connection are free together.
func TestPinSlotGoesFirstToCallerHoldingConnection(t *testing.T) {
	m, _ := start(t, setup{server: srv(10), apps: []AppConfig{app("a", 2, 1, 5*time.Second)}})
	ctx := context.Background()
	c1, c2 := mustAcquire(t, m, "a", "db"), mustAcquire(t, m, "a", "db")
	if err := m.AcquirePin(ctx, "a"); err != nil { // c1's holder pins
		t.Fatal(err)
	}
	x := acquireWithPinAsync(m, ctx, "a", "db")
	waitFor(t, "pin-and-connection waiter", func() bool { return m.Stats("a").PinWaiting == 1 })
	p2 := pinAsync(m, ctx, "a") // c2's holder, inside its transaction
	waitFor(t, "pin waiter", func() bool { return m.Stats("a").PinWaiting == 2 })

	m.ReleasePin("a") // c1's holder unpins but stays in its transaction
	if err := <-p2; err != nil {
		t.Fatalf("the caller holding a connection: %v", err)
	}
	notYet(t, "AcquireWithPin with no connection free", x)
	m.Release(c1) // a connection, but no slot: it idles
	expectStats(t, m, "a", Stats{Open: 2, Idle: 1, InUse: 1, Pinned: 1, PinWaiting: 1})
	notYet(t, "AcquireWithPin with no slot free", x)

	m.ReleasePin("a") // slot and idle connection together
	r := recv(t, x)
	if r.err != nil || r.c != c1 {
		t.Fatalf("AcquireWithPin got %v, %v; want the idle connection", r.c, r.err)
	}
	expectStats(t, m, "a", Stats{Open: 2, InUse: 2, Pinned: 1})
	m.Release(c2)
	m.Release(r.c)
	m.ReleasePin("a")
}

// AcquireWithPin and Acquire callers are served in FIFO order when a slot
// is free: a released connection goes to the older of them.
func TestAcquireWithPinFIFOWithAcquire(t *testing.T) {
	m, _ := start(t, setup{server: srv(10), apps: []AppConfig{app("a", 1, 1, 5*time.Second)}})
	ctx := context.Background()
	held := mustAcquire(t, m, "a", "db")
	x := acquireWithPinAsync(m, ctx, "a", "db")
	waitFor(t, "pin-and-connection waiter", func() bool { return m.Stats("a").Waiting == 1 })
	y := acquireAsync(m, ctx, "a", "db")
	waitFor(t, "connection waiter", func() bool { return m.Stats("a").Waiting == 2 })
	m.Release(held)
	rx := recv(t, x)
	if rx.err != nil {
		t.Fatal(rx.err)
	}
	notYet(t, "the younger Acquire", y)
	m.Release(rx.c)
	m.ReleasePin("a")
	ry := recv(t, y)
	if ry.err != nil {
		t.Fatal(ry.err)
	}
	m.Release(ry.c)
	expectStats(t, m, "a", Stats{Open: 1, Idle: 1})
}

// A wait that ends without a grant says what was missing, counts in the
// metrics, and leaves nothing held.
func TestAcquireWithPinTimeoutAndCancel(t *testing.T) {
	const wait = 150 * time.Millisecond
	tests := []struct {
		name        string
		conns, pins int
		hold        func(t *testing.T, m *Manager) (release func())
		cancel      bool
		want        error
		outcome     string
		connTimeout float64 // lockpool_pool_wait_timeouts_total
	}{
		{name: "no pin slot", conns: 3, pins: 1, want: ErrPinTimeout, outcome: "timeout",
			hold: func(t *testing.T, m *Manager) func() {
				c := mustAcquire(t, m, "a", "db")
				if err := m.AcquirePin(context.Background(), "a"); err != nil {
					t.Fatal(err)
				}
				return func() { m.Release(c); m.ReleasePin("a") }
			}},
		{name: "no connection", conns: 1, pins: 1, want: ErrWaitTimeout, outcome: "timeout", connTimeout: 1,
			hold: func(t *testing.T, m *Manager) func() {
				c := mustAcquire(t, m, "a", "db")
				return func() { m.Release(c) }
			}},
		{name: "canceled", conns: 1, pins: 1, cancel: true, want: context.Canceled, outcome: "canceled",
			hold: func(t *testing.T, m *Manager) func() {
				c := mustAcquire(t, m, "a", "db")
				return func() { m.Release(c) }
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m, _ := start(t, setup{server: srv(10), apps: []AppConfig{app("a", tc.conns, tc.pins, wait)}, reg: reg})
			release := tc.hold(t, m)
			before := m.Stats("a")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				ch := acquireWithPinAsync(m, ctx, "a", "db")
				waitFor(t, "waiter", func() bool { return m.Stats("a").PinWaiting == 1 })
				cancel()
				if r := recv(t, ch); !errors.Is(r.err, tc.want) {
					t.Fatalf("err = %v, want %v", r.err, tc.want)
				}
			} else {
				t0 := time.Now()
				_, err := m.AcquireWithPin(ctx, "a", "db", nil)
				if !errors.Is(err, tc.want) {
					t.Fatalf("err = %v, want %v", err, tc.want)
				}
				if el := time.Since(t0); el < wait {
					t.Fatalf("gave up after %v, before wait_timeout %v", el, wait)
				}
			}
			if got := m.Stats("a"); got != before {
				t.Fatalf("after the failed wait: %+v, want %+v as before it", got, before)
			}
			if got := counterValue(t, reg, "lockpool_pin_waits_total", map[string]string{"app": "a", "outcome": tc.outcome}); got != 1 {
				t.Errorf("pin_waits_total{outcome=%s} = %v, want 1", tc.outcome, got)
			}
			if got := counterValue(t, reg, "lockpool_pool_wait_timeouts_total", map[string]string{"app": "a"}); got != tc.connTimeout {
				t.Errorf("pool_wait_timeouts_total = %v, want %v", got, tc.connTimeout)
			}
			release()
		})
	}
}

// A dial that fails gives the slot that came with it back.
func TestAcquireWithPinDialFailureGivesSlotBack(t *testing.T) {
	m, f := start(t, setup{server: srv(10), apps: []AppConfig{app("a", 2, 1, time.Second)}})
	f.failDials(errors.New("refused for the test"))
	f.failOnce = true
	// A connection error is retried until wait_timeout; make it final.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := m.AcquireWithPin(ctx, "a", "db", nil)
	if err != nil {
		t.Fatalf("AcquireWithPin after one failed dial attempt: %v", err)
	}
	expectStats(t, m, "a", Stats{Open: 1, InUse: 1, Pinned: 1})
	m.Release(c)
	m.ReleasePin("a")

	// A refusal by PostgreSQL is final.
	f.failDials(&pgconn.PgError{Severity: "FATAL", Code: "3D000", Message: `database "db2" does not exist`})
	var pe *pgconn.PgError
	if _, err := m.AcquireWithPin(ctx, "a", "db2", nil); !errors.As(err, &pe) || pe.Code != "3D000" {
		t.Fatalf("AcquireWithPin with a refused dial: %v, want the PgError 3D000", err)
	}
	expectStats(t, m, "a", Stats{Open: 1, Idle: 1})
}

// Close and a reconfiguration that removes the application end the waits.
func TestAcquireWithPinEndedByCloseAndRemoval(t *testing.T) {
	m, _ := start(t, setup{server: srv(10), apps: []AppConfig{app("a", 1, 1, 5*time.Second), app("gone", 1, 1, 5*time.Second)}})
	ctx := context.Background()
	ga := mustAcquire(t, m, "gone", "db")
	gw := acquireWithPinAsync(m, ctx, "gone", "db")
	waitFor(t, "waiter of gone", func() bool { return m.Stats("gone").PinWaiting == 1 })
	m.Reconfigure(srv(10), []AppConfig{app("a", 1, 1, 5*time.Second)})
	if r := recv(t, gw); !errors.Is(r.err, ErrUnknownApp) {
		t.Fatalf("waiter of a removed application: %v", r.err)
	}
	m.Release(ga)

	held := mustAcquire(t, m, "a", "db")
	w := acquireWithPinAsync(m, ctx, "a", "db")
	waitFor(t, "waiter", func() bool { return m.Stats("a").PinWaiting == 1 })
	m.Close()
	if r := recv(t, w); !errors.Is(r.err, ErrClosed) {
		t.Fatalf("waiter at Close: %v", r.err)
	}
	m.Release(held)
	expectStats(t, m, "a", Stats{})
}

// Run-time limits (SetLimit) apply to AcquireWithPin: with no pin slot
// allowed it waits, and a raised limit serves it.
func TestSetLimitServesAcquireWithPin(t *testing.T) {
	m, _ := start(t, setup{server: srv(10), apps: []AppConfig{app("a", 2, 1, 5*time.Second)}})
	m.SetLimit("a", 2, 0)
	ch := acquireWithPinAsync(m, context.Background(), "a", "db")
	waitFor(t, "waiter", func() bool { return m.Stats("a").PinWaiting == 1 })
	expectStats(t, m, "a", Stats{PinWaiting: 1})
	m.SetLimit("a", 2, 1)
	r := recv(t, ch)
	if r.err != nil {
		t.Fatal(r.err)
	}
	expectStats(t, m, "a", Stats{Open: 1, InUse: 1, Pinned: 1})
	m.Release(r.c)
	m.ReleasePin("a")
}

// Grants racing timeouts: whatever races, the pool ends consistent, with
// no slot or connection lost.
func TestAcquireWithPinGrantRacingTimeout(t *testing.T) {
	m, f := start(t, setup{server: srv(10), apps: []AppConfig{app("a", 1, 1, time.Millisecond)}})
	raceGrants(t, ErrWaitTimeout, func() (func(), error) {
		c, err := m.AcquireWithPin(context.Background(), "a", "db", nil)
		if errors.Is(err, ErrPinTimeout) {
			err = ErrWaitTimeout // either is a timeout here
		}
		return func() { m.Release(c); m.ReleasePin("a") }, err
	})
	expectStats(t, m, "a", Stats{Open: 1, Idle: 1})
	if f.openCount("a") != 1 {
		t.Fatalf("fake server open = %d", f.openCount("a"))
	}
}

// Sessions on a small budget where slots and connections are both scarce
// run random mixes of plain transactions, pins taken inside transactions
// (AcquirePin while holding the connection) and pins taken outside
// (AcquireWithPin), every pin ending after a few steps: no wait may time
// out, no budget may be exceeded, and no connection may be handed to two
// holders.
func TestPinAndConnectionWaitsNeverCycle(t *testing.T) {
	const (
		conns, pins = 3, 2
		sessions    = 10
		steps       = 150
	)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	m, f := start(t, setup{server: srv(10), apps: []AppConfig{app("a", conns, pins, 10*time.Second)}})
	ctx := context.Background()
	var owners sync.Map // *Conn -> session
	take := func(id int, c *Conn) {
		if prev, dup := owners.LoadOrStore(c, id); dup {
			t.Errorf("session %d got a connection session %v holds", id, prev)
		}
	}
	give := func(c *Conn) { owners.Delete(c) }
	pause := func(rng *rand.Rand) { time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond) }

	var wg sync.WaitGroup
	for id := 0; id < sessions; id++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(id)))
			var c *Conn
			slot := false   // holds a pin slot
			pinnedFor := 0  // steps left pinned, holding c and the slot
			let := func() { // the session's connection and slot go back
				if slot {
					m.ReleasePin("a")
				}
				if c != nil {
					give(c)
					m.Release(c)
				}
				c, slot, pinnedFor = nil, false, 0
			}
			defer let()
			for step := 0; step < steps && !t.Failed(); step++ {
				if pinnedFor > 0 {
					pause(rng)
					if pinnedFor--; pinnedFor == 0 {
						let()
					}
					continue
				}
				var err error
				if rng.IntN(10) < 5 { // a transaction, maybe pinning inside it
					if c, err = m.Acquire(ctx, "a", "db"); err != nil {
						t.Errorf("session %d step %d: Acquire: %v", id, step, err)
						return
					}
					take(id, c)
					pause(rng)
					if rng.IntN(3) == 0 {
						if err := m.AcquirePin(ctx, "a"); err != nil {
							t.Errorf("session %d step %d: AcquirePin holding a connection: %v", id, step, err)
							return
						}
						slot = true
						pause(rng)
					}
				} else { // a pinning statement outside a transaction
					if c, err = m.AcquireWithPin(ctx, "a", "db", nil); err != nil {
						t.Errorf("session %d step %d: AcquireWithPin: %v", id, step, err)
						return
					}
					take(id, c)
					slot = true
					pause(rng)
				}
				if st := m.Stats("a"); st.Pinned > pins || st.Open > conns {
					t.Errorf("stats %+v exceed the budget (%d connections, %d pins)", st, conns, pins)
				}
				if slot {
					pinnedFor = rng.IntN(4) // what it pinned may outlive the statement for a few steps
				}
				if pinnedFor == 0 { // the probe found nothing held, or nothing was pinned
					let()
				}
			}
		}()
	}
	wg.Wait()
	st := m.Stats("a")
	if st.Pinned != 0 || st.InUse != 0 || st.Waiting != 0 || st.PinWaiting != 0 {
		t.Fatalf("at the end: %+v, want nothing pinned, in use or waiting", st)
	}
	f.checkViolations(t)
}
