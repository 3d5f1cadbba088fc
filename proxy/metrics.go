package proxy

import (
	"github.com/lockpool/lockpool/proxy/local"
	"github.com/lockpool/lockpool/rewrite"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics holds the collectors the proxy owns. With a nil Registerer they
// still work, unregistered.
type metrics struct {
	clients  *prometheus.GaugeVec
	pinned   *prometheus.GaugeVec
	pins     *prometheus.CounterVec
	rejected *prometheus.CounterVec
	leaked   *prometheus.CounterVec
	prepared *prometheus.CounterVec

	hold *local.HoldMetrics // advisory_locks: hold
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		clients: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lockpool_client_connections", Help: "Client connections logged in, by application.",
		}, []string{"app"}),
		pinned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lockpool_pinned_sessions", Help: "Sessions pinned to a server connection, by application and what pins them.",
		}, []string{"app", "reason"}),
		pins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockpool_pins_total", Help: "Times a session became pinned, by application.",
		}, []string{"app"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockpool_advisory_locks_rejected_total", Help: "Session-level advisory lock calls rejected by policy, by application and function.",
		}, []string{"app", "function"}),
		leaked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockpool_leaked_locks_total", Help: "Idle server connections closed by the leak sweep because they held advisory locks.",
		}, []string{"app"}),
		prepared: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockpool_prepared_statements_total", Help: "Named prepared statements needed on a server connection: hit (already there), miss (prepared there), eviction (closed to stay within max_prepared_statements).",
		}, []string{"app", "result"}),
	}
	m.hold = local.NewHoldMetrics()
	if reg != nil {
		reg.MustRegister(m.clients, m.pinned, m.pins, m.rejected, m.leaked, m.prepared)
		reg.MustRegister(m.hold.Collectors()...)
	}
	return m
}

// bindApp precomputes the children the hot path touches.
func (m *metrics) bindApp(a *appState) {
	a.clients = m.clients.WithLabelValues(a.cfg.Name)
	a.pins = m.pins.WithLabelValues(a.cfg.Name)
	a.leaked = m.leaked.WithLabelValues(a.cfg.Name)
	a.prepHit = m.prepared.WithLabelValues(a.cfg.Name, "hit")
	a.prepMiss = m.prepared.WithLabelValues(a.cfg.Name, "miss")
	a.prepEvict = m.prepared.WithLabelValues(a.cfg.Name, "eviction")
	a.pinnedGauge = m.pinned
	a.rejectedVec = m.rejected
	// Make every series visible at zero from the start, so dashboards and
	// alerts see 0 rather than no data.
	for _, reason := range probeReasons {
		m.pinned.WithLabelValues(a.cfg.Name, reason)
	}
	for f := rewrite.AdvisoryLock; f.SessionAcquire(); f++ {
		c := m.rejected.WithLabelValues(a.cfg.Name, f.String())
		a.rejectedCache.Store(f.String(), c)
	}
	m.hold.Show(a.cfg.Name)
}

func (a *appState) rejected(fn string) {
	if c, ok := a.rejectedCache.Load(fn); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	c := a.rejectedVec.WithLabelValues(a.cfg.Name, fn)
	a.rejectedCache.Store(fn, c)
	c.Inc()
}
