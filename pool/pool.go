package pool

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/hosts"
	"github.com/lockpool/lockpool/internal/evloop"
	"github.com/lockpool/lockpool/internal/wire"
)

// Errors returned by the Manager. Acquire and AcquirePin wrap them; test
// with errors.Is.
var (
	ErrWaitTimeout = errors.New("pool: no server connection available within wait_timeout")
	ErrPinTimeout  = errors.New("pool: no pin slot available within wait_timeout")
	ErrClosed      = errors.New("pool: closed")
	ErrUnknownApp  = errors.New("pool: unknown application")
)

// AppConfig is what the pool needs to know about one application.
type AppConfig struct {
	Name           string
	User, Password string // server login (password may be "" for trust servers)
	// SCRAM, when Password is empty, returns keys for SCRAM pass-through
	// (known once a client of this user logged in with SCRAM).
	SCRAM          func() (SCRAMKeys, bool)
	MaxConnections int
	MaxPinned      int
	WaitTimeout    time.Duration // <= 0: wait only as long as the context allows
	Target         hosts.Target  // where its connections go (with Options.Hosts)
}

// Options configure a Manager.
type Options struct {
	Server     config.Server
	Apps       []AppConfig
	Logger     *slog.Logger          // nil: discard
	Registerer prometheus.Registerer // nil: no metrics registered
	// Dial overrides how a server connection is made (tests); nil uses pgconn.
	// The returned Conn needs Net (and PID/SecretKey/StartupParams as
	// available); Reader, App, Database and User are filled in when
	// left empty.
	Dial func(ctx context.Context, app AppConfig, database string) (*Conn, error)
	// Hosts, when set, chooses the host of every dial and says which
	// connections may still be used (route.go); nil dials Server's host.
	Hosts *hosts.Monitor

	// unexported knobs for tests
	now             func() time.Time
	janitorInterval time.Duration
}

// ClosedInfo describes a connection closed by SweepIdle.
type ClosedInfo struct {
	App, Database, LastClient string
	PID                       uint32
}

// Stats is a snapshot of one application's pool.
type Stats struct {
	Open       int // idle + in use + dialing + being checked/closed
	Idle       int
	InUse      int // handed out to holders
	Waiting    int // Acquire calls queued, and AcquireWithPin calls while a pin slot is free (they wait for a connection only)
	Pinned     int // pin slots held
	PinWaiting int // AcquirePin and AcquireWithPin calls queued
	Dialing    int // slots reserved by dials in progress (part of Open)
}

type paramsKey struct{ database, user string }

// Manager owns the server connections of all applications.
type Manager struct {
	mu       sync.Mutex
	server   config.Server
	srvGen   uint64
	apps     map[string]*appPool
	lastApp  *appPool   // the one AcquireIdle found last (an entry of apps)
	appList  []*appPool // every appPool ever created (removed ones stay, drained)
	open     int        // instance-wide open count (same accounting as appPool.open)
	waiting  int        // queued Acquire and AcquireWithPin waiters over all apps
	seq      uint64     // waiter age
	closed   bool
	params   map[paramsKey]map[string]string
	headsBuf []*waiter
	spareW   []*waiter  // parked waiters done with, for the next AcquireParked (so a wait allocates nothing)
	pause    pauseState // PAUSE / RESUME (pause.go)

	limits map[string]limit                                                        // run-time budget caps (limit.go)
	onDial atomic.Pointer[func(ctx context.Context, app string, pid uint32) error] // OnDial's hook (limit.go)
	gate   atomic.Pointer[func(app string) (time.Time, error)]                     // DialGate's hook (limit.go)

	dial    func(ctx context.Context, srv config.Server, app AppConfig, database string) (*Conn, error)
	hosts   *hosts.Monitor     // nil: one host (route.go)
	live    map[*Conn]struct{} // with hosts: every dialed conn until its socket is closed
	reach   reachability
	loss    lossLog // server connections lost, logged per burst (loss.go)
	log     *slog.Logger
	metrics *metrics
	now     func() time.Time

	stopJanitor chan struct{}
	janitorDone chan struct{}
	closeOnce   sync.Once

	dialSem chan struct{}    // server.dial_concurrency tokens
	bufs    *wire.BufferPool // the read buffers of the server connections' Readers
}

type appPool struct {
	name    string
	cfg     AppConfig
	target  atomic.Pointer[hosts.Target] // cfg.Target, for reads without the lock (route.go)
	gen     uint64                       // bumped when the login (user/password) changes
	removed bool

	open     int // idle + inUse + dialing + checking + closing
	idleN    int
	inUse    int
	dialing  int
	checking int
	closing  int
	idle     map[string]*idleStack // by database; most recently used on top
	lastIdle *idleStack            // the stack popIdle or pushIdle used last (most applications use one database); in idle

	waiters      waitQueue
	pauseWaiters waitQueue // Acquire calls waiting for RESUME (pause.go)
	pinHeld      int
	pinWaiters   waitQueue // AcquirePin: a pin slot only (the caller holds a connection)
	bothWaiters  waitQueue // AcquireWithPin: a pin slot and a connection together (the caller holds neither)

	am appMetrics
	// Every Acquire's wait, for the admin console's SHOW STATS (snapshot.go).
	waitCount, waitNanos atomic.Int64
	// immediate counts AcquireIdle's grants (waits of zero), under the
	// manager's lock: no atomic operation on the hot path. WaitTotals and
	// the wait histogram add them in when read.
	immediate int64
}

type idleStack struct {
	db    string
	conns []*Conn
}

// grant is what a waiter receives.
type grant struct {
	c      *Conn // a conn handed over (state in use, counted in inUse)
	pin    bool  // a pin slot comes with it (counted in pinHeld): an AcquireWithPin grant
	dial   bool  // a slot was reserved for this waiter (counted in open and dialing)
	victim *Conn // with dial: a conn to close before dialing (its slot is the reserved one)
	// victimCounted: the victim belongs to another application and stays
	// counted there (stateClosing) until closed; its instance slot moves
	// to the dialer. Otherwise the victim's slot was transferred whole.
	victimCounted bool
	err           error
}

type waiter struct {
	seq        uint64
	app        *appPool
	db         string
	ch         chan grant // buffered 1; sent under the lock when dequeued
	parker     Parker     // when not nil, woken (Unpark) after the send
	prev, next *waiter
	queued     bool
	since      time.Time // when it started waiting (SHOW POOLS' maxwait)
	// pin: an AcquireWithPin waiter (in bothWaiters): its grant takes a
	// pin slot too. slotFree is when a pin slot was first seen free for
	// it while it had to wait for a connection (zero: not yet): its wait
	// for a connection counts from then.
	pin      bool
	slotFree time.Time
}

type waitQueue struct {
	head, tail *waiter
	n          int
}

func (q *waitQueue) push(w *waiter) {
	w.prev, w.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
	w.queued = true
	q.n++
}

func (q *waitQueue) remove(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next = nil, nil
	w.queued = false
	q.n--
}

