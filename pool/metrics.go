package pool

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

type pinOutcome int

const (
	pinImmediate pinOutcome = iota
	pinWaited
	pinTimeout
	pinCanceled
	numPinOutcomes
)

var pinOutcomeNames = [numPinOutcomes]string{"immediate", "waited", "timeout", "canceled"}

// waitBuckets cover an immediate grant (first bucket) up to long waits.
var waitBuckets = []float64{0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

type metrics struct {
	wait         *prometheus.HistogramVec
	pins         *prometheus.CounterVec
	waitTimeouts *prometheus.CounterVec
	unreachable  prometheus.Gauge
}

// appMetrics holds one application's precomputed children; the zero value
// (no registerer) does nothing.
type appMetrics struct {
	wait         prometheus.Observer
	pins         [numPinOutcomes]prometheus.Counter
	waitTimeouts prometheus.Counter
}

func (am *appMetrics) observeWait(d time.Duration) {
	if am.wait != nil {
		am.wait.Observe(d.Seconds())
	}
}

func (am *appMetrics) waitTimedOut() {
	if am.waitTimeouts != nil {
		am.waitTimeouts.Inc()
	}
}

func (am *appMetrics) pinOutcome(o pinOutcome) {
	if c := am.pins[o]; c != nil {
		c.Inc()
	}
}

func newMetrics(reg prometheus.Registerer, m *Manager) (*metrics, error) {
	mt := &metrics{
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "lockpool_pool_wait_seconds",
			Help:    "Time an Acquire spent queued for a server connection (0 when served at once).",
			Buckets: waitBuckets,
		}, []string{"app"}),
		pins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockpool_pin_waits_total",
			Help: "Pin slot requests by outcome: immediate, waited, timeout, canceled.",
		}, []string{"app", "outcome"}),
	}
	mt.waitTimeouts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lockpool_pool_wait_timeouts_total",
		Help: "Acquires that waited wait_timeout for a server connection and gave up (the client got 53300).",
	}, []string{"app"})
	mt.unreachable = newUnreachableGauge()
	cs := []prometheus.Collector{&waitCollector{vec: mt.wait, m: m}, mt.pins, mt.waitTimeouts, mt.unreachable, &connCollector{m: m}}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, r := range cs[:i] {
				reg.Unregister(r)
			}
			return nil, errors.Join(errors.New("pool: registering metrics"), err)
		}
	}
	return mt, nil
}

func (mt *metrics) forApp(app string) appMetrics {
	am := appMetrics{wait: mt.wait.WithLabelValues(app), waitTimeouts: mt.waitTimeouts.WithLabelValues(app)}
	for i := range am.pins {
		am.pins[i] = mt.pins.WithLabelValues(app, pinOutcomeNames[i])
	}
	return am
}

// waitCollector is lockpool_pool_wait_seconds: the histogram of the waits
// observed (Acquire's, queued or not), plus each application's immediate
// grants (AcquireIdle's, counted under the manager's lock with no atomic
// operation), which it adds at scrape time as waits of zero: to the count
// and to every bucket, nothing to the sum.
type waitCollector struct {
	vec *prometheus.HistogramVec
	m   *Manager
}

func (wc *waitCollector) Describe(ch chan<- *prometheus.Desc) { wc.vec.Describe(ch) }

func (wc *waitCollector) Collect(ch chan<- prometheus.Metric) {
	immediate := make(map[string]uint64)
	wc.m.mu.Lock()
	for _, a := range wc.m.appList {
		immediate[a.name] += uint64(a.immediate)
	}
	wc.m.mu.Unlock()
	got := make(chan prometheus.Metric)
	go func() {
		wc.vec.Collect(got)
		close(got)
	}()
	for pm := range got {
		var d dto.Metric
		if err := pm.Write(&d); err != nil || d.Histogram == nil {
			ch <- pm
			continue
		}
		app := ""
		for _, lp := range d.Label {
			if lp.GetName() == "app" {
				app = lp.GetValue()
			}
		}
		n, h := immediate[app], d.Histogram
		if n == 0 {
			ch <- pm
			continue
		}
		buckets := make(map[float64]uint64, len(h.Bucket))
		for _, b := range h.Bucket {
			buckets[b.GetUpperBound()] = b.GetCumulativeCount() + n
		}
		ch <- prometheus.MustNewConstHistogram(pm.Desc(), h.GetSampleCount()+n, h.GetSampleSum(), buckets, app)
	}
}

var (
	connDesc = prometheus.NewDesc("lockpool_server_connections",
		"Server connections opened by the pools, by application and state (idle|active; active = open - idle).",
		[]string{"app", "state"}, nil)
	maxConnDesc = prometheus.NewDesc("lockpool_pool_max_connections",
		"The application's max_connections (its budget of server connections), as configured now.",
		[]string{"app"}, nil)
	maxPinnedDesc = prometheus.NewDesc("lockpool_pool_max_pinned",
		"The application's max_pinned (its pin slots), as configured now.",
		[]string{"app"}, nil)
)

// connCollector reads the counts and the budgets under the manager's lock
// at scrape time.
type connCollector struct{ m *Manager }

func (cc *connCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- connDesc
	ch <- maxConnDesc
	ch <- maxPinnedDesc
}

func (cc *connCollector) Collect(ch chan<- prometheus.Metric) {
	type row struct {
		app              string
		idle, active     int
		maxConn, maxPins int
		removed          bool
	}
	m := cc.m
	m.mu.Lock()
	rows := make([]row, 0, len(m.appList))
	for _, a := range m.appList {
		if a.removed && a.open == 0 {
			continue
		}
		rows = append(rows, row{a.name, a.idleN, a.open - a.idleN, a.cfg.MaxConnections, a.cfg.MaxPinned, a.removed})
	}
	m.mu.Unlock()
	for _, r := range rows {
		ch <- prometheus.MustNewConstMetric(connDesc, prometheus.GaugeValue, float64(r.idle), r.app, "idle")
		ch <- prometheus.MustNewConstMetric(connDesc, prometheus.GaugeValue, float64(r.active), r.app, "active")
		if !r.removed {
			ch <- prometheus.MustNewConstMetric(maxConnDesc, prometheus.GaugeValue, float64(r.maxConn), r.app)
			ch <- prometheus.MustNewConstMetric(maxPinnedDesc, prometheus.GaugeValue, float64(r.maxPins), r.app)
		}
	}
}
