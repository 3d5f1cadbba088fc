package proxy

import (
	"fmt"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockpool/lockpool/internal/evloop"
	"github.com/lockpool/lockpool/internal/pgerr"
)

// loginsPerCPU sizes the login pipeline: at most this many logins per CPU
// (GOMAXPROCS when the server is made) are in progress at once. A login in
// progress mostly waits for its client (a SCRAM client computes 4,096
// PBKDF2 rounds between two messages): lockpool's part is tens of
// microseconds of CPU, so the bound is wide enough that a login never waits
// for a place while the CPU has time, and narrow enough that a storm of
// thousands of connections holds a few hundred coroutines, not thousands.
const loginsPerCPU = 32

// minLoginsInProgress is the pipeline's width on the smallest machine.
const minLoginsInProgress = 64

// loginWidth is the number of logins in progress at once on a machine
// running gomaxprocs threads of Go code.
func loginWidth(gomaxprocs int) int {
	return max(minLoginsInProgress, loginsPerCPU*gomaxprocs)
}

// maxLoginsWaiting bounds the queue of connections waiting to start their
// login: one more is refused at once (53300). max_client_connections bounds
// the clients logged in; a queue as long again is the most a storm leaves
// waiting.
func maxLoginsWaiting(maxClients int) int { return max(1000, maxClients) }

// loginGate is the login pipeline: a connection accepted while width logins
// are in progress waits in a FIFO queue (holding its socket and a few bytes,
// no coroutine, no buffer) until one ends. client_login_timeout runs from the
// accept, so it covers the wait: a connection still waiting when it passes is
// refused with 53300 and closed, by a timer armed for the queue's head.
// Logins run on the event loops (pendingLogin.run), the refusals on the timer's
// goroutine or the goroutine that ended a login.
type loginGate struct {
	width int

	mu      sync.Mutex
	running int
	queue   []*pendingLogin // FIFO; queue[head:] are waiting
	head    int
	timer   *time.Timer  // fires at the head's deadline
	closed  *pgerr.Error // set by close: every later arrival is refused with it

	// Metrics (the lockpool_login* series of docs/metrics.md).
	inProgress prometheus.Gauge
	waiting    prometheus.Gauge
	seconds    prometheus.Histogram
	refused    *prometheus.CounterVec // by reason: timeout, queue_full, shutdown
}

// pendingLogin is an accepted connection on its way through the pipeline.
type pendingLogin struct {
	conn     net.Conn
	at       time.Time // accepted
	deadline time.Time // at + client_login_timeout (zero: none)
	run      func()    // starts the login of a connection that waited (from any goroutine)
	refused  func()    // called after the gate refused the connection and closed it (may be nil)
}

func newLoginGate(width int, reg prometheus.Registerer) *loginGate {
	g := &loginGate{
		width: width,
		inProgress: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lockpool_logins_in_progress", Help: "Client logins in progress: from the start of the startup exchange to the first ReadyForQuery or the refusal.",
		}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lockpool_logins_waiting", Help: "Accepted client connections waiting for a place in the login pipeline.",
		}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockpool_login_seconds",
			Help:    "Time from a client's accept to the end of its successful login (ReadyForQuery sent), its wait in the login queue included.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockpool_login_queue_refused_total", Help: "Connections refused by the login pipeline before their login started: timeout (waited client_login_timeout), queue_full, shutdown.",
		}, []string{"reason"}),
	}
	for _, r := range []string{"timeout", "queue_full", "shutdown"} {
		g.refused.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(g.inProgress, g.waiting, g.seconds, g.refused)
	}
	return g
}

// defaultLoginWidth is the pipeline's width for this process.
func defaultLoginWidth() int { return loginWidth(runtime.GOMAXPROCS(0)) }

// tryStart takes a place in the pipeline when one is free and no
// connection waits for one (the common case: nothing to allocate for a
// connection that starts at once); false, the caller goes through arrive.
func (g *loginGate) tryStart() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed != nil || g.running >= g.width || g.head < len(g.queue) {
		return false
	}
	g.running++
	g.inProgress.Inc()
	return true
}

// arrive admits p: it reports true when the pipeline has room (the caller
// starts the login now, without p.run), else p waits in the queue for
// p.run (or is refused at once when the queue is full or the gate closed).
// maxWaiting bounds the queue.
func (g *loginGate) arrive(p *pendingLogin, maxWaiting int) (startNow bool) {
	g.mu.Lock()
	if err := g.closed; err != nil {
		g.mu.Unlock()
		g.refuse(p, "shutdown", err)
		return false
	}
	if g.running < g.width {
		g.running++
		g.inProgress.Inc()
		g.mu.Unlock()
		return true
	}
	if len(g.queue)-g.head >= maxWaiting {
		g.mu.Unlock()
		g.refuse(p, "queue_full", &pgerr.Error{Severity: "FATAL", Code: "53300",
			Message: fmt.Sprintf("lockpool: too many connections waiting to log in (%d)", maxWaiting),
			Hint:    "lockpool is logging in other clients; retry in a moment."})
		return false
	}
	g.queue = append(g.queue, p)
	g.waiting.Inc()
	if len(g.queue)-g.head == 1 {
		g.armLocked()
	}
	g.mu.Unlock()
	return false
}

// done ends a login in progress: the next waiting connection whose time
// has not run out takes its place.
func (g *loginGate) done() {
	g.mu.Lock()
	expired := g.expireLocked(time.Now())
	var next *pendingLogin
	if g.head < len(g.queue) {
		next = g.popLocked()
		g.armLocked()
	} else {
		g.running--
		g.inProgress.Dec()
	}
	g.mu.Unlock()
	g.refuseExpired(expired)
	if next != nil {
		next.run()
	}
}

