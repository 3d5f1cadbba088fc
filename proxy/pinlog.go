package proxy

import (
	"context"
	"time"
)

// pinLogLoop logs, once per pin, every session pinned longer than
// log_pins_over, with what pins it (as RDS Proxy logs a pinned session). It
// runs beside the sessions and only reads their server links' views, so the
// session path pays nothing for it.
func (s *Server) pinLogLoop(ctx context.Context) {
	logged := map[uint32]time.Time{} // session pid -> pinnedSince of the pin already logged
	for {
		over := s.rc.Load().cfg.LogPinsOver
		t := time.NewTimer(pinLogInterval(over))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if over > 0 {
			s.logLongPins(time.Now(), over, logged)
		}
	}
}

// pinLogInterval is how often the sessions are looked at: a quarter of
// log_pins_over, between 50 ms and 5 s (5 s while it is off, to notice a
// reload).
func pinLogInterval(over time.Duration) time.Duration {
	if over <= 0 {
		return 5 * time.Second
	}
	return min(max(over/4, 50*time.Millisecond), 5*time.Second)
}

// longPin is one pin held longer than log_pins_over.
type longPin struct {
	pid                         uint32
	app, user, database, client string
	reason                      string
	backendPID                  uint32
	since                       time.Time
}

// logLongPins logs the pins held longer than over at now that logged does
// not list yet, and forgets the pins that ended.
func (s *Server) logLongPins(now time.Time, over time.Duration, logged map[uint32]time.Time) {
	var found []longPin
	s.mu.Lock()
	for pid, ss := range s.sessions {
		l := ss.Link() // only the link: this runs for every session several times a second
		if !l.Attached || l.PinReason == "" || l.PinnedSince.IsZero() {
			continue
		}
		found = append(found, longPin{pid: pid, app: ss.App().Name, user: ss.User(), database: ss.Database(), client: ss.Remote(),
			reason: l.PinReason, backendPID: l.BackendPID, since: l.PinnedSince})
	}
	s.mu.Unlock()
	current := make(map[uint32]time.Time, len(found))
	for _, p := range found {
		current[p.pid] = p.since
		if now.Sub(p.since) < over || logged[p.pid].Equal(p.since) {
			continue
		}
		logged[p.pid] = p.since
		s.log.Info("session pinned longer than log_pins_over", "app", p.app, "user", p.user, "database", p.database,
			"client", p.client, "reason", p.reason, "backend_pid", p.backendPID,
			"pinned_for", now.Sub(p.since).Round(time.Millisecond).String(), "log_pins_over", over.String())
	}
	for pid, since := range logged {
		if !current[pid].Equal(since) {
			delete(logged, pid)
		}
	}
}