// New creates a Manager and starts its janitor. Close stops it.
func New(opts Options) (*Manager, error) {
	if err := checkServer(opts.Server); err != nil {
		return nil, err
	}
	m := &Manager{
		server:      opts.Server,
		apps:        make(map[string]*appPool, len(opts.Apps)),
		params:      make(map[paramsKey]map[string]string),
		log:         opts.Logger,
		now:         opts.now,
		stopJanitor: make(chan struct{}),
		janitorDone: make(chan struct{}),
		dialSem:     make(chan struct{}, max(opts.Server.DialConcurrency, 1)),
		bufs:        wire.NewBufferPool(readerSize),
		hosts:       opts.Hosts,
		live:        map[*Conn]struct{}{},
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.now == nil {
		m.now = time.Now
	}
	if opts.Dial != nil {
		d := opts.Dial
		m.dial = func(ctx context.Context, _ config.Server, app AppConfig, database string) (*Conn, error) {
			return d(ctx, app, database)
		}
	} else {
		m.dial = pgDial
	}
	seen := make(map[string]bool, len(opts.Apps))
	for _, a := range opts.Apps {
		if err := checkApp(a); err != nil {
			return nil, err
		}
		if seen[a.Name] {
			return nil, fmt.Errorf("pool: application %q listed twice", a.Name)
		}
		seen[a.Name] = true
	}
	if opts.Registerer != nil {
		mt, err := newMetrics(opts.Registerer, m)
		if err != nil {
			return nil, err
		}
		m.metrics = mt
	}
	for _, a := range opts.Apps {
		m.addAppLocked(a)
	}
	interval := opts.janitorInterval
	if interval <= 0 {
		interval = time.Second
	}
	go m.janitor(interval)
	return m, nil
}

func checkServer(s config.Server) error {
	if s.MaxConnections <= 0 {
		return fmt.Errorf("pool: server max_connections must be positive, got %d", s.MaxConnections)
	}
	return nil
}

func checkApp(a AppConfig) error {
	if a.Name == "" {
		return errors.New("pool: application without a name")
	}
	if a.MaxConnections <= 0 {
		return fmt.Errorf("pool: application %q: max_connections must be positive, got %d", a.Name, a.MaxConnections)
	}
	if a.MaxPinned < 0 {
		return fmt.Errorf("pool: application %q: max_pinned must not be negative", a.Name)
	}
	return nil
}

func (m *Manager) addAppLocked(cfg AppConfig) *appPool {
	a := &appPool{
		name: cfg.Name,
		cfg:  cfg,
		idle: make(map[string]*idleStack),
	}
	a.target.Store(&cfg.Target)
	if m.metrics != nil {
		a.am = m.metrics.forApp(cfg.Name)
	}
	m.apps[cfg.Name] = a
	m.lastApp = nil // it may be the one a replaces
	m.appList = append(m.appList, a)
	m.applyLimitLocked(a, true)
	return a
}

// ---------------------------------------------------------------- Acquire

// Acquire returns an idle server connection for (app, database) or opens
// one, waiting FIFO up to the app's WaitTimeout (or ctx). On timeout the
// error wraps ErrWaitTimeout; on cancellation it wraps ctx.Err(). A dial
// failure is returned wrapped (a *pgconn.PgError stays reachable with
// errors.As) and its slot is freed. Dial time is bounded by ctx and
// server.connect_timeout, not by WaitTimeout.
func (m *Manager) Acquire(ctx context.Context, app, database string) (*Conn, error) {
	return m.AcquireParked(ctx, app, database, nil)
}

// Parker lets Acquire wait without blocking a thread: an event loop's
// coroutine parks in its loop and is unparked when a connection is granted.
type Parker interface {
	// Park suspends the caller until Unpark, the deadline (zero: none) or
	// an interruption (an error); it may also return nil spuriously.
	Park(deadline time.Time) error
	// Unpark ends a Park, from any goroutine. It must not block: the pool
	// calls it under its lock.
	Unpark()
	// Offload runs fn (a dial) where it may block.
	Offload(fn func())
}

// A CancelParker is a Parker that ends its Park by itself when the context
// its caller passes to AcquireParked ends (WakesOnCancel true), so the pool
// does not watch that context (a context.AfterFunc per wait).
type CancelParker interface {
	Parker
	WakesOnCancel() bool
}

// AcquireParked is Acquire for a caller that waits through p (nil: an
// ordinary blocking wait). A dial runs through p.Offload.
func (m *Manager) AcquireParked(ctx context.Context, app, database string, p Parker) (*Conn, error) {
	var waited time.Duration
	if m.pause.on.Load() {
		var err error
		if waited, err = m.waitResumedVia(ctx, app, database, p); err != nil {
			return nil, err
		}
	}
	for {
		m.mu.Lock()
		a, err := m.appLocked(app)
		if err != nil {
			m.mu.Unlock()
			return nil, err
		}
		var g grant
		ok := false
		if a.connHead() == nil {
			g, ok = m.tryServeLocked(a, database)
		}
		if ok {
			m.mu.Unlock()
			a.observeWait(waited)
		} else {
			w := m.newWaiterLocked(a, database, p)
			a.waiters.push(w)
			m.waiting++
			timeout := a.cfg.WaitTimeout
			m.mu.Unlock()

			var err error
			g, err = m.wait(ctx, w, timeout)
			waited += time.Since(w.since)
			m.recycle(w)
			a.observeWait(waited)
			if err != nil {
				if errors.Is(err, ErrWaitTimeout) {
					a.am.waitTimedOut()
					err = fmt.Errorf("%w (application %q, waited %s)", ErrWaitTimeout, app, timeout)
				}
				return nil, err
			}
		}
		c, retry, err := m.useGrantVia(ctx, a, database, g, p)
		if retry {
			continue
		}
		return c, err
	}
}

// waitResumedVia waits for RESUME for a paused application's caller,
// through p.Offload (the wait is on a channel, not in the caller's loop).
// The closure is in a function of its own, as in useGrantVia: variables a
// closure captures live on the heap, and AcquireParked's common path
// allocates nothing.
func (m *Manager) waitResumedVia(ctx context.Context, app, database string, p Parker) (waited time.Duration, err error) {
	if p == nil {
		return m.waitResumed(ctx, app, database)
	}
	p.Offload(func() { waited, err = m.waitResumed(ctx, app, database) })
	return waited, err
}

// useGrantVia is useGrant, through p.Offload when the grant is a dial.
func (m *Manager) useGrantVia(ctx context.Context, a *appPool, database string, g grant, p Parker) (*Conn, bool, error) {
	if !g.dial || p == nil {
		return m.useGrant(ctx, a, database, g)
	}
	return m.useGrantOffloaded(ctx, a, database, g, p)
}

func (m *Manager) useGrantOffloaded(ctx context.Context, a *appPool, database string, g grant, p Parker) (c *Conn, retry bool, err error) {
	p.Offload(func() { c, retry, err = m.useGrant(ctx, a, database, g) })
	return c, retry, err
}

// Liveness tells whether an idle connection's socket has received nothing
// since it was last read (an idle server sends nothing: anything there is a
// FATAL or the end), without a system call where it can: an event loop
// knows what epoll reported. known false: the pool peeks at the socket.
type Liveness interface {
	Quiet(nc net.Conn) (quiet, known bool)
}

// AcquireIdle is Acquire's fast path for callers that must not block (a
// session on an event loop): an idle connection of (app, database) when one
// can be had at once, with no waiter ahead of the caller; nil otherwise (the
// caller then calls Acquire where it may wait or dial). lv, if not nil,
// checks the connection's liveness.
func (m *Manager) AcquireIdle(app, database string, lv Liveness) *Conn {
	m.mu.Lock()
	a := m.lastApp
	if a == nil || a.name != app {
		a = m.apps[app]
		m.lastApp = a
	}
	if m.closed || a == nil || a.removed || a.connHead() != nil || m.pause.on.Load() && m.pausedLocked(app) {
		m.mu.Unlock()
		return nil
	}
	c := a.popIdle(database)
	if c == nil {
		m.mu.Unlock()
		return nil
	}
	c.state = stateInUse
	a.inUse++
	a.immediate++
	m.mu.Unlock()
	if !m.usable(c) {
		m.Destroy(c)
		return nil
	}
	if !c.aliveAfterIdle(lv, m.now) {
		m.log.Debug("pool: discarding dead idle server connection", "app", a.name, "database", c.Database, "pid", c.PID)
		c.Gone = goneReason(c) // Destroy counts it (ServerLost)
		m.Destroy(c)
		return nil
	}
	c.idleSince = time.Time{}
	return c
}

// newWaiterLocked returns a queued-to-be waiter for AcquireParked: a spare
// one when there is one (its channel empty), else a new one.
func (m *Manager) newWaiterLocked(a *appPool, database string, p Parker) *waiter {
	var w *waiter
	if n := len(m.spareW); n > 0 {
		w = m.spareW[n-1]
		m.spareW[n-1] = nil
		m.spareW = m.spareW[:n-1]
	} else {
		w = &waiter{ch: make(chan grant, 1)}
	}
	w.seq, w.app, w.db, w.parker, w.since = m.nextSeq(), a, database, p, time.Now()
	return w
}

// recycle keeps w, which wait has returned (dequeued, its grant received
// or given back, its channel empty), for the next parked waiter. It clears
// w under the lock: the grant that woke it may still be reading w.parker
// under the lock after the send (grantLocked).
func (m *Manager) recycle(w *waiter) {
	m.mu.Lock()
	*w = waiter{ch: w.ch}
	if len(m.spareW) < maxSpareWaiters {
		m.spareW = append(m.spareW, w)
	}
	m.mu.Unlock()
}

// maxSpareWaiters bounds the waiters kept for reuse (one per session
// waiting at once is what a steady load needs).
const maxSpareWaiters = 1024

func (m *Manager) nextSeq() uint64 {
	m.seq++
	return m.seq
}

// wait blocks until w is granted, ctx ends or the timeout fires. On
// timeout/cancel the waiter is removed; a grant that raced in is given back.
// An AcquireWithPin waiter that times out with no pin slot free gets
// ErrPinTimeout (it waited for a slot), otherwise ErrWaitTimeout.
func (m *Manager) wait(ctx context.Context, w *waiter, timeout time.Duration) (grant, error) {
	var err error
	if w.parker != nil {
		err = m.park(ctx, w, timeout)
	} else {
		timerC, stop := timeoutChan(timeout)
		defer stop()
		select {
		case g := <-w.ch:
			return g, g.err
		case <-ctx.Done():
			err = fmt.Errorf("pool: waiting for a server connection: %w", ctx.Err())
		case <-timerC:
			err = ErrWaitTimeout
		}
	}
	if err == nil {
		g := <-w.ch // park saw it sent
		return g, g.err
	}
	m.mu.Lock()
	if w.queued {
		m.dequeueLocked(w)
		if w.pin && errors.Is(err, ErrWaitTimeout) && w.app.pinHeld >= w.app.cfg.MaxPinned {
			err = ErrPinTimeout
		}
		m.mu.Unlock()
		return grant{}, err
	}
	m.mu.Unlock()
	m.giveBack(w.app, <-w.ch) // dequeued under the lock together with the send
	return grant{}, err
}

// dequeueLocked takes a queued Acquire or AcquireWithPin waiter out of its
// queue.
func (m *Manager) dequeueLocked(w *waiter) {
	if w.pin {
		w.app.bothWaiters.remove(w)
	} else {
		w.app.waiters.remove(w)
	}
	m.waiting--
}

// park waits through w.parker until w is granted (nil), ctx ends or the
// timeout passes.
func (m *Manager) park(ctx context.Context, w *waiter, timeout time.Duration) error {
	var deadline time.Time
	if timeout > 0 {
		deadline = w.since.Add(timeout)
	}
	if cp, ok := w.parker.(CancelParker); ctx.Done() != nil && !(ok && cp.WakesOnCancel()) {
		stop := context.AfterFunc(ctx, w.parker.Unpark)
		defer stop()
	}
	for woken := false; ; woken = true {
		if len(w.ch) > 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("pool: waiting for a server connection: %w", err)
		}
		// Before the first Park the deadline is a wait_timeout away.
		if woken && !deadline.IsZero() && !time.Now().Before(deadline) {
			return ErrWaitTimeout
		}
		if err := w.parker.Park(deadline); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				continue // the deadline check above says which
			}
			return err
		}
	}
}

