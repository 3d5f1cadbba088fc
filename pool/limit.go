package pool

import (
	"context"
	"errors"
	"time"

	"github.com/lockpool/lockpool/config"
)

// Limits a component outside the pool moves at run time (package cluster):
// an application's budgets may be lowered below the configured ones. The
// configured values stay the ceiling; a reconfiguration keeps the limit.

// limit is an application's run-time budget cap and the configured budgets
// it caps.
type limit struct {
	conns, pins       int // the caps
	cfgConns, cfgPins int // max_connections and max_pinned as configured
}

// SetLimit caps app's budgets at conns server connections and pins pin
// slots (never above the configured max_connections and max_pinned; 0
// lets no connection be opened or pinned). A lower cap closes idle
// connections above it at once and in-use ones at their release; pin
// slots above it are not taken away, only not granted again until the
// count is below it. Once SetLimit returns, the application's open count
// never rises above max(its count now, conns) — the cluster component
// relies on that to give slots back safely. A cap set before the
// application exists applies when it is added.
func (m *Manager) SetLimit(app string, conns, pins int) {
	var toClose []*Conn
	m.mu.Lock()
	if m.limits == nil {
		m.limits = make(map[string]limit)
	}
	l, had := m.limits[app]
	a := m.apps[app]
	if !had && a != nil {
		l.cfgConns, l.cfgPins = a.cfg.MaxConnections, a.cfg.MaxPinned
	}
	l.conns, l.pins = max(conns, 0), max(pins, 0)
	m.limits[app] = l
	if a != nil && !m.closed {
		m.applyLimitLocked(a, false)
		for a.open > a.cfg.MaxConnections && a.idleN > 0 {
			toClose = append(toClose, m.closeConnLocked(a.popOldestIdle()))
		}
		m.grantPinsLocked(a)
		if m.waiting > 0 {
			m.dispatchLocked()
		}
	}
	m.mu.Unlock()
	m.finishClose(toClose, true)
}

// Limit returns app's run-time caps (ok false when SetLimit was never
// called for it).
func (m *Manager) Limit(app string) (conns, pins int, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.limits[app]
	return l.conns, l.pins, ok
}

// applyLimitLocked caps a.cfg with a's limit. configured says a.cfg was
// just set from the configuration (its values become the ceiling).
func (m *Manager) applyLimitLocked(a *appPool, configured bool) {
	l, ok := m.limits[a.name]
	if !ok {
		return
	}
	if configured {
		l.cfgConns, l.cfgPins = a.cfg.MaxConnections, a.cfg.MaxPinned
		m.limits[a.name] = l
	}
	a.cfg.MaxConnections = min(l.cfgConns, l.conns)
	a.cfg.MaxPinned = min(l.cfgPins, l.pins)
}

// OnDial registers fn to be called with the application and backend pid of
// every server connection the pool opens, on the dialing goroutine, before
// the connection is counted in use or handed out (the cluster component
// records it in PostgreSQL). An error from fn closes the connection and
// fails the dial with that error. nil removes it.
func (m *Manager) OnDial(fn func(ctx context.Context, app string, pid uint32) error) {
	if fn == nil {
		m.onDial.Store(nil)
		return
	}
	m.onDial.Store(&fn)
}

// ErrDialGated wraps the error of a dial the DialGate hook refused (it is
// retried within the application's wait_timeout like a failed dial, and
// does not count as PostgreSQL being unreachable).
var ErrDialGated = errors.New("pool: opening a server connection is not allowed now")

// DialGate registers fn, asked before every dial attempt (retries
// included) of any application: an error refuses the attempt (wrapped in
// ErrDialGated) before any connection to PostgreSQL is made; a non-zero
// deadline bounds the attempt (the login must finish by then). The cluster
// component opens the gate only while its heartbeat is fresh and its row
// is in place, and ends every attempt before the others could take the
// instance for dead. fn must not block; nil removes it.
func (m *Manager) DialGate(fn func(app string) (deadline time.Time, err error)) {
	if fn == nil {
		m.gate.Store(nil)
		return
	}
	m.gate.Store(&fn)
}

// gatedDial is one dial attempt through the DialGate hook.
func (m *Manager) gatedDial(ctx context.Context, srv config.Server, cfg AppConfig, database string) (*Conn, error) {
	if f := m.gate.Load(); f != nil {
		deadline, err := (*f)(cfg.Name)
		if err != nil {
			return nil, errors.Join(ErrDialGated, err)
		}
		if !deadline.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline)
			defer cancel()
		}
	}
	return m.dial(ctx, srv, cfg, database)
}
