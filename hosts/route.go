package hosts

import (
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/internal/pgerr"
)

// Target is where an application's server connections may go.
type Target struct {
	Kind   string        // config.TargetPrimary, TargetStandby, TargetPreferStandby or TargetAny
	MaxLag time.Duration // a standby lagging more is not used
}

// Endpoint is the host a server connection was dialed to, the host's
// generation then, and whether it was a standby then.
type Endpoint struct {
	Host    *Host
	Gen     uint64
	Standby bool
}

// Addr is the endpoint's address.
func (e Endpoint) Addr() config.HostAddr { return e.Host.addr }

// Opened and Closed keep the host's count of pool connections.
func (e Endpoint) Opened() { e.Host.conns.Add(1) }

// Closed: see Opened.
func (e Endpoint) Closed() { e.Host.conns.Add(-1) }

// fits reports whether a host with status s may take new work of target t.
func (m *Monitor) fits(s *Status, t Target, primary bool) bool {
	if s.Refused {
		return false
	}
	switch {
	case primary:
		return t.Kind != config.TargetStandby
	case s.Up && s.Role == RoleStandby && s.Lag <= t.MaxLag:
		return t.Kind != config.TargetPrimary
	}
	return false
}

// Usable reports whether a connection dialed to e may start a transaction
// now for target t: its host's generation is still the one it was dialed
// in, and the host still fits t (the primary for targets primary and any,
// and for prefer-standby only while no standby qualifies: it is that
// target's fallback; a standby that answers within max_lag for the
// standby targets).
func (m *Monitor) Usable(e Endpoint, t Target) bool {
	s := e.Host.status.Load()
	if s.Gen != e.Gen || s.Refused {
		return false
	}
	if s.Role == RolePrimary {
		switch t.Kind {
		case config.TargetStandby:
			return false
		case config.TargetPreferStandby:
			return !m.standbyFits(t)
		}
		return true
	}
	return t.Kind != config.TargetPrimary && s.Up && s.Lag <= t.MaxLag
}

// standbyFits reports whether a standby may take new work of t now.
func (m *Monitor) standbyFits(t Target) bool {
	for _, h := range m.hosts {
		if s := h.status.Load(); s.Role == RoleStandby && m.fits(s, t, false) {
			return true
		}
	}
	return false
}

// Route returns a host for a new connection of target t: the primary for
// target primary; for the others the qualifying standby with the fewest
// connections (any: the primary counts as one of them; prefer-standby: the
// primary only when no standby qualifies). With no host to go to it waits,
// until ctx ends, for one; then it returns a 53300 error that says why.
// While it waits the hosts are checked every kickGap, not every Interval:
// a promotion (or a standby catching up) serves the waiting clients as
// soon as a check can see it.
func (m *Monitor) Route(ctx context.Context, t Target) (Endpoint, error) {
	var recheck *time.Timer
	defer func() {
		if recheck != nil {
			recheck.Stop()
		}
	}()
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return Endpoint{}, pgerr.Shutdown()
		}
		ep, ok := m.pickLocked(t)
		wait := m.changed
		m.mu.Unlock()
		if ok {
			return ep, nil
		}
		m.CheckNow()
		if recheck == nil {
			recheck = time.NewTimer(kickGap)
		} else {
			recheck.Reset(kickGap)
		}
		select {
		case <-wait:
		case <-recheck.C:
		case <-ctx.Done():
			return Endpoint{}, m.noHost(t)
		}
	}
}

// Pick is Route without the wait: a host for a new connection of target t
// now, or false when none fits.
func (m *Monitor) Pick(t Target) (Endpoint, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return Endpoint{}, false
	}
	return m.pickLocked(t)
}

// pickLocked chooses a host for t, or reports that none fits.
func (m *Monitor) pickLocked(t Target) (Endpoint, bool) {
	if t.Kind == config.TargetPrimary {
		if p := m.primary; p != nil {
			return Endpoint{Host: p, Gen: p.status.Load().Gen}, true
		}
		return Endpoint{}, false
	}
	var best *Host
	var bestStatus *Status
	n := len(m.hosts)
	start := int(m.rr.Add(1) % uint64(n))
	for i := range n {
		h := m.hosts[(start+i)%n]
		s := h.status.Load()
		isPrimary := h == m.primary
		if !m.fits(s, t, isPrimary) || isPrimary && t.Kind == config.TargetPreferStandby {
			continue
		}
		if best == nil || h.conns.Load() < best.conns.Load() {
			best, bestStatus = h, s
		}
	}
	if best == nil && t.Kind == config.TargetPreferStandby && m.primary != nil {
		best, bestStatus = m.primary, m.primary.status.Load()
	}
	if best == nil {
		return Endpoint{}, false
	}
	return Endpoint{Host: best, Gen: bestStatus.Gen, Standby: bestStatus.Role == RoleStandby}, true
}

