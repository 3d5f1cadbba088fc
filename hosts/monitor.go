package hosts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockpool/lockpool/config"
)

// Role is what a host was found to be at its last answered check.
type Role uint8

// The roles of a host.
const (
	RoleUnknown Role = iota // never answered
	RolePrimary             // not in recovery
	RoleStandby             // in recovery
)

func (r Role) String() string {
	switch r {
	case RolePrimary:
		return "primary"
	case RoleStandby:
		return "standby"
	}
	return "unknown"
}

// Status is one host's state after a check. It is never changed once
// published; a check publishes a new one.
type Status struct {
	Addr    config.HostAddr
	Role    Role          // the role at the last answered check
	Up      bool          // the last check answered
	Lag     time.Duration // a standby's replay lag (0: caught up, or a primary)
	Gen     uint64        // the host's generation (see the package doc)
	Refused bool          // claims to be a primary beside another (split brain)
	Checked time.Time     // when the last check ended
	Since   time.Time     // when Role, Up or Refused last changed
	Err     string        // the last failed check's error, while down
}

// State is how SHOW HOSTS names the status: primary, standby, lagging
// (a standby beyond maxLag, when maxLag > 0), refused, down, or unknown
// (not checked yet).
func (s *Status) State(maxLag time.Duration) string {
	switch {
	case !s.Up && s.Checked.IsZero():
		return "unknown"
	case !s.Up:
		return "down"
	case s.Refused:
		return "refused"
	case s.Role == RoleStandby && maxLag > 0 && s.Lag > maxLag:
		return "lagging"
	}
	return s.Role.String()
}

// Host is one PostgreSQL host the monitor follows.
type Host struct {
	addr   config.HostAddr
	status atomic.Pointer[Status]
	conns  atomic.Int64 // server connections of the pools open to it

	mu  sync.Mutex
	own map[net.Conn]uint64 // lockpool's own connections (DialPrimary), by the generation they were dialed in
}

// Addr is the host's address.
func (h *Host) Addr() config.HostAddr { return h.addr }

// Status is the host's last published status.
func (h *Host) Status() *Status { return h.status.Load() }

// Conns is the number of the pools' server connections open to the host.
func (h *Host) Conns() int64 { return h.conns.Load() }

// Options configure a Monitor.
type Options struct {
	Hosts    []config.HostAddr
	Interval time.Duration // between checks of one host
	// Timeout bounds one check (dial and query); 0 means Interval, at
	// least a second.
	Timeout time.Duration
	// Connect logs in to a host for its checks (lockpool's own login).
	Connect func(ctx context.Context, addr config.HostAddr) (*pgconn.PgConn, error)
	// OnChange is called after the primary changed, a split brain began or
	// ended, or a host's generation was bumped (see [Change]).
	OnChange func(Change)
	// UserTimeout is server.tcp_user_timeout, for DialPrimary's connections.
	UserTimeout time.Duration
	Logger      *slog.Logger
	Registerer  prometheus.Registerer // nil: no metrics
}

// Change describes what one check changed.
type Change struct {
	Old, New   *Host   // the primary before and after (nil: none)
	Bumped     []*Host // hosts whose generation was bumped
	SplitBrain bool    // two or more hosts claim to be the primary
}

// Monitor checks the hosts and routes connections to them.
type Monitor struct {
	opts    Options
	hosts   []*Host
	log     *slog.Logger
	metrics *metrics

	mu          sync.Mutex
	primary     *Host
	lastPrimary *Host // the last host that was the primary (kept while there is none)
	splitBrain  bool
	changed     chan struct{} // closed and replaced when any status changes
	failovers   uint64
	events      []Change
	eventsCond  *sync.Cond
	closed      bool

	kicks  []chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup
	rr     atomic.Uint64
	dialer *net.Dialer
}

