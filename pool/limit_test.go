package pool

import (
	"context"
	"errors"
	"testing"
	"time"
)

// SetLimit moves an application's budget at run time: lowered, the open
// count never rises above max(open at the call, limit), idle excess closes
// at once and in-use excess at its release; raised, waiters are served; a
// reconfiguration keeps the cap.
func TestSetLimit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		held      int // connections held when the limit changes
		idle      int // of those, released to idle before the change
		limit     int
		wantOpen  int // open right after SetLimit
		wantAfter int // open after every held connection is released
	}{
		{name: "lower below idle closes idle at once", held: 3, idle: 2, limit: 1, wantOpen: 1, wantAfter: 1},
		{name: "lower to zero closes in-use at release", held: 3, idle: 0, limit: 0, wantOpen: 3, wantAfter: 0},
		{name: "raise keeps connections", held: 2, idle: 1, limit: 4, wantOpen: 2, wantAfter: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, f := start(t, setup{server: srv(10), apps: []AppConfig{app("a", 4, 1, time.Second)}})
			var conns []*Conn
			for i := 0; i < tc.held; i++ {
				conns = append(conns, mustAcquire(t, m, "a", "db"))
			}
			for _, c := range conns[:tc.idle] {
				m.Release(c)
			}
			conns = conns[tc.idle:]
			m.SetLimit("a", tc.limit, 0)
			if got := m.Stats("a").Open; got != tc.wantOpen {
				t.Fatalf("open after SetLimit(%d) = %d, want %d", tc.limit, got, tc.wantOpen)
			}
			for _, c := range conns {
				m.Release(c)
			}
			if got := m.Stats("a").Open; got != tc.wantAfter {
				t.Fatalf("open after releasing = %d, want %d", got, tc.wantAfter)
			}
			if got := f.openCount("a"); got != tc.wantAfter {
				t.Fatalf("server sees %d connections, want %d", got, tc.wantAfter)
			}
		})
	}
}

func TestSetLimitZeroWaitsThenServes(t *testing.T) {
	t.Parallel()
	m, _ := start(t, setup{server: srv(10), apps: []AppConfig{app("a", 4, 2, 5*time.Second)}})
	m.SetLimit("a", 0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err := m.Acquire(ctx, "a", "db")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire under limit 0: %v, want a deadline error", err)
	}
	got := make(chan *Conn, 1)
	go func() {
		c, err := m.Acquire(context.Background(), "a", "db")
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	waitFor(t, "the acquire to queue", func() bool { return m.Stats("a").Waiting == 1 })
	m.SetLimit("a", 2, 1)
	c := <-got
	if err := m.AcquirePin(context.Background(), "a"); err != nil {
		t.Fatalf("pin under limit 1: %v", err)
	}
	// The cap survives a reconfiguration and never exceeds the configured budget.
	m.Reconfigure(srv(10), []AppConfig{app("a", 4, 2, 5*time.Second)})
	if conns, pins, ok := m.Limit("a"); !ok || conns != 2 || pins != 1 {
		t.Fatalf("Limit after Reconfigure = %d, %d, %v; want 2, 1, true", conns, pins, ok)
	}
	m.SetLimit("a", 9, 9)
	m.mu.Lock()
	gotMax, gotPins := m.apps["a"].cfg.MaxConnections, m.apps["a"].cfg.MaxPinned
	m.mu.Unlock()
	if gotMax != 4 || gotPins != 2 {
		t.Fatalf("budget under a cap above the configuration = %d, %d; want 4, 2", gotMax, gotPins)
	}
	m.ReleasePin("a")
	m.Release(c)
}

// DialGate refuses dial attempts before any connection is made (retried
// within wait_timeout, so a gate that opens in time serves the client) and
// bounds an allowed attempt by its deadline; OnDial's error closes the new
// connection and fails the dial.
func TestDialGateAndOnDial(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		gateErr   bool // the gate refuses until opened
		openAfter time.Duration
		dialErr   bool // OnDial refuses
		wantErr   bool
		wantDials int // dials that reached the server
	}{
		{name: "open gate, recorded", wantDials: 1},
		{name: "gate opens within wait_timeout", gateErr: true, openAfter: 150 * time.Millisecond, wantDials: 1},
		{name: "gate stays closed", gateErr: true, openAfter: time.Hour, wantErr: true, wantDials: 0},
		{name: "record refused", dialErr: true, wantErr: true, wantDials: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, f := start(t, setup{server: srv(10), apps: []AppConfig{app("a", 4, 1, 600*time.Millisecond)}})
			opened := time.Now().Add(tc.openAfter)
			m.DialGate(func(string) (time.Time, error) {
				if tc.gateErr && time.Now().Before(opened) {
					return time.Time{}, errors.New("closed")
				}
				return time.Now().Add(time.Second), nil
			})
			var recorded []uint32
			m.OnDial(func(_ context.Context, app string, pid uint32) error {
				if tc.dialErr {
					return errors.New("not recorded")
				}
				recorded = append(recorded, pid)
				return nil
			})
			c, err := m.Acquire(context.Background(), "a", "db")
			if (err != nil) != tc.wantErr {
				t.Fatalf("Acquire: %v, want error %v", err, tc.wantErr)
			}
			if got := f.dialCount(); got != tc.wantDials {
				t.Fatalf("%d dials reached the server, want %d", got, tc.wantDials)
			}
			if err == nil {
				if len(recorded) != 1 || recorded[0] != c.PID {
					t.Fatalf("OnDial saw %v, want [%d]", recorded, c.PID)
				}
				m.Release(c)
			} else if tc.gateErr && !errors.Is(err, ErrDialGated) {
				t.Fatalf("error %v does not wrap ErrDialGated", err)
			}
			waitFor(t, "nothing open after a failed dial", func() bool { return err == nil || (m.Stats("a").Open == 0 && f.openCount("a") == 0) })
		})
	}
}