// giveBack returns a grant a waiter no longer wants (its pin slot too).
func (m *Manager) giveBack(a *appPool, g grant) {
	if g.pin {
		defer m.releasePinOf(a)
	}
	switch {
	case g.err != nil:
	case g.c != nil:
		m.mu.Lock()
		a.inUse--
		toClose := m.putBackLocked(g.c, true)
		m.mu.Unlock()
		m.finishClose(toClose, true)
	case g.dial:
		m.closeVictim(g)
		m.mu.Lock()
		a.dialing--
		m.unreserveLocked(a)
		m.mu.Unlock()
	}
}

// useGrant turns a grant into a usable conn: checks a handed-over idle conn,
// or closes the victim and dials. retry asks Acquire to start over (the idle
// conn was dead).
func (m *Manager) useGrant(ctx context.Context, a *appPool, database string, g grant) (c *Conn, retry bool, err error) {
	if g.c != nil {
		c = g.c
		if !m.usable(c) {
			m.Destroy(c) // its host was replaced since it went idle
			return nil, true, nil
		}
		if !c.aliveAfterIdle(nil, m.now) {
			m.log.Debug("pool: discarding dead idle server connection", "app", a.name, "database", c.Database, "pid", c.PID)
			c.Gone = goneReason(c) // Destroy counts it (ServerLost)
			m.Destroy(c)
			return nil, true, nil
		}
		c.idleSince = time.Time{}
		return c, false, nil
	}
	m.closeVictim(g)
	return m.dialReserved(ctx, a, database)
}

// closeVictim closes the conn evicted for a dial grant, before the dial.
func (m *Manager) closeVictim(g grant) {
	switch {
	case g.victim == nil:
	case g.victimCounted:
		m.finishClose([]*Conn{g.victim}, true)
	default:
		g.victim.closeSocket(true)
	}
}

