package bgtask

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestTaskWarnsFirstAndEveryMinute(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := NewSet(reg, "sweep")
	task := s.Task("sweep")
	steps := []struct {
		name     string
		run      func() bool
		back     time.Duration // how far to move lastWarn into the past first
		want     bool
		failing  float64
		failures float64
	}{
		{"first failure warns", task.Failed, 0, true, 1, 1},
		{"second within a minute does not", task.Failed, 0, false, 1, 2},
		{"a minute later warns again", task.Failed, WarnEvery, true, 1, 3},
		{"a run that works says it recovered", task.OK, 0, true, 0, 3},
		{"another that works does not", task.OK, 0, false, 0, 3},
		{"a new failure warns at once", task.Failed, 0, true, 1, 4},
	}
	for _, st := range steps {
		task.mu.Lock()
		task.lastWarn = task.lastWarn.Add(-st.back)
		task.mu.Unlock()
		if got := st.run(); got != st.want {
			t.Errorf("%s: got %v, want %v", st.name, got, st.want)
		}
		if v := value(s.failing.WithLabelValues("sweep")); v != st.failing {
			t.Errorf("%s: failing = %v, want %v", st.name, v, st.failing)
		}
		if v := value(s.failures.WithLabelValues("sweep")); v != st.failures {
			t.Errorf("%s: failures = %v, want %v", st.name, v, st.failures)
		}
	}
}

func TestNilTask(t *testing.T) {
	var s *Set
	task := s.Task("x")
	for i := range 2 {
		if !task.Failed() {
			t.Errorf("failure %d: a nil Task must say to log every failure", i+1)
		}
	}
	if task.OK() {
		t.Error("a nil Task never recovers")
	}
}

// value is a gauge's or counter's value.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Gauge != nil {
		return d.Gauge.GetValue()
	}
	return d.Counter.GetValue()
}
