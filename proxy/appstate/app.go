package appstate

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockpool/lockpool/config"
	"github.com/lockpool/lockpool/policy"
	"github.com/lockpool/lockpool/proxy/backend"
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
	a.Connected = m.clients.WithLabelValues(a.Cfg.Name)
	a.Pins = m.pins.WithLabelValues(a.Cfg.Name)
	a.Leaked = m.leaked.WithLabelValues(a.Cfg.Name)
	a.PrepHit = m.prepared.WithLabelValues(a.Cfg.Name, "hit")
	a.PrepMiss = m.prepared.WithLabelValues(a.Cfg.Name, "miss")
	a.PrepEvict = m.prepared.WithLabelValues(a.Cfg.Name, "eviction")
	a.PinnedGauge = m.pinned
	a.rejectedVec = m.rejected
	// Make every series visible at zero from the start, so dashboards and
	// alerts see 0 rather than no data.
	for _, reason := range backend.ProbeReasons {
		m.pinned.WithLabelValues(a.Cfg.Name, reason)
	}
	for f := rewrite.AdvisoryLock; f.SessionAcquire(); f++ {
		c := m.rejected.WithLabelValues(a.Cfg.Name, f.String())
		a.rejectedCache.Store(f.String(), c)
	}
	m.hold.Show(a.Cfg.Name)
}

// Rejected counts a call of fn refused by policy.
func (a *App) Rejected(fn string) {
	if c, ok := a.rejectedCache.Load(fn); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	c := a.rejectedVec.WithLabelValues(a.Cfg.Name, fn)
	a.rejectedCache.Store(fn, c)
	c.Inc()
}

// App is an application's configuration as the sessions use it.
type App struct {
	Cfg           config.Application
	Advisory      policy.Mode
	SessionState  policy.Mode
	Listen        policy.Mode // Shared, Pin or Reject
	SessionPool   bool
	Connected     prometheus.Gauge
	Pins          prometheus.Counter
	Leaked        prometheus.Counter
	PrepHit       prometheus.Counter
	PrepMiss      prometheus.Counter
	PrepEvict     prometheus.Counter
	PinnedGauge   *prometheus.GaugeVec
	Hold          *local.HoldApp // advisory_locks: hold metrics; nil under other policies
	rejectedVec   *prometheus.CounterVec
	rejectedCache sync.Map // function name -> prometheus.Counter
	clientCount   *atomic.Int64
	Stats         *Stats // SHOW STATS counters (stats.go)
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
	as := &App{Cfg: a, Advisory: adv, SessionState: st, Listen: lm, SessionPool: a.PoolMode == "session", clientCount: new(atomic.Int64), Stats: newStats()}
	if prev != nil {
		as.clientCount = prev.clientCount
		as.Stats = prev.Stats
	}
	m.bindApp(as)
	if adv == policy.Hold {
		as.Hold = m.hold.App(a.Name)
	}
	return as, nil
}

// AppTraffic is an application's traffic counters (SHOW STATS).
type AppTraffic struct {
	Since                          time.Time
	Xacts, Queries, Received, Sent int64
}

// Config returns the application's configuration.
func (a *App) Config() config.Application { return a.Cfg }

// Clients returns how many of the application's clients are logged in.
func (a *App) Clients() int64 { return a.clientCount.Load() }

// Admit counts one more logged-in client and reports whether it is within
// max_clients; when not, the count is as before.
func (a *App) Admit() bool {
	if n := a.clientCount.Add(1); a.Cfg.MaxClients > 0 && int(n) > a.Cfg.MaxClients {
		a.clientCount.Add(-1)
		return false
	}
	return true
}

// Unadmit counts one logged-in client fewer.
func (a *App) Unadmit() { a.clientCount.Add(-1) }

// Traffic returns the application's traffic counters, each read atomically.
func (a *App) Traffic() AppTraffic {
	st := a.Stats
	return AppTraffic{Since: st.since, Xacts: st.xacts.Load(), Queries: st.queries.Load(), Received: st.received.Load(), Sent: st.sent.Load()}
}

// NoteLeaked counts a server connection of the application the leak sweep
// closed because it held advisory locks.
func (a *App) NoteLeaked() { a.Leaked.Inc() }