// tryServeLocked serves (a, database) without waiting if possible: an idle
// conn of that database, else a free slot, else a slot made by evicting an
// idle conn (same application other database when the application is full;
// any application when only the instance is full).
func (m *Manager) tryServeLocked(a *appPool, database string) (grant, bool) {
	if c := a.popIdle(database); c != nil {
		c.state = stateInUse
		a.inUse++
		return grant{c: c}, true
	}
	appFull := a.open >= a.cfg.MaxConnections
	instFull := m.open >= m.server.MaxConnections
	switch {
	case !appFull && !instFull:
		a.open++
		a.dialing++
		m.open++
		return grant{dial: true}, true
	case appFull:
		// Evict one of our own idle conns (another database): its slot is
		// both the application's and the instance's.
		if a.open > a.cfg.MaxConnections || m.open > m.server.MaxConnections || a.idleN == 0 {
			return grant{}, false
		}
		v := a.popOldestIdle()
		v.state = stateClosed
		delete(m.live, v)
		a.dialing++ // slot transferred: open counts unchanged
		return grant{dial: true, victim: v}, true
	default:
		// Application has room, instance is full: evict the least recently
		// used idle conn anywhere.
		if m.open > m.server.MaxConnections {
			return grant{}, false
		}
		va := m.oldestIdleAppLocked()
		if va == nil {
			return grant{}, false
		}
		v := va.popOldestIdle()
		m.closeConnLocked(v)
		v.keepInstSlot = true // its instance slot moves to a's dial
		a.open++
		a.dialing++
		return grant{dial: true, victim: v, victimCounted: true}, true
	}
}

// dialRetrying dials with at most server.dial_concurrency dials at once,
// and retries a dial that failed for a connection error, a timeout, 53300
// (too many connections) or 57P03 (starting up) until the application's
// wait_timeout has passed since the first attempt: a burst of clients, or
// PostgreSQL restarting, costs the waiting client time, not an error. The
// wait for a dial slot ends at the same deadline (dialSlot), so a client
// waits at most wait_timeout plus one connect_timeout.
func (m *Manager) dialRetrying(ctx context.Context, srv config.Server, cfg AppConfig, database string) (*Conn, hosts.Endpoint, error) {
	deadline := m.now().Add(cfg.WaitTimeout)
	backoff := 50 * time.Millisecond
	var lastErr error // the last failed attempt's
	for {
		at, ep, err := m.routeDial(ctx, srv, cfg, deadline) // route.go
		if err != nil {
			return nil, ep, err
		}
		if err := m.dialSlot(ctx, deadline); err != nil {
			if lastErr != nil && errors.Is(err, errDialSlotTimeout) {
				err = lastErr
			}
			return nil, ep, err
		}
		if ep.Host != nil {
			// The turn may have come late: each dial ahead of this one can
			// take connect_timeout (a host that stopped answering), and
			// the host chosen before the wait may be down or replaced now.
			now, ok := m.hosts.Pick(cfg.Target)
			if !ok {
				<-m.dialSem
				continue // routeDial waits for a host, within the deadline
			}
			at, ep = srv.At(now.Addr()), now
		}
		c, err := m.gatedDial(ctx, at, cfg, database) // limit.go
		<-m.dialSem
		if err == nil && ep.Host != nil {
			if err = m.checkRole(c, ep, cfg.Target); err != nil {
				c.closeSocket(false)
				c = nil
			}
		} else if err != nil && ep.Host != nil && Unreachable(err) {
			m.hosts.CheckNow() // the host may be gone: do not wait for the next check
		}
		if err == nil || !retryableDial(err) || ctx.Err() != nil || m.now().Add(backoff).After(deadline) {
			return c, ep, err
		}
		lastErr = err
		m.log.Debug("pool: server connection failed; retrying", "app", cfg.Name, "database", database, "in", backoff, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ep, ctx.Err()
		}
		backoff = min(2*backoff, time.Second)
	}
}

// errDialSlotTimeout is a dial that found no free dial slot within the
// application's wait_timeout: the server.dial_concurrency dials ahead of
// it took that long (PostgreSQL, or the host they go to, answers slowly or
// not at all).
var errDialSlotTimeout = errors.New("pool: no dial slot free within wait_timeout: server.dial_concurrency dials to PostgreSQL were under way all along")

// dialSlot takes one of the server.dial_concurrency dial slots, waiting
// for one until ctx ends or the deadline passes (errDialSlotTimeout); a
// slot free at once is taken also after the deadline. Without the bound,
// a client queued behind dials to a host that stopped answering would wait
// connect_timeout for every round of dials ahead of it.
func (m *Manager) dialSlot(ctx context.Context, deadline time.Time) error {
	select {
	case m.dialSem <- struct{}{}:
		return nil
	default:
	}
	t := time.NewTimer(deadline.Sub(m.now()))
	defer t.Stop()
	select {
	case m.dialSem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return errDialSlotTimeout
	}
}

// retryableDial reports whether a failed dial may succeed when retried:
// PostgreSQL's refusals (a wrong password, an unknown database) are final,
// except 53300 and 57P03.
func retryableDial(err error) bool {
	if finalDial(err) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "53300" || pe.Code == "57P03"
	}
	return !errors.Is(err, context.Canceled)
}

// dialReserved dials into a slot already counted for a (open, dialing).
func (m *Manager) dialReserved(ctx context.Context, a *appPool, database string) (*Conn, bool, error) {
	m.mu.Lock()
	cfg, srv, gen, srvGen := a.cfg, m.server, a.gen, m.srvGen
	m.mu.Unlock()

	c, ep, err := m.dialRetrying(ctx, srv, cfg, database)
	if err == nil && (c == nil || c.Net == nil) {
		err = errors.New("pool: dial returned no connection")
	}
	if ctx.Err() == nil && !errors.Is(err, ErrDialGated) && !noStandby(err, cfg.Target) {
		m.ServerReached("pool", err)
	}
	if f := m.onDial.Load(); err == nil && f != nil {
		if herr := (*f)(ctx, cfg.Name, c.PID); herr != nil {
			_ = c.Net.Close()
			err = herr
		}
	}
	if err != nil {
		m.mu.Lock()
		a.dialing--
		m.unreserveLocked(a)
		m.mu.Unlock()
		m.log.Debug("pool: server connection failed", "app", cfg.Name, "database", database, "err", err)
		return nil, false, fmt.Errorf("pool: connecting for application %q to database %q: %w", cfg.Name, database, err)
	}
	if c.Reader == nil {
		if _, isTLS := c.Net.(*tls.Conn); !isTLS {
			c.Net = evloop.Wrap(c.Net) // an event loop can adopt it (a TLS conn was wrapped below TLS at dial)
		}
		c.Reader = newReader(c.Net, m.bufs, c.early)
		c.early = nil
	}
	if c.App == "" {
		c.App = cfg.Name
	}
	if c.Database == "" {
		c.Database = database
	}
	if c.User == "" {
		c.User = cfg.User
	}
	if c.StartupParams == nil {
		c.StartupParams = map[string]string{}
	}
	c.pool = a
	c.created = m.now()
	c.gen, c.srvGen, c.srv = gen, srvGen, srv
	if ep.Host != nil {
		c.ep, c.srv = ep, srv.At(ep.Addr())
		ep.Opened()
	}

	m.mu.Lock()
	a.dialing--
	if m.closed {
		a.closing++
		c.state = stateClosing
		m.mu.Unlock()
		m.finishClose([]*Conn{c}, true)
		return nil, false, ErrClosed
	}
	c.state = stateInUse
	a.inUse++
	if m.hosts != nil {
		m.live[c] = struct{}{}
	}
	if srvGen == m.srvGen {
		k := paramsKey{database, c.User}
		if _, ok := m.params[k]; !ok {
			m.params[k] = maps.Clone(c.StartupParams) // never changed: CachedServerParams shares it
		}
	}
	m.mu.Unlock()
	if !m.usable(c) {
		// The monitor found its host changed (a new role, a new primary)
		// after the dial was routed: checkRole compared the login with the
		// new view, not with the target. No transaction may start on it;
		// start over. (A change after this check finds it in m.live, in
		// use, for Revalidate.)
		m.Destroy(c)
		return nil, true, nil
	}
	return c, false, nil
}

