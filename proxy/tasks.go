package proxy

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// taskWarnEvery is how often a background task that keeps failing is
// logged at WARN again.
const taskWarnEvery = time.Minute

// taskHealth is what lockpool knows of its background tasks that log in
// to PostgreSQL (the leak sweep): whether each is failing, logged at WARN
// when it starts failing and again at least every taskWarnEvery while it
// goes on, and counted in lockpool_background_task_failing and
// lockpool_background_task_failures_total{task}. Safe for concurrent use.
type taskHealth struct {
	log      *slog.Logger
	failing  *prometheus.GaugeVec
	failures *prometheus.CounterVec

	titles map[string]string // task → what its log lines call it

	mu     sync.Mutex
	warned map[string]time.Time // task → last WARN, while failing
}

// newTaskHealth returns the health of tasks: metric label → the title its
// log lines start with ("leak sweep": "leak sweep failed").
func newTaskHealth(log *slog.Logger, reg prometheus.Registerer, tasks map[string]string) *taskHealth {
	t := &taskHealth{
		log: log,
		failing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lockpool_background_task_failing", Help: "1 while the last run of a background task failed (leak_sweep), else 0.",
		}, []string{"task"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockpool_background_task_failures_total", Help: "Failed runs of a background task.",
		}, []string{"task"}),
		titles: tasks,
		warned: make(map[string]time.Time),
	}
	for name := range tasks {
		t.failing.WithLabelValues(name)
		t.failures.WithLabelValues(name)
	}
	if reg != nil {
		reg.MustRegister(t.failing, t.failures)
	}
	return t
}

// failed records a failed run of task: WARN with err when it starts
// failing and then every taskWarnEvery, DEBUG in between.
func (t *taskHealth) failed(task string, err error) {
	t.failing.WithLabelValues(task).Set(1)
	t.failures.WithLabelValues(task).Inc()
	now := time.Now()
	t.mu.Lock()
	last, was := t.warned[task]
	warn := !was || now.Sub(last) >= taskWarnEvery
	if warn {
		t.warned[task] = now
	}
	t.mu.Unlock()
	if warn {
		t.log.Warn(t.titles[task]+" failed", "err", err, "still", was)
		return
	}
	t.log.Debug(t.titles[task]+" failed again", "err", err)
}

// ok records a run of task that worked; after failures it logs so.
func (t *taskHealth) ok(task string) {
	t.failing.WithLabelValues(task).Set(0)
	t.mu.Lock()
	_, was := t.warned[task]
	delete(t.warned, task)
	t.mu.Unlock()
	if was {
		t.log.Info(t.titles[task] + " works again")
	}
}
