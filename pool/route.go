package pool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/hosts"
	"github.com/lockpool/lockpool/internal/pgerr"
)

// Routing. With Options.Hosts set, every dial asks the monitor where the
// application's target is (hosts.Monitor.Route, waiting within the
// application's wait_timeout), every connection remembers its endpoint,
// and a connection is handed out (or kept idle) only while the monitor
// finds it usable for its application's target. Without Options.Hosts the
// pool dials server.host and port, as ever.

// errWrongRole is a dial that reached a host in another role than the
// monitor last saw; the dial is retried once the monitor checked again.
var errWrongRole = errors.New("pool: the host is not in the role the monitor saw")

// routeDial picks the host for one dial attempt of cfg: srv at the chosen
// host, and its endpoint. deadline bounds the wait for a host.
func (m *Manager) routeDial(ctx context.Context, srv config.Server, cfg AppConfig, deadline time.Time) (config.Server, hosts.Endpoint, error) {
	if m.hosts == nil {
		return srv, hosts.Endpoint{}, nil
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	ep, err := m.hosts.Route(rctx, cfg.Target)
	if err != nil {
		if ctx.Err() != nil {
			return srv, ep, ctx.Err()
		}
		return srv, ep, err
	}
	return srv.At(ep.Addr()), ep, nil
}

// checkRole verifies a new connection is in the role its endpoint was
// chosen for, from the in_hot_standby setting PostgreSQL (14 and later)
// reports at login: a switchover within the last check interval must not
// start a transaction on a host that became a standby.
func (m *Manager) checkRole(c *Conn, ep hosts.Endpoint, t hosts.Target) error {
	if m.hosts == nil {
		return nil
	}
	standby, known := c.StartupParams["in_hot_standby"]
	if !known {
		return nil
	}
	isStandby := standby == "on"
	primary := ep.Host.Status().Role == hosts.RolePrimary
	if isStandby == primary {
		m.hosts.CheckNow()
		return fmt.Errorf("%w: %s (in_hot_standby %s)", errWrongRole, ep.Addr(), standby)
	}
	return nil
}

// usable reports whether c may start a transaction for its application.
// It reads only atomics (the application's target is kept in one, as
// Reconfigure may change it), so the caller may or may not hold m.mu.
func (m *Manager) usable(c *Conn) bool {
	return m.hosts == nil || c.ep.Host == nil || m.hosts.Usable(c.ep, *c.pool.target.Load())
}

// finalDial reports whether a dial error must not be retried: the
// monitor's own answer (no host within the wait) is the client's error.
func finalDial(err error) bool {
	var pe *pgerr.Error
	return errors.As(err, &pe)
}

// noStandby reports whether err is the monitor's answer to an application
// of target standby that no standby is within max_lag: no dial was made,
// and the primary may well answer, so it is not PostgreSQL being
// unreachable (ServerReached). The other targets can use the primary: the
// monitor finding none for them is.
func noStandby(err error, t hosts.Target) bool {
	return t.Kind == config.TargetStandby && finalDial(err)
}

// Revalidate closes the idle connections the monitor no longer finds
// usable, and ends the in-use ones whose host changed generation (it
// stopped being the primary, changed role, or takes part in a split
// brain): their sockets are shut down, so their sessions see the server
// connection end (Conn.Retired tells them why). The exception is a standby
// promoted to be the primary: a session on it goes on as a direct session
// to it would, and its connection is closed when it comes back idle.
// hosts.Monitor's OnChange calls it.
func (m *Manager) Revalidate() {
	if m.hosts == nil {
		return
	}
	primary, hasPrimary := m.hosts.KnownPrimary()
	var toClose []*Conn
	var kill []*Conn
	m.mu.Lock()
	for _, a := range m.appList {
		for _, c := range a.takeAllIdle() {
			toClose = append(toClose, m.putBackLocked(c, true)...) // closes the unusable ones
		}
	}
	for c := range m.live {
		if c.state == stateClosed {
			delete(m.live, c) // an evicted conn, closed outside finishClose
			continue
		}
		if c.state == stateInUse && c.ep.Host != nil && c.ep.Host.Status().Gen != c.ep.Gen &&
			!(c.ep.Standby && hasPrimary && c.ep.Addr() == primary) {
			kill = append(kill, c)
		}
	}
	for _, c := range kill {
		c.retired.Store(true)
	}
	m.mu.Unlock()
	for _, c := range kill {
		c.kill.pull() // after a close, the duplicate is gone and this does nothing
	}
	if len(toClose)+len(kill) > 0 {
		m.log.Info("pool: server connections of a replaced host closed", "idle", len(toClose), "in_use", len(kill))
	}
	m.finishClose(toClose, true)
}

// Retired reports whether the pool ended c because its host stopped being
// what the application targets (a new primary, a role change, a split
// brain): the session's FATAL says so.
func (c *Conn) Retired() bool { return c.retired.Load() }

// onPrimary reports whether c is a connection to the primary (or lockpool
// follows one host): SweepIdle's check reads the primary's pg_locks.
func (m *Manager) onPrimary(c *Conn) bool {
	if m.hosts == nil || c.ep.Host == nil {
		return true
	}
	st := c.ep.Host.Status()
	return st.Role == hosts.RolePrimary && !st.Refused && st.Gen == c.ep.Gen
}