// unreserveLocked frees one counted slot of a (no conn behind it any more)
// and hands the room to waiters.
func (m *Manager) unreserveLocked(a *appPool) {
	a.open--
	m.open--
	if m.waiting > 0 {
		m.dispatchLocked()
	}
}

func (a *appPool) popIdle(database string) *Conn {
	st := a.lastIdle
	if st == nil || st.db != database {
		st = a.idle[database]
	}
	if st == nil || len(st.conns) == 0 {
		return nil
	}
	n := len(st.conns) - 1
	c := st.conns[n]
	st.conns[n] = nil
	st.conns = st.conns[:n]
	a.idleN--
	a.lastIdle = st
	return c
}

func (a *appPool) pushIdle(c *Conn) {
	st := a.lastIdle
	if st == nil || st.db != c.Database {
		st = a.idle[c.Database]
		if st == nil {
			st = &idleStack{db: c.Database}
			a.idle[c.Database] = st
		}
		a.lastIdle = st
	}
	st.conns = append(st.conns, c)
	c.state = stateIdle
	a.idleN++
}

// oldestIdle returns the stack whose bottom conn has been idle longest.
func (a *appPool) oldestIdle() (*idleStack, time.Time) {
	var best *idleStack
	var since time.Time
	for _, st := range a.idle {
		if len(st.conns) == 0 {
			continue
		}
		if t := st.conns[0].idleSince; best == nil || t.Before(since) {
			best, since = st, t
		}
	}
	return best, since
}

func (a *appPool) popOldestIdle() *Conn {
	st, _ := a.oldestIdle()
	if st == nil {
		return nil
	}
	c := st.conns[0]
	copy(st.conns, st.conns[1:])
	st.conns[len(st.conns)-1] = nil
	st.conns = st.conns[:len(st.conns)-1]
	a.idleN--
	return c
}

// takeAllIdle removes every idle conn of a (oldest first per database).
func (a *appPool) takeAllIdle() []*Conn {
	var out []*Conn
	for _, st := range a.idle {
		out = append(out, st.conns...)
		clear(st.conns)
		st.conns = st.conns[:0]
	}
	a.idleN = 0
	return out
}

func (m *Manager) oldestIdleAppLocked() *appPool {
	var best *appPool
	var since time.Time
	for _, a := range m.appList {
		if a.idleN == 0 {
			continue
		}
		if st, t := a.oldestIdle(); st != nil && (best == nil || t.Before(since)) {
			best, since = a, t
		}
	}
	return best
}

// connHead returns a's oldest waiter that a server connection would serve
// now: the head of its Acquire queue, or the head of its AcquireWithPin
// queue when a pin slot is free for it, whichever is older; nil when
// neither. An AcquireWithPin waiter with no pin slot free is no candidate
// for a connection: it must not keep one from others while it waits.
func (a *appPool) connHead() *waiter {
	w := a.waiters.head
	if b := a.bothWaiters.head; b != nil && a.pinHeld < a.cfg.MaxPinned && (w == nil || b.seq < w.seq) {
		return b
	}
	return w
}

// dispatchLocked serves queued waiters while any can be served, oldest
// (across applications) first. Only queue heads are candidates (connHead):
// a blocked head means the rest of its queue is blocked too.
func (m *Manager) dispatchLocked() {
	for m.waiting > 0 {
		heads := m.headsBuf[:0]
		for _, a := range m.appList {
			if h := a.connHead(); h != nil {
				heads = append(heads, h)
			}
		}
		for i := 1; i < len(heads); i++ { // few applications: insertion sort
			for j := i; j > 0 && heads[j].seq < heads[j-1].seq; j-- {
				heads[j], heads[j-1] = heads[j-1], heads[j]
			}
		}
		served := false
		for _, w := range heads {
			if g, ok := m.tryServeLocked(w.app, w.db); ok {
				m.grantLocked(w, g)
				served = true
				break
			}
		}
		clear(heads)
		m.headsBuf = heads[:0]
		if !served {
			return
		}
	}
}

// grantLocked hands g to the queued waiter w (an AcquireWithPin waiter
// takes a pin slot with it, which the caller has made sure is free).
func (m *Manager) grantLocked(w *waiter, g grant) {
	m.dequeueLocked(w)
	if w.pin && g.err == nil {
		w.app.pinHeld++
		g.pin = true
	}
	w.ch <- g
	if w.parker != nil {
		w.parker.Unpark()
	}
}

// ---------------------------------------------------------------- Release / Destroy

// Release returns c to the idle set, or straight to the first waiter of its
// application. Conns past MaxLifetime, marked Broken, of a removed or
// shrunk pool, logged in with outdated credentials, or released after
// Close are closed instead. Call it only at a safe point; Destroy otherwise.
func (m *Manager) Release(c *Conn) {
	m.mu.Lock()
	if c.state != stateInUse {
		m.mu.Unlock()
		m.log.Error("pool: Release of a connection that is not in use", "app", c.App, "pid", c.PID, "state", c.state)
		return
	}
	// Read before putBackLocked: once back, c may be handed out (and its
	// Gone set by its next session) before this goroutine looks again.
	gone := c.Gone
	if gone != "" {
		c.Broken = true // the server ended it
	}
	c.pool.inUse--
	broken := c.Broken
	toClose := m.putBackLocked(c, false)
	m.mu.Unlock()
	if gone != "" {
		m.ServerLost(gone)
	}
	if toClose != nil {
		m.finishClose(toClose, !broken)
	}
}

// putBackLocked files a conn that left its holder (counts already adjusted,
// still in a.open). It returns conns to close with finishClose.
func (m *Manager) putBackLocked(c *Conn, keepIdleSince bool) []*Conn {
	a := c.pool
	now := m.now()
	if c.Broken || m.closed || a.removed || c.gen != a.gen || c.srvGen != m.srvGen || !m.usable(c) ||
		a.open > a.cfg.MaxConnections || m.open > m.server.MaxConnections ||
		(m.server.MaxLifetime > 0 && now.Sub(c.created) >= m.server.MaxLifetime) {
		c.state = stateClosing
		a.closing++
		return []*Conn{c}
	}
	if w := a.connHead(); w != nil {
		if o := m.olderInstanceWaiterLocked(a, w.seq); o != nil {
			// An older waiter of another application is blocked only by the
			// instance cap: first come, first served across applications,
			// so the instance slot goes to it (it dials after closing c).
			m.closeConnLocked(c)
			c.keepInstSlot = true
			o.app.open++
			o.app.dialing++
			m.grantLocked(o, grant{dial: true, victim: c, victimCounted: true})
			return nil
		}
		if w.db == c.Database {
			c.state = stateInUse
			c.idleSince = time.Time{}
			a.inUse++
			m.grantLocked(w, grant{c: c})
		} else {
			// The first waiter wants another database: our slot is its slot.
			c.state = stateClosed
			delete(m.live, c)
			a.dialing++
			m.grantLocked(w, grant{dial: true, victim: c})
		}
		return nil
	}
	if !keepIdleSince || c.idleSince.IsZero() {
		c.idleSince = now
	}
	a.pushIdle(c)
	if m.waiting > 0 {
		m.dispatchLocked() // another application may be waiting for the instance slot
	}
	return nil
}

