package proxy

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/lockpool/lockpool/internal/pgerr"
)

// gateConn is one end of a pipe given to the gate, and what the client end
// read from it.
type gateConn struct {
	server net.Conn
	got    chan string // everything the client end read, at its close
}

func newGateConn(t *testing.T) *gateConn {
	t.Helper()
	srv, cli := net.Pipe()
	g := &gateConn{server: srv, got: make(chan string, 1)}
	go func() {
		b, _ := io.ReadAll(cli)
		g.got <- string(b)
	}()
	t.Cleanup(func() { _ = srv.Close(); _ = cli.Close() })
	return g
}

// pending makes a pendingLogin for c that counts its start in started and
// its refusal in refused.
func (c *gateConn) pending(timeout time.Duration, started, refused chan *gateConn) *pendingLogin {
	now := time.Now()
	p := &pendingLogin{conn: c.server, at: now}
	if timeout > 0 {
		p.deadline = now.Add(timeout)
	}
	p.run = func() { started <- c }
	p.refused = func() { refused <- c }
	return p
}

// metricValue is a gauge's or a counter's value.
func metricValue(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Gauge != nil {
		return d.Gauge.GetValue()
	}
	return d.Counter.GetValue()
}

// arrive is g.arrive, with the start the caller makes when there is room
// done through p.run, as for a connection that waited.
func arrive(g *loginGate, p *pendingLogin, maxWaiting int) {
	if g.arrive(p, maxWaiting) {
		p.run()
	}
}

func TestLoginWidth(t *testing.T) {
	for _, c := range []struct{ procs, want int }{{1, 64}, {2, 64}, {3, 96}, {16, 512}} {
		if got := loginWidth(c.procs); got != c.want {
			t.Errorf("loginWidth(%d) = %d, want %d", c.procs, got, c.want)
		}
	}
	if maxLoginsWaiting(10) != 1000 || maxLoginsWaiting(10000) != 10000 {
		t.Errorf("maxLoginsWaiting: %d, %d", maxLoginsWaiting(10), maxLoginsWaiting(10000))
	}
}

// A gate of width 2: two logins start at once, the next ones wait in
// order, each done starts the next, and the gauges follow.
func TestLoginGateQueuesInOrder(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := newLoginGate(2, reg)
	started, refused := make(chan *gateConn, 10), make(chan *gateConn, 10)
	var cs []*gateConn
	for i := 0; i < 5; i++ {
		c := newGateConn(t)
		cs = append(cs, c)
		arrive(g, c.pending(time.Minute, started, refused), 100)
	}
	for i := 0; i < 2; i++ {
		if got := <-started; got != cs[i] {
			t.Fatalf("start %d: not the connection that came %d", i, i)
		}
	}
	select {
	case <-started:
		t.Fatal("a third login started while two were in progress")
	default:
	}
	if v := metricValue(g.inProgress); v != 2 {
		t.Errorf("in progress = %v, want 2", v)
	}
	if v := metricValue(g.waiting); v != 3 {
		t.Errorf("waiting = %v, want 3", v)
	}
	for i := 2; i < 5; i++ {
		g.done()
		if got := <-started; got != cs[i] {
			t.Fatalf("start %d: not the connection that came %d (FIFO)", i, i)
		}
	}
	g.done()
	g.done()
	if v := metricValue(g.inProgress); v != 0 {
		t.Errorf("in progress after all done = %v, want 0", v)
	}
	if v := metricValue(g.waiting); v != 0 {
		t.Errorf("waiting after all done = %v, want 0", v)
	}
	if len(refused) != 0 {
		t.Errorf("%d refused, want none", len(refused))
	}
}