// New returns a monitor of opts.Hosts; Start begins the checks.
func New(opts Options) (*Monitor, error) {
	if len(opts.Hosts) == 0 {
		return nil, errors.New("hosts: no host")
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.Timeout <= 0 {
		opts.Timeout = max(opts.Interval, time.Second)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Monitor{opts: opts, log: log, changed: make(chan struct{}), dialer: Dialer(opts.UserTimeout)}
	m.eventsCond = sync.NewCond(&m.mu)
	now := time.Now()
	for _, a := range opts.Hosts {
		h := &Host{addr: a, own: map[net.Conn]uint64{}}
		h.status.Store(&Status{Addr: a, Gen: 1, Since: now})
		m.hosts = append(m.hosts, h)
		m.kicks = append(m.kicks, make(chan struct{}, 1))
	}
	if opts.Registerer != nil {
		m.metrics = newMetrics(opts.Registerer, m)
	}
	return m, nil
}

// Hosts returns the hosts in configuration order.
func (m *Monitor) Hosts() []*Host { return m.hosts }

// Start starts one check loop per host and the notifier.
func (m *Monitor) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	for i, h := range m.hosts {
		m.wg.Add(1)
		go m.loop(ctx, h, m.kicks[i])
	}
	m.wg.Add(1)
	go m.notify()
}

// Close stops the checks and closes the check connections. Waits in
// Route end with an error. A nil Monitor's Close does nothing.
func (m *Monitor) Close() {
	if m == nil {
		return
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	close(m.changed)
	m.changed = make(chan struct{})
	m.eventsCond.Broadcast()
	m.mu.Unlock()
	if m.cancel != nil {
		m.cancel()
	}
	m.wg.Wait()
}

// CheckNow asks every host's loop to check at once (a dial found a host
// in another role than the monitor knew). It does not wait.
func (m *Monitor) CheckNow() {
	for _, k := range m.kicks {
		select {
		case k <- struct{}{}:
		default:
		}
	}
}

// kickGap is the least time between two checks of a host that CheckNow
// asked for.
const kickGap = 50 * time.Millisecond

// loop checks h every interval (or when kicked) until ctx ends.
func (m *Monitor) loop(ctx context.Context, h *Host, kick chan struct{}) {
	defer m.wg.Done()
	var conn *pgconn.PgConn
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	t := time.NewTimer(0)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
			// Kicks come from failing dials, maybe many: a host is still
			// checked at most every kickGap.
			if d := kickGap - time.Since(last); d > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(d):
				}
			}
		}
		last = time.Now()
		var r result
		conn, r = m.check(ctx, h, conn)
		if ctx.Err() != nil {
			return
		}
		if r.err != nil && conn == nil && !timedOut(r.err) {
			// One retry on a fresh connection: a check connection that was
			// ended (pg_terminate_backend, a restart) says nothing about
			// the host yet. A check that timed out does: the host did not
			// answer within the timeout, and is down now, not a second
			// timeout later.
			conn, r = m.check(ctx, h, nil)
			if ctx.Err() != nil {
				return
			}
		}
		m.apply(h, r)
		t.Reset(m.opts.Interval)
	}
}

