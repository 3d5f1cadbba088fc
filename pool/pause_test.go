package pool

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestPauseResume: a paused application's Acquire waits (counted as
// waiting, per database with its wait time) until Resume; others go on.
func TestPauseResume(t *testing.T) {
	for _, tc := range []struct {
		name         string
		pause        string // "" pauses everything
		resume       string
		otherWaits   bool // application b is paused too
		otherResumed bool // after resume, b goes on as well
	}{
		{name: "one application", pause: "a", resume: "a"},
		{name: "all, resume all", pause: "", resume: "", otherWaits: true, otherResumed: true},
		{name: "all, resume one", pause: "", resume: "a", otherWaits: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := start(t, setup{server: srv(10), apps: []AppConfig{app("a", 2, 0, 5*time.Second), app("b", 2, 0, 5*time.Second)}})
			if err := m.Pause(tc.pause); err != nil {
				t.Fatal(err)
			}
			if !m.Paused("a") || m.Paused("b") != tc.otherWaits {
				t.Fatalf("Paused(a)=%v Paused(b)=%v", m.Paused("a"), m.Paused("b"))
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			chA := acquireAsync(m, ctx, "a", "db1")
			waitFor(t, "a waiting", func() bool { return m.Stats("a").Waiting == 1 })
			ds := m.DatabaseStats("a")
			if len(ds) != 1 || ds[0].Database != "db1" || ds[0].Waiting != 1 {
				t.Fatalf("DatabaseStats(a) = %+v, want db1 with one waiter", ds)
			}
			time.Sleep(20 * time.Millisecond) // let the wait grow measurably
			if ds = m.DatabaseStats("a"); ds[0].MaxWait < 20*time.Millisecond {
				t.Fatalf("MaxWait = %s, want >= 20ms", ds[0].MaxWait)
			}
			var chB chan result
			if tc.otherWaits {
				chB = acquireAsync(m, ctx, "b", "db1")
				waitFor(t, "b waiting", func() bool { return m.Stats("b").Waiting == 1 })
			} else {
				m.Release(mustAcquire(t, m, "b", "db1"))
			}
			select {
			case r := <-chA:
				t.Fatalf("Acquire of a paused application returned %v", r.err)
			case <-time.After(30 * time.Millisecond):
			}
			if err := m.Resume(tc.resume); err != nil {
				t.Fatal(err)
			}
			r := recv(t, chA)
			if r.err != nil {
				t.Fatalf("after Resume: %v", r.err)
			}
			m.Release(r.c)
			if n, d := m.WaitTotals("a"); n != 1 || d < 50*time.Millisecond {
				t.Fatalf("WaitTotals(a) = %d, %s; want 1 acquire that waited >= 50ms", n, d)
			}
			if tc.otherWaits {
				if tc.otherResumed {
					r := recv(t, chB)
					if r.err != nil {
						t.Fatal(r.err)
					}
					m.Release(r.c)
				} else {
					if !m.Paused("b") || m.Stats("b").Waiting != 1 {
						t.Fatalf("b: paused %v, stats %+v; want still paused with its waiter", m.Paused("b"), m.Stats("b"))
					}
					cancel()
					if r := recv(t, chB); !errors.Is(r.err, context.Canceled) {
						t.Fatalf("cancelled paused wait: %v", r.err)
					}
				}
			}
			expectStats(t, m, "a", Stats{Open: 1, Idle: 1})
		})
	}
}

// TestPauseWaitEnds: a paused wait ends with wait_timeout, its context, or
// Close; unknown applications are refused.
func TestPauseWaitEnds(t *testing.T) {
	m, _ := start(t, setup{server: srv(10), apps: []AppConfig{app("a", 2, 0, 50*time.Millisecond)}})
	if err := m.Pause("nope"); !errors.Is(err, ErrUnknownApp) {
		t.Fatalf("Pause(nope) = %v, want ErrUnknownApp", err)
	}
	if err := m.Resume("nope"); !errors.Is(err, ErrUnknownApp) {
		t.Fatalf("Resume(nope) = %v, want ErrUnknownApp", err)
	}
	if err := m.Pause("a"); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, err := m.Acquire(context.Background(), "a", "db"); !errors.Is(err, ErrWaitTimeout) || time.Since(t0) < 50*time.Millisecond {
		t.Fatalf("paused Acquire = %v after %s, want ErrWaitTimeout after 50ms", err, time.Since(t0))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := m.Acquire(ctx, "a", "db"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("paused Acquire with a short context = %v", err)
	}
	expectStats(t, m, "a", Stats{})
	m.Reconfigure(srv(10), []AppConfig{app("a", 2, 0, time.Minute)})
	ch := acquireAsync(m, context.Background(), "a", "db")
	waitFor(t, "waiting", func() bool { return m.Stats("a").Waiting == 1 })
	m.Close()
	if r := recv(t, ch); !errors.Is(r.err, ErrClosed) {
		t.Fatalf("Acquire paused across Close = %v, want ErrClosed", r.err)
	}
}
