package listen

import (
	"errors"

	"github.com/lockpool/lockpool/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

// Reasons of lockpool_listen_clients_closed_total.
const (
	ReasonListenerLost = "listener_lost" // counted by the hub, one per Lost call
	ReasonMaxPending   = "max_pending"   // counted by the proxy through CountClosed
)

// metrics are the hub's collectors. Gauges move by differences only, so
// hubs sharing a registry (the collectors are then shared) add up.
type metrics struct {
	clients   prometheus.Gauge
	channels  prometheus.Gauge
	conns     prometheus.Gauge
	delivered prometheus.Counter
	closed    *prometheus.CounterVec
}

// newMetrics makes the collectors and registers them on r (may be nil). A
// collector that cannot be registered is still counted, unexported, and the
// error is returned for the caller to log.
func newMetrics(r prometheus.Registerer) (*metrics, error) {
	var m metrics
	var errs []error
	reg := func(err error) { errs = append(errs, err) }
	var err error
	m.clients, err = promreg.Register(r, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "lockpool_listen_clients",
		Help: "Clients listening through a shared listener connection (subscribed to at least one channel).",
	}))
	reg(err)
	m.channels, err = promreg.Register(r, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "lockpool_listen_channels",
		Help: "Channels (per database) with at least one listening client.",
	}))
	reg(err)
	m.conns, err = promreg.Register(r, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "lockpool_listen_connections",
		Help: "Listener connections open (connecting, listening or closing), at most one live per database.",
	}))
	reg(err)
	m.delivered, err = promreg.Register(r, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lockpool_notifications_delivered_total",
		Help: "Notifications handed to listening clients (one per client and notification).",
	}))
	reg(err)
	m.closed, err = promreg.Register(r, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockpool_listen_clients_closed_total",
		Help: "Listening clients closed, by reason: listener_lost (their listener connection died), max_pending (they did not read their notifications).",
	}, []string{"reason"}))
	reg(err)
	m.closed.WithLabelValues(ReasonListenerLost)
	m.closed.WithLabelValues(ReasonMaxPending)
	return &m, errors.Join(errs...)
}
