package pool

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
)

// reachability tracks whether PostgreSQL accepts lockpool's connections, so
// an outage is logged twice (when it starts and when it ends), not once per
// failed dial, and lockpool_server_unreachable shows it.
type reachability struct {
	mu     sync.Mutex
	down   bool
	since  time.Time
	failed int // failed attempts since the outage started
}

// Unreachable reports whether err means PostgreSQL cannot be reached or
// does not accept connections now (refused, reset, timed out, starting up,
// shutting down, too many connections), as opposed to a login PostgreSQL
// refused for this role (password, database, permissions).
func Unreachable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "57P01", "57P02", "57P03", "53300", "08006", "08001", "08004":
			return true
		}
		return false
	}
	return true
}

// ServerReached records the outcome of an attempt to connect to PostgreSQL
// (a pool dial, or one of lockpool's own connections: source names it). The
// first failure that means PostgreSQL is unreachable (see [Unreachable])
// logs "PostgreSQL unreachable" at WARN with its cause; the first success
// after that logs "PostgreSQL reachable again" at INFO. Failures of a login
// PostgreSQL refused (a wrong password) do not count.
func (m *Manager) ServerReached(source string, err error) {
	if err != nil && !Unreachable(err) {
		return
	}
	r := &m.reach
	r.mu.Lock()
	switch {
	case err != nil && !r.down:
		r.down, r.since, r.failed = true, m.now(), 1
		r.mu.Unlock()
		if m.metrics != nil {
			m.metrics.unreachable.Set(1)
		}
		m.log.Warn("PostgreSQL unreachable", "source", source, "server", m.serverAddr(), "err", err)
		return
	case err != nil:
		r.failed++
		r.mu.Unlock()
		return
	case r.down:
		downFor, failed := m.now().Sub(r.since), r.failed
		r.down = false
		r.mu.Unlock()
		if m.metrics != nil {
			m.metrics.unreachable.Set(0)
		}
		m.log.Info("PostgreSQL reachable again", "source", source, "server", m.serverAddr(),
			"down_for", downFor.Round(time.Millisecond).String(), "failed_attempts", failed)
		return
	}
	r.mu.Unlock()
}

// serverAddr is the configured server as host:port (or socket directory).
func (m *Manager) serverAddr() string {
	m.mu.Lock()
	srv := m.server
	m.mu.Unlock()
	_, addr := serverNetwork(srv)
	return addr
}

func newUnreachableGauge() prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "lockpool_server_unreachable",
		Help: "1 while PostgreSQL does not accept lockpool's connections (from the last failed dial until one succeeds), else 0.",
	})
}