// olderInstanceWaiterLocked returns the oldest queue head of another
// application, older than seq, that is below its application's budget (so
// only the instance cap keeps it waiting).
func (m *Manager) olderInstanceWaiterLocked(a *appPool, seq uint64) *waiter {
	var best *waiter
	for _, o := range m.appList {
		h := o.connHead()
		if o == a || h == nil || h.seq > seq || o.open >= o.cfg.MaxConnections {
			continue
		}
		if best == nil || h.seq < best.seq {
			best = h
		}
	}
	return best
}

// finishClose closes the sockets of conns in stateClosing (outside the
// lock), then frees their slots and serves waiters.
func (m *Manager) finishClose(conns []*Conn, graceful bool) {
	if len(conns) == 0 {
		return
	}
	for _, c := range conns {
		c.closeSocket(graceful)
	}
	m.mu.Lock()
	for _, c := range conns {
		a := c.pool
		delete(m.live, c)
		c.state = stateClosed
		a.closing--
		a.open--
		if c.keepInstSlot {
			c.keepInstSlot = false // the instance slot went to a dialer
		} else {
			m.open--
		}
	}
	if m.waiting > 0 {
		m.dispatchLocked()
	}
	m.mu.Unlock()
}

// Destroy closes c (no Terminate: it may be mid-protocol) and frees its
// slot, waking a waiter.
func (m *Manager) Destroy(c *Conn) {
	if c.Gone != "" {
		m.ServerLost(c.Gone)
	}
	m.mu.Lock()
	if c.state != stateInUse {
		m.mu.Unlock()
		m.log.Error("pool: Destroy of a connection that is not in use", "app", c.App, "pid", c.PID, "state", c.state)
		return
	}
	c.state = stateClosing
	c.pool.inUse--
	c.pool.closing++
	m.mu.Unlock()
	m.finishClose([]*Conn{c}, false)
}

// appLocked returns the application app for a new wait: ErrClosed once the
// manager closed, ErrUnknownApp for an application that is not (or no
// longer) configured. The caller holds m.mu.
func (m *Manager) appLocked(app string) (*appPool, error) {
	if m.closed {
		return nil, ErrClosed
	}
	a := m.apps[app]
	if a == nil || a.removed {
		return nil, fmt.Errorf("%w %q", ErrUnknownApp, app)
	}
	return a, nil
}

// ---------------------------------------------------------------- pins

// AcquirePin waits for one of the application's MaxPinned pin slots, up
// to WaitTimeout (error wraps ErrPinTimeout) or ctx (wraps ctx.Err()), for
// a caller that holds a server connection already (a session inside a
// transaction). It waits for a slot only: FIFO with the other AcquirePin
// callers, and it takes a free slot ahead of older AcquireWithPin callers
// that cannot get a connection yet (see grantPinsLocked). A caller that
// holds no connection uses AcquireWithPin instead.
func (m *Manager) AcquirePin(ctx context.Context, app string) error {
	m.mu.Lock()
	a, err := m.appLocked(app)
	if err != nil {
		m.mu.Unlock()
		return err
	}
	if a.pinWaiters.n == 0 && a.pinHeld < a.cfg.MaxPinned {
		a.pinHeld++
		m.mu.Unlock()
		a.am.pinOutcome(pinImmediate)
		return nil
	}
	w := &waiter{seq: m.nextSeq(), app: a, ch: make(chan grant, 1)}
	a.pinWaiters.push(w)
	timeout := a.cfg.WaitTimeout
	m.mu.Unlock()

	timerC, stop := timeoutChan(timeout)
	defer stop()
	outcome := pinCanceled
	select {
	case g := <-w.ch:
		if g.err != nil {
			return g.err
		}
		a.am.pinOutcome(pinWaited)
		return nil
	case <-ctx.Done():
		err = fmt.Errorf("pool: waiting for a pin slot: %w", ctx.Err())
	case <-timerC:
		outcome = pinTimeout
		err = fmt.Errorf("%w (application %q, waited %s)", ErrPinTimeout, app, timeout)
	}
	m.mu.Lock()
	if w.queued {
		a.pinWaiters.remove(w)
	} else if g := <-w.ch; g.err == nil {
		a.pinHeld-- // granted meanwhile: give it back
		m.grantPinsLocked(a)
	}
	m.mu.Unlock()
	a.am.pinOutcome(outcome)
	return err
}

// AcquireWithPin takes one of app's pin slots and a server connection for
// (app, database) together, for a caller that holds neither (a session
// outside a transaction whose statement may pin it). It waits holding
// nothing, up to WaitTimeout or ctx, and is granted both at once, under the
// manager's lock, when a slot is free and a connection can be had (an idle
// one, or room to dial): a free slot is never kept for it while it has no
// connection, so it never blocks an AcquirePin caller, which holds a
// connection. Among themselves AcquireWithPin callers are served FIFO, and
// with a slot free the oldest one competes for connections with the
// Acquire callers in FIFO order (connHead). On success the caller holds
// the slot (ReleasePin) and the connection (Release or Destroy).
//
// A timeout with no slot free wraps ErrPinTimeout, one with a slot free
// but no connection ErrWaitTimeout; cancellation wraps ctx.Err(); a failed
// dial is returned as Acquire returns it, with the slot given back. p is as
// for AcquireParked (nil: an ordinary blocking wait; a dial runs through
// p.Offload). lockpool_pin_waits_total counts the call by outcome;
// lockpool_pool_wait_seconds observes its wait for a connection, from the
// moment a pin slot was free for it (its wait for the slot is not one for
// a connection).
func (m *Manager) AcquireWithPin(ctx context.Context, app, database string, p Parker) (*Conn, error) {
	var paused time.Duration
	if m.pause.on.Load() {
		var err error
		if paused, err = m.waitResumedVia(ctx, app, database, p); err != nil {
			return nil, err
		}
	}
	outcome := pinImmediate
	for {
		m.mu.Lock()
		a, err := m.appLocked(app)
		if err != nil {
			m.mu.Unlock()
			return nil, err
		}
		waited := paused
		paused = 0
		var g grant
		ok := false
		if a.pinHeld < a.cfg.MaxPinned && a.bothWaiters.n == 0 && a.waiters.n == 0 {
			if g, ok = m.tryServeLocked(a, database); ok {
				a.pinHeld++
				g.pin = true
			}
		}
		if ok {
			m.mu.Unlock()
			a.observeWait(waited)
		} else {
			outcome = pinWaited
			w := m.newWaiterLocked(a, database, p)
			w.pin = true
			if a.pinHeld < a.cfg.MaxPinned {
				w.slotFree = w.since // only a connection is missing
			}
			a.bothWaiters.push(w)
			m.waiting++
			timeout := a.cfg.WaitTimeout
			m.mu.Unlock()

			var err error
			g, err = m.wait(ctx, w, timeout)
			if !w.slotFree.IsZero() {
				waited += time.Since(w.slotFree)
			}
			m.recycle(w)
			a.observeWait(waited)
			if err != nil {
				switch {
				case errors.Is(err, ErrPinTimeout):
					a.am.pinOutcome(pinTimeout)
					err = fmt.Errorf("%w (application %q, waited %s)", ErrPinTimeout, app, timeout)
				case errors.Is(err, ErrWaitTimeout):
					a.am.pinOutcome(pinTimeout)
					a.am.waitTimedOut()
					err = fmt.Errorf("%w (application %q, waited %s with a pin slot free)", ErrWaitTimeout, app, timeout)
				case ctx.Err() != nil:
					a.am.pinOutcome(pinCanceled)
				}
				return nil, err
			}
		}
		c, retry, err := m.useGrantVia(ctx, a, database, g, p)
		if retry || err != nil {
			m.releasePinOf(a) // the connection was dead or could not be made: wait for both again, or fail
		}
		if retry {
			continue
		}
		a.am.pinOutcome(outcome)
		return c, err
	}
}