// noHost is the 53300 for a Route that found no host in time.
func (m *Monitor) noHost(t Target) *pgerr.Error {
	m.mu.Lock()
	split := m.splitBrain
	m.mu.Unlock()
	var states []string
	for _, h := range m.hosts {
		states = append(states, h.addr.String()+" "+h.status.Load().State(t.MaxLag))
	}
	detail := "Hosts: " + strings.Join(states, ", ") + "."
	switch {
	case t.Kind == config.TargetPrimary && split:
		return pgerr.New(pgerr.TooManyConnections, "lockpool: no primary: more than one host claims to be the primary (split brain)",
			"lockpool uses none of them until only one is a primary; demote the others.").WithDetail(detail)
	case t.Kind == config.TargetPrimary || t.Kind == config.TargetPreferStandby:
		return pgerr.New(pgerr.TooManyConnections, "lockpool: no primary is available",
			"The primary is down or being replaced; retry once a host is promoted.").WithDetail(detail)
	}
	return pgerr.New(pgerr.TooManyConnections, "lockpool: no standby is available within max_lag "+t.MaxLag.String(),
		"Every standby is down or replays further behind than max_lag; raise max_lag, or use target prefer-standby to fall back to the primary.").WithDetail(detail)
}

// Primary returns the primary's address, waiting for one until ctx ends.
func (m *Monitor) Primary(ctx context.Context) (config.HostAddr, error) {
	ep, err := m.Route(ctx, Target{Kind: config.TargetPrimary})
	if err != nil {
		return config.HostAddr{}, err
	}
	return ep.Addr(), nil
}

// KnownPrimary returns the primary's address when there is one now.
func (m *Monitor) KnownPrimary() (config.HostAddr, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.primary == nil {
		return config.HostAddr{}, false
	}
	return m.primary.addr, true
}

// DialPrimary is a DialFunc for lockpool's own connections (pgx's
// ConnConfig.DialFunc): it ignores addr and dials the current primary
// (waiting for one within ctx), and tracks the connection under that host,
// so that it is closed when the host stops being the primary.
func (m *Monitor) DialPrimary(ctx context.Context, network, _ string) (net.Conn, error) {
	ep, err := m.Route(ctx, Target{Kind: config.TargetPrimary})
	if err != nil {
		return nil, err
	}
	a := ep.Addr()
	addr := net.JoinHostPort(a.Host, fmt.Sprint(a.Port))
	if strings.HasPrefix(a.Host, "/") {
		network, addr = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", a.Host, a.Port)
	}
	nc, err := m.dialer.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	h := ep.Host
	oc := &ownConn{Conn: nc, h: h}
	h.mu.Lock()
	if h.status.Load().Gen != ep.Gen {
		h.mu.Unlock()
		_ = nc.Close()
		m.CheckNow()
		return nil, fmt.Errorf("hosts: %s stopped being the primary during the dial", a)
	}
	h.own[oc] = ep.Gen
	h.mu.Unlock()
	return oc, nil
}

// ValidatePrimary is a pgconn ValidateConnect for lockpool's own
// connections: the host must not be in recovery; when it is, the monitor
// checks every host at once.
func (m *Monitor) ValidatePrimary(ctx context.Context, pc *pgconn.PgConn) error {
	if err := pgconn.ValidateConnectTargetSessionAttrsPrimary(ctx, pc); err != nil {
		m.CheckNow()
		return err
	}
	return nil
}

// ownConn is one of lockpool's own connections to a host.
type ownConn struct {
	net.Conn
	h *Host
}

// Close implements net.Conn and forgets the connection.
func (c *ownConn) Close() error {
	c.h.mu.Lock()
	delete(c.h.own, c)
	c.h.mu.Unlock()
	return c.Conn.Close()
}

// closeOwn closes every own connection dialed in an older generation.
func (h *Host) closeOwn() {
	gen := h.status.Load().Gen
	h.mu.Lock()
	var stale []net.Conn
	for c, g := range h.own {
		if g != gen {
			stale = append(stale, c)
			delete(h.own, c)
		}
	}
	h.mu.Unlock()
	for _, c := range stale {
		_ = c.(*ownConn).Conn.Close()
	}
}

// Dialer returns the dialer of every server connection: TCP keepalives,
// and with userTimeout > 0 TCP_USER_TIMEOUT, so a host that stops
// answering without a reset (a partition) ends a connection within about
// userTimeout, whether it was sending or waiting.
func Dialer(userTimeout time.Duration) *net.Dialer {
	d := &net.Dialer{}
	if userTimeout <= 0 {
		return d
	}
	probe := max(userTimeout/3, time.Second)
	d.KeepAliveConfig = net.KeepAliveConfig{Enable: true, Idle: probe, Interval: probe, Count: 3}
	ms := int(userTimeout / time.Millisecond)
	d.Control = func(network, _ string, rc syscall.RawConn) error {
		if !strings.HasPrefix(network, "tcp") {
			return nil
		}
		var serr error
		err := rc.Control(func(fd uintptr) { serr = setUserTimeout(int(fd), ms) })
		if err != nil {
			return err
		}
		return serr
	}
	return d
}
