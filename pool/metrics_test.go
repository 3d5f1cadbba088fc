package pool

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// gathered returns the value of the counter or gauge series name with the
// label app=app.
func gathered(t *testing.T, reg *prometheus.Registry, name, app string) (float64, bool) {
	t.Helper()
	for _, s := range gatherSeries(t, reg, name) {
		if v, ok := s.labels["app"]; ok && v == app && (s.counter != nil || s.gauge != nil) {
			return s.value(), true
		}
	}
	return 0, false
}

func TestBudgetAndTimeoutMetrics(t *testing.T) {
	f := newFakeServer()
	reg := prometheus.NewRegistry()
	m, err := New(Options{Server: srv(10), Apps: []AppConfig{app("a", 1, 0, 20*time.Millisecond), app("b", 3, 2, time.Second)}, Dial: f.dial, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, tc := range []struct {
		name, app string
		want      float64
	}{
		{"lockpool_pool_max_connections", "a", 1},
		{"lockpool_pool_max_pinned", "a", 0},
		{"lockpool_pool_max_connections", "b", 3},
		{"lockpool_pool_max_pinned", "b", 2},
		{"lockpool_pool_wait_timeouts_total", "a", 0},
		{"lockpool_pool_wait_timeouts_total", "b", 0},
	} {
		if v, ok := gathered(t, reg, tc.name, tc.app); !ok || v != tc.want {
			t.Errorf("%s{app=%q} = %v (present %v), want %v", tc.name, tc.app, v, ok, tc.want)
		}
	}

	held, err := m.Acquire(context.Background(), "a", "db")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Acquire(context.Background(), "a", "db"); !errors.Is(err, ErrWaitTimeout) {
		t.Fatalf("second acquire over a budget of 1: %v, want ErrWaitTimeout", err)
	}
	m.Release(held)
	if v, _ := gathered(t, reg, "lockpool_pool_wait_timeouts_total", "a"); v != 1 {
		t.Errorf("lockpool_pool_wait_timeouts_total{app=a} = %v after one timeout, want 1", v)
	}

	m.Reconfigure(srv(10), []AppConfig{app("a", 5, 4, time.Second)})
	if v, _ := gathered(t, reg, "lockpool_pool_max_connections", "a"); v != 5 {
		t.Errorf("lockpool_pool_max_connections{app=a} = %v after a reload, want 5", v)
	}
	if _, ok := gathered(t, reg, "lockpool_pool_max_connections", "b"); ok {
		t.Error("a removed application still shows its budget")
	}
}