// enter and leave count a login that runs outside the pipeline (accepted
// on a goroutine: a listener the event loops do not take) in the
// logins-in-progress gauge.
func (g *loginGate) enter() { g.inProgress.Inc() }
func (g *loginGate) leave() { g.inProgress.Dec() }

// popLocked takes the queue's head.
func (g *loginGate) popLocked() *pendingLogin {
	p := g.queue[g.head]
	g.queue[g.head] = nil
	g.head++
	g.waiting.Dec()
	if g.head == len(g.queue) {
		g.queue, g.head = g.queue[:0], 0
	} else if g.head >= 1024 && g.head*2 >= len(g.queue) {
		n := copy(g.queue, g.queue[g.head:])
		clear(g.queue[n:])
		g.queue, g.head = g.queue[:n], 0
	}
	return p
}

// expireLocked takes the waiting connections whose deadline passed at now
// off the queue's head (deadlines grow along the queue but for a reload
// that shortened client_login_timeout: those are taken when they reach the
// head).
func (g *loginGate) expireLocked(now time.Time) []*pendingLogin {
	var out []*pendingLogin
	for g.head < len(g.queue) {
		p := g.queue[g.head]
		if p.deadline.IsZero() || now.Before(p.deadline) {
			break
		}
		out = append(out, g.popLocked())
	}
	return out
}

// armLocked sets the timer for the head's deadline.
func (g *loginGate) armLocked() {
	if g.head >= len(g.queue) {
		return
	}
	dl := g.queue[g.head].deadline
	if dl.IsZero() {
		return
	}
	d := time.Until(dl)
	if g.timer == nil {
		g.timer = time.AfterFunc(d, g.expire)
		return
	}
	g.timer.Reset(d)
}

// expire is the timer: it refuses the waiting connections whose time ran
// out and re-arms for the new head.
func (g *loginGate) expire() {
	g.mu.Lock()
	expired := g.expireLocked(time.Now())
	g.armLocked()
	g.mu.Unlock()
	g.refuseExpired(expired)
}

func (g *loginGate) refuseExpired(ps []*pendingLogin) {
	for _, p := range ps {
		g.refuse(p, "timeout", &pgerr.Error{Severity: "FATAL", Code: "53300",
			Message: fmt.Sprintf("lockpool: too many logins in progress: this connection waited %s (client_login_timeout) for its turn",
				p.deadline.Sub(p.at).Round(time.Millisecond)),
			Hint: "lockpool was busy logging in other clients; retry, or spread the connections over time."})
	}
}

// refuse sends p its error, closes it and tells p.refused.
func (g *loginGate) refuse(p *pendingLogin, reason string, pe *pgerr.Error) {
	g.refused.WithLabelValues(reason).Inc()
	// A fresh socket's send buffer takes a few hundred bytes without
	// blocking; the connection is not the loop's yet.
	_, _ = p.conn.Write(pe.AppendTo(nil, 'E'))
	_ = p.conn.Close()
	if p.refused != nil {
		p.refused()
	}
}

// close refuses every waiting connection and every later arrival with err
// (shutdown); logins in progress go on.
func (g *loginGate) close(err *pgerr.Error) {
	g.mu.Lock()
	if g.closed != nil {
		g.mu.Unlock()
		return
	}
	g.closed = err
	var waiting []*pendingLogin
	for g.head < len(g.queue) {
		waiting = append(waiting, g.popLocked())
	}
	if g.timer != nil {
		g.timer.Stop()
	}
	g.mu.Unlock()
	for _, p := range waiting {
		g.refuse(p, "shutdown", err)
	}
}

// loginSet holds the coroutines running a login on an event loop
// (serveLogin, between add and remove), so that a shutdown can end their
// logins (end) instead of waiting for each until client_login_timeout.
// add and remove run on the coroutine's loop; end on any goroutine.
type loginSet struct {
	mu    sync.Mutex
	cos   map[*evloop.Co]struct{}
	ended *pgerr.Error // set by end: a login added later ends at once
}

// add records that co runs a login. After end, co's next wait for its
// client returns end's error.
func (ls *loginSet) add(co *evloop.Co) {
	ls.mu.Lock()
	if ls.cos == nil {
		ls.cos = make(map[*evloop.Co]struct{})
	}
	ls.cos[co] = struct{}{}
	ended := ls.ended
	ls.mu.Unlock()
	if ended != nil {
		co.Interrupt(ended) // on co itself: its next wait returns it
	}
}

// remove records that co's login ended.
func (ls *loginSet) remove(co *evloop.Co) {
	ls.mu.Lock()
	delete(ls.cos, co)
	ls.mu.Unlock()
}

// running reports how many logins run.
func (ls *loginSet) running() int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return len(ls.cos)
}

// end makes each running login's next wait for its client (and every
// later login's) return pe, which the client gets as its FATAL. The
// interrupt runs on the login's loop, and only if that coroutine is still
// logging in (not yet serving its session).
func (ls *loginSet) end(pe *pgerr.Error) {
	ls.mu.Lock()
	ls.ended = pe
	cos := make([]*evloop.Co, 0, len(ls.cos))
	for co := range ls.cos {
		cos = append(cos, co)
	}
	ls.mu.Unlock()
	for _, co := range cos {
		co.Loop().Post(func() {
			ls.mu.Lock()
			_, still := ls.cos[co]
			ls.mu.Unlock()
			if still {
				co.Interrupt(pe)
			}
		})
	}
}
