package bgtask

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The tasks' names, the task label of their metrics.
const (
	LeakSweep    = "leak_sweep"    // proxy: idle connections' hidden advisory locks
	Cluster      = "cluster"       // cluster: the coordinator's heartbeat
	Listen       = "listen"        // listen: opening the LISTEN connections of clients
	LeaseRenewal = "lease_renewal" // lease: the keeper's renewals
	LeaseListen  = "lease_listen"  // lease: the connection that wakes lease waiters
)

// WarnEvery is how often a task that keeps failing is logged at WARN
// again.
const WarnEvery = time.Minute

// Set is the metrics of lockpool's background tasks.
type Set struct {
	failing  *prometheus.GaugeVec
	failures *prometheus.CounterVec
}

// NewSet returns the metrics of the tasks named, registered with reg
// (nil: not registered), every series visible at zero from the start.
func NewSet(reg prometheus.Registerer, tasks ...string) *Set {
	s := &Set{
		failing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lockpool_background_task_failing",
			Help: "1 while the last run of a background task that logs in to PostgreSQL failed, else 0.",
		}, []string{"task"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockpool_background_task_failures_total",
			Help: "Failed runs of a background task that logs in to PostgreSQL.",
		}, []string{"task"}),
	}
	for _, t := range tasks {
		s.failing.WithLabelValues(t)
		s.failures.WithLabelValues(t)
	}
	if reg != nil {
		reg.MustRegister(s.failing, s.failures)
	}
	return s
}

// Task returns the task called name (its metrics' label). A nil Set gives
// a nil Task.
func (s *Set) Task(name string) *Task {
	if s == nil {
		return nil
	}
	return &Task{failing: s.failing.WithLabelValues(name), failures: s.failures.WithLabelValues(name)}
}

// Task is one background task's failure state. Safe for concurrent use.
type Task struct {
	failing  prometheus.Gauge
	failures prometheus.Counter

	mu       sync.Mutex
	down     bool      // the last run failed
	lastWarn time.Time // when Failed last said to WARN
}

// Failed records a failed run and reports whether to log it at WARN: the
// first failure after a run that worked, and then once every WarnEvery.
// Otherwise the task logs it at DEBUG.
func (t *Task) Failed() (warn bool) {
	if t == nil {
		return true
	}
	t.failing.Set(1)
	t.failures.Inc()
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	warn = !t.down || now.Sub(t.lastWarn) >= WarnEvery
	t.down = true
	if warn {
		t.lastWarn = now
	}
	return warn
}

// OK records a run that worked and reports whether the task was failing
// before it (the task then logs that it works again).
func (t *Task) OK() (recovered bool) {
	if t == nil {
		return false
	}
	t.failing.Set(0)
	t.mu.Lock()
	defer t.mu.Unlock()
	recovered, t.down = t.down, false
	return recovered
}
