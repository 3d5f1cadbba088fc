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
		Help: "Times the primary changed from one host to another.",
	})}
	reg.MustRegister(x.failovers, &collector{m: m}, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "lockpool_split_brain",
		Help: "1 while more than one host claims to be the primary (lockpool then uses none of them), else 0.",
	}, func() float64 {
		if _, _, split, _ := m.Snapshot(); split {
			return 1
		}
		return 0
	}))
	return x
}

var (
	roleDesc = prometheus.NewDesc("lockpool_host_role",
		"1 for each host's current role: primary, standby, refused (claims to be a primary beside another: split brain), down or unknown (never answered).",
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