// A connection that waits longer than its client_login_timeout is refused
// with 53300 by the gate's timer, even when no login ends meanwhile, and
// the one behind it keeps its place.
func TestLoginGateWaitTimesOut(t *testing.T) {
	g := newLoginGate(1, nil)
	started, refused := make(chan *gateConn, 10), make(chan *gateConn, 10)
	first, second, third := newGateConn(t), newGateConn(t), newGateConn(t)
	arrive(g, first.pending(time.Minute, started, refused), 100)
	<-started
	t0 := time.Now()
	arrive(g, second.pending(100*time.Millisecond, started, refused), 100)
	arrive(g, third.pending(time.Minute, started, refused), 100)
	select {
	case c := <-refused:
		if c != second {
			t.Fatal("refused the wrong connection")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting connection was not refused after its timeout")
	}
	if d := time.Since(t0); d < 90*time.Millisecond || d > 3*time.Second {
		t.Errorf("refused after %v, want about 100ms", d)
	}
	msg := <-second.got
	if !strings.Contains(msg, "53300") || !strings.Contains(msg, "lockpool: too many logins in progress") ||
		!strings.Contains(msg, "client_login_timeout") || !strings.Contains(msg, "FATAL") {
		t.Errorf("refusal = %q, want a FATAL 53300 naming client_login_timeout", msg)
	}
	if v := metricValue(g.refused.WithLabelValues("timeout")); v != 1 {
		t.Errorf("refused{timeout} = %v, want 1", v)
	}
	g.done() // the first ends: the third starts
	select {
	case c := <-started:
		if c != third {
			t.Fatal("started the wrong connection")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the third connection did not start")
	}
	g.done()
}

// A connection whose time ran out while it waited is refused, not started,
// when a login ends.
func TestLoginGateSkipsExpiredOnDone(t *testing.T) {
	g := newLoginGate(1, nil)
	started, refused := make(chan *gateConn, 10), make(chan *gateConn, 10)
	first, late, next := newGateConn(t), newGateConn(t), newGateConn(t)
	arrive(g, first.pending(time.Minute, started, refused), 100)
	<-started
	p := late.pending(time.Minute, started, refused)
	p.deadline = time.Now().Add(-time.Millisecond) // already past (as after a reload that shortened it)
	g.mu.Lock()
	g.queue = append(g.queue, p)
	g.waiting.Inc()
	g.mu.Unlock()
	arrive(g, next.pending(time.Minute, started, refused), 100)
	g.done()
	if c := <-refused; c != late {
		t.Fatal("refused the wrong connection")
	}
	if c := <-started; c != next {
		t.Fatal("started the wrong connection")
	}
	g.done()
}

// A full queue refuses at once; close refuses what waits and what comes
// later with its error, and logins in progress are left alone.
func TestLoginGateFullAndClose(t *testing.T) {
	g := newLoginGate(1, nil)
	started, refused := make(chan *gateConn, 10), make(chan *gateConn, 10)
	running, waiting, over := newGateConn(t), newGateConn(t), newGateConn(t)
	arrive(g, running.pending(time.Minute, started, refused), 1)
	<-started
	arrive(g, waiting.pending(time.Minute, started, refused), 1)
	arrive(g, over.pending(time.Minute, started, refused), 1)
	if c := <-refused; c != over {
		t.Fatal("the full queue refused the wrong connection")
	}
	if msg := <-over.got; !strings.Contains(msg, "53300") || !strings.Contains(msg, "too many connections waiting to log in") {
		t.Errorf("queue full: %q", msg)
	}
	g.close(pgerr.Shutdown())
	if c := <-refused; c != waiting {
		t.Fatal("close refused the wrong connection")
	}
	if msg := <-waiting.got; !strings.Contains(msg, "57P01") {
		t.Errorf("close: %q, want 57P01", msg)
	}
	late := newGateConn(t)
	arrive(g, late.pending(time.Minute, started, refused), 1)
	if c := <-refused; c != late {
		t.Fatal("an arrival after close was not refused")
	}
	g.done() // the login that was in progress ends normally
	if len(started) != 0 {
		t.Error("a login started after close")
	}
	for _, r := range []string{"queue_full", "shutdown"} {
		want := map[string]float64{"queue_full": 1, "shutdown": 2}[r]
		if v := metricValue(g.refused.WithLabelValues(r)); v != want {
			t.Errorf("refused{%s} = %v, want %v", r, v, want)
		}
	}
}

// Many goroutines arriving and finishing at once: every connection is
// started exactly once or refused, never more than width run together.
func TestLoginGateConcurrent(t *testing.T) {
	const width, n = 4, 400
	g := newLoginGate(width, nil)
	var mu sync.Mutex
	running, peak, starts := 0, 0, 0
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			srv, cli := net.Pipe()
			go func() { _, _ = io.Copy(io.Discard, cli) }()
			p := &pendingLogin{conn: srv, at: time.Now(), deadline: time.Now().Add(time.Minute)}
			p.refused = func() { wg.Done() }
			p.run = func() {
				mu.Lock()
				running++
				starts++
				peak = max(peak, running)
				mu.Unlock()
				go func() {
					time.Sleep(time.Millisecond)
					mu.Lock()
					running--
					mu.Unlock()
					_ = srv.Close()
					g.done()
					wg.Done()
				}()
			}
			arrive(g, p, n)
		}()
	}
	wg.Wait()
	if starts != n {
		t.Errorf("%d started, want %d", starts, n)
	}
	if peak > width {
		t.Errorf("%d logins ran at once, want at most %d", peak, width)
	}
	if v := metricValue(g.inProgress); v != 0 {
		t.Errorf("in progress at the end = %v", v)
	}
}

// tryStart takes a free place only while nobody waits, and never more
// than the width.
func TestLoginGateTryStart(t *testing.T) {
	g := newLoginGate(2, nil)
	for i := 0; i < 2; i++ {
		if !g.tryStart() {
			t.Fatalf("tryStart refused free place %d", i+1)
		}
	}
	if g.tryStart() {
		t.Fatal("tryStart went past the width")
	}
	started, refused := make(chan *gateConn, 10), make(chan *gateConn, 10)
	waiting := newGateConn(t)
	arrive(g, waiting.pending(time.Minute, started, refused), 10)
	g.done() // the place goes to the waiting connection
	if c := <-started; c != waiting {
		t.Fatal("the waiting connection did not start")
	}
	g.done()
	if !g.tryStart() {
		t.Fatal("tryStart refused a place freed with nobody waiting")
	}
	if v := metricValue(g.inProgress); v != 2 {
		t.Errorf("in progress = %v, want 2", v)
	}
}
