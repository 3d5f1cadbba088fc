package session

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/policy"
	"github.com/lockpool/lockpool/proxy/local"
	"github.com/lockpool/lockpool/rewrite"
)

// Metrics holds the collectors of the sessions' metrics. With a nil
// Registerer they still work, unregistered.
type Metrics struct {
	clients  *prometheus.GaugeVec
	pinned   *prometheus.GaugeVec
	pins     *prometheus.CounterVec
	rejected *prometheus.CounterVec
	leaked   *prometheus.CounterVec
	prepared *prometheus.CounterVec

	hold *local.HoldMetrics // advisory_locks: hold
}

// NewMetrics makes the collectors and registers them with reg (nil: none).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
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
func (m *Metrics) bindApp(a *App) {
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

// rejected counts a call of fn refused by policy.
func (a *App) rejected(fn string) {
	if c, ok := a.rejectedCache.Load(fn); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	c := a.rejectedVec.WithLabelValues(a.cfg.Name, fn)
	a.rejectedCache.Store(fn, c)
	c.Inc()
}

// App is an application's configuration as the sessions use it.
type App struct {
	cfg           config.Application
	advisory      policy.Mode
	sessionState  policy.Mode
	listen        policy.Mode // Shared, Pin or Reject
	sessionPool   bool
	clients       prometheus.Gauge
	pins          prometheus.Counter
	leaked        prometheus.Counter
	prepHit       prometheus.Counter
	prepMiss      prometheus.Counter
	prepEvict     prometheus.Counter
	pinnedGauge   *prometheus.GaugeVec
	hold          *local.HoldApp // advisory_locks: hold metrics; nil under other policies
	rejectedVec   *prometheus.CounterVec
	rejectedCache sync.Map // function name -> prometheus.Counter
	clientCount   *atomic.Int64
	stats         *appStats // SHOW STATS counters (appstats.go)
}

// NewApp makes an application's state from its configuration; prev is
// its state before a reload (nil: none), whose logged-in clients and
// traffic counters carry over.
func NewApp(a config.Application, m *Metrics, prev *App) (*App, error) {
	adv, err := policy.ParseMode(a.AdvisoryLocks)
	if err != nil {
		return nil, err
	}
	st, err := policy.ParseMode(a.SessionState)
	if err != nil {
		return nil, err
	}
	lm, err := policy.ParseMode(a.Listen)
	if err != nil {
		return nil, err
	}
	if a.Listen == "" {
		lm = policy.Shared
	}
	as := &App{cfg: a, advisory: adv, sessionState: st, listen: lm, sessionPool: a.PoolMode == "session", clientCount: new(atomic.Int64), stats: newAppStats()}
	if prev != nil {
		as.clientCount = prev.clientCount
		as.stats = prev.stats
	}
	m.bindApp(as)
	if adv == policy.Hold {
		as.hold = m.hold.App(a.Name)
	}
	return as, nil
}
