package pool

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// pauseState is which applications are paused (the admin console's PAUSE):
// their Acquire calls wait until RESUME. Guarded by Manager.mu.
type pauseState struct {
	on   atomic.Bool     // anything is paused: Acquire looks no further when not
	all  bool            // every application is paused
	apps map[string]bool // applications paused by name (while !all)
	// resumed is closed and replaced at every Resume: paused waiters wait
	// on it, then look again.
	resumed chan struct{}
}

// Pause makes new Acquire calls of app (every application when app is "")
// wait until Resume. Connections already handed out are not touched. The
// error wraps ErrUnknownApp for an application that is not configured.
func (m *Manager) Pause(app string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if app == "" {
		m.pause.all = true
		clear(m.pause.apps)
	} else {
		if a := m.apps[app]; a == nil || a.removed {
			return fmt.Errorf("%w %q", ErrUnknownApp, app)
		}
		if m.pause.apps == nil {
			m.pause.apps = make(map[string]bool)
		}
		m.pause.apps[app] = true
	}
	if m.pause.resumed == nil {
		m.pause.resumed = make(chan struct{})
	}
	m.pause.on.Store(true)
	return nil
}

// Resume ends a Pause of app (of everything when app is ""): its waiting
// Acquire calls go on. Resuming one application while all are paused
// leaves the others paused.
func (m *Manager) Resume(app string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case app == "":
		m.pause.all = false
		clear(m.pause.apps)
	case m.apps[app] == nil || m.apps[app].removed:
		return fmt.Errorf("%w %q", ErrUnknownApp, app)
	case m.pause.all:
		m.pause.all = false
		if m.pause.apps == nil {
			m.pause.apps = make(map[string]bool)
		}
		for name, a := range m.apps {
			if name != app && !a.removed {
				m.pause.apps[name] = true
			}
		}
	default:
		delete(m.pause.apps, app)
	}
	m.pause.on.Store(m.pause.all || len(m.pause.apps) > 0)
	if m.pause.resumed != nil {
		close(m.pause.resumed)
		m.pause.resumed = make(chan struct{})
	}
	return nil
}

// Paused reports whether app's new Acquire calls wait for Resume.
func (m *Manager) Paused(app string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pausedLocked(app)
}

func (m *Manager) pausedLocked(app string) bool {
	return !m.closed && (m.pause.all || m.pause.apps[app])
}

// waitResumed waits while app is paused, up to its WaitTimeout (the error
// wraps ErrWaitTimeout) or ctx. It returns how long it waited. The waiter
// counts as waiting in Stats and DatabaseStats meanwhile. Close ends the
// wait (Acquire then returns ErrClosed).
func (m *Manager) waitResumed(ctx context.Context, app, database string) (time.Duration, error) {
	if !m.pause.on.Load() {
		return 0, nil
	}
	m.mu.Lock()
	a := m.apps[app]
	if a == nil || !m.pausedLocked(app) {
		m.mu.Unlock()
		return 0, nil
	}
	start := time.Now()
	w := &waiter{seq: m.nextSeq(), app: a, db: database, since: start}
	a.pauseWaiters.push(w)
	ch, timeout := m.pause.resumed, a.cfg.WaitTimeout
	m.mu.Unlock()

	timerC, stop := timeoutChan(timeout)
	defer stop()
	for {
		var err error
		select {
		case <-ch:
		case <-m.stopJanitor: // Close
		case <-ctx.Done():
			err = fmt.Errorf("pool: waiting for application %q to be resumed: %w", app, ctx.Err())
		case <-timerC:
			err = fmt.Errorf("%w (application %q is paused, waited %s)", ErrWaitTimeout, app, timeout)
		}
		m.mu.Lock()
		if err == nil && m.pausedLocked(app) {
			ch = m.pause.resumed // paused again (or another application resumed)
			m.mu.Unlock()
			continue
		}
		a.pauseWaiters.remove(w)
		m.mu.Unlock()
		waited := time.Since(start)
		if err != nil {
			a.observeWait(waited)
		}
		return waited, err
	}
}