// ReleasePin frees one pin slot of app (handing it to the first pin waiter).
func (m *Manager) ReleasePin(app string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.apps[app]
	if a == nil || a.pinHeld == 0 {
		m.log.Error("pool: ReleasePin without a held pin slot", "app", app)
		return
	}
	a.pinHeld--
	m.grantPinsLocked(a)
}

// releasePinOf gives back a pin slot of a that came with an AcquireWithPin
// grant the caller could not use.
func (m *Manager) releasePinOf(a *appPool) {
	m.mu.Lock()
	a.pinHeld--
	m.grantPinsLocked(a)
	m.mu.Unlock()
}

// grantPinsLocked hands a's free pin slots to its waiters, oldest first,
// wherever that cannot make a wait cycle. An AcquirePin waiter holds a
// connection and waits for a slot only: it gets a free slot. An
// AcquireWithPin waiter holds nothing and needs a connection too: the
// oldest one gets a slot only together with a connection (no older Acquire
// waiter, and tryServeLocked finds one); otherwise the slot goes on to a
// younger AcquirePin waiter, or stays free, and that AcquireWithPin waiter
// waits for a connection (connHead). So no slot is ever kept for a waiter
// that cannot use it, and a waiter that holds a connection never waits for
// one that holds nothing.
func (m *Manager) grantPinsLocked(a *appPool) {
	for a.pinHeld < a.cfg.MaxPinned {
		p, b := a.pinWaiters.head, a.bothWaiters.head
		if b != nil && (p == nil || b.seq < p.seq) && (a.waiters.head == nil || b.seq < a.waiters.head.seq) {
			if g, ok := m.tryServeLocked(a, b.db); ok {
				m.grantLocked(b, g)
				continue
			}
		}
		if p == nil {
			break
		}
		a.pinWaiters.remove(p)
		a.pinHeld++
		p.ch <- grant{}
	}
	if a.pinHeld < a.cfg.MaxPinned && a.bothWaiters.n > 0 {
		// A slot is free for them: from now on they wait for a connection.
		now := time.Now()
		for w := a.bothWaiters.head; w != nil; w = w.next {
			if w.slotFree.IsZero() {
				w.slotFree = now
			}
		}
	}
}

// ---------------------------------------------------------------- Reconfigure

// Reconfigure applies new budgets, logins and server settings without
// dropping in-use conns. Raised budgets wake waiters at once; lowered ones
// close idle conns now and excess in-use conns as they are released; conns
// logged in with changed credentials or to a changed server address are
// replaced the same way; removed applications drain (their waiters get
// ErrUnknownApp, new Acquires too, their conns close at release).
// Invalid entries (non-positive budgets, duplicate names) are skipped and
// logged; a non-positive server max_connections keeps the old one.
func (m *Manager) Reconfigure(server config.Server, apps []AppConfig) {
	var toClose []*Conn
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	if err := checkServer(server); err != nil {
		m.log.Error("pool: reconfigure: keeping server max_connections", "err", err)
		server.MaxConnections = m.server.MaxConnections
	}
	if server.Host != m.server.Host || server.Port != m.server.Port {
		m.srvGen++
		clear(m.params)
		for _, a := range m.appList {
			toClose = append(toClose, m.closeIdleLocked(a)...)
		}
	}
	m.server = server

	keep := make(map[string]bool, len(apps))
	for _, cfg := range apps {
		if err := checkApp(cfg); err != nil {
			m.log.Error("pool: reconfigure: skipping application", "err", err)
			continue
		}
		if keep[cfg.Name] {
			m.log.Error("pool: reconfigure: application listed twice", "app", cfg.Name)
			continue
		}
		keep[cfg.Name] = true
		a := m.apps[cfg.Name]
		if a == nil {
			m.addAppLocked(cfg)
			continue
		}
		if cfg.User != a.cfg.User || cfg.Password != a.cfg.Password {
			a.gen++
			toClose = append(toClose, m.closeIdleLocked(a)...)
		}
		a.cfg = cfg
		a.target.Store(&cfg.Target)
		m.applyLimitLocked(a, true)
		a.removed = false
	}
	for _, a := range m.appList {
		if keep[a.name] || a.removed {
			continue
		}
		a.removed = true
		toClose = append(toClose, m.closeIdleLocked(a)...)
		err := fmt.Errorf("%w %q (removed by reconfiguration)", ErrUnknownApp, a.name)
		for w := a.waiters.head; w != nil; w = a.waiters.head {
			m.grantLocked(w, grant{err: err})
		}
		for w := a.bothWaiters.head; w != nil; w = a.bothWaiters.head {
			m.grantLocked(w, grant{err: err})
		}
		for w := a.pinWaiters.head; w != nil; w = a.pinWaiters.head {
			a.pinWaiters.remove(w)
			w.ch <- grant{err: err}
		}
	}
	// Lowered budgets: close idle excess, least recently used first.
	for _, a := range m.appList {
		for a.open > a.cfg.MaxConnections && a.idleN > 0 {
			toClose = append(toClose, m.closeConnLocked(a.popOldestIdle()))
		}
	}
	for m.open > m.server.MaxConnections {
		a := m.oldestIdleAppLocked()
		if a == nil {
			break
		}
		toClose = append(toClose, m.closeConnLocked(a.popOldestIdle()))
	}
	for _, a := range m.appList {
		m.grantPinsLocked(a)
	}
	if m.waiting > 0 {
		m.dispatchLocked()
	}
	m.mu.Unlock()
	m.finishClose(toClose, true)
}

// closeConnLocked marks a conn already taken out of idle as closing.
func (m *Manager) closeConnLocked(c *Conn) *Conn {
	c.state = stateClosing
	c.pool.closing++
	return c
}

func (m *Manager) closeIdleLocked(a *appPool) []*Conn {
	conns := a.takeAllIdle()
	for _, c := range conns {
		m.closeConnLocked(c)
	}
	return conns
}

// ---------------------------------------------------------------- ServerParams, Stats