// timedOut reports whether a check failed because the host did not answer
// in time (a dial or a query that timed out).
func timedOut(err error) bool {
	var ne net.Error
	return pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// result is one check's outcome.
type result struct {
	inRecovery bool
	lag        time.Duration
	err        error
}

// checkSQL reads the role and the replay lag (lagSQL).
var checkSQL = "SELECT pg_is_in_recovery(),\n  " +
	lagSQL("pg_is_in_recovery()", "pg_last_wal_receive_lsn()", "pg_last_wal_replay_lsn()", "pg_last_xact_replay_timestamp()")

// lagSQL is the replay lag in seconds of a host, from SQL expressions for
// whether it is in recovery, the WAL position it received and the one it
// replayed, and when the last transaction it replayed committed: 0 for a
// primary and for a standby that replayed all the WAL it received, else
// the time since that commit (0 when there is none). A standby that
// restarted reports as received the start of the WAL segment it streams
// from until more WAL comes, which may be behind what it replayed: that is
// a standby that replayed all it received too, so the test is >=, not =.
func lagSQL(inRecovery, received, replayed, replayedAt string) string {
	return "CASE WHEN NOT " + inRecovery + " OR " + replayed + " >= " + received + " THEN 0\n" +
		"       ELSE COALESCE(extract(epoch FROM now() - (" + replayedAt + ")), 0) END"
}

// check runs one check of h on conn (dialing when nil). It returns the
// connection to keep (nil after a failure) and the result.
func (m *Monitor) check(ctx context.Context, h *Host, conn *pgconn.PgConn) (*pgconn.PgConn, result) {
	ctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	defer cancel()
	if conn == nil {
		c, err := m.opts.Connect(ctx, h.addr)
		if err != nil {
			return nil, result{err: err}
		}
		conn = c
	}
	rr := conn.ExecParams(ctx, checkSQL, nil, nil, nil, nil).Read()
	if rr.Err == nil && (len(rr.Rows) != 1 || len(rr.Rows[0]) != 2) {
		rr.Err = fmt.Errorf("hosts: check returned %d rows", len(rr.Rows))
	}
	if rr.Err != nil {
		_ = conn.Close(context.Background())
		return nil, result{err: rr.Err}
	}
	var r result
	r.inRecovery = string(rr.Rows[0][0]) == "t"
	var secs float64
	if _, err := fmt.Sscan(string(rr.Rows[0][1]), &secs); err == nil && secs > 0 && !math.IsInf(secs, 0) {
		r.lag = time.Duration(secs * float64(time.Second))
	}
	return conn, r
}

// apply publishes h's new status and decides the primary.
func (m *Monitor) apply(h *Host, r result) {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	old := h.status.Load()
	st := *old
	st.Checked = now
	st.Up = r.err == nil
	st.Err = ""
	if r.err != nil {
		st.Err = r.err.Error()
	} else {
		role := RoleStandby
		if !r.inRecovery {
			role = RolePrimary
		}
		if st.Role != RoleUnknown && st.Role != role {
			st.Gen++ // a role change: no connection of the old role is used again
			m.log.Warn("hosts: host changed role", "host", h.addr.String(), "from", st.Role.String(), "to", role.String())
		}
		st.Role = role
		st.Lag = r.lag
		if role == RolePrimary {
			st.Lag = 0
		}
	}
	if st.Up != old.Up {
		if st.Up {
			m.log.Info("hosts: host answers", "host", h.addr.String(), "role", st.Role.String())
		} else {
			m.log.Warn("hosts: host does not answer", "host", h.addr.String(), "err", st.Err)
		}
	}
	var bumped []*Host
	if st.Gen != old.Gen {
		bumped = append(bumped, h)
	}
	changed := st.Up != old.Up || st.Role != old.Role || st.Gen != old.Gen
	if changed {
		st.Since = now
	}
	h.status.Store(&st)

	// The primary: the one host that answers and is not in recovery.
	var claim []*Host
	for _, x := range m.hosts {
		if s := x.status.Load(); s.Up && s.Role == RolePrimary {
			claim = append(claim, x)
		}
	}
	ch := Change{Old: m.primary}
	switch {
	case len(claim) > 1 && !m.splitBrain && len(staleClaims(claim)) > 0:
		// A claimant last checked before another host's claim began may
		// have stopped since: a switchover stops the old primary, then
		// promotes the standby, often within one check interval. Check it
		// again at once before calling a split brain; meanwhile there is
		// no primary, and the one there was starts no more transactions
		// (as a replaced primary or a split brain's claimant would not).
		if p := m.primary; p != nil {
			s := *p.status.Load()
			s.Gen++
			s.Since = now
			p.status.Store(&s)
			if !contains(bumped, p) {
				bumped = append(bumped, p)
			}
			m.log.Info("hosts: another host became a primary; checking the old primary again",
				"primary", p.addr.String(), "claims", h.addr.String())
		}
		m.primary = nil
		m.CheckNow()
	case len(claim) > 1:
		// Every claimant is refused, and its connections retired, once:
		// also one that joins a split brain already under way.
		names := ""
		for _, x := range claim {
			names += " " + x.addr.String()
			if x.status.Load().Refused {
				continue
			}
			s := *x.status.Load()
			if !contains(bumped, x) {
				s.Gen++
				bumped = append(bumped, x)
			}
			s.Refused = true
			s.Since = now
			x.status.Store(&s)
		}
		if !m.splitBrain {
			m.splitBrain = true
			m.log.Error("hosts: split brain: more than one host is a primary; lockpool uses none of them until only one is", "hosts", names[1:])
		}
		m.primary = nil
	case len(claim) == 1:
		p := claim[0]
		if m.splitBrain {
			m.splitBrain = false
			m.log.Warn("hosts: split brain over: one primary remains", "primary", p.addr.String())
			for _, x := range m.hosts {
				if s := x.status.Load(); s.Refused {
					ns := *s
					ns.Refused = false
					ns.Since = now
					x.status.Store(&ns)
				}
			}
		}
		if m.primary != p {
			if prev := m.lastPrimary; prev != nil && prev != p {
				// The old primary is replaced: none of its connections
				// start another transaction, even if it still answers.
				s := *prev.status.Load()
				if !contains(bumped, prev) {
					s.Gen++
					s.Since = now
					prev.status.Store(&s)
					bumped = append(bumped, prev)
				}
				m.failovers++
				if m.metrics != nil {
					m.metrics.failovers.Inc()
				}
				m.log.Warn("hosts: primary changed", "from", prev.addr.String(), "to", p.addr.String())
			} else {
				m.log.Info("hosts: primary found", "primary", p.addr.String())
			}
			m.primary = p
			m.lastPrimary = p
		}
	default:
		if m.primary != nil {
			m.log.Warn("hosts: no primary: lockpool waits for one", "last", m.primary.addr.String())
		}
		m.primary = nil
	}
	ch.New, ch.SplitBrain = m.primary, m.splitBrain
	if changed || ch.Old != ch.New || len(bumped) > 0 || old.Lag != st.Lag {
		close(m.changed)
		m.changed = make(chan struct{})
	}
	if ch.Old != ch.New || len(bumped) > 0 {
		ch.Bumped = bumped
		m.events = append(m.events, ch)
		m.eventsCond.Signal()
	}
}

// staleClaims returns the claimants of the primary role whose last check
// ended before another claimant's claim began (its Since).
func staleClaims(claim []*Host) []*Host {
	var newest time.Time
	for _, x := range claim {
		if s := x.status.Load(); s.Since.After(newest) {
			newest = s.Since
		}
	}
	var stale []*Host
	for _, x := range claim {
		if x.status.Load().Checked.Before(newest) {
			stale = append(stale, x)
		}
	}
	return stale
}

func contains(hs []*Host, h *Host) bool {
	for _, x := range hs {
		if x == h {
			return true
		}
	}
	return false
}

// notify runs OnChange for each change in order, after closing lockpool's
// own connections to the hosts whose generation was bumped.
func (m *Monitor) notify() {
	defer m.wg.Done()
	for {
		m.mu.Lock()
		for len(m.events) == 0 && !m.closed {
			m.eventsCond.Wait()
		}
		if m.closed {
			m.mu.Unlock()
			return
		}
		ch := m.events[0]
		m.events = m.events[1:]
		m.mu.Unlock()
		for _, h := range ch.Bumped {
			h.closeOwn()
		}
		if m.opts.OnChange != nil {
			m.opts.OnChange(ch)
		}
	}
}

// Snapshot returns every host's status, in configuration order, and the
// primary's address ("" when there is none).
func (m *Monitor) Snapshot() (hosts []*Host, primary string, splitBrain bool, failovers uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.primary != nil {
		primary = m.primary.addr.String()
	}
	return m.hosts, primary, m.splitBrain, m.failovers
}
