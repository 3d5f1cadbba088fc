package hosts

import "github.com/prometheus/client_golang/prometheus"

// metrics are the monitor's collectors: lockpool_host_role{host,role} and
// lockpool_host_replay_lag_seconds{host} are read from the statuses at
// scrape time; lockpool_failovers_total counts primary changes and
// lockpool_split_brain is 1 while more than one host claims to be primary.
type metrics struct {
	failovers prometheus.Counter
}

// roleStates are the values of lockpool_host_role's role label.
var roleStates = []string{"primary", "standby", "refused", "down", "unknown"}

func newMetrics(reg prometheus.Registerer, m *Monitor) *metrics {
	x := &metrics{failovers: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockpool_failovers_total",
		Help: failoversHelp,
	})}
	reg.MustRegister(x.failovers, &collector{m: m}, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "lockpool_split_brain",
		Help: splitBrainHelp,
	}, func() float64 {
		if _, _, split, _ := m.Snapshot(); split {
			return 1
		}
		return 0
	}))
	return x
}

const (
	failoversHelp  = "Times the primary changed from one host to another."
	splitBrainHelp = "1 while more than one host claims to be the primary (lockpool then uses none of them), else 0."
)

var (
	roleDesc = prometheus.NewDesc("lockpool_host_role",
		"1 for each host's current role: primary, standby, refused (claims to be a primary beside another: split brain), down, unknown (not checked yet), or unchecked (lockpool follows one host and port without checks).",
		[]string{"host", "role"}, nil)
	lagDesc = prometheus.NewDesc("lockpool_host_replay_lag_seconds",
		"A standby's replay lag at its last check (0 for the primary and for a standby that replayed all it received).",
		[]string{"host"}, nil)
	connsDesc = prometheus.NewDesc("lockpool_host_server_connections",
		"The pools' server connections open to each host.",
		[]string{"host"}, nil)
)

// collector reads the statuses at scrape time.
type collector struct{ m *Monitor }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- roleDesc
	ch <- lagDesc
	ch <- connsDesc
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, h := range c.m.hosts {
		s := h.status.Load()
		state := s.State(0)
		name := h.addr.String()
		for _, r := range roleStates {
			v := 0.0
			if r == state {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(roleDesc, prometheus.GaugeValue, v, name, r)
		}
		ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, s.Lag.Seconds(), name)
		ch <- prometheus.MustNewConstMetric(connsDesc, prometheus.GaugeValue, float64(h.conns.Load()), name)
	}
}

// RegisterUnchecked registers the monitor's metrics for a lockpool that
// follows no hosts (one host and port, not checked): lockpool_host_role
// says role "unchecked" for it, conns gives its server connections, and
// lockpool_failovers_total and lockpool_split_brain stay 0. Dashboards
// and alerts then see the same series with or without server.hosts.
func RegisterUnchecked(reg prometheus.Registerer, addr string, conns func() float64) {
	reg.MustRegister(
		prometheus.NewCounter(prometheus.CounterOpts{Name: "lockpool_failovers_total", Help: failoversHelp}),
		prometheus.NewGauge(prometheus.GaugeOpts{Name: "lockpool_split_brain", Help: splitBrainHelp}),
		uncheckedCollector{addr: addr, conns: conns},
	)
}

type uncheckedCollector struct {
	addr  string
	conns func() float64
}

func (c uncheckedCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- roleDesc
	ch <- lagDesc
	ch <- connsDesc
}

func (c uncheckedCollector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range append(roleStates, "unchecked") {
		v := 0.0
		if r == "unchecked" {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(roleDesc, prometheus.GaugeValue, v, c.addr, r)
	}
	ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, 0, c.addr)
	ch <- prometheus.MustNewConstMetric(connsDesc, prometheus.GaugeValue, c.conns(), c.addr)
}