// CachedServerParams returns the ParameterStatus values app's server user
// got for database, when a server connection learned them already, without
// waiting for anything. The map is shared: read it, never change it.
func (m *Manager) CachedServerParams(app, database string) (map[string]string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.apps[app]
	if a == nil || a.removed {
		return nil, false
	}
	p, ok := m.params[paramsKey{database, a.cfg.User}]
	return p, ok
}

// ServerParams returns the ParameterStatus set a server connection of (app,
// database) reports at login, cached per database+user after the first
// login. Without a cached set it acquires a conn (respecting budgets and
// waiting like Acquire), copies its StartupParams and releases it. The
// returned map is the caller's.
func (m *Manager) ServerParams(ctx context.Context, app, database string) (map[string]string, error) {
	m.mu.Lock()
	a := m.apps[app]
	if a == nil || a.removed {
		m.mu.Unlock()
		return nil, fmt.Errorf("%w %q", ErrUnknownApp, app)
	}
	p, ok := m.params[paramsKey{database, a.cfg.User}]
	m.mu.Unlock()
	if ok {
		return maps.Clone(p), nil
	}
	c, err := m.Acquire(ctx, app, database)
	if err != nil {
		return nil, err
	}
	p = maps.Clone(c.StartupParams)
	m.Release(c)
	return p, nil
}

// Stats returns a snapshot of app's pool (zero for an unknown app).
func (m *Manager) Stats(app string) Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.apps[app]
	if a == nil {
		return Stats{}
	}
	return a.statsLocked()
}

// InstanceStats sums Stats over all applications.
func (m *Manager) InstanceStats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	var s Stats
	for _, a := range m.appList {
		x := a.statsLocked()
		s.Open += x.Open
		s.Idle += x.Idle
		s.InUse += x.InUse
		s.Waiting += x.Waiting
		s.Pinned += x.Pinned
		s.PinWaiting += x.PinWaiting
		s.Dialing += x.Dialing
	}
	return s
}

func (a *appPool) statsLocked() Stats {
	waiting := a.waiters.n + a.pauseWaiters.n
	if a.pinHeld < a.cfg.MaxPinned {
		waiting += a.bothWaiters.n // a slot is free: they wait for a connection
	}
	return Stats{
		Open:       a.open,
		Idle:       a.idleN,
		InUse:      a.inUse,
		Waiting:    waiting,
		Pinned:     a.pinHeld,
		PinWaiting: a.pinWaiters.n + a.bothWaiters.n,
		Dialing:    a.dialing,
	}
}

// ---------------------------------------------------------------- SweepIdle

// SweepIdle calls check with the backend PIDs of all idle conns. They are
// taken out of the idle set meanwhile (nobody can get them; they stay
// counted) and check runs without the lock. Conns whose pid check reports
// are closed and returned as ClosedInfo; the others go back to idle (or to
// waiters) with their idle time preserved. If check fails, all go back and
// its error is returned.
func (m *Manager) SweepIdle(ctx context.Context, check func(ctx context.Context, pids []uint32) (leaked map[uint32]bool, err error)) ([]ClosedInfo, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	var conns []*Conn
	for _, a := range m.appList {
		if a.idleN == 0 {
			continue
		}
		taken := a.takeAllIdle()
		for _, c := range taken {
			if !m.onPrimary(c) {
				a.pushIdle(c) // check knows the primary's pids only
				continue
			}
			c.state = stateChecking
			a.checking++
			conns = append(conns, c)
		}
	}
	m.mu.Unlock()
	if len(conns) == 0 {
		return nil, nil
	}

	pids := make([]uint32, len(conns))
	for i, c := range conns {
		pids[i] = c.PID
	}
	leaked, err := check(ctx, pids)

	var closed []ClosedInfo
	var toClose []*Conn
	m.mu.Lock()
	for _, c := range conns {
		c.pool.checking--
		if err == nil && leaked[c.PID] {
			toClose = append(toClose, m.closeConnLocked(c))
			closed = append(closed, ClosedInfo{App: c.App, Database: c.Database, LastClient: c.LastClient, PID: c.PID})
			continue
		}
		toClose = append(toClose, m.putBackLocked(c, true)...)
	}
	m.mu.Unlock()
	for _, ci := range closed {
		m.log.Warn("pool: closing idle server connection that still holds advisory locks",
			"app", ci.App, "database", ci.Database, "pid", ci.PID, "last_client", ci.LastClient)
	}
	m.finishClose(toClose, true)
	if err != nil {
		return nil, fmt.Errorf("pool: idle connection check: %w", err)
	}
	return closed, nil
}

// ---------------------------------------------------------------- janitor, Close

func (m *Manager) janitor(interval time.Duration) {
	defer close(m.janitorDone)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-m.stopJanitor:
			return
		case <-t.C:
			m.sweepExpired(m.now())
		}
	}
}

// sweepExpired closes idle conns idle longer than IdleTimeout or older than
// MaxLifetime (each ignored when <= 0).
func (m *Manager) sweepExpired(now time.Time) {
	var toClose []*Conn
	m.mu.Lock()
	idleTO, life := m.server.IdleTimeout, m.server.MaxLifetime
	for _, a := range m.appList {
		if a.idleN == 0 {
			continue
		}
		for db, st := range a.idle {
			kept := st.conns[:0]
			for _, c := range st.conns {
				if (idleTO > 0 && now.Sub(c.idleSince) >= idleTO) || (life > 0 && now.Sub(c.created) >= life) {
					a.idleN--
					toClose = append(toClose, m.closeConnLocked(c))
					continue
				}
				kept = append(kept, c)
			}
			clear(st.conns[len(kept):])
			st.conns = kept
			if len(kept) == 0 {
				delete(a.idle, db)
				if a.lastIdle == st {
					a.lastIdle = nil
				}
			}
		}
	}
	m.mu.Unlock()
	m.finishClose(toClose, true)
}

// Close closes idle conns, refuses new Acquires and pins (ErrClosed), wakes
// all waiters with ErrClosed and stops the janitor. In-use conns are closed
// at their Release/Destroy. Close is idempotent.
func (m *Manager) Close() {
	var toClose []*Conn
	m.mu.Lock()
	if !m.closed {
		m.closed = true
		for _, a := range m.appList {
			toClose = append(toClose, m.closeIdleLocked(a)...)
			for w := a.waiters.head; w != nil; w = a.waiters.head {
				m.grantLocked(w, grant{err: ErrClosed})
			}
			for w := a.bothWaiters.head; w != nil; w = a.bothWaiters.head {
				m.grantLocked(w, grant{err: ErrClosed})
			}
			for w := a.pinWaiters.head; w != nil; w = a.pinWaiters.head {
				a.pinWaiters.remove(w)
				w.ch <- grant{err: ErrClosed}
			}
		}
	}
	m.mu.Unlock()
	m.closeOnce.Do(func() { close(m.stopJanitor) })
	<-m.janitorDone
	m.finishClose(toClose, true)
}

// timeoutChan returns a channel that fires after d (never for d <= 0) and a
// function that releases its timer.
func timeoutChan(d time.Duration) (<-chan time.Time, func()) {
	if d <= 0 {
		return nil, func() {}
	}
	t := time.NewTimer(d)
	return t.C, func() { t.Stop() }
}
