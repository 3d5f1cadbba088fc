package lease

import (
	"github.com/lockpool/lockpool/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

// Operation and result label values of lockpool_lease_operations_total.
const (
	OpAcquire     = "acquire"
	OpRenew       = "renew"
	OpRelease     = "release"
	OpList        = "list"
	OpKeeperRenew = "keeper_renew"

	ResultOK       = "ok"
	ResultNotHeld  = "not_held"
	ResultError    = "error"
	ResultLost     = "lost"
	ResultTimeout  = "timeout"
	ResultCanceled = "canceled"
)

type metrics struct {
	held prometheus.Gauge
	ops  *prometheus.CounterVec
	wait prometheus.Histogram
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	var m metrics
	var err error
	if m.held, err = promreg.Register(r, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "lockpool_leases_held",
		Help: "Leases currently held by this instance's sessions.",
	})); err != nil {
		return nil, err
	}
	if m.ops, err = promreg.Register(r, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockpool_lease_operations_total",
		Help: "Lease operations by operation (acquire, renew, release, list, keeper_renew) and result (ok, not_held, error, lost, timeout, canceled).",
	}, []string{"op", "result"})); err != nil {
		return nil, err
	}
	if m.wait, err = promreg.Register(r, prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "lockpool_lease_acquire_wait_seconds",
		Help:    "Time spent in lease_acquire calls with wait_seconds > 0, whatever the outcome.",
		Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
	})); err != nil {
		return nil, err
	}
	for _, op := range []string{OpAcquire, OpRenew, OpRelease, OpList, OpKeeperRenew} {
		m.ops.WithLabelValues(op, ResultOK)
		m.ops.WithLabelValues(op, ResultError)
	}
	m.ops.WithLabelValues(OpAcquire, ResultNotHeld)
	m.ops.WithLabelValues(OpAcquire, ResultTimeout)
	m.ops.WithLabelValues(OpRenew, ResultLost)
	m.ops.WithLabelValues(OpRenew, ResultNotHeld)
	m.ops.WithLabelValues(OpRelease, ResultNotHeld)
	m.ops.WithLabelValues(OpKeeperRenew, ResultLost)
	return &m, nil
}

func (m *metrics) op(op, result string) { m.ops.WithLabelValues(op, result).Inc() }
