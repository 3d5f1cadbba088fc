package cluster

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the cluster's collectors:
//
//   - lockpool_cluster_slots{app} (gauge: the server connections this
//     instance holds of a cluster application's budget),
//   - lockpool_cluster_instances (gauge: live instances of the cluster as
//     this instance last saw them; 0 without a cluster).
type Metrics struct {
	slots     *prometheus.GaugeVec
	instances prometheus.Gauge
}

// NewMetrics registers the cluster collectors on reg (nil: unregistered),
// with lockpool_cluster_slots at 0 for each of apps. The proxy registers
// them whether or not a cluster is configured, so every series reads 0
// from the start.
func NewMetrics(reg prometheus.Registerer, apps ...string) *Metrics {
	m := &Metrics{
		slots: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "lockpool_cluster_slots",
			Help: "Server connections this instance holds of a cluster application's budget (budget_scope: cluster)."}, []string{"app"}),
		instances: prometheus.NewGauge(prometheus.GaugeOpts{Name: "lockpool_cluster_instances",
			Help: "Live lockpool instances of this instance's cluster (0 without a cluster)."}),
	}
	if reg != nil {
		reg.MustRegister(m.slots, m.instances)
	}
	for _, a := range apps {
		m.setSlots(a, 0)
	}
	return m
}

func (m *Metrics) setSlots(app string, n int) { m.slots.WithLabelValues(app).Set(float64(n)) }

func (m *Metrics) setInstances(n int) { m.instances.Set(float64(n)) }
